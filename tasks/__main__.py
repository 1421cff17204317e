"""`python -m tasks [list|table|vocab|chat]`: the registered tasks and mixtures, offline.

`list` (the default) prints every seqio task and mixture with its source and
whether its data is present locally (a file-system check, never the network).
`table` prints the Markdown table of spot tasks used in docs/tasks.md.
`vocab` shows how a vocabulary spells words, label words or a file's texts: the pieces each
takes and the characters it lacks (`tasks.vocab_check`), e.g.
  python -m tasks vocab yes no colour
  python -m tasks vocab --labels=positive,negative --vocab=t5
  python -m tasks vocab --file=train.tsv --column=review
`chat` reads an instruction JSONL file as `register_chat_task` would (`tasks.chat`): its
examples, their token lengths and the first ones as the model reads them, e.g.
  python -m tasks chat train.jsonl --tokenizer=/models/Llama-3.2-1B-Instruct
"""
from __future__ import annotations

import sys
from typing import List

import seqio

import tasks
from spot_jax import cli
from tasks import chat
from tasks import registry
from tasks import vocab_check


def _present(source) -> str:
  check = getattr(source, "is_present", None)
  if check is None:
    return "unknown"
  try:
    return "yes" if check() else "no"
  except Exception as e:  # pylint: disable=broad-except
    return f"no ({type(e).__name__})"


def _describe(source) -> str:
  describe = getattr(source, "describe", None)
  return describe() if describe else type(source).__name__


def list_lines() -> List[str]:
  """One line per task ("task  <name>  <source>  present=<yes|no>") and per mixture."""
  lines = [f"# TFDS data_dir: {tasks.tfds_data_dir()}   local files: "
           f"{tasks.files_dir() or '(unset)'}"]
  task_names = sorted(seqio.TaskRegistry.names())
  for name in task_names:
    source = seqio.get_mixture_or_task(name).source
    lines.append(f"task     {name:48s} {_describe(source):60s} present={_present(source)}")
  for name in sorted(seqio.MixtureRegistry.names()):
    members = [t.name for t in seqio.get_mixture_or_task(name).tasks]
    present = all(_present(seqio.get_mixture_or_task(t).source) == "yes" for t in members)
    lines.append(f"mixture  {name:48s} {f'{len(members)} tasks':60s} "
                 f"present={'yes' if present else 'no'}")
  return lines


def _splits(source) -> str:
  split_map = getattr(source, "split_map", None) or {s: s for s in source.splits}
  return ", ".join(k if k == v else f"{k}={v}" for k, v in split_map.items())


def table_lines() -> List[str]:
  """Markdown rows: name | source | format | postprocessor | metrics, for every spot task."""
  lines = ["| task | source | splits | inputs -> targets | postprocessor | metrics |",
           "| --- | --- | --- | --- | --- | --- |"]
  for name, spec in sorted(registry.SPECS.items()):
    if name.endswith("_files_v200") or name.endswith("_hf_v200") or "_taskless_" in name:
      continue
    post = getattr(spec.postprocess_fn, "func", spec.postprocess_fn)
    post_name = getattr(post, "__name__", "-") if post else "-"
    metric_names = (", ".join(getattr(getattr(m, "func", m), "__name__", "?")
                              for m in spec.metric_fns) or "-")
    fmt = spec.formats.replace("|", "\\|")
    source = _describe(spec.source).replace("|", "\\|")
    lines.append(f"| `{name}` | {source} | {_splits(spec.source)} | {fmt} | {post_name} | "
                 f"{metric_names} |")
  return lines


def main(argv: List[str]) -> int:
  """Command-line entry point (run it through `cli.run`, which reports errors in one line)."""
  parser = cli.ArgumentParser(prog="tasks", description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", metavar="{list,table,vocab,chat}")
  commands.add_parser("list", help="every task and mixture, and whether its data is here")
  commands.add_parser("table", help="the Markdown table of the spot tasks")
  check = commands.add_parser("vocab", help="the pieces a vocabulary spells words with")
  check.add_argument("texts", nargs="*", help="words or texts to check, e.g. yes no colour")
  check.add_argument("--labels", default=None, help="comma-separated label words, e.g. yes,no")
  check.add_argument("--file", default=None,
                     help="a file of texts: one a line, or a TSV/CSV/JSONL file with --column")
  check.add_argument("--column", default=None, help="the column of --file to read")
  check.add_argument("--vocab", default="embedded",
                     help="embedded (the toy T5's, the default), t5 (the T5 vocabulary: "
                          "$SPOT_JAX_VOCAB or the public file), byte, or a SentencePiece file")
  show = commands.add_parser("chat", help="an instruction JSONL file as the model reads it")
  show.add_argument("file", help="a .jsonl file: prompt/completion or messages rows")
  show.add_argument("--tokenizer", required=True,
                    help="the model's directory (tokenizer.json or tokenizer.model and its chat "
                         "template), or embedded_decoder")
  show.add_argument("--template", default="model",
                    help="model (its own chat template), plain, or a .jinja file")
  show.add_argument("--show", type=int, default=2, help="examples to print")
  args = parser.parse_args(argv)
  if args.command == "vocab":
    lines = vocab_lines(args)
  elif args.command == "chat":
    lines = chat.check_lines(args.file, args.tokenizer, args.template, args.show)
  else:
    lines = table_lines() if args.command == "table" else list_lines()
  print("\n".join(lines))
  return 0


def vocab_lines(args) -> List[str]:
  """The report of `tasks vocab`: the texts and labels given, then the file's summary."""
  if args.column and not args.file:
    raise cli.UsageError("--column needs --file; give --file=PATH --column=NAME")
  texts = list(args.texts) + (vocab_check.label_list(args.labels) if args.labels else [])
  if not texts and not args.file:
    raise cli.UsageError("nothing to check; give words (python -m tasks vocab yes no), "
                         "--labels=a,b or --file=PATH (see --help)")
  vocab = vocab_check.vocabulary(args.vocab)
  lines = [vocab_check.describe(args.vocab, vocab)]
  if texts:
    lines += vocab_check.text_lines(vocab, texts)
  if args.file:
    lines += vocab_check.file_lines(vocab, args.file, args.column)
  return lines


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "tasks"))

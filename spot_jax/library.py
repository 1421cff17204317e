"""`python -m spot_jax.library add|list|show|remove`: the SPoT prompt library.

  # from any run directory (spot_jax.train, the study, retrieval, the demo): its run.json knows
  # the task, seed, score, task-embedding step and frozen model
  python -m spot_jax.library add --library=/lib --run_dir=/runs/mnli
  # from .npy files:
  python -m spot_jax.library add --library=/lib --prompt=p.npy --embedding=e.npy \
    --task=spot_glue_mnli_v200 --score=86.1 --model=... --checkpoint=...
  python -m spot_jax.library list --library=/lib
  python -m spot_jax.library show --library=/lib --id=spot_glue_mnli_v200.mnli
  python -m spot_jax.library remove --library=/lib --id=spot_glue_mnli_v200.mnli

Entry ids default to <task>.<run_id> (just <task> when the run directory is named after it).

A refused `add` (wrong embedding size, another frozen model, truncated .npy, duplicate id,
unknown task) prints one line, exits 2 and leaves the library unchanged.
"""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Optional, Sequence

import numpy as np

from spot_jax import cli, fileio, validate
from spot_jax.cli import flags
from spot_jax.cli import model_flag
from spot_jax.errors import ConfigError
from spot_jax.run_dir import PROMPT_FILE_RE, RunDir, companion_file
from spot_jax import backbone as backbone_lib
from spot_jax.spot import library as prompt_library
from spot_jax.spot import settings as settings_lib

PROG = "spot_jax.library"


def _parser() -> cli.ArgumentParser:
  parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  add = sub.add_parser("add", help="add an entry from a run directory or .npy files")
  add.add_argument("--library", required=True)
  add.add_argument("--run_dir", help="a training run's MODEL_DIR")
  add.add_argument("--prompt", help="best prompt .npy (instead of --run_dir)")
  add.add_argument("--embedding", help="task embedding .npy (instead of --run_dir)")
  add.add_argument("--task", help="the source task (a registered seqio task)")
  add.add_argument("--score", type=float, help="the prompt's best validation score")
  add.add_argument("--metric", default=None, help="the score's metric (default: accuracy)")
  add.add_argument("--seed", type=int, default=None)
  add.add_argument("--run_id", default=None, help="default: the run directory's name")
  add.add_argument("--id", default=None, help="entry id (default: <task>.<run_id>)")
  add.add_argument("--embedding_step", type=int, default=None,
                   help="with --run_dir: the step whose exported prompt is the task embedding")
  add.add_argument("--task_module", default=None,
                   help="module(s) registering the task (default: the run's, else tasks)")
  add.add_argument("--allow_backbone_change", action="store_true",
                   help="enter the prompt as trained with the --model/--checkpoint "
                        "given, although the run recorded another frozen backbone")
  flags.add_backbone(add, required=False, seed=False)
  for name in ("list", "show", "remove"):
    p = sub.add_parser(name)
    p.add_argument("--library", required=True)
    if name != "list":
      p.add_argument("--id", required=True)
  return parser


def _from_run_dir(args) -> dict:
  """What a run directory's record says about its prompt (every spot_jax.train run has one)."""
  run_dir = RunDir(validate.existing_dir(args.run_dir, "--run_dir", "a training run's directory"))
  record = run_dir.read_record()
  if record is None:
    raise ConfigError(f"--run_dir {args.run_dir!r} has no run.json (not a spot_jax.train run, or "
                      "one of an older version); give --prompt, --embedding, --task and --model "
                      "instead")
  if args.task and args.task != record.task:
    raise ConfigError(f"--task {args.task!r} differs from the run's task {record.task!r}; "
                      "drop --task")
  if args.embedding_step is not None:
    step, embedding = args.embedding_step, run_dir.prompt_path(args.embedding_step)
  else:
    embedding, step = run_dir.embedding_prompt()
  prompt, _ = run_dir.exported_prompt()
  return {"task": record.task, "seed": record.seed, "score": record.score,
          "metric": record.metric or "accuracy", "prompt": prompt, "embedding": embedding,
          "embedding_step": step, "fingerprint": record.fingerprint,
          "task_module": record.task_module}


def _refuse_offset_prompts(prompt_file: pathlib.Path) -> None:
  """A DePT prompt is half of its model (its input offset is exported beside it): no entry."""
  if PROMPT_FILE_RE.match(prompt_file.name) and companion_file(
      prompt_file, "offset").is_file():
    raise ConfigError(f"{prompt_file} is a DePT prompt: it needs the input offset exported beside "
                      f"it and library entries hold a prompt alone; add a Prompt Tuning "
                      f"or Residual "
                      "run")


def add(args) -> int:
  validate.positive_int(args.seed, "--seed", minimum=0, optional=True)
  validate.positive_int(args.embedding_step, "--embedding_step", optional=True)
  if (args.run_dir is None) == (args.prompt is None):
    raise ConfigError("give exactly one source: --run_dir=<run directory> or --prompt=<.npy> "
                      "(with --embedding)")
  if args.run_dir:
    found = _from_run_dir(args)
  else:
    if not args.embedding or not args.task:
      raise ConfigError("--prompt needs --embedding=<.npy> and --task=<task name>")
    found = {"task": args.task, "seed": args.seed or 0, "score": args.score,
             "metric": args.metric or "accuracy", "prompt": args.prompt,
             "embedding": args.embedding, "embedding_step": args.embedding_step,
             "fingerprint": None, "task_module": None}
  settings_lib.check_tasks([found["task"]], args.task_module or found["task_module"] or "tasks")
  _refuse_offset_prompts(pathlib.Path(found["prompt"]))
  prompt = prompt_library.load_npy(found["prompt"], "prompt")
  embedding = prompt_library.load_npy(found["embedding"], "task embedding")
  fileio.writable_dir(args.library, "--library")  # before loading the model
  embed_dim = None
  if args.model:
    model, _ = model_flag.load_model(args.model, args.model_binding)
    embed_dim = int(model.config.emb_dim)
    given = settings_lib.model_fingerprint(model, args.checkpoint, found["seed"])
    if found["fingerprint"] is not None and not args.allow_backbone_change:
      backbone_lib.check_same(found["fingerprint"], given, f"--run_dir {args.run_dir!r}",
                              "--allow_backbone_change")
    found["fingerprint"] = given
  if found["fingerprint"] is None:
    raise ConfigError("the frozen model is unknown: give --model (and --checkpoint) of "
                      "the model the prompt was trained with")
  run_id = args.run_id or (pathlib.Path(args.run_dir).resolve().name if args.run_dir
                           else pathlib.Path(args.prompt).stem)
  entry_id = args.id or (found["task"] if run_id == found["task"] else f"{found['task']}.{run_id}")
  entry = prompt_library.Library(args.library).add(
      entry_id=entry_id, task=found["task"], run_id=run_id, seed=found["seed"],
      fingerprint=found["fingerprint"], prompt=prompt, embedding=embedding, score=found["score"],
      metric=found["metric"], embedding_step=found["embedding_step"], embed_dim=embed_dim)
  print(f"added {entry.id}: task {entry.task}, prompt {list(entry.prompt.shape)}, "
        f"embedding {list(entry.embedding.shape)}, score {_score(entry.score)}")
  return 0


def _score(score: Optional[float]) -> str:
  """A score as people write it: 4 significant digits (28.499999999999996 -> 28.5)."""
  return "-" if score is None else f"{score:.4g}"


def _columns(header: Sequence[str], rows: Sequence[Sequence[str]],
             right: Sequence[int] = ()) -> list[str]:
  """Lines of a table whose every column is as wide as its widest cell (`right`: numbers)."""
  widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
  return ["  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                    for i, (cell, w) in enumerate(zip(cells, widths))).rstrip()
          for cells in (header, *rows)]


def _report_problems(problems: Sequence[str]) -> None:
  for line in problems:
    print(f"{PROG}: warning: {line}", file=sys.stderr)


def main(argv: Sequence[str]) -> int:
  args = _parser().parse_args(argv)
  if args.command == "add":
    return add(args)
  lib = prompt_library.Library(args.library)
  if not lib.root.is_dir():
    what = "is a file, not a library directory" if lib.root.exists() else "does not exist"
    raise ConfigError(f"--library {args.library!r} {what}; `add` creates a library")
  if args.command == "list":
    entries, problems = lib.load()
    _report_problems(problems)
    rows = [(e.id, e.task, str(e.seed), _score(e.score), str(list(e.prompt.shape)),
             str(list(e.embedding.shape))) for e in entries]
    header = ("id", "task", "seed", "score", "prompt", "embedding")
    print("\n".join(_columns(header, rows, right=(2, 3))))
    print(f"{len(entries)} entries" + (f", {len(problems)} skipped" if problems else ""))
  elif args.command == "show":
    e = lib.get(args.id)
    info = {k: getattr(e, k) for k in ("id", "task", "run_id", "seed", "score", "metric",
                                       "embedding_step", "fingerprint")}
    info.update(prompt_shape=list(e.prompt.shape), embedding_shape=list(e.embedding.shape),
                prompt_mean_token_norm=float(np.linalg.norm(e.prompt, axis=-1).mean()),
                embedding_mean_token_norm=float(np.linalg.norm(e.embedding, axis=-1).mean()))
    print(json.dumps(info, indent=1))
  else:
    lib.remove(args.id)
    print(f"removed {args.id}")
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], PROG))

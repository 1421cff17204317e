"""`python -m spot_jax.infer`: serve soft prompts on a frozen T5 or decoder-only model.

  # A run directory alone: its recorded backbone and vocabulary (no --model, no --vocab)
  python -m spot_jax.infer --prompt=/runs/rte_pt --input=in.txt --output=out.jsonl
  # Predictions (JSONL: input, prompt, prediction, score) for a file of inputs; rows name
  # their prompt ("prompt" field) or use --default_prompt / the only prompt given.
  python -m spot_jax.infer --model=t5_1_1_lm100k_base --checkpoint=/ckpts/checkpoint_1100000 \
    --prompt=rte=/runs/rte_pt --prompt=boolq=/prompts/boolq.npy --input=in.jsonl --output=out.jsonl
  # Class-label scoring instead of decoding:  --label=entailment --label=not_entailment
  # Ensemble of all --prompt (one batched pass per batch):  --ensemble [--combine=logprob]
  # Inputs from a seqio task split:  --task=spot_super_glue_rte_v200 --split=validation
  # Nearest vocabulary tokens of every prompt token:  --interpret [--top_tokens=5] [--output=x.json]
  # Export one prompt:  --export_peft=DIR [--base_model=NAME_OR_DIR]  |  --export_npy=FILE
  # Export an MPT run unfolded (shared prompt + task factors):  --export_peft_mpt=DIR
  # Each input as a vLLM request (decoder-only):  --export_vllm=DIR --vllm_model=NAME

Prompts (`--prompt NAME=PATH`, or PATH alone to use its file/directory name) come from a
spot_jax.train run directory (its exported prompt; Residual and Residual SMoP prompts are folded;
SMoP runs also read the router; DePT runs also read their input offset; ATTEMPT runs their
sources and attention network; MPT runs are folded; prefix tuning and P-tuning v2 runs serve
their per-layer prefixes), a .npy [L, E] prompt, a PEFT prompt-tuning, prefix-tuning or
multitask-prompt-tuning adapter directory, or a SPoT prompt library entry
`LIBRARY_DIR#ENTRY_ID` (its best prompt; refused unless it was trained against the served
backbone). A multi-task run or adapter serves each task as NAME/<k>.

Run directories record their backbone and vocabulary (run.json): without --model, infer serves
on the recorded config, checkpoint and vocabulary (spot_jax.serve.catalog.served_backbone); a
--model or --checkpoint other than the recorded one is refused unless --allow_backbone_change. With
--model and no --checkpoint the backbone is the random one of --seed (what a smoke run trains
against). A decoder-only run (Llama, Gemma) serves the same way: its inputs become
[BOS, inputs] as in training, it decodes greedily or samples, and a prompt of the other kind is
refused in one line. See docs/serving.md.
"""
from __future__ import annotations

import io
import json
import pathlib
import sys
from typing import Any, Optional, Sequence

import numpy as np

from spot_jax import cli, validate, vocabulary
from spot_jax.cli import distributed
from spot_jax.cli import flags
from spot_jax.errors import ConfigError

PROG = "spot_jax.infer"




def _parser() -> cli.ArgumentParser:
  p = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  a = p.add_argument
  from spot_jax.serve.catalog import served_backbone  # pylint: disable=g-import-not-at-top
  served_backbone.add_served_flags(p)
  a("--smop_routing", default="linear", help="routing of SMoP runs: linear, top2, gumbel, "
    "stochastic or single")
  a("--attempt_temperature", type=float, default=None, help="softmax temperature of ATTEMPT "
    "runs trained with a non-default one (default: E * e, the paper's)")
  a("--placement", default="prefix", choices=("prefix", "after_bos", "suffix"))
  a("--input", default=None, help="text or JSONL file of inputs, or - for stdin")
  a("--task", default=None, help="seqio task whose --split is served instead of --input")
  a("--split", default="validation")
  a("--task_module", default=None, help="module registering --task (e.g. tasks.synthetic)")
  a("--num_examples", type=int, default=None, help="serve at most this many task examples")
  a("--vocab", default=None, help="'byte' or a SentencePiece model (default: the runs' recorded "
    "vocabulary, else T5's: SPOT_JAX_VOCAB)")
  flags.add_output(p, "predictions JSONL (interpretation: JSON) to write")
  a("--default_prompt", default=None, help="prompt of inputs that name none")
  flags.add_lengths(p, 128, 32, target_help="decoded tokens per prediction (EOS included); "
                    "with --label, the longest label")
  a("--batch_size", type=int, default=16, help="inputs per batch")
  a("--method", default="greedy", choices=("greedy", "beam", "sample"))
  a("--num_beams", type=int, default=4)
  a("--alpha", type=float, default=0.6, help="beam search length penalty")
  a("--temperature", type=float, default=1.0)
  a("--top_k", type=int, default=0)
  a("--label", action="append", default=[], help="class label (repeatable): rank the labels by "
    "log-likelihood instead of decoding")
  a("--ensemble", action="store_true", help="every input through all prompts; combine them")
  a("--combine", default="vote", choices=("vote", "logprob"), help="ensemble combination")
  a("--interpret", action="store_true", help="nearest vocabulary tokens of every prompt token")
  a("--top_tokens", type=int, default=5)
  a("--export_peft", default=None, help="write the (single) prompt as a PEFT adapter directory")
  a("--export_npy", default=None, help="write the (single) prompt as a bare [L, E] .npy")
  a("--export_peft_mpt", default=None, help="write the (single) MPT run or adapter, unfolded, as "
    "a PEFT MULTITASK_PROMPT_TUNING adapter directory")
  a("--export_vllm", default=None, help="write each --input as a vLLM Completions request whose "
    "prompt_embeds are the (single) prompt and the input's embedded tokens, to DIR/requests.jsonl")
  a("--vllm_model", default=None, help="the model name vLLM serves (default: --base_model)")
  a("--vllm_dtype", default="float32", choices=("float32", "bfloat16"),
    help="the prompt_embeds tensor's dtype (bfloat16 halves the request size)")
  a("--base_model", default=None, help="base_model_name_or_path recorded in the PEFT adapter")
  a("--overwrite", action="store_true", help="replace existing export outputs")
  distributed.add_arguments(p)
  a("--compilation_cache_dir", default=None,
    help="JAX's persistent compilation cache: a later run of the same shapes loads the compiled "
         "decoder instead of compiling it (default: $SPOT_JAX_COMPILATION_CACHE, else "
         "~/.cache/spot_jax/jax, at most 1 GiB; 'none' turns it off)")
  a("--timing", action="store_true", help="print where the time went (stderr), from process start")
  return p




def _check_numbers(args) -> None:
  """Every numeric flag in its range, by name."""
  for flag in ("batch_size", "input_length", "target_length", "num_beams", "top_tokens",
               "num_examples"):
    validate.positive_int(getattr(args, flag), f"--{flag}", optional=True)
  validate.positive_int(args.top_k, "--top_k", minimum=0, optional=True)
  validate.positive_int(args.seed, "--seed", minimum=0, optional=True)
  validate.non_negative(args.temperature, "--temperature", finite=False, note="0: greedy")
  if not abs(args.alpha) < float("inf"):
    raise ConfigError(f"--alpha={args.alpha} must be a finite number")


def main(argv: Sequence[str]) -> int:
  args = _parser().parse_args(argv)
  distributed.setup(args)  # several processes serve one mesh; each writes nothing but process 0
  _check_numbers(args)
  from spot_jax.serve.model import predict  # pylint: disable=g-import-not-at-top
  phases = predict.Phases(PROG, args.timing)
  from spot_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.enable_serving_cache(args.compilation_cache_dir, PROG)
  from spot_jax.serve.catalog import table as table_lib  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from spot_jax.serve.catalog import prompt_loaders, served_backbone
  modes = [m for m in ("interpret", "export_peft", "export_npy", "export_peft_mpt",
                       "export_vllm") if getattr(args, m)]
  if len(modes) > 1:
    raise ConfigError(f"give one of --interpret, --export_peft, --export_npy, --export_peft_mpt, "
                      f"--export_vllm, not {len(modes)}")
  specs = served_backbone.prompt_specs(args.prompt)
  served = served_backbone.resolve(  # --model's, or the one the run directories recorded
      [p for _, p in specs], checkpoint=args.checkpoint, seed=args.seed,
      config=flags.model_config(args.model, args.model_binding, dropout_rate=0.0) if args.model
      else None, allow_backbone_change=args.allow_backbone_change,
      weights_used=not (args.export_peft or args.export_npy or args.export_peft_mpt))
  config = served.config
  if args.export_peft_mpt:
    from spot_jax.serve.export import export  # pylint: disable=g-import-not-at-top
    return export.export_mpt(args, specs, config)
  fingerprint = None  # library entries must match the served model
  if any(prompt_loaders.library_reference(p) for _, p in specs):
    fingerprint = served.fingerprint()
  # A multi-task run (ATTEMPT targets, MPT tasks) serves one entry per task, NAME/<task index>.
  entries = [e for n, p in specs for e in prompt_loaders.load_all(
      n, p, smop_routing=args.smop_routing, config=config, fingerprint=fingerprint,
      attempt_temperature=args.attempt_temperature)]
  table = table_lib.PromptTable(entries, config.emb_dim)
  phases.mark("imports and prompts")
  if args.export_peft or args.export_npy:
    from spot_jax.serve.export import export  # pylint: disable=g-import-not-at-top
    return export.export(args, table, config)
  if args.interpret:
    return _interpret(args, table, served)
  if args.export_vllm:
    return _export_vllm(args, table, served)
  return _predict(args, table, served, phases)




def _interpret(args, table, served) -> int:
  from spot_jax.serve.catalog import interpret  # pylint: disable=g-import-not-at-top
  deep = [e.name for e in table.entries if e.deep]
  if deep:
    raise ConfigError(f"--interpret reads input prompts; {', '.join(deep)} are deep prompts "
                      f"(per-layer keys and values, no vocabulary neighbours)")
  if args.output:
    validate.output_file(args.output, "--output")
  if served.checkpoint and served.kind == "t5":
    from spot_jax import backbone as backbone_lib  # pylint: disable=g-import-not-at-top
    from spot_jax.backbones.t5 import checkpoints  # pylint: disable=g-import-not-at-top
    backbone_lib.check_initial_checkpoint(served.checkpoint)
    embedding = checkpoints.load_embedding(backbone_lib.resolve_checkpoint_path(served.checkpoint),
                                           served.config)
  else:
    from spot_jax import partitioning  # pylint: disable=g-import-not-at-top
    from spot_jax.serve.catalog import served_backbone  # pylint: disable=g-import-not-at-top
    params = served_backbone.load_params(served)[0]
    embedding = partitioning.fetch(params["token_embedder"]["embedding"])
  vocab = _vocab_or_none(served, args.vocab)
  records = [r for e in table.entries
             for r in interpret.interpret(e, embedding, args.top_tokens, vocab)]
  if args.output:
    from spot_jax.serve.model import inputs  # pylint: disable=g-import-not-at-top
    with inputs.atomic_jsonl(args.output) as f:
      json.dump(records, f, indent=1)
  print(interpret.format_table(records))
  return 0


def _export_vllm(args, table, served) -> int:
  from spot_jax.serve.catalog import served_backbone  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.export import export, vllm  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.model import inputs  # pylint: disable=g-import-not-at-top
  if served.kind != "decoder":
    raise ConfigError("--export_vllm writes decoder-only prompts (Llama, Gemma, Qwen); the served "
                      "backbone is an encoder-decoder (T5)")
  prompt = vllm.check_entry(export.single(table, "--export_vllm"))
  model = args.vllm_model or args.base_model
  if not model or args.input is None:
    raise ConfigError("--export_vllm needs --input (the requests' texts) and --vllm_model (the "
                      "name vLLM serves, e.g. meta-llama/Llama-3.2-1B)")
  path = vllm.requests_path(args.export_vllm, args.overwrite)
  examples = inputs.read_examples(args.input)
  vocab = served.vocabulary(args.vocab)
  served.check_vocabulary(vocab)
  params, _ = served_backbone.load_params(served)
  network = served.network()
  temperature = 0.0 if args.method == "greedy" else args.temperature
  bodies = [vllm.completion_body(model, vllm.encode(vllm.request_rows(network, params, prompt, row),
                                                    args.vllm_dtype),
                                 max_tokens=args.target_length, temperature=temperature,
                                 top_k=args.top_k or None)
            for row in _real_rows(*_tokens(args, vocab, examples))]
  vllm.write_requests(path, bodies)
  print(f"wrote {len(bodies)} vLLM Completions requests ({len(prompt)}-token prompt "
        f"{table.names[0]!r}, {args.vllm_dtype}) to {path}; serve with `vllm serve {model} "
        f"--enable-prompt-embeds`")
  return 0


def _vocab_or_none(served, name: Optional[str]):
  try:
    return served.vocabulary(name)
  except ConfigError:
    raise
  except Exception:  # pylint: disable=broad-except  (no vocabulary reachable: show ids)
    return None


def _predict(args, table, served, phases) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from spot_jax.serve.model import inputs, predict, server as server_lib
  from spot_jax.serve.catalog import served_backbone  # pylint: disable=g-import-not-at-top
  if not args.output:
    raise ConfigError("--output is required: the predictions JSONL to write")
  if (args.input is None) == (args.task is None):
    raise ConfigError("give exactly one of --input (file or -) or --task (a seqio task)")
  validate.output_file(args.output, "--output")
  if args.task:
    examples, vocab = inputs.task_examples(args.task, args.split, args.input_length,
                                           args.task_module, args.num_examples)
    names = _resolve_prompts(args, table, examples)
  else:
    examples = inputs.read_examples(args.input)
    names = _resolve_prompts(args, table, examples)  # before the (slow) vocabulary import
    vocab = served.vocabulary(args.vocab)  # --vocab's, the runs' recorded one, or T5's
  config = served.config
  served.check_vocabulary(vocab)
  tokens, valid = _tokens(args, vocab, examples)
  if tokens.max() >= config.vocab_size:
    raise ConfigError(f"an input encodes to id {tokens.max()}, beyond the model's table of "
                      f"{config.vocab_size} ids; give inputs (or --vocab) the model was trained on")
  phases.mark("inputs and vocabulary")
  labels, label_valid = (inputs.label_rows(vocab, args.label, args.target_length) if args.label
                         else (None, None))
  settings = server_lib.DecodeSettings(args.target_length, args.method, args.num_beams,
                                       args.alpha, args.temperature, args.top_k, args.seed,
                                       eos_id=inputs.eos_of(vocab))
  params, mesh = served_backbone.load_params(served)
  srv = server_lib.Server(served.network(), params, table, placement=args.placement,
                          settings=settings, mesh=mesh if jax.process_count() > 1 else None)
  phases.mark("backbone")
  show, first = predict.tty_progress(PROG), []

  def progress(done: int, total: int, start: float) -> None:
    if not first:  # the first batch: compiling (or loading from the cache) and running it
      phases.mark("first batch")
      from spot_jax import runtime  # pylint: disable=g-import-not-at-top
      first.append(runtime.seconds_since_start())
    show(done, total, start)

  runner = predict.Predictor(srv, vocab, batch_size=args.batch_size, labels=args.label or None,
                             label_tokens=labels, label_valid=label_valid,
                             ensemble=args.ensemble, combine=args.combine, progress=progress)
  if jax.process_index() == 0:
    with inputs.atomic_jsonl(args.output) as f:
      summary = runner.run(examples, names, tokens, f, valid)
  else:  # the same calls (collectives), nothing written
    summary = runner.run(examples, names, tokens, io.StringIO(), valid)
  phases.mark("other batches and writing")
  if summary is not None:
    if jax.process_index() == 0:
      with inputs.atomic_jsonl(args.output + ".summary.json") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary))
  if jax.process_index() == 0:
    print(f"wrote {len(examples)} predictions to {args.output}")
    phases.report(first[0] if first else None)
  return 0


def _resolve_prompts(args, table, examples) -> list[str]:
  if args.ensemble:
    table.check_input_length(table.names, args.input_length)
    return [""] * len(examples)
  default = args.default_prompt or (table.names[0] if len(table) == 1 else None)
  if default is not None:
    table.index(default)
  names = []
  for i, ex in enumerate(examples):
    name = ex.prompt or default
    if name is None:
      raise ConfigError(f"input {i + 1} names no prompt and {len(table)} are loaded; give each "
                        f"JSONL line a \"prompt\" or pass --default_prompt (valid: "
                        f"{', '.join(table.names)})")
    table.index(name)  # unknown names fail here, before any decoding
    names.append(name)
  table.check_input_length(names, args.input_length)  # DePT offsets cover s positions
  return names


def _tokens(args, vocab, examples) -> tuple[np.ndarray, np.ndarray]:
  """(ids [N, T] right-padded, validity [N, T] bool): padding is marked by the mask (a decoder's
  tokenizer may give a token id 0)."""
  from spot_jax.serve.model import inputs  # pylint: disable=g-import-not-at-top
  if examples[0].tokens is not None:
    return vocabulary.right_padded([ex.tokens for ex in examples], args.input_length)
  tokens, valid, cut = inputs.tokenize(vocab, [ex.input for ex in examples], args.input_length)
  if cut:
    where = "stdin" if args.input == "-" else args.input
    print(inputs.truncation_warning(examples, cut, args.input_length, where), file=sys.stderr)
  return tokens, valid


def _real_rows(tokens: np.ndarray, valid: np.ndarray) -> list[np.ndarray]:
  return [row[mask] for row, mask in zip(tokens, valid)]


if __name__ == "__main__":
  from spot_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.exit_now(cli.run(main, sys.argv[1:], PROG))  # outputs are on disk: skip the teardown

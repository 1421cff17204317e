r"""`python -m spot_jax.embedded.pretrain_decoder`: makes the embedded toy decoder, on a CPU.

  1. the suite's one vocabulary: the toy T5's SentencePiece model (pad 0, EOS 1, unk 2), copied;
     the decoder's BOS is a row of its own, the table's last (`BOS_ID`)
  2. a Llama-style decoder-only model (config `decoder_toy`) trained with AdamW on causal
     language modelling of the suite's unlabelled corpus plus examples of the pretraining
     sources as "<task name> <inputs> EOS <targets> EOS", scored on their targets (never a
     target task, never sentiment_food)
  3. written to --output_dir: `checkpoint/` (a Hugging Face directory, config.json and
     model.safetensors; loads with `spot_jax.backbones.decoder.checkpoints.load_checkpoint`),
     `spm.model`, `losses.json` (every step's loss), `eval.json` (greedy accuracy on every task's
     validation split, with task prefixes), `decoder_toy.gin` and `README.md`.

Same seed, same step count -> the same loss curve.

  python -m spot_jax.embedded.pretrain_decoder           # rewrites spot_jax/embedded/toy_decoder
  python -m spot_jax.embedded.pretrain_decoder --stop_after=5 --output_dir=/tmp/toy_decoder
"""
from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import sentencepiece as spm

from spot_jax import cli
from spot_jax import embedded
from spot_jax import fileio
from spot_jax import validate
from spot_jax import losses
from spot_jax.backbones.decoder import checkpoints
from spot_jax.cli import flags
from spot_jax.embedded import decoder_config
from spot_jax.embedded import pretrain as pretrain_t5
from spot_jax.embedded import toy_data
from spot_jax.errors import ConfigError
from spot_jax.models.common import unbox
from tasks import embedded as suite

STEPS = 600
BATCH_SIZE = 64
LENGTH = 64  # tokens of a row: the longest task example (paraphrase) is 57 with its two EOS
EVAL_INPUT_LENGTH = 56  # what the evaluation feeds (task prefix, inputs, EOS)
EVAL_TARGET_LENGTH = 8  # the longest answer (reverse's five words) is 6 tokens and EOS

GIN_TEXT = """\
# Model: the embedded toy decoder (Llama-style: RMSNorm, SwiGLU, RoPE, grouped-query attention;
# config decoder_toy) made by `python -m spot_jax.embedded.pretrain_decoder`, with the suite's
# SentencePiece vocabulary (tasks.embedded). Its BOS is a row of its own (383), never a token.
# Provides MODEL (and PROMPT = None, which a gin/prompts/ file given after this one replaces).
# Its checkpoint is spot_jax/embedded/toy_decoder/checkpoint (INITIAL_CHECKPOINT_PATH):
#   python -m spot_jax.train --gin_file=gin/models/decoder_toy.gin \\
#     --gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin --gin_file=gin/runs/prompt_tune.gin \\
#     --gin.MODEL_DIR="'/tmp/toy_decoder_run'" \\
#     --gin.MIXTURE_OR_TASK_NAME="'spot_toy_sentiment_travel_taskless_v100'" \\
#     --gin.MIXTURE_OR_TASK_MODULE="'tasks.embedded'" \\
#     --gin.TASK_FEATURE_LENGTHS="{'inputs': 48, 'targets': 8}" \\
#     --gin.INITIAL_CHECKPOINT_PATH="'spot_jax/embedded/toy_decoder/checkpoint'" \\
#     --gin.PROMPT_LENGTH=20 --gin.TRAIN_STEPS=300 --gin.EVAL_PERIOD=300 --gin.BATCH_SIZE=16
from __gin__ import dynamic_registration
from spot_jax.models import decoder_only
from spot_jax.backbones.decoder import network
from spot_jax.embedded import decoder_config

PROMPT = None
ACTIVATION_DTYPE = 'float32'
Z_LOSS = 1e-4

MODEL = @decoder_only.DecoderOnlyModel()
decoder_only.DecoderOnlyModel:
  module = @network.DecoderLM()
  z_loss = %Z_LOSS
network.DecoderLM:
  config = @decoder_config.toy_config()
  prompt = %PROMPT
decoder_config.toy_config:
  dtype = %ACTIVATION_DTYPE
"""


def lm_loss(module, params, batch: dict[str, jax.Array]) -> jax.Array:
  """Weighted next-token cross-entropy (plus t5x's z-loss) of a batch in the trainer's layout:
  the network reads [BOS, decoder_target_tokens[:-1]], as `DecoderOnlyModel` feeds it."""
  targets = batch["decoder_target_tokens"]
  bos = jnp.full((targets.shape[0], 1), module.config.bos_id, jnp.int32)
  logits = module.apply({"params": params}, jnp.concatenate([bos, targets[:, :-1]], axis=1),
                        valid=targets > 0)
  loss, _ = losses.cross_entropy_with_z_loss(logits, targets, batch["decoder_loss_weights"])
  return loss


def train(module, sp: spm.SentencePieceProcessor, *, steps: int, seed: int, batch_size: int,
          run_steps: int, log_period: int) -> tuple[dict, list[float], float]:
  """Pretrains `module` from a random initialisation; returns (params, losses, seconds)."""
  started = time.time()
  batches = toy_data.decoder_pretraining_batches(sp, seed=seed, batch_size=batch_size,
                                                 length=LENGTH)
  dummy = jnp.ones((1, LENGTH), jnp.int32)
  params = jax.jit(lambda r: unbox(module.init({"params": r}, dummy)["params"]))(
      jax.random.PRNGKey(seed))
  tx = pretrain_t5.make_optimizer(steps)  # the toy T5's AdamW and schedule
  opt_state = tx.init(params)

  @jax.jit
  def step_fn(params, opt_state, batch):
    loss, grads = jax.value_and_grad(lambda p: lm_loss(module, p, batch))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  losses_ = []
  for step in range(1, run_steps + 1):
    batch = {k: jnp.asarray(v) for k, v in next(batches).items()}
    params, opt_state, loss = step_fn(params, opt_state, batch)
    losses_.append(float(loss))
    if step % log_period == 0 or step == run_steps:
      print(f"step {step}/{run_steps}: loss {np.mean(losses_[-log_period:]):.4f} "
            f"({time.time() - started:.0f}s)", flush=True)
  return jax.device_get(params), losses_, time.time() - started


def pretrain(output_dir: str, *, steps: int = STEPS, seed: int = 0, batch_size: int = BATCH_SIZE,
             stop_after: Optional[int] = None, log_period: int = 50, evaluate: bool = True) -> dict:
  """Runs the whole recipe and writes its files; returns the loss log.

  Args:
    output_dir: folder to write (created).
    steps: length of the learning-rate schedule, and of the run.
    seed: seed of the data stream and of the initialisation.
    batch_size: rows per step (half corpus text, half task examples).
    stop_after: stop after this many steps (the schedule still spans `steps`), so a short run
      reproduces the first losses of the full one exactly.
    log_period: steps between progress lines.
    evaluate: score every task at the end (eval.json).
  """
  from spot_jax.backbones.decoder.network import DecoderLM  # pylint: disable=g-import-not-at-top
  run_steps = min(stop_after or steps, steps)
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  started = time.time()

  # 1. vocabulary: the suite's one, with a BOS row no piece or sentinel reaches
  model_bytes = pathlib.Path(embedded.VOCAB_PATH).read_bytes()
  sp = spm.SentencePieceProcessor(model_proto=model_bytes)
  config = decoder_config.toy_config()
  if sp.get_piece_size() + suite.EXTRA_IDS > config.bos_id:
    raise ConfigError(f"the vocabulary has {sp.get_piece_size()} pieces; with "
                      f"{suite.EXTRA_IDS} sentinels it must leave row {config.bos_id} (BOS) free")

  # 2. train
  module = DecoderLM(config)
  params, losses_, train_seconds = train(module, sp, steps=steps, seed=seed,
                                         batch_size=batch_size, run_steps=run_steps,
                                         log_period=log_period)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  print(f"model {decoder_config.NAME}: {num_params:,} parameters", flush=True)

  # 3. write
  log = {"command": "python -m spot_jax.embedded.pretrain_decoder " + " ".join(sys.argv[1:]),
         "seed": seed, "steps": run_steps, "schedule_steps": steps, "batch_size": batch_size,
         "length": LENGTH, "peak_learning_rate": pretrain_t5.PEAK_LEARNING_RATE,
         "num_parameters": num_params, "bos_id": config.bos_id,
         "seconds": round(train_seconds, 1), "jax_version": jax.__version__, "loss": losses_}
  write(out, module, params, log, model_bytes, evaluate=evaluate)
  print(f"wrote {out} ({time.time() - started:.0f}s in all)", flush=True)
  return log


def write(out: pathlib.Path, module, params, log: dict, vocabulary: bytes, *,
          evaluate: bool = True) -> None:
  """Writes the folder: losses.json, checkpoint/, spm.model, the gin file, eval.json (when
  `evaluate`: greedy accuracy of every task, with its prefix) and README.md."""
  (out / "losses.json").write_text(json.dumps(log))
  checkpoints.save_hf_dir(str(out / "checkpoint"), module.config, params, overwrite=True)
  (out / "spm.model").write_bytes(vocabulary)
  (out / f"{decoder_config.NAME}.gin").write_text(GIN_TEXT)
  scores = None
  if evaluate:
    scores = evaluate_prefixed(module, params, spm.SentencePieceProcessor(model_proto=vocabulary))
    (out / "eval.json").write_text(json.dumps(scores, indent=1, sort_keys=True))
    print("validation accuracy with task prefixes: " +
          ", ".join(f"{k} {v:.1f}" for k, v in sorted(scores.items())), flush=True)
  (out / "README.md").write_text(readme(log, scores))


def greedy_fn(module, *, input_length: int = EVAL_INPUT_LENGTH, steps: int = EVAL_TARGET_LENGTH):
  """A jitted (params, tokens [B, input_length + steps], valid) -> tokens: `steps` greedy tokens
  written after index input_length - 1, a whole forward pass per token (no cache: 8 steps of
  64 positions)."""
  def one(params, i, carry):
    tokens, valid = carry
    logits = module.apply({"params": params}, tokens, valid=valid)
    best = jnp.argmax(jax.lax.dynamic_index_in_dim(logits, input_length - 1 + i, 1, False), -1)
    return (jax.lax.dynamic_update_index_in_dim(tokens, best.astype(jnp.int32),
                                                input_length + i, 1),
            jax.lax.dynamic_update_index_in_dim(valid, jnp.ones_like(best, bool),
                                                input_length + i, 1))
  return jax.jit(lambda params, tokens, valid: jax.lax.fori_loop(
      0, steps, lambda i, carry: one(params, i, carry), (tokens, valid))[0])


def greedy_answers(module, params, inputs: Sequence[Sequence[int]], *, fn=None,
                   input_length: int = EVAL_INPUT_LENGTH,
                   steps: int = EVAL_TARGET_LENGTH) -> np.ndarray:
  """Greedy continuations [B, steps] of [BOS, inputs, EOS] (token lists without EOS). Rows are
  left-padded, so every answer starts at one index; positions skip the padding (the network's
  cumsum(valid) - 1). `fn`: a `greedy_fn` of the same lengths, to compile once."""
  config = module.config
  tokens = np.zeros((len(inputs), input_length + steps), np.int32)
  for i, row in enumerate(inputs):
    row = [config.bos_id] + list(row)[:input_length - 2] + [config.eos_id]
    tokens[i, input_length - len(row):input_length] = row
  fn = fn or greedy_fn(module, input_length=input_length, steps=steps)
  out = fn(params, jnp.asarray(tokens), jnp.asarray(tokens > 0))
  return np.asarray(out)[:, input_length:]


def decode_answer(sp: spm.SentencePieceProcessor, ids: Sequence[int]) -> str:
  """The text of generated ids up to the first EOS (pieces only: no sentinel nor BOS)."""
  ids = list(ids)
  ids = ids[:ids.index(toy_data.EOS_ID)] if toy_data.EOS_ID in ids else ids
  return sp.decode([int(t) for t in ids if 1 < t < sp.get_piece_size()]).strip()


def evaluate_prefixed(module, params, sp: spm.SentencePieceProcessor,
                      split: str = "validation") -> dict[str, float]:
  """Greedy exact-match accuracy (percent) of the backbone on every task, with task prefixes, on
  the first EVAL_EXAMPLES examples of `split` (the toy T5's table, `pretrain.evaluate_prefixed`)."""
  scores, fn = {}, greedy_fn(module)
  for key in sorted(suite.TASKS):
    inputs, targets = (x[:pretrain_t5.EVAL_EXAMPLES] for x in suite.examples(key, split))
    answers = greedy_answers(module, params, [sp.encode(x) for x in inputs], fn=fn)
    scores[key] = 100.0 * float(np.mean([decode_answer(sp, a) == y
                                         for a, y in zip(answers, targets)]))
  return scores


def readme(log: dict, scores: Optional[dict]) -> str:
  """The folder's README: how it was made, the loss curve and what the backbone can do."""
  losses = log["loss"]
  marks = sorted({1, 10, 50, 100, 200, 400, 600, 800, 1000,
                  len(losses)} & set(range(1, len(losses) + 1)))
  curve = "\n".join(f"| {m} | {np.mean(losses[max(0, m - 50):m]):.4f} |" for m in marks)
  lines = [
      f"# The embedded toy decoder (`{decoder_config.NAME}`)", "",
      decoder_config.DESCRIPTION + f", {log['num_parameters']:,} parameters, made on a CPU from "
      "nothing by", "", f"    {log['command'].strip()}", "",
      f"seed {log['seed']}, {log['steps']} steps (schedule {log['schedule_steps']} steps) of "
      f"batch {log['batch_size']}, rows of {log['length']} tokens, AdamW (peak learning rate "
      f"{log['peak_learning_rate']}, {pretrain_t5.WARMUP_STEPS} warm-up steps, cosine decay to "
      f"10%, weight decay 0.01, clipping 1.0), float32, no dropout, jax {log['jax_version']}; "
      f"{log['seconds']:.0f} s of training on this machine (2 CPU cores shared with other jobs)."
      " The loss is the mean over scored tokens: the text's (most of them, whose adjectives are "
      "drawn at random) and the answers'.", "",
      "Files: `checkpoint/` (a Hugging Face directory, `config.json` + `model.safetensors`: "
      "`spot_jax.backbones.decoder.checkpoints.load_checkpoint(path)`), `spm.model` (the "
      "suite's SentencePiece vocabulary, a copy of the toy T5's: pad 0, EOS 1, unk 2, in a "
      f"384-row table whose last row, {log['bos_id']}, is the BOS the model puts first), "
      f"`{decoder_config.NAME}.gin` (the gin model file, also `gin/models/`), `losses.json` "
      "(every step's training loss; the same seed gives the same curve), `eval.json`.", "",
      "Data: each batch is half plain text, whole sentences of the suite's unlabelled corpus "
      "(tasks/embedded.py `corpus_sentence`, all four domains; loss on every token), and half "
      "examples of the source tasks " + ", ".join(suite.PRETRAIN_SOURCES) + " as `<task name> "
      "<inputs> EOS <targets> EOS`, the trainer's decoder-only layout, with the loss on the "
      "targets only (what a prompt is later trained to produce). No target task and not "
      "sentiment_food is ever trained on.", "",
      "Loss (mean of the 50 steps up to the step):", "", "| step | loss |",
      "| --- | --- |", curve, ""]
  if scores:
    lines += ["Greedy validation accuracy (%) of the backbone alone on the first "
              f"{pretrain_t5.EVAL_EXAMPLES} examples, inputs with their task-name prefixes "
              "(targets and sentiment_food were never trained; the prompt methods use the "
              "taskless inputs; chance: the most frequent train label's share):", "",
              "| task | chance | accuracy |", "| --- | --- | --- |"]
    lines += [f"| {k}{' (pretrained)' if k in suite.PRETRAIN_SOURCES else ''} | "
              f"{suite.TASKS[k].chance:.1f} | {v:.1f} |" for k, v in sorted(scores.items())]
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> Optional[int]:
  parser = cli.ArgumentParser(prog="spot_jax.embedded.pretrain_decoder",
                              description=__doc__.splitlines()[0])
  flags.add_output_dir(parser, "where to write the model (default: the package's embedded folder)",
                       default=embedded.DECODER_DIR)
  parser.add_argument("--steps", type=int, default=STEPS)
  parser.add_argument("--stop_after", type=int, default=None,
                      help="stop early (checks): the first losses equal the full run's")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--batch_size", type=int, default=BATCH_SIZE)
  parser.add_argument("--no_eval", action="store_true", help="skip the final accuracy check")
  args = parser.parse_args(argv)
  validate.positive_int(args.steps, "--steps")
  validate.positive_int(args.stop_after, "--stop_after", optional=True)
  validate.positive_int(args.batch_size, "--batch_size", minimum=2)
  fileio.writable_dir(args.output_dir, "--output_dir")
  pretrain(args.output_dir, steps=args.steps, seed=args.seed, batch_size=args.batch_size,
           stop_after=args.stop_after, evaluate=not args.no_eval)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "spot_jax.embedded.pretrain_decoder"))

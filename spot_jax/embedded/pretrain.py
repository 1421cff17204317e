r"""`python -m spot_jax.embedded.pretrain`: makes the embedded toy T5 from nothing, on a CPU.

  1. a SentencePiece vocabulary trained on the embedded suite's corpus (tasks/embedded.py)
  2. a T5.1.1-style model (config `t5_1_1_toy`) trained with AdamW on span corruption over the
     corpus plus multi-task examples of some source tasks with their task-name prefixes (never
     a target task)
  3. written to --output_dir: `checkpoint/` (T5X, loads with
     `spot_jax.backbones.t5.load_checkpoint`),
     `spm.model`, `losses.json` (every step's loss), `eval.json` (accuracy on the pretraining
     tasks' validation splits) and `t5_1_1_toy.gin`.

Same seed, same step count -> the same vocabulary bytes and the same loss curve.

  python -m spot_jax.embedded.pretrain                       # rewrites spot_jax/embedded/toy_t5
  python -m spot_jax.embedded.pretrain --stop_after=20 --output_dir=/tmp/toy   # its first 20 steps
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
from spot_jax.cli import flags
from spot_jax import embedded
from spot_jax import fileio
from spot_jax import models
from spot_jax.backbones import t5
from spot_jax import validate
from spot_jax.embedded import toy_data
from spot_jax.errors import ConfigError
from tasks import embedded as suite

STEPS = 800
BATCH_SIZE = 64
INPUT_LENGTH = 56
TARGET_LENGTH = 16
PEAK_LEARNING_RATE = 3e-3
WARMUP_STEPS = 100
EVAL_EXAMPLES = 200  # the first validation examples eval.json scores (the committed model's)

GIN_TEXT = """\
# Model: the embedded toy T5 (T5.1.1 gated-GELU, untied; config t5_1_1_toy, 1.6M parameters)
# made by `python -m spot_jax.embedded.pretrain`, with its SentencePiece vocabulary \
(tasks.embedded).
# Provides MODEL (and PROMPT = None, which a gin/prompts/ file given after this one replaces).
# Its checkpoint is spot_jax/embedded/toy_t5/checkpoint (INITIAL_CHECKPOINT_PATH):
#   python -m spot_jax.train --gin_file=gin/models/t5_1_1_toy.gin \\
#     --gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin --gin_file=gin/runs/prompt_tune.gin \\
#     --gin.MODEL_DIR="'/tmp/toy_run'" \
--gin.MIXTURE_OR_TASK_NAME="'spot_toy_sentiment_travel_taskless_v100'" \\
#     --gin.MIXTURE_OR_TASK_MODULE="'tasks.embedded'" --gin.TASK_FEATURE_LENGTHS="{'inputs': 48, \
'targets': 8}" \\
#     --gin.INITIAL_CHECKPOINT_PATH="'spot_jax/embedded/toy_t5/checkpoint'" \\
#     --gin.PROMPT_LENGTH=20 --gin.TRAIN_STEPS=300 --gin.EVAL_PERIOD=300 --gin.BATCH_SIZE=16
from __gin__ import dynamic_registration
from spot_jax import models
from spot_jax.backbones import t5
from spot_jax import validate

PROMPT = None
DROPOUT_RATE = 0.1
ACTIVATION_DTYPE = 'float32'
Z_LOSS = 1e-4

MODEL = @models.EncoderDecoderModel()
models.EncoderDecoderModel:
  module = @t5.Transformer()
  z_loss = %Z_LOSS
t5.Transformer:
  config = @t5.config_by_name()
  prompt = %PROMPT
t5.config_by_name:
  name = 't5_1_1_toy'
  dropout_rate = %DROPOUT_RATE
  dtype = %ACTIVATION_DTYPE
"""


def build_model() -> models.EncoderDecoderModel:
  """The toy model without a prompt, dropout off."""
  config = t5.config_by_name(embedded.CONFIG_NAME, dropout_rate=0.0)
  return models.EncoderDecoderModel(module=t5.Transformer(config))


def make_optimizer(steps: int) -> optax.GradientTransformation:
  """AdamW, linear warm-up then cosine decay to 10% of the peak, global-norm clipping at 1."""
  schedule = optax.warmup_cosine_decay_schedule(0.0, PEAK_LEARNING_RATE, min(WARMUP_STEPS, steps),
                                                max(steps, WARMUP_STEPS + 1),
                                                PEAK_LEARNING_RATE * 0.1)
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def pretrain(output_dir: str, *, steps: int = STEPS, seed: int = 0, batch_size: int = BATCH_SIZE,
             stop_after: Optional[int] = None, log_period: int = 50, evaluate: bool = True) -> dict:
  """Runs the whole recipe and writes its files; returns the loss log.

  Args:
    output_dir: folder to write (created).
    steps: length of the learning-rate schedule, and of the run.
    seed: seed of the vocabulary corpus, the data stream and the initialisation.
    batch_size: examples per step (half span corruption, half tasks).
    stop_after: stop after this many steps (the schedule still spans `steps`), so a short run
      reproduces the first losses of the full one exactly.
    log_period: steps between progress lines.
    evaluate: score the pretraining tasks at the end.
  """
  run_steps = min(stop_after or steps, steps)
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  started = time.time()

  # 1. vocabulary
  model_bytes = toy_data.train_sentencepiece(toy_data.vocabulary_text(seed=seed))
  sp = spm.SentencePieceProcessor(model_proto=model_bytes)
  model = build_model()
  if sp.get_piece_size() + suite.EXTRA_IDS > model.config.vocab_size:
    raise ConfigError(f"the vocabulary has {sp.get_piece_size()} pieces; with "
                      f"{suite.EXTRA_IDS} sentinels it must fit {model.config.vocab_size} rows")
  print(f"vocabulary: {sp.get_piece_size()} pieces + {suite.EXTRA_IDS} sentinels", flush=True)

  # 2. model and optimizer
  batches = toy_data.pretraining_batches(sp, seed=seed, batch_size=batch_size,
                                         input_length=INPUT_LENGTH, target_length=TARGET_LENGTH)
  dummy = models.EncoderDecoderModel.dummy_batch(INPUT_LENGTH, TARGET_LENGTH)
  params = jax.jit(lambda r: models.unbox(model.init_backbone(r, dummy)))(jax.random.PRNGKey(seed))
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  print(f"model {embedded.CONFIG_NAME}: {num_params:,} parameters", flush=True)
  tx = make_optimizer(steps)
  opt_state = tx.init(params)

  @jax.jit
  def step_fn(params, opt_state, batch):
    (loss, _), grads = jax.value_and_grad(
        lambda p: model.loss_fn(p, batch, None, enable_dropout=False), has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  # 3. loop
  losses = []
  for step in range(1, run_steps + 1):
    batch = {k: jnp.asarray(v) for k, v in next(batches).items()}
    params, opt_state, loss = step_fn(params, opt_state, batch)
    losses.append(float(loss))
    if step % log_period == 0 or step == run_steps:
      print(f"step {step}/{run_steps}: loss {np.mean(losses[-log_period:]):.4f} "
            f"({time.time() - started:.0f}s)", flush=True)
  train_seconds = time.time() - started

  # 4. write
  ckpt = t5.save_checkpoint(params, str(out / "checkpoint"), step=run_steps, overwrite=True)
  (out / "spm.model").write_bytes(model_bytes)
  (out / f"{embedded.CONFIG_NAME}.gin").write_text(GIN_TEXT)
  log = {"command": "python -m spot_jax.embedded.pretrain " + " ".join(sys.argv[1:]), "seed": seed,
         "steps": run_steps, "schedule_steps": steps, "batch_size": batch_size,
         "input_length": INPUT_LENGTH, "target_length": TARGET_LENGTH,
         "peak_learning_rate": PEAK_LEARNING_RATE, "num_parameters": num_params,
         "vocabulary_pieces": sp.get_piece_size(), "seconds": round(train_seconds, 1),
         "jax_version": jax.__version__, "loss": losses}
  (out / "losses.json").write_text(json.dumps(log))
  scores = None
  if evaluate:
    scores = evaluate_prefixed(model, params, sp)
    (out / "eval.json").write_text(json.dumps(scores, indent=1, sort_keys=True))
    print("validation accuracy with task prefixes: " +
          ", ".join(f"{k} {v:.1f}" for k, v in sorted(scores.items())), flush=True)
  (out / "README.md").write_text(readme(log, scores))
  print(f"wrote {ckpt} ({time.time() - started:.0f}s in all)", flush=True)
  return log


def readme(log: dict, scores: Optional[dict]) -> str:
  """The folder's README: how it was made, the loss curve and what the backbone can do."""
  losses = log["loss"]
  marks = sorted({1, 10, 50, 100, 200, 500, 1000, 1500,
                  len(losses)} & set(range(1, len(losses) + 1)))
  curve = "\n".join(f"| {m} | {np.mean(losses[max(0, m - 50):m]):.4f} |" for m in marks)
  lines = [
      "# The embedded toy T5 (`t5_1_1_toy`)", "",
      "A T5.1.1-style encoder-decoder (gated-GELU MLP, untied output layer, relative position "
      f"buckets) of {log['num_parameters']:,} parameters, made on a CPU from nothing by",
      "", f"    {log['command'].strip()}", "",
      f"seed {log['seed']}, {log['steps']} steps (schedule "
      f"{log.get('schedule_steps', log['steps'])} steps) of batch {log['batch_size']}, inputs "
      f"{log['input_length']} / targets {log['target_length']} tokens, AdamW (peak learning rate "
      f"{log['peak_learning_rate']}, {WARMUP_STEPS} warm-up steps, cosine decay to 10%, weight "
      f"decay 0.01, clipping 1.0), float32, no dropout, jax {log['jax_version']}; "
      f"{log['seconds']:.0f} s of training on this machine (2 shared CPU cores).", "",
      "Files: `checkpoint/` (T5X format: `spot_jax.backbones.t5.load_checkpoint(path, "
      "config_by_name('t5_1_1_toy'))`), `spm.model` (the SentencePiece vocabulary, "
      f"{log['vocabulary_pieces']} pieces + {suite.EXTRA_IDS} sentinels in a 384-row table; pad 0, "
      "EOS 1, unk 2), `t5_1_1_toy.gin` (the gin model file, also `gin/models/`), `losses.json` "
      "(every step's training loss; the same seed gives the same curve), `eval.json`.", "",
      "Data: each batch is half T5 span corruption (15% noise, mean span 3) of the suite's "
      "unlabelled corpus (tasks/embedded.py `corpus_sentence`, all four domains) and half "
      "examples of the source tasks " + ", ".join(suite.PRETRAIN_SOURCES) + " with their "
      "task-name prefixes. No target task and not sentiment_food is ever trained on.", "",
      "Loss (mean of the 50 steps up to the step):", "", "| step | loss |",
      "| --- | --- |", curve, ""]
  if scores:
    lines += ["Greedy validation accuracy (%) of the backbone alone, inputs with their task-name "
              "prefixes (targets and sentiment_food were never trained; the prompt methods use "
              "the taskless inputs):", "", "| task | accuracy |", "| --- | --- |"]
    lines += [f"| {k}{' (pretrained)' if k in suite.PRETRAIN_SOURCES else ''} | {v:.1f} |"
              for k, v in sorted(scores.items())]
  return "\n".join(lines) + "\n"


def evaluate_prefixed(model: models.EncoderDecoderModel, params, sp: spm.SentencePieceProcessor,
                      split: str = "validation") -> dict[str, float]:
  """Greedy exact-match accuracy (percent) of the backbone on every task, with task prefixes, on
  the first EVAL_EXAMPLES examples of `split`."""
  predict = jax.jit(lambda p, x: model.predict_batch(p, x, TARGET_LENGTH))
  scores = {}
  for key in sorted(suite.TASKS):
    inputs, targets = (x[:EVAL_EXAMPLES] for x in suite.examples(key, split))
    batch = toy_data.to_batch([sp.encode(x) for x in inputs], [[]] * len(inputs), INPUT_LENGTH, 2)
    tokens = np.asarray(predict(params, batch["encoder_input_tokens"]))
    decoded = [sp.decode([int(t) for t in row if t > 1 and t < sp.get_piece_size()])
               for row in tokens]
    scores[key] = 100.0 * float(np.mean([d.strip() == y for d, y in zip(decoded, targets)]))
  return scores


def main(argv: Sequence[str]) -> Optional[int]:
  parser = cli.ArgumentParser(prog="spot_jax.embedded.pretrain",
                              description=__doc__.splitlines()[0])
  flags.add_output_dir(parser, "where to write the model (default: the package's embedded folder)",
                       default=embedded.TOY_DIR)
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
  sys.exit(cli.run(main, sys.argv[1:], "spot_jax.embedded.pretrain"))

"""A compact prompt-only training loop for the prompt-method tests (not the real trainer).

The split is structural: `frozen` holds the backbone's parameters and is never donated nor
differentiated; the training state holds only the `prompt` subtree, its optimizer state, the
step and an rng. The synthetic task maps an input to the target [first input token, EOS].
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from spot_jax.backbones.t5 import Transformer, config_by_name
from spot_jax.backbones.t5.config import T5Config

EOS = 1
# Backbone dropout off: it is not under test here and its RNG ops triple compile time.
TEST_CONFIG: T5Config = config_by_name("t5_1_1_test").replace(dropout_rate=0.0)


def synthetic_batch(seed: int, batch: int = 8, length: int = 8,
                    vocab: int = TEST_CONFIG.vocab_size) -> dict[str, np.ndarray]:
  """Right-padded inputs of random length ending in EOS; target = [first input token, EOS]."""
  rs = np.random.RandomState(seed)
  inputs = np.zeros((batch, length), np.int32)
  for b in range(batch):
    n = rs.randint(2, length + 1)  # real tokens, EOS included
    inputs[b, :n - 1] = rs.randint(3, vocab, n - 1)
    inputs[b, n - 1] = EOS
  targets = np.stack([inputs[:, 0], np.full(batch, EOS, np.int32)], axis=1)
  decoder_inputs = np.concatenate([np.zeros((batch, 1), np.int32), targets[:, :-1]], axis=1)
  return {"encoder_input_tokens": inputs, "decoder_input_tokens": decoder_inputs,
          "decoder_target_tokens": targets}


@functools.lru_cache(maxsize=None)
def frozen_backbone(config: T5Config = TEST_CONFIG, seed: int = 0) -> dict[str, Any]:
  """Randomly initialised backbone parameters (no prompt), as plain arrays.

  Shapes come from `jax.eval_shape` of the real init; values are drawn with NumPy (Flax's
  jitted init spends many seconds compiling RNG ops on CPU): fan-in scaled normal kernels,
  unit-normal embeddings, unit layer-norm scales. Cached: callers must copy before mutating,
  and call it outside jit/eval_shape.
  """
  batch = synthetic_batch(0, batch=2)
  shapes = jax.eval_shape(lambda: Transformer(config).init(
      jax.random.PRNGKey(0), batch["encoder_input_tokens"], batch["decoder_input_tokens"],
      enable_dropout=False))["params"]
  rs = np.random.RandomState(seed)

  def fill(path, leaf):
    name = path[-1].key
    if name == "scale":
      return np.ones(leaf.shape, np.float32)
    std = 1.0 if name == "embedding" else 0.5 if name == "rel_embedding" else leaf.shape[0] ** -0.5
    return rs.normal(0.0, std, leaf.shape).astype(np.float32)

  return jax.device_put(jax.tree_util.tree_map_with_path(fill, nn.meta.unbox(shapes)))


def create_prompt_params(model: Transformer, frozen: dict[str, Any], seed: int = 1,
                         full_model: bool = False) -> dict[str, Any]:
  """The trainer's recipe: apply with the frozen params and a mutable "params" collection,
  so initialisers see the real table; keep only the new `prompt` subtree (unboxed).

  Args:
    full_model: run the whole model (the trainer's call) rather than only the embedding
      step (`Transformer.embed_encoder_input`), which creates the same parameters and
      compiles faster.
  """
  batch = synthetic_batch(0, batch=2)

  @jax.jit
  def create(frozen, rng):
    rngs = {"params": rng, "dropout": rng}
    if full_model:
      return model.apply({"params": frozen}, batch["encoder_input_tokens"],
                         batch["decoder_input_tokens"], rngs=rngs, mutable=["params"])[1]
    return model.apply({"params": frozen}, batch["encoder_input_tokens"],
                       method=Transformer.embed_encoder_input, rngs=rngs, mutable=["params"])[1]

  variables = create(frozen, jax.random.PRNGKey(seed))
  new = set(variables["params"]) - set(frozen)
  assert new == {"prompt"}, f"apply created {sorted(new)}, expected only the prompt subtree"
  return nn.meta.unbox(variables["params"]["prompt"])


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean token cross-entropy over non-padding targets."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  weights = (targets > 0).astype(jnp.float32)
  return jnp.sum(nll * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def _forward(model: Transformer, frozen: dict[str, Any], prompt: Any, batch: dict[str, Any],
             *, train: bool, rng: jax.Array) -> tuple[jax.Array, dict[str, Any]]:
  logits, aux = model.apply(
      {"params": {**frozen, "prompt": prompt}}, batch["encoder_input_tokens"],
      batch["decoder_input_tokens"], batch["decoder_target_tokens"], enable_dropout=train,
      rngs={"dropout": rng}, mutable=["intermediates", "aux_loss"])
  return logits, aux


def make_train_step(model: Transformer, optimizer: optax.GradientTransformation
                    ) -> tuple[Callable, Callable[[], int]]:
  """(jitted `step(state, frozen, batch) -> (state, metrics)`, a counter of its traces)."""
  traces = []

  def step(state, frozen, batch):
    traces.append(None)  # runs once per trace, never per call
    rng = jax.random.fold_in(state["rng"], state["step"])

    def loss_fn(prompt):
      logits, aux = _forward(model, frozen, prompt, batch, train=True, rng=rng)
      ce = cross_entropy(logits, batch["decoder_target_tokens"])
      aux_loss = sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(aux.get("aux_loss", {})))
      return ce + aux_loss, (ce, aux.get("intermediates", {}))

    (loss, (ce, inter)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["prompt"])
    updates, opt_state = optimizer.update(grads, state["opt_state"], state["prompt"])
    new_state = {"step": state["step"] + 1, "prompt": optax.apply_updates(state["prompt"], updates),
                 "opt_state": opt_state, "rng": state["rng"]}
    return new_state, {"loss": loss, "ce": ce, "intermediates": inter}

  return jax.jit(step, donate_argnums=(0,)), lambda: len(traces)


def init_state(prompt: Any, optimizer: optax.GradientTransformation, seed: int = 2) -> dict:
  """Training state: step, prompt params, optimizer state (of the prompt only), rng."""
  prompt = jax.tree_util.tree_map(jnp.array, prompt)  # own copies: the state is donated
  return {"step": jnp.zeros((), jnp.int32), "prompt": prompt,
          "opt_state": optimizer.init(prompt), "rng": jax.random.PRNGKey(seed)}


def make_eval_loss(model: Transformer) -> Callable[[Any, Any, dict[str, Any]], jax.Array]:
  """Jitted deterministic cross-entropy `(frozen, prompt, batch) -> loss` (no dropout, no
  perturbation)."""

  def loss(frozen, prompt, batch):
    logits, _ = _forward(model, frozen, prompt, batch, train=False, rng=jax.random.PRNGKey(0))
    return cross_entropy(logits, batch["decoder_target_tokens"])

  return jax.jit(loss)


def model_adam_steps(model: Any, frozen: dict[str, Any], prompt: Any, batch: dict[str, Any],
                     steps: int, learning_rate: float = 0.05):
  """Adam on `prompt` through `model.loss_fn` (an EncoderDecoderModel: its own loss, metrics and
  extra features such as task_index), dropout off, one batch; yields (prompt, loss, metrics,
  gradients) after each of `steps` steps."""
  tx = optax.adam(learning_rate)

  @jax.jit
  def step(p, opt):
    (loss, metrics), g = jax.value_and_grad(
        lambda q: model.loss_fn({**frozen, "prompt": q}, batch, None, enable_dropout=False),
        has_aux=True)(p)
    updates, opt = tx.update(g, opt, p)
    return optax.apply_updates(p, updates), opt, loss, metrics, g

  opt = tx.init(prompt)
  for _ in range(steps):
    prompt, opt, loss, metrics, grads = step(prompt, opt)
    yield prompt, loss, metrics, grads

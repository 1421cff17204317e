"""The prompted decoder-only model: a frozen `DecoderLM` (Llama, Gemma 2/3) plus its loss.

`DecoderOnlyModel` has the interface the trainer, the evaluator and the experiment runner use
on `EncoderDecoderModel`; only the batches differ. A task's inputs and targets are one
sequence, as in t5x's `DecoderFeatureConverter` with inputs (unpacked, fully causal: the frozen
model was pretrained causal). Features, int32 [B, L] with L = input length + target length:

  decoder_target_tokens   inputs ++ targets, each with its EOS, right-padded with 0
  decoder_input_tokens    decoder_target_tokens shifted right by one, 0 first; the model puts
                          the backbone's BOS there, so the model reads [BOS, inputs, targets[:-1]]
  decoder_loss_weights    1 on the targets' tokens (EOS included), 0 on inputs and padding
  decoder_target_valid    1 where decoder_target_tokens holds a token, 0 on padding (made before
                          padding, so every id, 0 included, is a token; the pad id is never read)

A position is real where decoder_target_valid is 1 (without the feature: where its target token
is > 0, the convention of vocabularies that reserve id 0 for padding). An input-hook
prompt goes where its placement puts it in the embedded sequence ("prefix": before BOS, as
PEFT's prompt tuning does; "after_bos"); the logits of prompt positions predict nothing and are
dropped before the loss, so the loss counts target tokens only. How many positions a prompt
adds is read from the logits' length, so methods whose added length is not `length` (SMoP's
routed prompt, DePT's shorter one) need no special case. A deep prompt (prefix tuning,
P-tuning v2) adds key/value prefixes in every layer and no positions.

Inference takes the inputs alone, [B, T] right-padded (what seqio's encoder-decoder converter
gives the evaluator as encoder_input_tokens), with their validity `input_valid` [B, T] (the
feature encoder_input_valid; None: tokens > 0); label and target rows likewise take
`label_valid` / decoder_target_valid: `predict_batch` generates after [BOS, inputs];
`score_batch` builds the sequence above on the device; `classify_batch` runs [BOS, inputs] once
into a key/value cache and scores each class label's tokens against it.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Optional, Union

import jax
import jax.numpy as jnp

from spot_jax import losses
from spot_jax.backbones import memory
from spot_jax.backbones.decoder import decoding
from spot_jax.backbones.decoder.network import DecoderLM, is_deep_prompt
from spot_jax.models.common import PROMPT_KEY, Params, loss_and_metrics

Array = jax.Array

INPUT_HOOK_PLACEMENTS = ("prefix", "after_bos")  # "suffix" would follow the targets


def validity(tokens: Array, valid: Optional[Array]) -> Array:
  """[B, T] bool: `valid` when given, else tokens > 0 (vocabularies that reserve 0 for padding)."""
  return jnp.asarray(tokens) > 0 if valid is None else jnp.asarray(valid).astype(bool)


def concatenate(inputs: Array, targets: Array, input_valid: Optional[Array] = None,
                target_valid: Optional[Array] = None) -> tuple[Array, Array]:
  """Right-padded inputs [B, T] and targets [B, S] (validity [B, T] / [B, S] bool; None:
  tokens > 0) -> (inputs ++ targets [B, T + S] right-padded, loss weights [B, T + S] int32, 1 on
  the targets' tokens); the pipeline's layout, on device. A position is valid where its loss
  weight is 1 or it holds an input token (`sequence_valid`)."""
  batch, length = inputs.shape
  input_valid, target_valid = validity(inputs, input_valid), validity(targets, target_valid)
  real = jnp.sum(jnp.cumsum(input_valid[:, ::-1], axis=1) > 0, axis=1)  # one past the last
  width = length + targets.shape[1]
  where = real[:, None] + jnp.arange(targets.shape[1])[None]
  rows = jnp.arange(batch)[:, None]
  tokens = jnp.zeros((batch, width), jnp.int32).at[:, :length].set(inputs)
  tokens = tokens.at[rows, where].set(targets.astype(jnp.int32))
  weights = jnp.zeros((batch, width), jnp.int32).at[rows, where].set(
      target_valid.astype(jnp.int32))
  return tokens, weights


def sequence_valid(inputs: Array, weights: Array, input_valid: Optional[Array] = None) -> Array:
  """[B, T + S] int32, 1 at the real positions of `concatenate`'s sequence."""
  input_valid = validity(inputs, input_valid)
  width = weights.shape[1]
  real = jnp.sum(input_valid, axis=1)[:, None]  # right-padded inputs: their count
  return ((jnp.arange(width)[None] < real) | (weights > 0)).astype(jnp.int32)


def input_positions(weights: Optional[Array]) -> Optional[Array]:
  """[B, L] loss weights -> [B, L] bool, the model input positions that hold BOS or an input
  token (input position t holds sequence token t - 1): what the prompt module reads, as it reads
  [BOS, inputs] before decoding. None: no weights, every position."""
  if weights is None:
    return None
  weights = jnp.asarray(weights)
  first = jnp.ones((weights.shape[0], 1), bool)
  return jnp.concatenate([first, weights[:, :-1] <= 0], axis=1)


def shift_right(tokens: Array, bos_id: int) -> Array:
  """[B, L] -> [BOS, tokens[:, :-1]] (the model's input for teacher forcing)."""
  bos = jnp.full((tokens.shape[0], 1), bos_id, jnp.int32)
  return jnp.concatenate([bos, tokens[:, :-1].astype(jnp.int32)], axis=1)


@dataclasses.dataclass(frozen=True)
class DecoderOnlyModel:
  """Loss, initialisation and inference around a frozen decoder-only `DecoderLM`.

  Attributes:
    module: the Flax network; `module.prompt` is the prompt method or None.
    z_loss: coefficient of t5x's z-loss.
    label_smoothing: label smoothing of the cross-entropy.
    loss_normalizing_factor: see `losses.cross_entropy_with_z_loss`.
    temperature: 0 for greedy decoding in `predict_batch`, else sampling at this temperature.
    top_k: sample among the k likeliest tokens (None: all).
    eos_id: end-of-sequence id of the task's vocabulary, where generation stops (None: the
      backbone config's `eos_id`, right when the task reads the model's own tokenizer).
    bos_id: the id put before the inputs (None: the backbone config's `bos_id`).
    loss_positions: the most positions of a row the loss counts (the task's target length;
      the trainer sets it, `for_batches`): the training loss runs the output layer on those
      positions only, which over a 128k-262k vocabulary is most of a step. None: every
      position (a batch with more weighted positions in a row would lose the extra ones).
  """
  module: DecoderLM
  z_loss: float = 1e-4
  label_smoothing: float = 0.0
  loss_normalizing_factor: Union[None, str, float] = losses.NUM_REAL_TARGET_TOKENS
  temperature: float = 0.0
  top_k: Optional[int] = None
  eos_id: Optional[int] = None
  bos_id: Optional[int] = None
  loss_positions: Optional[int] = None

  kind = "decoder"  # the backbone kind (`spot_jax.backbones.kinds`)
  feature_layout = "decoder_only"  # the batches it reads (`spot_jax.data.FEATURE_LAYOUTS`)

  @property
  def config(self):
    return self.module.config

  def with_config(self, config: Any) -> "DecoderOnlyModel":
    """This model around the same network of another `DecoderConfig` (e.g. its frozen dtype
    or remat policy resolved)."""
    return dataclasses.replace(self, module=self.module.clone(config=config))

  def for_batches(self, task_feature_lengths: Mapping[str, int]) -> "DecoderOnlyModel":
    """This model for training batches of these feature lengths: the loss reads at most the
    targets' length of positions per row (`loss_positions`)."""
    return dataclasses.replace(self, loss_positions=int(task_feature_lengths["targets"]))

  @property
  def bos(self) -> int:
    return int(self.config.bos_id if self.bos_id is None else self.bos_id)

  @property
  def eos(self) -> int:
    return int(self.config.eos_id if self.eos_id is None else self.eos_id)

  @property
  def has_prompt(self) -> bool:
    return self.module.prompt is not None

  @property
  def prompt_length(self) -> int:
    """Positions the prompt adds to the sequence (0 without a prompt or for deep prompts)."""
    if self.module.prompt is None or is_deep_prompt(self.module.prompt):
      return 0
    return int(getattr(self.module.prompt, "length"))

  # --- parameters -------------------------------------------------------------------------

  @staticmethod
  def dummy_batch(input_length: int, target_length: int, batch_size: int = 1) -> dict[str, Array]:
    """An all-ones batch of length input_length + target_length (for shapes and initialisation)."""
    ones = jnp.ones((batch_size, input_length + target_length), jnp.int32)
    return {"decoder_input_tokens": ones, "decoder_target_tokens": ones,
            "decoder_loss_weights": ones}

  def backbone_module(self) -> DecoderLM:
    """The same network without the prompt (the frozen part's own tree)."""
    return self.module.clone(prompt=None)

  def init_backbone(self, rng: Array, batch: Mapping[str, Array]) -> Params:
    """Randomly initialised backbone parameters (boxed with logical axes), in the config's
    `frozen_dtype`."""
    params = self.backbone_module().init({"params": rng}, batch["decoder_input_tokens"])["params"]
    return memory.cast(params, self.config.frozen_dtype)

  def init_prompt(self, rng: Array, frozen_params: Params, batch: Mapping[str, Array]) -> Params:
    """Prompt-side parameters `{"prompt": ...}` (boxed), initialised against the frozen weights
    (the initialisers see the loaded embedding table)."""
    if not self.has_prompt:
      return {}
    _, variables = self.module.apply(
        {"params": frozen_params}, batch["decoder_input_tokens"],
        rngs={"params": rng, "dropout": rng}, mutable=["params"])
    return {PROMPT_KEY: variables["params"][PROMPT_KEY]}

  # --- training ---------------------------------------------------------------------------

  def logits(self, params: Params, batch: Mapping[str, Array], *,
             dropout_rng: Optional[Array] = None, enable_dropout: bool = False,
             mutable: Any = False, keep: Optional[Array] = None) -> Any:
    """Teacher-forced logits [B, L, V] at the batch's own positions (prompt positions dropped),
    and the sown state when `mutable` names collections; with `keep` [B, K], at those positions
    only ([B, K, V]).

    The model reads decoder_input_tokens with BOS at position 0 (without them: the targets
    shifted right); a position is real where decoder_target_valid is 1 (without it: where its
    target token is > 0)."""
    targets = batch["decoder_target_tokens"]
    tokens = batch.get("decoder_input_tokens")
    tokens = (shift_right(targets, self.bos) if tokens is None
              else jnp.asarray(tokens, jnp.int32).at[:, 0].set(self.bos))
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    valid = validity(targets, batch.get("decoder_target_valid"))
    out = self.module.apply({"params": params}, tokens, valid=valid,
                            deterministic=not enable_dropout, task_index=batch.get("task_index"),
                            keep=keep, reads=input_positions(batch.get("decoder_loss_weights")),
                            rngs=rngs, mutable=mutable)
    logits, state = out if mutable else (out, {})
    if keep is None:
      logits = self.token_logits(logits, tokens.shape[1])
    return (logits, state) if mutable else logits

  def token_logits(self, logits: Array, length: int) -> Array:
    """The logits [B, T', V] of a prompted sequence -> [B, T, V] at the tokens' own positions."""
    extra = logits.shape[1] - length
    if extra == 0:
      return logits
    placement = getattr(self.module.prompt, "placement", "prefix")
    if placement == "after_bos":
      return jnp.concatenate([logits[:, :1], logits[:, 1 + extra:]], axis=1)
    return logits[:, extra:]

  def loss_fn(self, params: Params, batch: Mapping[str, Array], dropout_rng: Optional[Array],
              enable_dropout: bool = True) -> tuple[Array, dict[str, Array]]:
    """Loss of a batch (target tokens only) and metrics (sums, prompt statistics, aux losses).

    With `loss_positions` K, each row's weighted positions (in order, then unweighted ones up to
    K) are the only ones the output layer sees; the loss and metrics are the same sums."""
    keep = self.loss_index(batch["decoder_loss_weights"])
    logits, state = self.logits(params, batch, dropout_rng=dropout_rng,
                                enable_dropout=enable_dropout,
                                mutable=["intermediates", "aux_loss"], keep=keep)
    if keep is not None:
      batch = {**batch, **{k: jnp.take_along_axis(jnp.asarray(batch[k]), keep, axis=1)
                           for k in ("decoder_target_tokens", "decoder_loss_weights")}}
    return self.task_loss(logits, batch, state)

  def loss_index(self, weights: Array) -> Optional[Array]:
    """[B, K] positions of each row's weighted tokens first (stable order), K =
    `loss_positions`; None when it is unset or not shorter than the rows."""
    k = self.loss_positions
    if k is None or k >= weights.shape[1]:
      return None
    unweighted = (jnp.asarray(weights) <= 0).astype(jnp.int32)
    return jnp.argsort(unweighted, axis=1, stable=True)[:, :k].astype(jnp.int32)

  def task_loss(self, logits: Array, batch: Mapping[str, Array], state: Mapping[str, Any]
                ) -> tuple[Array, dict[str, Array]]:
    """The loss of teacher-forced `logits` [B, L, V] and the sown `state` (see `loss_fn`)."""
    return loss_and_metrics(logits, batch["decoder_target_tokens"],
                            batch["decoder_loss_weights"], state, z_loss=self.z_loss,
                            label_smoothing=self.label_smoothing,
                            loss_normalizing_factor=self.loss_normalizing_factor)

  # --- inference --------------------------------------------------------------------------

  def predict_batch(self, params: Params, encoder_input_tokens: Array, max_decode_length: int,
                    rng: Optional[Array] = None, task_index: Optional[Array] = None,
                    input_valid: Optional[Array] = None) -> Array:
    """Generated token ids [B, max_decode_length] after [BOS, inputs] (0 after EOS)."""
    from spot_jax.backbones.decoder import decoding  # pylint: disable=g-import-not-at-top
    bos = jnp.full((encoder_input_tokens.shape[0], 1), self.bos, jnp.int32)
    tokens = jnp.concatenate([bos, encoder_input_tokens.astype(jnp.int32)], axis=1)
    valid = jnp.concatenate([jnp.ones_like(bos, bool),
                             validity(encoder_input_tokens, input_valid)], axis=1)
    return decoding.generate(self.module, params, tokens, valid, max_new_tokens=max_decode_length,
                             rng=rng, temperature=self.temperature, top_k=self.top_k,
                             eos_id=self.eos, task_index=task_index)

  def _scores(self, params: Params, inputs: Array, targets: Array,
              task_index: Optional[Array], input_valid: Optional[Array] = None,
              target_valid: Optional[Array] = None) -> Array:
    """Sum of the target tokens' log-probabilities per row, [B] (the output layer on the
    targets' positions only)."""
    tokens, weights = concatenate(inputs, targets, input_valid, target_valid)
    batch = {"decoder_target_tokens": tokens, "decoder_loss_weights": weights,
             "decoder_target_valid": sequence_valid(inputs, weights, input_valid),
             "task_index": task_index}
    keep = dataclasses.replace(self, loss_positions=targets.shape[1]).loss_index(weights)
    logits = self.logits(params, batch, keep=keep)
    if keep is not None:
      tokens, weights = (jnp.take_along_axis(a, keep, axis=1) for a in (tokens, weights))
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0]
    return jnp.sum(picked * weights, axis=1)

  def score_batch(self, params: Params, batch: Mapping[str, Array]) -> Array:
    """Sum of target-token log-probabilities per example, [B], of a batch of inputs and targets
    (encoder_input_tokens / decoder_target_tokens, as the evaluator reads them; with
    encoder_input_valid / decoder_target_valid when the vocabulary has a token at id 0)."""
    return self._scores(params, batch["encoder_input_tokens"], batch["decoder_target_tokens"],
                        batch.get("task_index"), batch.get("encoder_input_valid"),
                        batch.get("decoder_target_valid"))

  def classify_batch(self, params: Params, encoder_input_tokens: Array, labels: Array,
                     task_index: Optional[Array] = None, input_valid: Optional[Array] = None,
                     label_valid: Optional[Array] = None) -> Array:
    """Log-likelihoods [B, C] of label rows labels [C, S] (EOS included; validity label_valid
    [C, S], None: labels > 0) as the continuation of inputs [B, T] (validity input_valid).

    [BOS, inputs] and the prompt are run once, into a key/value cache; each label then reads
    that cache (C passes of S positions instead of C of T + S). Each row is rolled so that its
    last real position ends the prefix, and key indices and RoPE positions are the row's own,
    so sliding-window layers see the distances of `score_batch`'s one sequence.
    """
    module, variables, batch = self.module, {"params": params}, encoder_input_tokens.shape[0]
    bos = jnp.full((batch, 1), self.bos, jnp.int32)
    x, valid = module.apply(
        variables, jnp.concatenate([bos, encoder_input_tokens.astype(jnp.int32)], axis=1),
        valid=jnp.concatenate([jnp.ones_like(bos, bool),
                               validity(encoder_input_tokens, input_valid)], axis=1),
        task_index=task_index, method=DecoderLM.inputs)
    prefixes = module.apply(variables, method=DecoderLM.deep_prefixes)
    num = 0 if prefixes is None else prefixes[0][0].shape[1]
    length, width = valid.shape[1], labels.shape[1]
    real = jnp.sum(valid, axis=1, dtype=jnp.int32)  # right-padded: real positions come first
    shift = length - real
    source = (jnp.arange(length)[None] - shift[:, None]) % length
    x = jnp.take_along_axis(x, source[..., None], axis=1)
    valid = jnp.take_along_axis(valid, source, axis=1)
    slots = jnp.arange(num + length + width, dtype=jnp.int32)[None]
    k_index = jnp.where(slots < num, slots, slots - shift[:, None])
    k_valid = jnp.zeros(k_index.shape, bool).at[:, :num].set(True)
    k_valid = k_valid.at[:, num:num + length].set(valid)
    stack = functools.partial(module.apply, variables, method=DecoderLM.stack)
    last, cache = stack(
        x, positions=num + jnp.maximum(jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1, 0),
        q_index=k_index[:, num:num + length], k_index=k_index, k_valid=k_valid,
        past=self._empty_cache(prefixes, batch, k_index.shape[1]), write_index=jnp.int32(num),
        last_only=True)

    def one(row: tuple[Array, Array]) -> Array:
      label, real_label = row
      tokens = jnp.broadcast_to(label[None], (batch, width)).astype(jnp.int32)
      label_ok = jnp.broadcast_to(real_label[None], (batch, width))
      logits, _ = stack(
          module.apply(variables, tokens, method=DecoderLM.embed),
          positions=(num + real)[:, None] + jnp.arange(width, dtype=jnp.int32)[None],
          q_index=k_index[:, num + length:], k_index=k_index,
          k_valid=k_valid.at[:, num + length:].set(label_ok), past=cache,
          write_index=jnp.int32(num + length))
      # Label token j is predicted by the prefix's last position (j = 0) or label token j - 1.
      logits = jnp.concatenate([last, logits[:, :-1]], axis=1).astype(jnp.float32)
      picked = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[..., None],
                                   axis=-1)[..., 0]
      return jnp.sum(jnp.where(label_ok, picked, 0.0), axis=1)

    return jax.lax.map(one, (labels, validity(labels, label_valid))).T

  def _empty_cache(self, prefixes: Any, batch: int, size: int) -> tuple:
    """Per layer (key, value) [B, K, size, D] zeros, the deep prefixes written at the front."""
    return decoding.empty_cache(self.config, prefixes, batch, size)

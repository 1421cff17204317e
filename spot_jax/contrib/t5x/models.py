"""A t5x model over spot-jax's T5 backbone with a soft-prompt module.

`PromptEncoderDecoderModel` is t5x's `EncoderDecoderModel` (loss, metrics, evaluation and the
training loop unchanged) around `spot_jax.backbones.t5.Transformer(config, prompt=...)`, whose
parameter tree is a T5X checkpoint's plus a `prompt/` subtree. What differs from t5x's own model:

- initial variables: spot-jax creates parameters boxed with logical axis names; t5x wants raw
  arrays plus a `params_axes` collection (`<name>_axes`), which is built from those boxes;
- decoding: the encoder output is longer than the input by the prompt, so prediction uses
  spot-jax's generation (greedy, beam or sampling), which knows the prompted encoder mask;
- training: `loss_fn` stops the gradients at every parameter outside the top-level `prompt/`
  subtree (`freeze_backbone`, on by default). t5x's step still takes `jax.value_and_grad` of the
  whole tree, but the frozen weights' cotangents are symbolic zeros: JAX emits no backward
  matmul for them, whatever reads the gradients afterwards (t5x's `WeightMetricsComputer`, an
  optax gradient clip), and they come out as zeros that the prompt-only `MultiOptimizer`
  ignores. The optimizer must therefore update only `prompt/` (checked when t5x builds the
  initial variables).

Training batches must be unpacked (`pack = False`, as in gin/t5x/runs/prompt_tune.gin): a
soft prompt attaches to one example per row.
"""
from __future__ import annotations

from typing import Any, Mapping, MutableMapping, Optional

import flax.core
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util
from flax.linen import partitioning as flax_partitioning
from t5x import models as t5x_models

from spot_jax import models as spot_models
from spot_jax.contrib.t5x import optim
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import generation

DECODE_METHODS = ("greedy", "beam", "sample")


def params_and_axes(boxed: Mapping[str, Any]) -> tuple[dict, dict]:
  """Splits a tree of `nn.LogicallyPartitioned` params into raw arrays and t5x `params_axes`.

  Returns:
    (params, params_axes): params with the boxes removed, and for every parameter
    `a/b/kernel` an entry `a/b/kernel_axes` = `AxisMetadata(names=...)`.
  """
  flat = traverse_util.flatten_dict(flax.core.unfreeze(boxed))
  params, axes = {}, {}
  for path, leaf in flat.items():
    if not isinstance(leaf, nn.LogicallyPartitioned):
      raise ValueError(f"parameter {'/'.join(path)} has no logical axis names; every spot-jax "
                       f"parameter is created with nn.with_logical_partitioning")
    params[path] = leaf.value
    axes[path[:-1] + (path[-1] + "_axes",)] = flax_partitioning.AxisMetadata(
        names=tuple(leaf.names))
  return traverse_util.unflatten_dict(params), traverse_util.unflatten_dict(axes)


def stop_backbone_gradients(params: Mapping[str, Any]) -> dict:
  """`params` with `jax.lax.stop_gradient` on every top-level subtree except `prompt/`."""
  return {k: v if k == optim.PROMPT_PREFIX else jax.tree.map(jax.lax.stop_gradient, v)
          for k, v in params.items()}


class PromptEncoderDecoderModel(t5x_models.EncoderDecoderModel):
  """t5x's EncoderDecoderModel for `spot_jax.backbones.t5.Transformer` with a prompt module.

  Constructor arguments are t5x's (module, input_vocabulary, output_vocabulary,
  optimizer_def, z_loss, ...) plus:
    decode_method: "greedy", "beam" or "sample" for inference evaluation.
    num_beams: beams for "beam".
    beam_alpha: beam search length-penalty exponent.
    freeze_backbone: stop the gradients at every parameter outside `prompt/` in `loss_fn`
      (the optimizer must then update `prompt/` only, e.g. `optim.prompt_only`); False
      differentiates the whole tree, as t5x's own models do.
  """

  def __init__(self, module: nn.Module, *args, decode_method: str = "greedy", num_beams: int = 4,
               beam_alpha: float = 0.6, freeze_backbone: bool = True, **kwargs):
    if decode_method not in DECODE_METHODS:
      raise ValueError(f"decode_method={decode_method!r}; valid: {', '.join(DECODE_METHODS)}")
    self.decode_method = decode_method
    self.num_beams = num_beams
    self.beam_alpha = beam_alpha
    self.freeze_backbone = freeze_backbone
    super().__init__(module, *args, **kwargs)

  def loss_fn(self, params: Any, batch: Mapping[str, jnp.ndarray],
              dropout_rng: Optional[jax.Array]) -> tuple[jnp.ndarray, Any]:
    """t5x's loss and metrics; with `freeze_backbone` only `prompt/` carries gradients."""
    if self.freeze_backbone:
      params = stop_backbone_gradients(params)
    return super().loss_fn(params, batch, dropout_rng)

  def get_initial_variables(self, rng: jax.Array, input_shapes: Mapping[str, Any],
                            input_types: Optional[Mapping[str, Any]] = None
                            ) -> flax.core.FrozenDict:
    """{"params": raw arrays, "params_axes": logical names} for the shapes t5x gives."""
    for key in ("encoder_segment_ids", "decoder_segment_ids", "encoder_positions",
                "decoder_positions"):
      if key in input_shapes:
        raise ValueError(f"the batch has {key!r}: packed examples are not supported with soft "
                         f"prompts; set pack = False on the train/eval DatasetConfigs")
    batch = spot_models.EncoderDecoderModel.dummy_batch(
        input_shapes["encoder_input_tokens"][1], input_shapes["decoder_input_tokens"][1],
        batch_size=input_shapes["encoder_input_tokens"][0])
    if isinstance(rng, Mapping):
      rngs = dict(rng)
    else:
      rngs = {"params": rng, "dropout": rng}
    variables = self.module.init(rngs, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
                                 batch["decoder_target_tokens"], enable_dropout=False)
    params, axes = params_and_axes(variables["params"])
    if self.freeze_backbone and self.optimizer_def is not None:
      updated = optim.backbone_paths_updated(self.optimizer_def, params)
      if updated:
        raise ConfigError(
            f"the optimizer updates {len(updated)} backbone parameter(s) ({', '.join(updated[:3])}"
            f"{', ...' if len(updated) > 3 else ''}) whose gradients freeze_backbone stops; valid: "
            "an optimizer of prompt/ only (spot_t5x_optim.prompt_only, gin/t5x/models/common.gin) "
            "or PromptEncoderDecoderModel.freeze_backbone = False")
    return flax.core.freeze({"params": params, "params_axes": axes})

  def predict_batch_with_aux(self, params: Any, batch: Mapping[str, jnp.ndarray],
                             rng: Optional[jax.Array] = None,
                             decoder_params: Optional[MutableMapping[str, Any]] = None,
                             return_all_decodes: bool = False, num_decodes: Optional[int] = None,
                             prompt_with_targets: bool = False) -> tuple[jnp.ndarray, dict]:
    """Decodes [B, S] tokens (S = the batch's target length) with spot-jax's generation."""
    del decoder_params, num_decodes
    if prompt_with_targets:
      raise ValueError("prompt_with_targets is not supported by PromptEncoderDecoderModel")
    # T5's EOS when no vocabulary is set
    eos_id = getattr(self.output_vocabulary, "eos_id", None) or 1
    tokens, scores = generation.generate(
        self.module, params, batch["encoder_input_tokens"],
        max_decode_length=batch["decoder_input_tokens"].shape[1], method=self.decode_method,
        num_beams=self.num_beams, alpha=self.beam_alpha, rng=rng, eos_id=eos_id,
        return_all_beams=bool(return_all_decodes) and self.decode_method == "beam")
    if return_all_decodes and self.decode_method != "beam":
      tokens, scores = tokens[:, None], scores[:, None]  # t5x's [B, num_decodes, L] layout
    return tokens, {"scores": scores}

"""The prompted models: a frozen backbone of either kind, a prompt method, and their loss.

  encoder_decoder  `EncoderDecoderModel`: a prompted T5 (`spot_jax.backbones.t5`)
  decoder_only     `DecoderOnlyModel`: a prompted Llama / Gemma (`spot_jax.backbones.decoder`);
                   its batches are inputs and targets as one sequence
  common           the trainable/frozen split (`PROMPT_KEY`, `merge_params`, `unbox`) and the
                   loss of a batch, shared by both

Both models hold no parameters and have one interface: `dummy_batch`, `backbone_module`,
`init_backbone`, `init_prompt`, `for_batches` (the model for the trainer's lengths), `loss_fn`,
`task_loss`, `predict_batch`, `score_batch`, `classify_batch`, `has_prompt`, `prompt_length`,
`config`, plus `kind` (the backbone kind) and `feature_layout` (the batches the data pipeline
makes for it); `Model` is either. t5x keeps its two models side by side the same way.
"""
from typing import Union

from spot_jax.models.common import PROMPT_KEY, Params, loss_and_metrics, merge_params, unbox
from spot_jax.models.decoder_only import DecoderOnlyModel
from spot_jax.models.encoder_decoder import EncoderDecoderModel

Model = Union[EncoderDecoderModel, DecoderOnlyModel]  # what the trainer and evaluator accept

__all__ = ["PROMPT_KEY", "DecoderOnlyModel", "EncoderDecoderModel", "Model", "Params",
           "loss_and_metrics", "merge_params", "unbox"]

"""What the decoder-only PEFT tests share: tiny random Hugging Face causal LMs built in memory
(no downloads) and a right-padded batch."""
from __future__ import annotations

import numpy as np

VOCAB = 64
PAD = 0
FAMILIES = ("llama", "gemma3")


def hf_config(family: str):
  """A tiny transformers config: 2 layers, 4 query heads over 2 key/value heads (grouped-query
  attention), head size 6 != width / heads, so no size can stand in for another; Gemma 3's
  sliding layer has a window of 4, shorter than prompt + batch, so it slides."""
  import transformers  # pylint: disable=g-import-not-at-top
  sizes = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=6,
               max_position_embeddings=64, pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
  if family == "llama":
    return transformers.LlamaConfig(**sizes, tie_word_embeddings=False)
  if family == "gemma3":
    return transformers.Gemma3TextConfig(
        **sizes, query_pre_attn_scalar=6, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"])
  raise ValueError(family)


def hf_model(family: str, seed: int = 0, scale: float = 0.3):
  """A random tiny causal LM in eval mode; weights ~ N(0, scale^2) (not the 0.02 of the default
  init, whose near-uniform logits would make every comparison pass)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  cls = {"llama": transformers.LlamaForCausalLM,
         "gemma3": transformers.Gemma3ForCausalLM}[family]
  model = cls(hf_config(family)).eval()
  with torch.no_grad():
    for param in model.parameters():
      param.normal_(0.0, scale)
  return model


def right_padded(rows: int = 3, length: int = 7, seed: int = 3):
  """(tokens, labels) int64 [rows, length]: row 1 padded from 5, row 2 from 3 (PAD); labels are
  the tokens with -100 on the padding and on each row's first two tokens (an input part)."""
  rng = np.random.RandomState(seed)
  tokens = rng.randint(3, VOCAB, size=(rows, length))
  tokens[1, 5:] = PAD
  tokens[2, 3:] = PAD
  labels = np.where(tokens == PAD, -100, tokens)
  labels[:, :2] = -100
  return tokens, labels


def target_log_probs(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """log p(labels[:, t] | ..< t) [B, T] from next-token logits [B, T, V] over the same T
  positions (0 where the label is -100 or t = 0)."""
  logits = logits[:, :-1].astype(np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  target = labels[:, 1:]
  picked = np.take_along_axis(logp, np.maximum(target, 0)[..., None], -1)[..., 0]
  picked = np.where(target >= 0, picked, 0.0)
  return np.concatenate([np.zeros((labels.shape[0], 1)), picked], axis=1)

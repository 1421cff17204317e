"""A Llama-3-style tokenizer whose "!" is id 0, a tiny random transformers Llama over it, and
transformers' log-probabilities and greedy tokens to compare with (float32; nothing downloaded).

`write_tokenizer(folder)` writes a byte-level BPE `tokenizer.json` ("!" = 0 as in Llama 3 and
Qwen, a few merges, BOS and EOS last, no pad token); `tiny_llama(tokenizer)` gives (torch model,
DecoderConfig, spot-jax params); `write_checkpoint` saves the model beside the tokenizer (a
Hugging Face model directory) with a gin model file of its config, what `infer` and `serve`
read.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Optional, Sequence

import numpy as np

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def write_tokenizer(folder: pathlib.Path) -> pathlib.Path:
  """The tokenizer directory (tokenizer.json, tokenizer_config.json) in `folder`."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: (c != "!", ord(c)))
  vocab = {c: i for i, c in enumerate(alphabet)}
  merges = [("!", "!"), ("w", "o"), ("n", "o")]
  for a, b in merges:
    vocab[a + b] = len(vocab)
  vocab[BOS], vocab[EOS] = len(vocab), len(vocab) + 1
  tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([BOS, EOS])
  folder.mkdir(parents=True, exist_ok=True)
  tok.save(str(folder / "tokenizer.json"))
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {"bos_token": BOS, "eos_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast"}))
  assert vocab["!"] == 0 and tok.encode("a!").ids == [vocab["a"], 0]
  return folder


def tiny_llama(hf_tokenizer, likely_bang: bool = False):
  """(torch model, DecoderConfig, spot-jax params) of a tiny random Llama over the tokenizer;
  `likely_bang` raises the output weights of "!" (id 0), so greedy answers hold it too."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.decoder import hf as decoder_hf  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=len(hf_tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=6, max_position_embeddings=64,
      bos_token_id=hf_tokenizer.bos_token_id, eos_token_id=hf_tokenizer.eos_token_id,
      tie_word_embeddings=False)
  model = transformers.LlamaForCausalLM(config).eval()
  with torch.no_grad():
    for param in model.parameters():
      param.normal_(0.0, 0.3)
    if likely_bang:
      head = model.lm_head.weight
      head[0] = 2 * (head[0] + head.mean(0))
  cfg = decoder_hf.config_from_hf(config.to_dict())
  state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  return model, cfg, decoder_hf.params_from_hf(state, cfg)


def write_checkpoint(folder: pathlib.Path, model, cfg) -> pathlib.Path:
  """Saves `model` into the tokenizer directory `folder` (save_pretrained) and writes
  folder/model.gin, a gin model file of `cfg` for --model; returns the gin file."""
  model.save_pretrained(str(folder), safe_serialization=True)
  lines = ["from __gin__ import dynamic_registration", "from spot_jax import models",
           "from spot_jax.backbones import decoder", "MODEL = @models.DecoderOnlyModel()",
           "models.DecoderOnlyModel.module = @decoder.DecoderLM()",
           "decoder.DecoderLM.config = @decoder.DecoderConfig()"]
  lines += [f"decoder.DecoderConfig.{f.name} = {getattr(cfg, f.name)!r}"
            for f in dataclasses.fields(cfg)]
  path = folder / "model.gin"
  path.write_text("\n".join(lines) + "\n")
  return path


def _embeds(model, ids: Sequence[int], prompt: Optional[np.ndarray]):
  import torch  # pylint: disable=g-import-not-at-top
  embeds = model.get_input_embeddings()(torch.tensor([list(ids)]))
  if prompt is not None:
    embeds = torch.cat([torch.tensor(prompt)[None], embeds], dim=1)
  return embeds


def row_log_probs(model, ids: Sequence[int], n_inputs: int,
                  prompt: Optional[np.ndarray] = None) -> np.ndarray:
  """transformers' log p of ids[n_inputs:] given [soft prompt,] ids[:n_inputs], [n - n_inputs]."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    logits = model(inputs_embeds=_embeds(model, ids, prompt)).logits[0].double()
  logits = logits[(0 if prompt is None else len(prompt)):]
  logp = torch.log_softmax(logits, -1).numpy()
  return np.array([logp[t - 1, ids[t]] for t in range(n_inputs, len(ids))])


def greedy(model, ids: Sequence[int], steps: int, eos_id: int,
           prompt: Optional[np.ndarray] = None) -> tuple[list[int], list[float]]:
  """transformers' greedy continuation of [soft prompt,] ids: (tokens up to and including the
  first EOS, at most `steps`; each token's log-probability)."""
  import torch  # pylint: disable=g-import-not-at-top
  ids, out, logps = list(ids), [], []
  with torch.no_grad():
    for _ in range(steps):
      logits = model(inputs_embeds=_embeds(model, ids, prompt)).logits[0, -1].double()
      token = int(logits.argmax())
      ids.append(token)
      out.append(token)
      logps.append(float(torch.log_softmax(logits, -1)[token]))
      if token == eos_id:
        break
  return out, logps

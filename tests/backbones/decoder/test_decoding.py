"""KV-cache generation (`decoding.generate`) against the uncached forward, token for token.

Tiny random Llama (llama3 rope) and Gemma 3 (window 4, so 16 steps slide well past it) models;
rows of different lengths, right- or left-padded; with no prompt, a soft prompt (input hook) or
deep prefixes. The reference runs the full network over each row alone, growing it by its
argmax. One Gemma 3 case is checked against transformers' own model fed `inputs_embeds` (the
soft prompt unscaled, the tokens through its scaled embedding). Sampling is reproducible and
keeps to top_k; the program compiles once per input shape.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from flax.core import meta

from spot_jax.backbones.decoder import CONFIGS, DecoderLM, decoding, hf
from spot_jax.errors import ConfigError
from tests.helpers import hlo as hlo_lib

STEPS, PROMPT, EOS = 16, 3, 1
LENGTHS = (9, 5, 2)


class _TestPrompt(nn.Module):
  """The input hook at its simplest: a [L, E] parameter before the embedded tokens."""
  length: int

  @nn.compact
  def __call__(self, embedded, tokens, *, embedding, deterministic, valid=None):
    del embedding, deterministic
    prompt = self.param("prompt", nn.initializers.normal(1.0), (self.length, embedded.shape[-1]))
    batch = embedded.shape[0]
    x = jnp.concatenate([jnp.broadcast_to(prompt, (batch,) + prompt.shape), embedded], axis=1)
    valid = tokens > 0 if valid is None else valid
    return x, jnp.concatenate([jnp.ones((batch, self.length), bool), valid], axis=1)


def _random_params(config, prompt=None, seed=0):
  """Parameters whose greedy continuations vary from step to step: a small embedding
  N(0, 0.02^2) (a large one makes a tied model repeat its input), matrices N(0, 0.5^2),
  vectors N(0, 0.4^2), prompts N(0, 0.1^2)."""
  model = DecoderLM(config, prompt)
  shapes = meta.unbox(jax.eval_shape(lambda: model.init(
      jax.random.PRNGKey(0), jnp.ones((1, 2), jnp.int32))["params"]))
  rng = np.random.RandomState(seed)
  std = lambda path, x: (0.1 if path[0] == "prompt" else 0.02 if path[0] == "token_embedder"  # noqa: E731
                         else 0.4 if len(x.shape) == 1 else 0.5)
  flat = {p: rng.normal(0, std(p, x), x.shape).astype(np.float32)
          for p, x in traverse_util.flatten_dict(shapes).items()}
  return model, traverse_util.unflatten_dict(flat)


def _rows(config, seed=1):
  rng = np.random.RandomState(seed)
  return [rng.randint(2, config.vocab_size, size=n).astype(np.int32) for n in LENGTHS]


def _batch(rows, side: str):
  width = max(len(r) for r in rows)
  tokens = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    if side == "right":
      tokens[i, :len(r)] = r
    else:
      tokens[i, width - len(r):] = r
  return tokens, tokens > 0


def _prefixes(config, seed=5):
  rng = np.random.RandomState(seed)
  shape = (1, PROMPT, config.num_kv_heads, config.head_dim)
  return tuple((rng.normal(0, 1, shape).astype(np.float32),
                rng.normal(0, 1, shape).astype(np.float32)) for _ in range(config.num_layers))


def _uncached(next_token, row, steps=STEPS, eos=EOS) -> list[int]:
  """Greedy decoding by full forwards over the growing row; 0 after EOS.

  `next_token(seq)` gets the row so far, right-padded to len(row) + steps, and its length.
  """
  seq = np.zeros((1, len(row) + steps), np.int32)
  seq[0, :len(row)] = row
  out, length = [], len(row)
  while len(out) < steps:
    token = next_token(seq, length)
    out.append(token)
    if token == eos:
      break
    seq[0, length] = token
    length += 1
  return out + [0] * (steps - len(out))


@pytest.mark.parametrize("name", ["decoder_tiny_llama", "decoder_tiny_gemma3"])
@pytest.mark.parametrize("kind, side", [("none", "right"), ("soft", "right"), ("soft", "left"),
                                        ("deep", "right")])
def test_cached_greedy_equals_the_uncached_loop(name, kind, side):
  config = CONFIGS[name]
  model, params = _random_params(config, _TestPrompt(PROMPT) if kind == "soft" else None)
  prefixes = _prefixes(config) if kind == "deep" else None
  rows = _rows(config)
  tokens, valid = _batch(rows, side)
  got = np.asarray(decoding.generate(model, params, tokens, valid, max_new_tokens=STEPS,
                                     eos_id=EOS, prefixes=prefixes))

  @jax.jit
  def forward(seq, length):  # right padding: equal to the row alone (test_parity)
    logits = model.apply({"params": params}, seq, valid=(jnp.arange(seq.shape[1]) < length)[None],
                         prefixes=prefixes)
    return jnp.argmax(logits[0, logits.shape[1] - seq.shape[1] + length - 1])

  compared = 0
  for i, row in enumerate(rows):
    want = _uncached(lambda seq, n: int(forward(seq, n)), row)
    # Id 0 is padding (docs/decoder.md, Limits): a random model may emit it mid-row, and past
    # it the uncached loop reads it as padding while the cache holds it as a token.
    upto = want.index(0) + 1 if 0 in want[:-1] and want[want.index(0):] != [0] * (
        len(want) - want.index(0)) else len(want)
    assert got[i].tolist()[:upto] == want[:upto], (i, got[i].tolist(), want)
    compared += upto
  assert compared >= len(rows) * STEPS * 3 // 4, compared  # most of every row was compared
  assert sum(len(set(r)) > 5 for r in got.tolist()) >= 2  # not one token repeated


def test_generation_equals_transformers_greedy_from_inputs_embeds():
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  hf_config = transformers.Gemma3TextConfig(
      vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
      sliding_window=4, max_position_embeddings=64,
      layer_types=["sliding_attention", "sliding_attention", "full_attention"])
  hf_config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch_model = transformers.Gemma3ForCausalLM(hf_config).eval()
  with torch.no_grad():  # as _random_params: varied continuations
    for name, p in torch_model.named_parameters():
      p.normal_(0.0, 0.02 if "embed_tokens" in name else 0.4 if p.ndim == 1 else 0.5)
  config = hf.config_from_hf(torch_model.config.to_dict())
  state = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
  prompt = np.random.RandomState(2).normal(0, 1, (PROMPT, config.emb_dim)).astype(np.float32)
  params = {**hf.params_from_hf(state, config), "prompt": {"prompt": prompt}}
  rows = _rows(config)
  tokens, valid = _batch(rows, "right")
  got = np.asarray(decoding.generate(DecoderLM(config, _TestPrompt(PROMPT)), params, tokens,
                                     valid, max_new_tokens=STEPS, eos_id=EOS))

  def hf_next(seq: np.ndarray, length: int) -> int:
    seq = seq[:, :length]  # transformers sees the row alone
    with torch.no_grad():
      embedded = torch_model.get_input_embeddings()(torch.as_tensor(seq, dtype=torch.long))
      embeds = torch.cat([torch.as_tensor(prompt)[None], embedded], dim=1)
      return int(torch_model(inputs_embeds=embeds).logits[0, -1].argmax())

  for i, row in enumerate(rows):
    assert got[i].tolist() == _uncached(hf_next, row), i
  assert sum(len(set(r)) > 5 for r in got.tolist()) >= 2  # not one token repeated


def _setup(name="decoder_tiny_gemma3"):
  config = CONFIGS[name]
  model, params = _random_params(config)
  tokens, valid = _batch(_rows(config), "right")
  return model, params, tokens, valid


def test_sampling_is_reproducible_and_keeps_to_top_k():
  model, params, tokens, valid = _setup()
  sample = lambda seed, **kw: np.asarray(decoding.generate(  # noqa: E731
      model, params, tokens, valid, max_new_tokens=STEPS, eos_id=EOS,
      rng=jax.random.PRNGKey(seed), **kw))
  hot = dict(temperature=2.0)
  np.testing.assert_array_equal(sample(3, **hot), sample(3, **hot))
  assert (sample(3, **hot) != sample(4, **hot)).any()
  greedy = sample(0)
  np.testing.assert_array_equal(sample(7, top_k=1, **hot), greedy)
  logits = model.apply({"params": params}, tokens, valid=valid)
  last = np.asarray(logits)[np.arange(len(tokens)), valid.sum(1) - 1]  # [B, V]
  top3 = np.argsort(-last, axis=1)[:, :3]
  firsts = np.stack([sample(seed, top_k=3, **hot)[:, 0] for seed in range(12)], axis=1)
  assert all(set(firsts[i]) <= set(top3[i]) for i in range(len(tokens)))
  assert len(set(firsts.ravel())) > len(tokens)  # it did sample, not argmax


def test_rows_stop_at_eos():
  model, params, tokens, valid = _setup()
  greedy = np.asarray(decoding.generate(model, params, tokens, valid, max_new_tokens=STEPS,
                                        eos_id=-1))  # no id: every row runs to the end
  eos = int(greedy[0, 2])
  out = np.asarray(decoding.generate(model, params, tokens, valid, max_new_tokens=STEPS,
                                     eos_id=eos))
  for row, want in zip(out, greedy):
    stop = list(want).index(eos) if eos in want else STEPS - 1
    assert row[:stop + 1].tolist() == want[:stop + 1].tolist()
    assert not row[stop + 1:].any()


def test_generate_compiles_once_per_shape():
  model, params, tokens, valid = _setup("decoder_tiny_llama")
  before = decoding._generate._cache_size()  # pylint: disable=protected-access
  for seed, temperature in ((0, 0.0), (1, 0.8)):
    shuffled = np.random.RandomState(seed).permutation(tokens)
    decoding.generate(model, params, shuffled, shuffled > 0, max_new_tokens=5, eos_id=EOS,
                      rng=jax.random.PRNGKey(seed), temperature=temperature)
  assert decoding._generate._cache_size() == before + 1  # pylint: disable=protected-access


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=0), "max_new_tokens=0 must be a positive integer"),
    (dict(max_new_tokens=4, top_k=0), "top_k=0 must be a positive integer"),
    (dict(max_new_tokens=4, temperature=-1.0), "temperature=-1.0 must be a number >= 0"),
])
def test_bad_settings_are_one_line(kwargs, message):
  model, params, tokens, valid = _setup("decoder_tiny_llama")
  with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
    decoding.generate(model, params, tokens, valid, eos_id=EOS, **kwargs)


def test_a_decode_step_reads_the_cache_where_it_lies():
  """The while loop's step attends over the heads-major cache in place: the optimized program
  moves no cache-sized array into another layout (before, every layer and step did, twice)."""
  model, params, tokens, valid = _setup("decoder_tiny_llama")
  cfg = model.config
  hlo = decoding._generate.lower(  # pylint: disable=protected-access
      model, params, jnp.asarray(tokens), jnp.asarray(valid), jax.random.PRNGKey(0),
      jnp.float32(0), None, None, max_new_tokens=STEPS, top_k=None, eos_id=EOS
  ).compile().as_text()
  size = tokens.shape[1] + STEPS  # no deep prefixes
  elements = tokens.shape[0] * cfg.num_kv_heads * size * cfg.head_dim
  assert cfg.num_kv_heads > 1 and elements != tokens.shape[0] * size * cfg.emb_dim
  assert not hlo_lib.relayouts(hlo, elements)

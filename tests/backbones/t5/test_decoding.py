"""Generation: greedy parity with Hugging Face, cache vs teacher forcing, exact beam search."""
from __future__ import annotations

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax.backbones.t5 import T5Config, Transformer, decoding, generate

# The package exports the function `generate`, which shadows the module of the same name.
from spot_jax.backbones.t5 import generation as generate_lib

EOS = 1


def _tiny_config(gated: bool, **overrides) -> T5Config:
  fields = dict(vocab_size=32, emb_dim=16, num_heads=2, head_dim=4, mlp_dim=24,
                num_encoder_layers=2, num_decoder_layers=2, relative_attention_num_buckets=8,
                relative_attention_max_distance=16, dropout_rate=0.0,
                mlp_activations=("gelu", "linear") if gated else ("relu",),
                logits_via_embedding=not gated)
  fields.update(overrides)
  return T5Config(**fields)


def _init(model: Transformer, seed: int = 0, kernel_scale: float = 2.0):
  """Random float32 parameters drawn with numpy on the model's own parameter shapes.

  (numpy rather than `model.init`: compiling the initialisers costs seconds per model.)
  Kernels are N(0, 1/fan_in) (queries also / sqrt(head_dim), as T5 folds it in), norm scales
  1 + N(0, 0.1^2), embeddings and prompts N(0, 1), relative-position tables N(0, 0.5^2).

  By default kernels are then doubled so that the layers, not the unit-variance embedding on
  the residual path, drive the output; otherwise these tiny random decoders mostly echo their
  input token and rarely emit EOS, which would test little. Checks of single logits at 1e-5
  use `kernel_scale=1`: doubled kernels make attention logits 4x larger, and float32 rounding
  differences between the cached and the full pass grow to ~1e-5.
  """
  shapes = jax.eval_shape(functools.partial(model.init, enable_dropout=False),
                          jax.random.PRNGKey(0), jnp.ones((2, 5), jnp.int32),
                          jnp.ones((2, 3), jnp.int32))
  rng = np.random.RandomState(seed)

  def draw(path, leaf):
    name, shape = jax.tree_util.keystr(path), leaf.shape
    normal = rng.normal(size=shape)
    if name.endswith("['scale']"):
      value = 1.0 + 0.1 * normal
    elif name.endswith("['rel_embedding']"):
      value = 0.5 * normal
    elif name.endswith("['kernel']"):
      value = kernel_scale * normal / np.sqrt(shape[0])
      if "['query']" in name:
        value = value / np.sqrt(model.config.head_dim)
    else:  # token embedding, prompt rows
      value = normal
    return jnp.asarray(value, jnp.float32)

  return jax.tree_util.tree_map_with_path(draw, nn.meta.unbox(shapes["params"]))


def _log_softmax(logits) -> np.ndarray:
  """log-softmax over the last axis, in float64 numpy (no compilation per shape)."""
  x = np.asarray(logits, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


# Reference computations only: unoptimised machine code compiles ~40% faster on CPU.
_jit_reference = functools.partial(jax.jit, static_argnums=0,
                                   compiler_options={"xla_backend_optimization_level": 0})


@_jit_reference
def _forward(model: Transformer, params, enc, dec_in):
  """Full teacher-forced logits [B, S, V] (causal decoder mask, no cache)."""
  return model.apply({"params": params}, enc, dec_in, enable_dropout=False)


def _padded_inputs(vocab: int, batch: int, length: int, seed: int) -> np.ndarray:
  rng = np.random.RandomState(seed)
  tokens = rng.randint(2, vocab, size=(batch, length)).astype(np.int32)
  for row in range(1, batch):  # row 0 is full; the others end in padding of varied length
    tokens[row, max(1, length - 2 * row):] = 0
  return tokens


def _teacher_forced_log_probs(model: Transformer, params, enc: np.ndarray, targets: np.ndarray):
  """Full (non-incremental) log-softmax [B, L, V] of the decoder fed the shifted targets."""
  dec_in = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
  logits = _forward(model, params, jnp.asarray(enc), jnp.asarray(dec_in, jnp.int32))
  return _log_softmax(logits)


def _sequence_log_prob(log_probs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
  """Sum of log-probs of each row's tokens up to and including its first EOS."""
  picked = np.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0]
  return (picked * _live_mask(tokens)).sum(-1)


def _live_mask(tokens: np.ndarray) -> np.ndarray:
  """1 for positions up to and including the first EOS, 0 after it."""
  ended_before = np.cumsum(tokens == EOS, axis=-1) - (tokens == EOS)
  return (ended_before == 0).astype(np.float32)


def _assert_zero_after_eos(tokens: np.ndarray) -> None:
  tokens = np.asarray(tokens)
  assert np.all(tokens[_live_mask(tokens) == 0] == 0)


def _assert_greedy_is_teacher_forced_argmax(model, params, enc, tokens, scores) -> None:
  """Each generated token is the argmax of the full forward pass over the generated prefix."""
  tokens = np.asarray(tokens)
  log_probs = _teacher_forced_log_probs(model, params, enc, tokens)
  live = _live_mask(tokens) > 0
  np.testing.assert_array_equal(log_probs.argmax(-1)[live], tokens[live])
  _assert_scores_close(scores, _sequence_log_prob(log_probs, tokens), tokens)


def _assert_scores_close(scores, reference, tokens) -> None:
  """A score sums one log-prob per emitted token, each within 1e-5 of the full forward pass."""
  n_tokens = _live_mask(np.asarray(tokens)).sum(-1)
  error = np.abs(np.asarray(scores) - reference)
  assert np.all(error <= 1e-5 * n_tokens), (error, n_tokens)


# ---------------------------------------------------------------- Hugging Face greedy parity


def _hf_key_map(cfg: T5Config) -> list[tuple[str, tuple[str, ...], bool]]:
  """(Hugging Face key, t5x parameter path, transposed?) for every tensor of a T5 (test helper)."""
  # The stacks' embed_tokens are ties of `shared` in the Hugging Face state dict.
  pairs = [(f"{name}.weight", ("token_embedder", "embedding"), False)
           for name in ("shared", "encoder.embed_tokens", "decoder.embed_tokens")]
  attention = (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))
  mlp_names = ("wi_0", "wi_1", "wo") if len(cfg.mlp_activations) > 1 else ("wi", "wo")
  for stack, n_layers in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
    pairs.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                  (stack, "relpos_bias", "rel_embedding"), True))
    pairs.append((f"{stack}.final_layer_norm.weight", (stack, f"{stack}_norm", "scale"), False))
    for i in range(n_layers):
      pre, ours = f"{stack}.block.{i}.layer", (stack, f"layers_{i}")
      if stack == "encoder":
        blocks = [(0, "SelfAttention", "attention", "pre_attention_layer_norm")]
      else:
        blocks = [(0, "SelfAttention", "self_attention", "pre_self_attention_layer_norm"),
                  (1, "EncDecAttention", "encoder_decoder_attention",
                   "pre_cross_attention_layer_norm")]
      for j, theirs, name, norm in blocks:
        pairs.append((f"{pre}.{j}.layer_norm.weight", ours + (norm, "scale"), False))
        pairs += [(f"{pre}.{j}.{theirs}.{h}.weight", ours + (name, o, "kernel"), True)
                  for o, h in attention]
      mlp = len(blocks)
      pairs.append((f"{pre}.{mlp}.layer_norm.weight",
                    ours + ("pre_mlp_layer_norm", "scale"), False))
      pairs += [(f"{pre}.{mlp}.DenseReluDense.{n}.weight", ours + ("mlp", n, "kernel"), True)
                for n in mlp_names]
  if cfg.logits_via_embedding:
    pairs.append(("lm_head.weight", ("token_embedder", "embedding"), False))  # tied
  else:
    pairs.append(("lm_head.weight", ("decoder", "logits_dense", "kernel"), True))
  return pairs


def _at(tree, path):
  for name in path:
    tree = tree[name]
  return tree


@functools.lru_cache(maxsize=None)
def _hf_case(name: str):
  """A tiny model of setting `name`: our random init, and a Hugging Face T5 holding
  the same weights.

  Our initialisation is used (not Hugging Face's) because randomly initialised Hugging Face T5s
  decode degenerately (one token repeated, EOS essentially never), which would test little.
  """
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  setting = dict(HF_SETTINGS[name])
  gated = setting.pop("gated")
  cfg = _tiny_config(gated, vocab_size=12, **setting)
  model = Transformer(cfg)
  params = _init(model, seed=3)
  hf_cfg = transformers.T5Config(
      vocab_size=cfg.vocab_size, d_model=cfg.emb_dim, d_kv=cfg.head_dim, d_ff=cfg.mlp_dim,
      num_layers=cfg.num_encoder_layers, num_decoder_layers=cfg.num_decoder_layers,
      num_heads=cfg.num_heads, relative_attention_num_buckets=cfg.relative_attention_num_buckets,
      relative_attention_max_distance=cfg.relative_attention_max_distance, dropout_rate=0.0,
      feed_forward_proj="gated-gelu" if gated else "relu", tie_word_embeddings=not gated,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=EOS)
  hf = transformers.T5ForConditionalGeneration(hf_cfg).eval()
  if not cfg.logits_via_embedding:
    # transformers 5.x always ties lm_head to the shared embedding (tie_word_embeddings=False
    # only turns off the output scaling); T5.1.1 needs its own output matrix.
    hf.lm_head.weight = torch.nn.Parameter(torch.zeros(cfg.vocab_size, cfg.emb_dim))
  state = {key: torch.tensor(np.asarray(_at(params, path)).T if transpose
                             else np.asarray(_at(params, path)))
           for key, path, transpose in _hf_key_map(cfg)}
  hf.load_state_dict(state, strict=True)
  enc = _padded_inputs(cfg.vocab_size, batch=8, length=9, seed=3)
  # Guard: the two models compute the same teacher-forced logits, so any token difference
  # below comes from the search, not from the weights.
  dec_in = np.random.RandomState(0).randint(0, cfg.vocab_size, size=(enc.shape[0], MAX_LEN))
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(enc, dtype=torch.long),
             attention_mask=torch.tensor(enc > 0, dtype=torch.long),
             decoder_input_ids=torch.tensor(dec_in, dtype=torch.long)).logits.numpy()
  ours = _forward(model, params, jnp.asarray(enc), jnp.asarray(dec_in, jnp.int32))
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)
  return cfg, model, params, hf, enc


HF_SETTINGS = {
    "t5_1_1": dict(gated=True),
    "t5_1_1_3heads_3dec": dict(gated=True, num_heads=3, num_decoder_layers=3,
                               relative_attention_num_buckets=4, relative_attention_max_distance=8),
    "t5_1enc_wide": dict(gated=False, num_encoder_layers=1, emb_dim=24, head_dim=6, num_heads=4,
                         relative_attention_num_buckets=16, relative_attention_max_distance=32),
}
MAX_LEN = 10


@pytest.mark.parametrize("name", sorted(HF_SETTINGS))
def test_greedy_matches_hugging_face(name):
  torch = pytest.importorskip("torch")
  cfg, model, params, hf, enc = _hf_case(name)
  tokens, scores = generate(model, params, jnp.asarray(enc), max_decode_length=MAX_LEN)
  with torch.no_grad():
    ref = hf.generate(input_ids=torch.tensor(enc, dtype=torch.long),
                      attention_mask=torch.tensor(enc > 0, dtype=torch.long), do_sample=False,
                      num_beams=1, max_new_tokens=MAX_LEN, min_new_tokens=0,
                      # transformers 5.x sizes its decoder cache by the encoder's layer count
                      # (IndexError when the decoder is deeper): recompute without it then.
                      use_cache=cfg.num_decoder_layers <= cfg.num_encoder_layers).numpy()
  assert np.all(ref[:, 0] == 0), "Hugging Face output must start with the decoder start id 0"
  # Strip HF's start token; HF stops once every row has ended and pads ended rows with 0, so
  # pad its output to the full length with 0 as well.
  ref = np.pad(ref[:, 1:], ((0, 0), (0, MAX_LEN - (ref.shape[1] - 1))))
  np.testing.assert_array_equal(np.asarray(tokens), ref)
  _assert_zero_after_eos(tokens)
  _assert_greedy_is_teacher_forced_argmax(model, params, enc, tokens, scores)


@pytest.mark.parametrize("name", sorted(HF_SETTINGS))
def test_hugging_face_cases_cover_early_and_late_ends(name):
  """The parity case only means something if a row stops at EOS mid-way and another does not."""
  pytest.importorskip("torch")
  _, model, params, _, enc = _hf_case(name)
  tokens = np.asarray(generate(model, params, jnp.asarray(enc), max_decode_length=MAX_LEN)[0])
  assert np.any(tokens[:, 1:-1] == EOS), tokens
  assert np.any(~(tokens == EOS).any(-1)), tokens


# ---------------------------------------------------------------- cache vs teacher forcing

LENGTH = 8


@functools.lru_cache(maxsize=None)
def _base(family: str, kernel_scale: float = 2.0):
  """A tiny random model of `family`, its parameters and a padded [4, 7] batch of inputs."""
  model = Transformer(_tiny_config(gated=family == "t5_1_1"))
  params = _init(model, seed=7, kernel_scale=kernel_scale)
  return model, params, _padded_inputs(32, batch=4, length=7, seed=3)


@_jit_reference
def _incremental_logits(model: Transformer, params, enc, targets):
  """Decoder logits [B, S, V] computed one position at a time through the cache."""
  encoded, valid = generate_lib.encode(model, params, enc)
  length = targets.shape[1]
  cache = generate_lib.init_cache(model, params, encoded, valid, length)
  step = generate_lib.make_tokens_to_logits(model, params, encoded, valid, length)
  fed = jnp.concatenate([jnp.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)

  def body(cache, tokens):
    logits, cache = step(tokens[:, None], cache)
    return cache, logits

  _, logits = jax.lax.scan(body, cache, fed.T)
  return logits.transpose(1, 0, 2)


def _assert_incremental_equals_teacher_forced(model, params, enc, targets) -> None:
  dec_in = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
  full = _forward(model, params, jnp.asarray(enc), jnp.asarray(dec_in))
  incremental = _incremental_logits(model, params, jnp.asarray(enc), jnp.asarray(targets))
  np.testing.assert_allclose(np.asarray(incremental), np.asarray(full), atol=1e-5, rtol=0)


def test_incremental_logits_equal_teacher_forced():
  """T5.1.1 here; the original-T5 family gets the same check with a prompt module below."""
  model, params, enc = _base("t5_1_1", kernel_scale=1.0)
  targets = np.random.RandomState(1).randint(0, 32, size=(enc.shape[0], LENGTH)).astype(np.int32)
  _assert_incremental_equals_teacher_forced(model, params, enc, targets)


# ---------------------------------------------------------------- beam search


def test_one_beam_equals_greedy():
  model, params, enc = _base("t5_1_1")
  greedy_tokens, greedy_scores = generate(model, params, jnp.asarray(enc), max_decode_length=LENGTH)
  assert greedy_tokens.shape == (4, LENGTH) and greedy_tokens.dtype == jnp.int32
  assert greedy_scores.shape == (4,)
  _assert_zero_after_eos(greedy_tokens)
  _assert_greedy_is_teacher_forced_argmax(model, params, enc, greedy_tokens, greedy_scores)
  tokens, scores = generate(model, params, jnp.asarray(enc), max_decode_length=LENGTH,
                            method="beam", num_beams=1, alpha=0.0)
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(greedy_tokens))
  np.testing.assert_allclose(scores, greedy_scores, atol=1e-5, rtol=0)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_scores_are_length_normalised_log_probs(alpha):
  model, params, enc = _base("t5_1_1")
  beams, scores = generate(model, params, jnp.asarray(enc), max_decode_length=LENGTH,
                           method="beam", num_beams=4, alpha=alpha, return_all_beams=True)
  beams, scores = np.asarray(beams), np.asarray(scores)
  assert beams.shape == (4, 4, LENGTH) and scores.shape == (4, 4)
  assert np.all(np.diff(scores, axis=1) <= 0), "beams must be sorted best first"
  assert len({tuple(b) for b in beams.reshape(-1, LENGTH).tolist()}) == beams.shape[0] * 4
  _assert_zero_after_eos(beams)
  for k in range(beams.shape[1]):
    log_prob = _sequence_log_prob(_teacher_forced_log_probs(model, params, enc, beams[:, k]),
                                  beams[:, k])
    lengths = _live_mask(beams[:, k]).sum(-1)
    _assert_scores_close(scores[:, k] * ((5.0 + lengths) / 6.0) ** alpha, log_prob, beams[:, k])
  best_tokens, best_scores = generate(model, params, jnp.asarray(enc), max_decode_length=LENGTH,
                                      method="beam", num_beams=4, alpha=alpha)
  np.testing.assert_array_equal(np.asarray(best_tokens), beams[:, 0])
  np.testing.assert_allclose(best_scores, scores[:, 0], atol=1e-6, rtol=0)
  if alpha == 0.0:
    _, greedy_scores = generate(model, params, jnp.asarray(enc), max_decode_length=LENGTH)
    assert np.all(scores[:, 0] >= np.asarray(greedy_scores) - 1e-5), (scores[:, 0], greedy_scores)


def _all_sequences(vocab: int, length: int) -> np.ndarray:
  """Every sequence that ends at its first EOS or at `length`, 0-padded: [N, length]."""
  out = []
  for n in range(1, length + 1):
    for prefix in itertools.product([t for t in range(vocab) if t != EOS], repeat=n - 1):
      ends = [EOS] if n < length else range(vocab)
      out += [list(prefix) + [last] + [0] * (length - n) for last in ends]
  return np.asarray(out, np.int32)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_is_exact_on_a_tiny_vocabulary(alpha):
  """With beams >= the candidates of any step, beam search ranks all sequences exactly."""
  vocab, length, beams = 4, 3, 36  # the last step extends 3 * 3 prefixes by 4 tokens
  model = Transformer(_tiny_config(gated=True, vocab_size=vocab))
  params = _init(model, seed=3, kernel_scale=1.0)  # scores are compared at a flat 1e-5
  enc = _padded_inputs(vocab, batch=2, length=5, seed=5)
  found, found_scores = generate(model, params, jnp.asarray(enc), max_decode_length=length,
                                 method="beam", num_beams=beams, alpha=alpha,
                                 return_all_beams=True)
  found, found_scores = np.asarray(found), np.asarray(found_scores)
  candidates = _all_sequences(vocab, length)
  assert len(candidates) == 1 + 3 + 9 * vocab  # EOS at 1, EOS at 2, anything at 3
  for row in range(enc.shape[0]):
    log_probs = _teacher_forced_log_probs(
        model, params, np.repeat(enc[row:row + 1], len(candidates), 0), candidates)
    lengths = _live_mask(candidates).sum(-1)
    exact = _sequence_log_prob(log_probs, candidates) / ((5.0 + lengths) / 6.0) ** alpha
    order = np.argsort(-exact)
    np.testing.assert_array_equal(found[row, 0], candidates[order[0]])
    np.testing.assert_allclose(found_scores[row], exact[order[:beams]], atol=1e-5, rtol=0)
    by_sequence = {tuple(c): e for c, e in zip(candidates.tolist(), exact)}
    for k in range(beams):  # each returned beam carries its own exact score
      assert abs(by_sequence[tuple(found[row, k].tolist())] - found_scores[row, k]) <= 1e-5


def _markov_step(table: np.ndarray):
  """A step function whose logits depend on the cache: table[previous token, running sum % 3]."""
  table = jnp.asarray(table)

  def tokens_to_logits(tokens, cache):
    token = tokens[:, 0]
    running = cache["sum"] + token
    return table[token, running % 3], {"sum": running, "index": cache["index"] + 1}

  return tokens_to_logits


def test_beam_search_gathers_the_cache_per_beam():
  """Exact search over a cache-dependent toy model: wrong cache gathering changes the ranking."""
  vocab, length, batch, beams = 3, 4, 2, 24  # the last step extends 2 ** 3 prefixes by 3 tokens
  table = np.random.RandomState(0).normal(size=(vocab, 3, vocab)).astype(np.float32) * 2
  cache = {"sum": jnp.zeros((batch,), jnp.int32), "index": jnp.array(0, jnp.int32)}
  found, scores = jax.jit(functools.partial(
      decoding.beam_search, _markov_step(table), batch_size=batch, num_beams=beams,
      max_decode_length=length, alpha=0.0))(cache)
  log_table = _log_softmax(table)
  exact = {}
  for seq in _all_sequences(vocab, length):
    previous, running, total = 0, 0, 0.0
    for token in seq[:int(_live_mask(seq[None])[0].sum())]:
      running += previous
      total += log_table[previous, running % 3, token]
      previous = token
    exact[tuple(seq.tolist())] = total
  ranked = sorted(exact.items(), key=lambda kv: -kv[1])
  for row in range(batch):  # both rows are the same problem
    np.testing.assert_array_equal(np.asarray(found[row, 0]), ranked[0][0])
    np.testing.assert_allclose(np.asarray(scores[row]), [v for _, v in ranked[:beams]],
                               atol=1e-5, rtol=0)


# ---------------------------------------------------------------- temperature sampling


def _sample(rng_seed: int, **kwargs):
  model, params, enc = _base("t5_1_1")
  tokens, scores = generate(model, params, jnp.asarray(enc), max_decode_length=LENGTH,
                            method="sample", rng=jax.random.PRNGKey(rng_seed), **kwargs)
  return np.asarray(tokens), np.asarray(scores)


def test_sampling_is_reproducible_and_scored_by_the_model():
  model, params, enc = _base("t5_1_1")
  tokens, scores = _sample(0)
  again, again_scores = _sample(0)
  np.testing.assert_array_equal(tokens, again)
  np.testing.assert_array_equal(scores, again_scores)
  other, _ = _sample(1)
  assert np.any(other != tokens), "a different rng should give a different sample"
  _assert_zero_after_eos(tokens)
  log_probs = _teacher_forced_log_probs(model, params, enc, tokens)
  _assert_scores_close(scores, _sequence_log_prob(log_probs, tokens), tokens)


def test_sampling_limits_equal_greedy():
  model, params, enc = _base("t5_1_1")
  greedy_tokens, greedy_scores = generate(model, params, jnp.asarray(enc), max_decode_length=LENGTH)
  # top_k=1 at temperature 1 differs from plain sampling only through the top-k filter.
  for kwargs in (dict(temperature=0.0), dict(temperature=1e-3), dict(temperature=1.0, top_k=1)):
    tokens, scores = _sample(0, **kwargs)
    np.testing.assert_array_equal(tokens, np.asarray(greedy_tokens), err_msg=str(kwargs))
    np.testing.assert_allclose(scores, greedy_scores, atol=1e-6, rtol=0, err_msg=str(kwargs))


# ---------------------------------------------------------------- prompt hook


class _PrependPrompt(nn.Module):
  """Test-only input hook: prepends `length` learned rows, always visible.

  Attributes:
    length: P, the number of prompt rows.
  """
  length: int

  @nn.compact
  def __call__(self, embedded, tokens, *, embedding, deterministic, valid=None):
    """embedded [B, T, E], tokens [B, T], valid [B, T] (None: tokens > 0) -> ([B, P + T, E],
    valid [B, P + T])."""
    del deterministic
    rows = self.param("prompt", nn.initializers.normal(1.0), (self.length, embedding.shape[1]))
    batch = embedded.shape[0]
    x = jnp.concatenate([jnp.broadcast_to(rows, (batch,) + rows.shape).astype(embedded.dtype),
                         embedded], axis=1)
    valid = tokens > 0 if valid is None else valid
    valid = jnp.concatenate([jnp.ones((batch, self.length), bool), valid], axis=1)
    return x, valid


def test_generation_with_a_prompt_module():
  backbone, backbone_params, enc = _base("t5", kernel_scale=1.0)
  model = Transformer(backbone.config, prompt=_PrependPrompt(length=3))
  params = dict(backbone_params, prompt=_init(model, seed=11, kernel_scale=1.0)["prompt"])
  encoded, valid = _jit_reference(generate_lib.encode)(model, params, jnp.asarray(enc))
  assert encoded.shape[1] == valid.shape[1] == enc.shape[1] + 3
  np.testing.assert_array_equal(np.asarray(valid), np.pad(enc > 0, ((0, 0), (3, 0)),
                                                          constant_values=True))

  tokens, scores = generate(model, params, jnp.asarray(enc), max_decode_length=LENGTH)
  _assert_zero_after_eos(tokens)
  _assert_greedy_is_teacher_forced_argmax(model, params, enc, tokens, scores)
  _assert_incremental_equals_teacher_forced(model, params, enc, np.asarray(tokens))
  without_prompt = _teacher_forced_log_probs(backbone, backbone_params, enc, np.asarray(tokens))
  with_prompt = _teacher_forced_log_probs(model, params, enc, np.asarray(tokens))
  assert np.abs(with_prompt - without_prompt).max() > 1e-2, "the prompt should change the output"


# ---------------------------------------------------------------- compilation and errors


def test_generate_is_jittable_and_compiles_once_per_shape():
  model, params, enc = _base("t5_1_1")
  traces = []

  @jax.jit
  def run(params, enc):
    traces.append(1)  # runs only while tracing
    return generate(model, params, enc, max_decode_length=LENGTH)

  jitted = [run(params, jnp.asarray(enc) + shift * (enc > 0)) for shift in range(3)]
  assert len(traces) == 1
  np.testing.assert_array_equal(
      np.asarray(jitted[0][0]), np.asarray(generate(model, params, jnp.asarray(enc),
                                                    max_decode_length=LENGTH)[0]))

  # generate's own jit: new values and a new alpha (traced) reuse the compiled search.
  generate(model, params, jnp.asarray(enc), max_decode_length=LENGTH, method="beam", num_beams=4)
  compiled = generate_lib._generate._cache_size()
  for shift, alpha in ((1, 0.0), (2, 1.0)):
    generate(model, params, jnp.asarray(enc) + shift * (enc > 0), max_decode_length=LENGTH,
             method="beam", num_beams=4, alpha=alpha)
  assert generate_lib._generate._cache_size() == compiled


def test_bad_arguments_are_rejected():
  model, params, enc = _base("t5_1_1")
  enc = jnp.asarray(enc)
  cases = [
      (dict(method="topp"), "method='topp' is unknown; valid: "),
      (dict(method="sample"), "needs rng"),
      (dict(max_decode_length=0), "max_decode_length"),
      (dict(method="beam", num_beams=0), "num_beams"),
      (dict(return_all_beams=True), "return_all_beams"),
      (dict(method="sample", rng=jax.random.PRNGKey(0), top_k=33), "top_k"),
      (dict(method="sample", rng=jax.random.PRNGKey(0), temperature=-1.0), "temperature"),
      (dict(eos_id=0), "eos_id"),
  ]
  for kwargs, message in cases:
    kwargs = {"max_decode_length": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
      generate(model, params, enc, **kwargs)
  with pytest.raises(ValueError, match="integer array"):
    generate(model, params, enc.astype(jnp.float32), max_decode_length=4)

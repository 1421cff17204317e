"""The trainer on a decoder-only backbone (decoder_tiny_llama) and a local seqio task.

Invariants: the held-out loss falls; only the prompt trains and the frozen weights equal the
checkpoint; a stopped run resumes to the uninterrupted run's prompt; K = 2 runs equal the runs
alone; the loss counts target tokens only; prompt positions are where the model says; every
input-hook and deep prompt method trains a step on the decoder, or is refused in one line.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import backbone as backbone_lib
from spot_jax import data, models, prompts
from spot_jax import train as train_lib
from spot_jax.backbones.decoder import checkpoints as decoder_checkpoints
from spot_jax.backbones.decoder.config import config_by_name
from spot_jax.backbones.decoder.network import DecoderLM
from spot_jax.errors import ConfigError
from spot_jax.train import checks, optimizers
from spot_jax.train import evaluator as evaluator_lib
from tests.helpers import local_tasks

LENGTHS = {"inputs": 24, "targets": 4}
CONFIG = config_by_name("decoder_tiny_llama")


@pytest.fixture(scope="module")
def task_name(tmp_path_factory) -> str:
  paths = local_tasks.write_tsv_task_files(tmp_path_factory.mktemp("tsv"))
  return local_tasks.register_tsv_task("test_decoder_polarity", paths)


@pytest.fixture(scope="module")
def backbone_checkpoint(tmp_path_factory):
  """A saved random decoder_tiny_llama (Hugging Face layout) and its parameters."""
  model = _model()
  params = models.unbox(model.init_backbone(jax.random.PRNGKey(7), model.dummy_batch(8, 4)))
  params = jax.device_get(params)
  path = tmp_path_factory.mktemp("ckpt") / "tiny_llama"
  decoder_checkpoints.save_hf_dir(str(path), CONFIG, params)
  return str(path), params


def _model(prompt=None) -> models.DecoderOnlyModel:
  if prompt is None:
    prompt = prompts.PromptTuning(length=4, prompt_init=prompts.sampled_vocab())
  return models.DecoderOnlyModel(DecoderLM(CONFIG, prompt=prompt), eos_id=1)  # the bytes' EOS


def _train(model_dir, task, steps, model=None, **kwargs):
  """A run (or K) as gin's RANDOM_SEED sets it: the data order follows the run's seed."""
  cfg = data.DatasetConfig(task, LENGTHS, batch_size=8, seed=kwargs.get("seed", 0))
  return train_lib.train(model=model or _model(), train_dataset_cfg=cfg, total_steps=steps,
                         model_dir=str(model_dir), optimizer=optimizers.adafactor(),
                         eval_period=1000, log_period=10, verbose=False, **kwargs)


def _batches(task, split, n):
  cfg = data.DatasetConfig(task, LENGTHS, split=split, batch_size=8, shuffle=False,
                           feature_layout="decoder_only")
  it = data.train_batches(cfg)
  out = []
  for _ in range(n):
    batch = next(it)
    out.append({k: batch[k] for k in ("decoder_input_tokens", "decoder_target_tokens",
                                      "decoder_loss_weights")})
  return out


@pytest.fixture(scope="module")
def run40(tmp_path_factory, task_name, backbone_checkpoint):
  """40 steps on the saved backbone, evaluated (generation and the task's metric) at the end."""
  return _train(tmp_path_factory.mktemp("run40"), task_name, 40,
                initial_checkpoint_path=backbone_checkpoint[0],
                eval_cfg=evaluator_lib.EvalConfig(task_name, LENGTHS, batch_size=16))


def test_batches_hold_inputs_then_targets_and_weigh_targets_only(task_name):
  batch = _batches(task_name, "validation", 1)[0]
  tokens, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
  assert tokens.shape == weights.shape == (8, LENGTHS["inputs"] + LENGTHS["targets"])
  np.testing.assert_array_equal(batch["decoder_input_tokens"][:, 1:], tokens[:, :-1])
  for row, w in zip(tokens, weights):
    text = bytes(int(t) - 3 for t in row if t > 2).decode()
    assert text.startswith("polarity: ") and text.endswith(("yes", "no")), text
    target = bytes(int(t) - 3 for t, on in zip(row, w) if on and t > 2).decode()
    assert target in ("yes", "no") and w.sum() == len(target) + 1  # + EOS


def test_held_out_loss_falls(run40, task_name, backbone_checkpoint):
  model = _model()
  frozen = run40.frozen_params
  start = models.unbox(model.init_prompt(backbone_lib.seed_keys(0)[1], frozen,
                                         model.dummy_batch(**{"input_length": 24,
                                                              "target_length": 4})))
  held_out = _batches(task_name, "validation", 4)
  loss = jax.jit(lambda p, b: model.loss_fn(models.merge_params(frozen, p), b, None, False)[0])
  before = np.mean([float(loss(start, b)) for b in held_out])
  after = np.mean([float(loss(run40.state.params, b)) for b in held_out])
  print(f"held-out loss {before:.3f} -> {after:.3f}")
  assert after < before - 0.5, (before, after)


def test_evaluation_generates_after_the_inputs(run40):
  (step, metrics), = run40.eval_history
  assert step == 40 and 0.0 <= metrics["test_decoder_polarity"]["accuracy"] <= 100.0


def test_generation_ends_at_eos_then_pads():
  model = _model()
  frozen = models.unbox(model.init_backbone(jax.random.PRNGKey(0), model.dummy_batch(8, 4)))
  params = models.merge_params(frozen, models.unbox(model.init_prompt(
      jax.random.PRNGKey(1), frozen, model.dummy_batch(8, 4))))
  out = np.asarray(jax.jit(lambda p, t: model.predict_batch(p, t, 6))(
      params, np.array([[40, 41, 1, 0], [50, 1, 0, 0]], np.int32)))
  assert out.shape == (2, 6)
  for row in out:
    ends = np.flatnonzero(row == 1)
    if ends.size:
      assert not row[ends[0] + 1:].any(), row


def test_only_the_prompt_trains_and_frozen_equals_checkpoint(run40, backbone_checkpoint):
  assert set(run40.state.params) == {"prompt"} and run40.compilations == 1
  saved = dict(jax.tree_util.tree_flatten_with_path(backbone_checkpoint[1])[0])
  got = dict(jax.tree_util.tree_flatten_with_path(jax.device_get(run40.frozen_params))[0])
  assert saved.keys() == got.keys()
  for path, value in saved.items():
    np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(value), err_msg=str(path))


def test_run_records_the_decoder_kind_and_refuses_t5(run40, tmp_path):
  record = run40.runs[0].run.run_dir.read_record()
  assert record.backbone["kind"] == "decoder" and record.fingerprint["kind"] == "decoder"
  assert record.fingerprint["model"].startswith("decoder_tiny_llama + checkpoint ")
  from spot_jax.backbones.t5 import config_by_name as t5_config  # pylint: disable=g-import-not-at-top
  t5 = backbone_lib.fingerprint(t5_config("t5_1_1_byte_tiny"), None, 0)
  with pytest.raises(ConfigError, match="does not move between backbone kinds") as info:
    backbone_lib.check_same(record.fingerprint, t5, "run", "--gin.ALLOW_BACKBONE_CHANGE=True")
  assert "\n" not in str(info.value)
  random = backbone_lib.fingerprint(CONFIG, None, 0)
  assert random["model"] == "decoder_tiny_llama + random weights of seed 0"


def test_stopped_run_resumes_to_the_same_prompt(tmp_path, task_name):
  whole = _train(tmp_path / "whole", task_name, 6)
  _train(tmp_path / "parts", task_name, 3)
  resumed = _train(tmp_path / "parts", task_name, 6)
  assert len(resumed.history) == 3  # steps 4-6 only
  a, b = jax.device_get(whole.state.params), jax.device_get(resumed.state.params)
  diff = max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  print(f"resumed against uninterrupted: max |diff| {diff:.3g}")
  assert diff <= 1e-6


def test_two_runs_in_one_step_equal_the_runs_alone(tmp_path, task_name, backbone_checkpoint):
  ckpt = backbone_checkpoint[0]
  both = _train(tmp_path / "both", task_name, 3, seeds=[0, 1], initial_checkpoint_path=ckpt)
  for k, seed in enumerate((0, 1)):
    alone = _train(tmp_path / f"alone{seed}", task_name, 3, seed=seed,
                   initial_checkpoint_path=ckpt)
    for x, y in zip(jax.tree.leaves(jax.device_get(both.runs[k].state.params)),
                    jax.tree.leaves(jax.device_get(alone.state.params))):
      np.testing.assert_allclose(x, y, atol=1e-5)
    np.testing.assert_allclose([h["loss"] for h in both.runs[k].history],
                               [h["loss"] for h in alone.history], atol=1e-5)


def test_loss_counts_target_tokens_only(task_name):
  model = _model()
  frozen = models.unbox(model.init_backbone(jax.random.PRNGKey(0), model.dummy_batch(24, 4)))
  params = models.merge_params(frozen, models.unbox(model.init_prompt(
      jax.random.PRNGKey(1), frozen, model.dummy_batch(24, 4))))
  batch = _batches(task_name, "validation", 1)[0]
  loss = jax.jit(lambda b: model.loss_fn(params, b, None, False)[0])
  base = float(loss(batch))
  inputs_side = dict(batch, decoder_target_tokens=np.where(
      (batch["decoder_loss_weights"] == 0) & (batch["decoder_target_tokens"] > 0), 7,
      batch["decoder_target_tokens"]))
  assert float(loss(inputs_side)) == base
  first_target = np.argmax(batch["decoder_loss_weights"][0])
  changed = batch["decoder_target_tokens"].copy()
  changed[0, first_target] = 7 if changed[0, first_target] != 7 else 8
  assert float(loss(dict(batch, decoder_target_tokens=changed))) != base


@pytest.mark.parametrize("prompt", [
    lambda: prompts.PromptTuning(4, prompt_init=prompts.sampled_vocab()),
    lambda: prompts.PromptTuning(3, placement="after_bos"),
    lambda: prompts.SMoP(num_prompts=2, length=3),
    lambda: prompts.PrefixTuning(2, attention=("decoder",)),
])
def test_loss_on_the_target_positions_only_equals_the_full_loss(task_name, prompt):
  """The trainer's model (`for_batches`: the output layer on each row's target positions) has
  the full model's loss, metrics and prompt gradients."""
  full = models.DecoderOnlyModel(DecoderLM(CONFIG, prompt=prompt()), eos_id=1)
  short = full.for_batches(LENGTHS)
  assert short.loss_positions == LENGTHS["targets"]
  frozen = models.unbox(full.init_backbone(jax.random.PRNGKey(0), full.dummy_batch(8, 4)))
  start = models.unbox(full.init_prompt(jax.random.PRNGKey(1), frozen, full.dummy_batch(8, 4)))
  batch = _batches(task_name, "train", 1)[0]
  assert int(np.max(np.sum(batch["decoder_loss_weights"] > 0, axis=1))) <= LENGTHS["targets"]

  def loss(model):
    return jax.jit(jax.value_and_grad(lambda p: model.loss_fn(
        models.merge_params(frozen, p), batch, None, enable_dropout=False), has_aux=True))(start)

  (want, want_metrics), want_grads = loss(full)
  (got, got_metrics), got_grads = loss(short)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for name in want_metrics:
    np.testing.assert_allclose(got_metrics[name], want_metrics[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("placement", ["prefix", "after_bos"])
def test_prompt_positions_are_dropped_from_the_logits(placement):
  """A prompt made of token embeddings (this Llama does not scale them) gives the logits the
  unprompted model gives with those tokens written into the sequence at the prompt's place."""
  ids = np.array([11, 12, 13], np.int32)
  plain = _model()
  frozen = models.unbox(plain.init_backbone(jax.random.PRNGKey(0), plain.dummy_batch(8, 4)))
  table = np.asarray(frozen["token_embedder"]["embedding"])  # pylint: disable=unsubscriptable-object
  prompt = prompts.PromptTuning(length=3, placement=placement,
                                prompt_init=prompts.from_array(table[ids]))
  model = _model(prompt)
  params = models.merge_params(frozen, models.unbox(model.init_prompt(
      jax.random.PRNGKey(1), frozen, model.dummy_batch(8, 4))))
  tokens = np.array([[40, 41, 42, 43, 1, 0, 0, 0]], np.int32)
  got = model.logits(params, {"decoder_target_tokens": tokens})
  bos = np.array([plain.bos], np.int32)
  shifted = np.concatenate([bos, tokens[0, :-1]])
  at = 0 if placement == "prefix" else 1
  spelled = np.concatenate([shifted[:at], ids, shifted[at:]])[None]
  valid = tokens[0] > 0  # a position is real where its target token is
  spelled_valid = np.concatenate([valid[:at], [True] * 3, valid[at:]])[None]
  reference = DecoderLM(CONFIG).apply({"params": frozen}, jnp.asarray(spelled),
                                      valid=jnp.asarray(spelled_valid))
  keep = np.r_[0:at, at + 3:11]
  np.testing.assert_allclose(np.asarray(got)[0][valid], np.asarray(reference)[0, keep][valid],
                             atol=1e-5)


METHODS = {
    "prompt_tuning": lambda: prompts.PromptTuning(4),
    "smop": lambda: prompts.SMoP(2, 3),
    "residual": lambda: prompts.ResidualPrompt(4, bottleneck=8),
    "residual_smop": lambda: prompts.ResidualSMoP(num_prompts=2, length=3, bottleneck=8),
    "dept": lambda: prompts.DePT(3, max_length=32, rank=2),
    "attempt": lambda: prompts.Attempt(
        np.random.RandomState(0).normal(0, 1, (2, 3, CONFIG.emb_dim)), bottleneck=8),
    "mpt": lambda: prompts.MultitaskPrompt(length=4, num_tasks=2),
    "ulpt": lambda: prompts.ULPT(4, rank=4),
    "prefix_tuning": lambda: prompts.PrefixTuning(3, attention=("decoder",)),
    "prefix_tuning_mlp": lambda: prompts.PrefixTuning(3, attention=("decoder",), projection=True,
                                                      projection_dim=8),
    "ptuning_v2": lambda: prompts.PTuningV2(3, stacks=("decoder",)),
}


@pytest.mark.parametrize("config_name", ["decoder_tiny_llama", "decoder_tiny_gemma3"])
def test_ptuning_v2_equals_tokens_in_front_of_every_layer(config_name):
  """P-tuning v2 on a decoder: layer l run on [P_l; h] (P_l at positions 0..L-1, causal,
  sliding windows included) with the prompt's outputs discarded gives the logits the network
  computes from P_l's prefixes."""
  from spot_jax.backbones.decoder import layers  # pylint: disable=g-import-not-at-top
  config = config_by_name(config_name)
  length, rows = 3, np.array([[2, 40, 41, 42, 43, 44, 45, 46, 47], [2, 50, 51, 52, 53, 54, 55,
                                                                      56, 57]], np.int32)
  model = models.DecoderOnlyModel(DecoderLM(config, prompt=prompts.PTuningV2(
      length, stacks=("decoder",))))
  frozen = models.unbox(model.init_backbone(jax.random.PRNGKey(0), model.dummy_batch(8, 4)))
  tokens = np.random.RandomState(1).normal(0, 1, (config.num_layers, length, config.emb_dim))
  got = DecoderLM(config, prompt=model.module.prompt).apply(
      {"params": {**frozen, "prompt": {"decoder_tokens": jnp.asarray(tokens, jnp.float32)}}},
      jnp.asarray(rows))

  def explicit(net, ids):
    x, (batch, width) = net.embed(ids), ids.shape
    pos = jnp.broadcast_to(jnp.arange(length + width), (batch, length + width))
    for i, layer in enumerate(net.layers):
      window = config.sliding_window if config.layer_type(i) == "sliding" else None
      mask = layers.attention_mask(pos, pos, jnp.ones(pos.shape, bool), window)
      prompt = jnp.broadcast_to(jnp.asarray(tokens[i], x.dtype), (batch, length, x.shape[-1]))
      x = layer(jnp.concatenate([prompt, x], axis=1), pos, mask)[0][:, length:]
    x = net.final_norm(x)
    out = (jnp.einsum("bte,ve->btv", x, net.table()) if config.tie_word_embeddings
           else net.logits_dense(x))
    return layers.softcap(out.astype(jnp.float32), config.final_logit_softcap)

  want = DecoderLM(config).apply({"params": frozen}, jnp.asarray(rows), method=explicit)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)
  assert np.max(np.abs(np.asarray(got) - np.asarray(DecoderLM(config).apply(
      {"params": frozen}, jnp.asarray(rows))))) > 1e-3  # the prompt changes the logits


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_trains_a_step_on_the_decoder(name, task_name):
  model = _model(METHODS[name]())
  checks.check_backbone_kind(model)
  frozen = models.unbox(model.init_backbone(jax.random.PRNGKey(0), model.dummy_batch(24, 4)))
  start = models.unbox(model.init_prompt(jax.random.PRNGKey(1), frozen, model.dummy_batch(24, 4)))
  batch = _batches(task_name, "train", 1)[0]

  def loss(p):
    return model.loss_fn(models.merge_params(frozen, p), batch, jax.random.PRNGKey(2))[0]

  value, grads = jax.jit(jax.value_and_grad(loss))(start)
  assert np.isfinite(float(value))
  norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(grads)]
  assert all(np.isfinite(norms)) and max(norms) > 0, norms


@pytest.mark.parametrize("prompt, message", [
    (lambda: prompts.PromptTuning(4, placement="suffix"), "placement='suffix' puts the prompt"),
    (lambda: prompts.PrefixTuning(3), "has no 'encoder' attention"),
    (lambda: prompts.PTuningV2(3), r"PTuningV2.stacks=\('encoder',\): a decoder-only model"),
    (lambda: prompts.PrefixTuning(3, attention=("decoder",), layout="peft"), "layout='peft'"),
])
def test_a_method_that_cannot_apply_is_refused_in_one_line(tmp_path, task_name, prompt, message):
  with pytest.raises(ConfigError, match=message) as info:
    _train(tmp_path / "run", task_name, 2, model=_model(prompt()))
  assert "\n" not in str(info.value)
  assert not (tmp_path / "run").exists()


def test_a_task_vocabulary_beyond_the_table_is_refused(tmp_path, task_name):
  small = models.DecoderOnlyModel(DecoderLM(CONFIG.replace(vocab_size=200),
                                            prompt=prompts.PromptTuning(4)), eos_id=1)
  with pytest.raises(ConfigError, match="vocabulary has 259 ids but the model's embedding table "
                                        "has 200 rows") as info:
    _train(tmp_path / "run", task_name, 2, model=small)
  assert "\n" not in str(info.value)
  assert not (tmp_path / "run").exists()


def test_prefix_tuning_exports_the_decoder_prefixes(tmp_path, task_name):
  model = _model(prompts.PrefixTuning(3, attention=("decoder",)))
  result = _train(tmp_path / "prefix", task_name, 2, model=model)
  record = np.load(tmp_path / "prefix" / "prompts" / "prompt_step_2.npy")
  assert record.dtype.names == ("decoder",)
  assert record["decoder"].shape == (CONFIG.num_layers, 2, 3, CONFIG.num_kv_heads,
                                     CONFIG.head_dim)
  flat = np.asarray(jax.device_get(result.state.params["prompt"]["prefix"]))
  np.testing.assert_array_equal(record["decoder"][1, 0], flat.reshape(3, -1, 2, 8)[:, 2])


@pytest.mark.parametrize("config_name, prompt", [
    ("decoder_tiny_llama", lambda: prompts.PromptTuning(3)),
    ("decoder_tiny_gemma3", lambda: prompts.PromptTuning(3, placement="after_bos")),
    ("decoder_tiny_gemma3", lambda: prompts.PrefixTuning(2, attention=("decoder",))),
    ("decoder_tiny_llama", lambda: prompts.SMoP(num_prompts=3, length=2, router_init=(
        jax.nn.initializers.normal(3.0)))),
    ("decoder_tiny_gemma3", lambda: prompts.DePT(2, max_length=16, rank=2)),
    ("decoder_tiny_llama", lambda: prompts.Attempt(source_prompts=np.random.RandomState(3).normal(
        0, 1, (2, 3, CONFIG.emb_dim)).astype(np.float32), bottleneck=4)),
])
def test_label_scores_from_one_prefix_pass_equal_whole_sequences(config_name, prompt):
  """Rank classification reads one cache of [BOS, inputs] per row; each label's score equals the
  score of inputs ++ label run as one sequence (Gemma 3's sliding layers included): a prompt
  that reads the row (router, pooling, DePT's offsets) reads the inputs alone in both, as in
  training and before decoding."""
  model = models.DecoderOnlyModel(DecoderLM(config_by_name(config_name), prompt=prompt()))
  frozen = models.unbox(model.init_backbone(jax.random.PRNGKey(0), model.dummy_batch(8, 4)))
  prompt_params = models.unbox(model.init_prompt(jax.random.PRNGKey(1), frozen,
                                                 model.dummy_batch(8, 4)))
  rs = np.random.RandomState(0)  # every leaf off its initial value (DePT's B starts at zero)
  params = models.merge_params(frozen, jax.tree.map(
      lambda v: np.asarray(v) + rs.normal(0, 0.3, np.shape(v)).astype(np.float32), prompt_params))
  inputs = np.array([[40, 41, 42, 43, 44, 45, 1, 0], [50, 1, 0, 0, 0, 0, 0, 0]], np.int32)
  labels = np.array([[60, 61, 1, 0], [62, 1, 0, 0], [63, 64, 65, 1]], np.int32)
  got = np.asarray(jax.jit(model.classify_batch)(params, inputs, labels))
  want = np.stack([np.asarray(model.score_batch(params, {
      "encoder_input_tokens": inputs,
      "decoder_target_tokens": np.broadcast_to(label, (2, 4))})) for label in labels], axis=1)
  np.testing.assert_allclose(got, want, atol=1e-4)

"""Id 0 is a token: a Llama-3-style byte-level BPE `tokenizer.json` built here gives "!" id 0
(as Llama 3's and Qwen's do), and a tiny random Llama (transformers) reads texts full of "!".
Token ids, validity and label log-likelihoods equal transformers' (float32, 1e-5) in training
(the trainer's loss on a batch of a real seqio task read with `TokenizerVocabulary`) and in
inference (`score_batch`, `classify_batch`, greedy `predict_batch`), with and without a soft
prompt. Nothing is downloaded."""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
seqio = pytest.importorskip("seqio")

from spot_jax import data  # noqa: E402
from spot_jax import prompts  # noqa: E402
from spot_jax.backbones.decoder.network import DecoderLM  # noqa: E402
from spot_jax.models.decoder_only import DecoderOnlyModel  # noqa: E402
from spot_jax.prompts import initializers  # noqa: E402
from tests.helpers import bang_token as bang  # noqa: E402

TOL = 1e-5
ROWS = [("wow! great!!", "yes!"), ("no way", "!no"), ("!!!", "ok")]
LENGTHS = {"inputs": 14, "targets": 6}
PROMPT = 3


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> pathlib.Path:
  return bang.write_tokenizer(tmp_path_factory.mktemp("llama3_tok"))


@pytest.fixture(scope="module")
def hf_tokenizer(hf_dir):
  return transformers.AutoTokenizer.from_pretrained(str(hf_dir))


@pytest.fixture(scope="module")
def llama(hf_tokenizer):
  """(torch model, DecoderConfig, spot-jax params) of a tiny random Llama over that vocabulary."""
  return bang.tiny_llama(hf_tokenizer)


@pytest.fixture(scope="module")
def task_name(hf_dir, tmp_path_factory) -> str:
  """A seqio task of ROWS (TSV) tokenized with `TokenizerVocabulary` over the directory."""
  from tasks.vocab import TokenizerVocabulary  # pylint: disable=g-import-not-at-top
  path = tmp_path_factory.mktemp("bang") / "train.tsv"
  path.write_text("".join(f"{i}\t{t}\n" for i, t in ROWS))
  name = "test_bang_token"
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  vocab = TokenizerVocabulary(str(hf_dir))

  def parse(line):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    fields = tf.strings.split(line, "\t")
    return {"inputs": fields[0], "targets": fields[1]}

  seqio.TaskRegistry.add(
      name, source=seqio.TextLineDataSource({"train": str(path)},
                                            num_input_examples={"train": len(ROWS)}),
      preprocessors=[seqio.map_over_dataset(parse), seqio.preprocessors.tokenize,
                     seqio.preprocessors.append_eos_after_trim],
      output_features={"inputs": seqio.Feature(vocab, add_eos=True),
                       "targets": seqio.Feature(vocab, add_eos=True)})
  return name


def _prompt(cfg, with_prompt: bool):
  if not with_prompt:
    return None
  return prompts.PromptTuning(length=PROMPT, prompt_init=initializers.uniform())


def _prompt_params(cfg, params, with_prompt: bool):
  if not with_prompt:
    return params, None
  prompt = np.random.RandomState(1).normal(0, 0.5, (PROMPT, cfg.emb_dim)).astype(np.float32)
  return {**params, "prompt": {"prompt": jnp.asarray(prompt)}}, prompt


_hf_row_log_probs = bang.row_log_probs


def _reference(model, hf_tokenizer, prompt):
  """Per row: (input ids with EOS, target ids with EOS, transformers' per-target log-probs)."""
  out = []
  for text, target in ROWS:
    inputs = hf_tokenizer(text, add_special_tokens=False)["input_ids"] + [hf_tokenizer.eos_token_id]
    targets = hf_tokenizer(target, add_special_tokens=False)["input_ids"] + [
        hf_tokenizer.eos_token_id]
    ids = [hf_tokenizer.bos_token_id] + inputs + targets
    out.append((inputs, targets, _hf_row_log_probs(model, ids, 1 + len(inputs), prompt)))
  return out


@pytest.mark.parametrize("with_prompt", [False, True])
def test_training_batch_matches_transformers(llama, hf_tokenizer, task_name, with_prompt):
  model, cfg, params = llama
  ds = data.DatasetConfig(task_name, LENGTHS, batch_size=len(ROWS), shuffle=False,
                          feature_layout="decoder_only")
  batch = next(data.train_batches(ds))
  reference = _reference(model, hf_tokenizer, None)
  for row, (inputs, targets, _) in enumerate(reference):
    assert 0 in inputs + targets  # "!" reaches the batch as id 0 ...
    n = len(inputs) + len(targets)
    np.testing.assert_array_equal(batch["decoder_target_tokens"][row, :n], inputs + targets)
    np.testing.assert_array_equal(batch["decoder_target_valid"][row],  # ... and is valid
                                  np.arange(batch["decoder_target_valid"].shape[1]) < n)
  params, prompt = _prompt_params(cfg, params, with_prompt)
  reference = _reference(model, hf_tokenizer, prompt)
  lm = DecoderOnlyModel(DecoderLM(cfg, prompt=_prompt(cfg, with_prompt)), z_loss=0.0,
                        loss_normalizing_factor=None)
  logits = lm.logits(params, batch)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  picked = np.take_along_axis(np.asarray(logp), batch["decoder_target_tokens"][..., None],
                              -1)[..., 0]
  want_total = 0.0
  for row, (inputs, targets, want) in enumerate(reference):
    got = picked[row, len(inputs):len(inputs) + len(targets)]
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    want_total += want.sum()
  loss, metrics = lm.loss_fn(params, batch, None, enable_dropout=False)
  np.testing.assert_allclose(float(loss), -want_total, rtol=TOL, atol=TOL)
  del metrics


def _padded(rows: list[list[int]], width: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded with `pad` (an id the model must never read), and the validity."""
  tokens = np.full((len(rows), width), pad, np.int32)
  valid = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, :len(r)], valid[i, :len(r)] = r, True
  return tokens, valid


def _check_greedy(got, model, hf_tokenizer, prompt, reference, steps: int) -> None:
  """`got` [B, >= steps] equals transformers' greedy continuation of each reference row (after
  the soft `prompt`, if any), up to its EOS."""
  for b, (row_inputs, _, _) in enumerate(reference):
    ids = [hf_tokenizer.bos_token_id] + row_inputs
    with torch.no_grad():
      for _ in range(steps):
        embeds = model.get_input_embeddings()(torch.tensor([ids]))
        if prompt is not None:
          embeds = torch.cat([torch.tensor(prompt)[None], embeds], dim=1)
        ids.append(int(model(inputs_embeds=embeds).logits[0, -1].argmax()))
    want = ids[1 + len(row_inputs):]
    if hf_tokenizer.eos_token_id in want:
      want = want[:want.index(hf_tokenizer.eos_token_id) + 1]
    np.testing.assert_array_equal(got[b, :len(want)], want)


@pytest.mark.parametrize("with_prompt", [False, True])
def test_inference_matches_transformers(llama, hf_tokenizer, with_prompt):
  model, cfg, params = llama
  params, prompt = _prompt_params(cfg, params, with_prompt)
  reference = _reference(model, hf_tokenizer, prompt)
  lm = DecoderOnlyModel(DecoderLM(cfg, prompt=_prompt(cfg, with_prompt)))
  # Padding with id 0 ("!") must be masked out, not read: results cannot depend on the pad id.
  for pad in (0, 7):
    inputs, input_valid = _padded([r[0] for r in reference], LENGTHS["inputs"], pad)
    targets, target_valid = _padded([r[1] for r in reference], LENGTHS["targets"], pad)
    scores = lm.score_batch(params, {"encoder_input_tokens": inputs,
                                     "encoder_input_valid": input_valid,
                                     "decoder_target_tokens": targets,
                                     "decoder_target_valid": target_valid})
    np.testing.assert_allclose(np.asarray(scores), [r[2].sum() for r in reference], rtol=0,
                               atol=TOL)
    # Rank classification: every row's own target as a label; C = B labels.
    labels = lm.classify_batch(params, inputs, targets, input_valid=input_valid,
                               label_valid=target_valid)
    for b, (row_inputs, _, _) in enumerate(reference):
      for c, (_, label, _) in enumerate(reference):
        ids = [hf_tokenizer.bos_token_id] + row_inputs + label
        want = _hf_row_log_probs(model, ids, 1 + len(row_inputs), prompt).sum()
        np.testing.assert_allclose(float(labels[b, c]), want, rtol=0, atol=TOL)
    # Greedy decoding equals transformers' greedy continuation.
    steps = 4
    got = np.asarray(lm.predict_batch(params, inputs, steps, input_valid=input_valid))
    _check_greedy(got, model, hf_tokenizer, prompt, reference, steps)


def test_serving_engine_matches_transformers(llama, hf_tokenizer):
  """The server's jitted mixed-prompt functions (what `infer` and the HTTP server run) with
  validity masks: scores, class log-likelihoods and greedy tokens equal transformers'."""
  from spot_jax.serve.catalog import prompt_loaders  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.catalog.table import PromptTable  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.model.server import DecodeSettings, Server  # pylint: disable=g-import-not-at-top
  model, cfg, params = llama
  full, prompt = _prompt_params(cfg, params, True)
  entry = prompt_loaders.from_module("pt", _prompt(cfg, True), full["prompt"])
  steps = 4
  server = Server(DecoderLM(cfg), params, PromptTable([entry], cfg.emb_dim),
                  settings=DecodeSettings(steps, "greedy", eos_id=hf_tokenizer.eos_token_id))
  reference = _reference(model, hf_tokenizer, prompt)
  names = ["pt"] * len(reference)
  for pad in (0, 7):
    inputs, input_valid = _padded([r[0] for r in reference], LENGTHS["inputs"], pad)
    targets, target_valid = _padded([r[1] for r in reference], LENGTHS["targets"], pad)
    scores = server.score(names, inputs, targets, valid=input_valid, target_valid=target_valid)
    np.testing.assert_allclose(scores, [r[2].sum() for r in reference], rtol=0, atol=TOL)
    labels = server.classify(names, inputs, targets, valid=input_valid, label_valid=target_valid)
    np.testing.assert_allclose(np.diag(labels), [r[2].sum() for r in reference], rtol=0,
                               atol=TOL)
    got, _ = server.generate(names, inputs, valid=input_valid)
    _check_greedy(got, model, hf_tokenizer, prompt, reference, steps)

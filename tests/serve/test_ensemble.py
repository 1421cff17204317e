"""Prompt ensembles (one batched pass, vote and mean log-prob) and nearest-token interpretation."""
from __future__ import annotations

import numpy as np
import pytest

from spot_jax.errors import ConfigError
from spot_jax.serve.model import ensemble
from spot_jax.serve.catalog import interpret
from spot_jax.serve.model.server import DecodeSettings, Server
from spot_jax.serve.catalog.table import PromptTable, ServedPrompt
from spot_jax.backbones.t5 import Transformer, config_by_name
from tests.helpers.prompt_train import frozen_backbone

CONFIG = config_by_name("t5_1_1_test", dropout_rate=0.0)


def test_majority_vote_on_hand_made_predictions():
  assert ensemble.majority_vote(["pos", "neg", "pos"]) == "pos"
  assert ensemble.majority_vote(["a", "b", "c", "b"]) == "b"
  # A tie goes to the answer of higher mean score, then to the earliest prompt.
  assert ensemble.majority_vote(["a", "b", "b", "a"], [-5.0, -1.0, -2.0, -4.0]) == "b"
  assert ensemble.majority_vote(["a", "b"], [-1.0, -1.0]) == "a"
  assert ensemble.majority_vote(["a", "b"]) == "a"
  with pytest.raises(ConfigError):
    ensemble.majority_vote([])


def test_mean_logprob_choice_and_report():
  ll = np.log(np.array([[[0.9, 0.1], [0.2, 0.8], [0.3, 0.7]]]))  # [B=1, N=3, C=2]
  # The vote would say label 1 (two prompts of three); mean log-prob also says 1 here:
  assert ensemble.mean_logprob_choice(ll).tolist() == [1]
  ll2 = np.log(np.array([[[0.99, 0.01], [0.45, 0.55], [0.45, 0.55]]]))
  assert ensemble.mean_logprob_choice(ll2).tolist() == [0]  # one confident prompt outweighs two
  per_prompt = [["x", "x", "y"], ["y", "x", "y"], ["z", "z", "z"], ["w", "q", "w"]]
  combined = [ensemble.majority_vote(p) for p in per_prompt]
  assert combined == ["x", "y", "z", "w"]
  rep = ensemble.report(["p0", "p1", "p2"], per_prompt, combined, ["x", "y", "z", None])
  assert rep["num_scored"] == 3 and rep["ensemble_accuracy"] == 1.0
  assert rep["per_prompt_accuracy"] == {"p0": 1.0, "p1": pytest.approx(2 / 3),
                                        "p2": pytest.approx(2 / 3)}
  assert rep["mean_accuracy"] == pytest.approx(7 / 9)
  assert rep["best_single"] == {"prompt": "p0", "accuracy": 1.0}


@pytest.fixture(scope="module")
def server():
  rs = np.random.RandomState(0)
  entries = [ServedPrompt(f"p{i}", rs.normal(0, 2.0, (2 + i, CONFIG.emb_dim))) for i in range(3)]
  settings = DecodeSettings(max_decode_length=5)
  return Server(Transformer(CONFIG), frozen_backbone(CONFIG, 0),
                PromptTable(entries, CONFIG.emb_dim),
                settings=settings)


def test_ensemble_is_one_batched_pass(server):
  rs = np.random.RandomState(1)
  tokens = rs.randint(2, CONFIG.vocab_size, (4, 7)).astype(np.int32)
  tokens[1, 3:] = 0
  names = server.table.names
  before = server.forward_passes
  out, scores = ensemble.generate(server, names, tokens)
  assert server.forward_passes - before == 1
  assert out.shape == (4, 3, 5) and scores.shape == (4, 3)
  # Each (input, prompt) cell equals that prompt run alone on that input.
  single_names = [n for _ in range(4) for n in names]
  alone, _ = server.generate(single_names, np.repeat(tokens, 3, axis=0))
  np.testing.assert_array_equal(out.reshape(12, -1), alone)
  # The prompts disagree somewhere, so the vote is not trivially unanimous.
  assert len({tuple(r) for r in out.reshape(12, -1)}) > 1
  labels = np.array([[5, 1, 0], [9, 12, 1]], np.int32)
  before = server.forward_passes
  ll = ensemble.classify(server, names, tokens, labels)
  assert server.forward_passes - before == 1 and ll.shape == (4, 3, 2)
  rescored = ensemble.rescore(server, names, tokens, out)
  assert rescored.shape == (4, 3, 3)
  # A prompt's own greedy answer scores its greedy log-probability (where the random model did
  # not emit the padding id 0, which scoring reads as padding).
  def clean(row):
    stop = list(row).index(1) if 1 in row else len(row)
    return bool(np.all(row[:stop] > 0))
  mask = np.array([[clean(r) for r in b] for b in out])
  assert mask.sum() >= 8
  np.testing.assert_allclose(np.einsum("bnn->bn", rescored)[mask], scores[mask], atol=1e-4)


def test_nearest_tokens_of_vocabulary_rows():
  embedding = np.asarray(frozen_backbone(CONFIG, 0)["token_embedder"]["embedding"])
  rows = [5, 17, 42, 101]
  ids, sims = interpret.nearest_tokens(embedding[rows], embedding, k=5)
  assert ids[:, 0].tolist() == rows
  np.testing.assert_allclose(sims[:, 0], 1.0, atol=1e-6)
  assert np.all(np.diff(sims, axis=1) <= 1e-12)
  # Scaled rows have the same direction: still first. SMoP prompts are read one by one.
  smop = ServedPrompt("smop", np.stack([3.0 * embedding[rows[:2]], 0.5 * embedding[rows[2:]]]),
                      np.zeros((CONFIG.emb_dim, 2)), "linear")
  records = interpret.interpret(smop, embedding, k=3)
  assert [(r["sub_prompt"], r["position"], r["neighbours"][0]["id"]) for r in records] == [
      (0, 0, 5), (0, 1, 17), (1, 0, 42), (1, 1, 101)]
  table = interpret.format_table(records)
  assert table.splitlines()[1].startswith("smop\t0\t0\t<5> (1.000)")


def test_interpret_reads_the_folded_residual_prompt():
  from spot_jax.prompts import ResidualPrompt  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.catalog import prompt_loaders  # pylint: disable=g-import-not-at-top
  from tests.helpers.prompt_train import create_prompt_params  # pylint: disable=g-import-not-at-top
  module = ResidualPrompt(3, bottleneck=8)
  params = create_prompt_params(Transformer(CONFIG, prompt=module), frozen_backbone(CONFIG, 0))
  entry = prompt_loaders.from_module("r", module, params)
  folded = np.asarray(module.fold(params)["prompt"])
  assert np.array_equal(entry.prompts[0], folded) and not np.allclose(folded, params["prompt"])
  embedding = np.asarray(frozen_backbone(CONFIG, 0)["token_embedder"]["embedding"])
  ids, _ = interpret.nearest_tokens(folded, embedding, 4)
  records = interpret.interpret(entry, embedding, 4)
  assert [[n["id"] for n in r["neighbours"]] for r in records] == ids.tolist()


def test_read_examples_text_jsonl_stdin(tmp_path):
  import io  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.model import inputs  # pylint: disable=g-import-not-at-top
  (tmp_path / "in.txt").write_text("first input\n\n  second  \n")
  assert [e.input for e in inputs.read_examples(str(tmp_path / "in.txt"))] == ["first input",
                                                                                "second"]
  got = inputs.read_examples("-", io.StringIO('{"input": "x", "prompt": "p", "id": 3}\n'))
  assert (got[0].input, got[0].prompt, got[0].id, got[0].target) == ("x", "p", 3, None)
  assert inputs.read_examples("-", io.StringIO("plain text\n"))[0].input == "plain text"
  (tmp_path / "bad.jsonl").write_text('{"input": "x", "prompt": 3}\n')
  with pytest.raises(ConfigError, match="line 1: \"prompt\" must be a string"):
    inputs.read_examples(str(tmp_path / "bad.jsonl"))
  (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
  with pytest.raises(ConfigError, match="cannot read --input"):
    inputs.read_examples(str(tmp_path / "latin.txt"))
  with pytest.raises(ConfigError, match="cannot read --input"):
    inputs.read_examples(str(tmp_path / "missing.txt"))
  vocab = __import__("seqio").ByteVocabulary()
  tokens, valid, cut = inputs.tokenize(vocab, ["ab", "abcdef"], 4)
  assert cut == [(1, 7)] and tokens.tolist() == [[100, 101, 1, 0], [100, 101, 102, 1]]
  assert valid.tolist() == [[True, True, True, False], [True] * 4]
  assert inputs.decode(vocab, np.array([100, 101, 1, 0])) == "ab"

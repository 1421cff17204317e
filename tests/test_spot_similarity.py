"""SPoT similarity, weighted-average initialisation, expert compression and report statistics
against plain NumPy references (loops over token pairs, textbook formulas)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from spot_jax.spot import experts, similarity
from spot_jax.spot import figures
from spot_jax.spot import grid


def _cos(a, b):
  na, nb = np.linalg.norm(a), np.linalg.norm(b)
  return 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))


def ref_average(e1, e2):
  return _cos(e1.mean(axis=0), e2.mean(axis=0))


def ref_per_token(e1, e2):
  return float(np.mean([_cos(a, b) for a in e1 for b in e2]))


REFS = {"average": ref_average, "per_token": ref_per_token}


def _library(rs):
  base = rs.normal(size=(5, 8))
  orth = np.zeros((3, 8))
  orth[:, 0] = 1.0
  orth2 = np.zeros((4, 8))
  orth2[:, 1] = 2.5
  return {
      "identical": base.copy(),
      "opposite": -base,
      "scaled": 3.0 * base,
      "longer": rs.normal(size=(11, 8)),
      "single_token": rs.normal(size=(1, 8)),
      "orth_a": orth,
      "orth_b": orth2,
      "with_zero_token": np.concatenate([rs.normal(size=(2, 8)), np.zeros((1, 8))]),
  }, base


@pytest.mark.parametrize("metric", similarity.METRICS)
def test_similarities_equal_numpy_reference(metric):
  lib, target = _library(np.random.RandomState(0))
  got = similarity.similarities(target, list(lib.values()), metric)
  want = [REFS[metric](target, p) for p in lib.values()]
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
  named = dict(zip(lib, got))
  if metric == "average":  # mean tokens: identical / scaled -> 1, opposite -> -1
    assert named["identical"] == pytest.approx(1.0, abs=1e-12)
    assert named["scaled"] == pytest.approx(1.0, abs=1e-12)
    assert named["opposite"] == pytest.approx(-1.0, abs=1e-12)
  else:  # per-token: identical prompt averages its own token cosines, opposite is its negative
    assert named["opposite"] == pytest.approx(-named["identical"], abs=1e-12)
  # orthogonal prompts (different lengths) have similarity 0 under both metrics
  assert similarity.similarities(lib["orth_a"], [lib["orth_b"]], metric)[0] == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("metric", similarity.METRICS)
def test_pairwise_matrix_is_the_reference_for_every_pair(metric):
  lib, _ = _library(np.random.RandomState(1))
  prompts = list(lib.values())
  got = similarity.pairwise(prompts, metric)
  want = np.array([[REFS[metric](a, b) for b in prompts] for a in prompts])
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
  np.testing.assert_allclose(got, got.T, atol=1e-15)


def test_per_token_identical_prompt_of_one_direction_is_one():
  p = np.tile(np.arange(1.0, 5.0), (6, 1))
  assert similarity.similarities(p, [p * 2], "per_token")[0] == pytest.approx(1.0, abs=1e-12)


def test_rank_is_descending_and_stable():
  np.testing.assert_array_equal(similarity.rank(np.array([0.2, 0.9, 0.2, -1.0, 0.9])), [1, 4, 0, 2, 3])


def test_similarity_rejects_mixed_widths_and_bad_shapes():
  with pytest.raises(ValueError, match="different embedding sizes"):
    similarity.similarities(np.ones((2, 4)), [np.ones((2, 5))], "average")
  with pytest.raises(ValueError, match=r"\[length, embed\]"):
    similarity.similarities(np.ones(4), [np.ones((2, 4))], "average")
  with pytest.raises(ValueError, match="valid: average, per_token"):
    similarity.similarities(np.ones((2, 4)), [np.ones((2, 4))], "cosine")


def test_weighted_average_is_the_formula():
  rs = np.random.RandomState(2)
  prompts = [rs.normal(size=(4, 6)) for _ in range(3)]
  sims = np.array([0.9, 0.5, 0.1])
  want = sum((s / sims.sum()) * p for s, p in zip(sims, prompts))
  got = similarity.weighted_average(prompts, sims)
  assert got.dtype == np.float32
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(similarity.weighted_average(prompts[:1], [0.3]), prompts[0], rtol=1e-6)
  with pytest.raises(ValueError, match="positive"):
    similarity.weighted_average(prompts[:2], [0.5, -0.5])
  with pytest.raises(ValueError, match="2 prompts but 3"):
    similarity.weighted_average(prompts[:2], sims)


def test_expert_compression():
  p = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
  np.testing.assert_array_equal(experts.compress(p, 3, "first"), p[:3])
  pooled = experts.compress(p, 3, "mean_pool")  # segments [0,2) [2,4) [4,7)
  np.testing.assert_allclose(pooled, [p[0:2].mean(0), p[2:4].mean(0), p[4:7].mean(0)])
  np.testing.assert_allclose(experts.compress(p, 7, "mean_pool"), p)
  np.testing.assert_allclose(experts.compress(p, 1, "mean_pool")[0], p.mean(0), rtol=1e-6)
  assert experts.expert_prompts([p, p + 1], 2, "first").shape == (2, 2, 3)
  with pytest.raises(ValueError, match="1 <= expert length <= 7"):
    experts.compress(p, 8, "first")
  with pytest.raises(ValueError, match="valid: first, mean_pool"):
    experts.compress(p, 2, "last")


def test_relative_error_reduction():
  assert grid.relative_error_reduction(80.0, 60.0, 100.0) == pytest.approx(0.5)
  assert grid.relative_error_reduction(50.0, 60.0, 100.0) == pytest.approx(-0.25)
  assert grid.relative_error_reduction(90.0, 100.0, 100.0) is None


def _rows():
  rs = np.random.RandomState(3)
  rows = []
  for t in ("t1", "t2"):
    for seed in (0, 1):
      base = float(rs.uniform(40, 60))
      rows.append({"target": t, "seed": seed, "init": "baseline", "score": base, "baseline_score": base,
                   "relative_error_reduction": 0.0, "similarity_average": None})
      for s in ("a", "b", "c", "d"):
        score = float(rs.uniform(30, 80))
        rows.append({"target": t, "seed": seed, "init": s, "score": score, "baseline_score": base,
                     "relative_error_reduction": grid.relative_error_reduction(score, base, 100.0),
                     "similarity_average": float(rs.uniform(-1, 1))})
  return rows


def test_correlations_match_scipy_on_the_same_points():
  rows = _rows()
  got = figures.correlations(rows, "t1", "average")
  pts = [(r["similarity_average"], r["relative_error_reduction"]) for r in rows
         if r["target"] == "t1" and r["init"] != "baseline"]
  x, y = np.array(pts).T
  assert got["n"] == 8
  r = np.corrcoef(x, y)[0, 1]
  assert got["pearson_r"] == pytest.approx(r, abs=1e-12)
  assert got["pearson_p"] == pytest.approx(stats.pearsonr(x, y)[1], abs=1e-12)
  assert got["spearman_r"] == pytest.approx(np.corrcoef(stats.rankdata(x), stats.rankdata(y))[0, 1], abs=1e-12)


def test_retrieval_table_against_hand_computation():
  rows = _rows()
  table = {r["method"]: r for r in figures.retrieval_table(rows, ["a", "b", "c", "d"], "average", ks=(1, 3))}
  cases = {}
  for r in rows:
    cases.setdefault((r["target"], r["seed"]), {})[r["init"]] = r
  base = np.mean([c["baseline"]["score"] for c in cases.values()])
  oracle = np.mean([max(c[s]["score"] for s in "abcd") for c in cases.values()])
  top1 = np.mean([max((c[s] for s in "abcd"), key=lambda r: r["similarity_average"])["score"]
                  for c in cases.values()])
  assert table["baseline"]["mean_score"] == pytest.approx(base)
  assert table["oracle"]["mean_score"] == pytest.approx(oracle)
  assert table["best_of_top_1"]["mean_score"] == pytest.approx(top1)
  assert table["best_of_top_1"]["oracle_gain_kept"] == pytest.approx((top1 - base) / (oracle - base))
  assert table["best_of_top_1"]["search_space_removed"] == pytest.approx(0.75)
  assert table["best_of_top_3"]["search_space_removed"] == pytest.approx(0.25)
  assert table["oracle"]["oracle_gain_kept"] == pytest.approx(1.0)
  assert table["best_of_top_3"]["mean_score"] <= table["oracle"]["mean_score"] + 1e-12
  assert all(v["cases"] == 4 for v in table.values())


def test_cluster_order_groups_related_tasks():
  sim = np.array([[1, .9, .1, .2], [.9, 1, .15, .1], [.1, .15, 1, .95], [.2, .1, .95, 1]])
  order = list(figures.cluster_order(sim))
  pos = {v: i for i, v in enumerate(order)}
  assert abs(pos[0] - pos[1]) == 1 and abs(pos[2] - pos[3]) == 1
  assert not math.isnan(sim.sum())

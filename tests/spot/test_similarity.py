"""SPoT similarity, weighted-average initialisation, expert compression and report statistics
against plain NumPy references (loops over token pairs, textbook formulas)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from spot_jax.spot import experts, similarity
from spot_jax.spot import report_figures
from spot_jax.spot import study_tables


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
  assert (similarity.similarities(lib["orth_a"], [lib["orth_b"]],
                                  metric)[0] == pytest.approx(0.0, abs=1e-15))


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
  np.testing.assert_array_equal(similarity.rank(np.array([0.2, 0.9, 0.2, -1.0, 0.9])),
                                [1, 4, 0, 2, 3])


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
  assert study_tables.relative_error_reduction(80.0, 60.0, 100.0) == pytest.approx(0.5)
  assert study_tables.relative_error_reduction(50.0, 60.0, 100.0) == pytest.approx(-0.25)
  assert study_tables.relative_error_reduction(90.0, 100.0, 100.0) is None


def _rows(seeds=(0, 1, 2), sources="abcd"):
  rs = np.random.RandomState(3)
  rows = []
  for t in ("t1", "t2"):
    for seed in seeds:
      base = float(rs.uniform(40, 60))
      rows.append({"target": t, "seed": seed, "init": "baseline", "score": base,
                   "baseline_score": base, "relative_error_reduction": 0.0,
                   "similarity_average": None})
      for s in sources:
        score = float(rs.uniform(30, 80))
        rows.append({
            "target": t, "seed": seed, "init": s, "score": score, "baseline_score": base,
            "relative_error_reduction": study_tables.relative_error_reduction(score, base, 100.0),
            "similarity_average": float(rs.uniform(-1, 1))})
  return rows


def test_correlations_match_scipy_on_the_seed_averaged_points():
  rows = _rows(sources="abcdef")
  got = study_tables.correlations(rows, ["t1", "t2"], list("abcdef"), "average")
  mean = lambda t, s, key: np.mean([r[key] for r in rows if r["target"] == t and r["init"] == s])
  x = [mean("t1", s, "similarity_average") for s in "abcdef"]
  y = [mean("t1", s, "relative_error_reduction") for s in "abcdef"]
  assert got["t1"]["n"] == 6 and got["all"]["n"] == 12
  assert got["t1"]["pearson"].mean == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
  assert got["t1"]["spearman"].mean == pytest.approx(
      np.corrcoef(stats.rankdata(x), stats.rankdata(y))[0, 1], abs=1e-12)
  assert got["t1"]["pearson"].resolved and got["t1"]["pearson"].low <= got["t1"]["pearson"].mean
  few = study_tables.correlations(_rows(sources="abc"), ["t1"], list("abc"), "average")["t1"]
  assert few["n"] == 3 and not few["pearson"].resolved and "too few" in few["pearson"].why
  assert report_figures.describe(few).endswith("n=3: too few points for an interval")


def test_retrieval_table_against_hand_computation():
  rows = _rows()
  table = {r["method"]: r
           for r in study_tables.retrieval_table(rows, ["a", "b", "c", "d"], "average", ks=(1, 3))}
  cases = {}
  for r in rows:
    cases.setdefault((r["target"], r["seed"]), {})[r["init"]] = r
  keys = sorted(cases)
  base = [cases[k]["baseline"]["score"] for k in keys]
  oracle = [max(cases[k][s]["score"] for s in "abcd") for k in keys]
  top1 = [max((cases[k][s] for s in "abcd"), key=lambda r: r["similarity_average"])["score"]
          for k in keys]
  per_seed = [np.mean([v for k, v in zip(keys, top1) if k[1] == seed]) for seed in (0, 1, 2)]
  assert table["best_of_top_1"]["mean_score"].mean == pytest.approx(np.mean(per_seed))
  want_half = stats.t.ppf(0.975, 2) * np.std(per_seed, ddof=1) / np.sqrt(3)
  assert table["best_of_top_1"]["mean_score"].half_width == pytest.approx(want_half)
  share = (np.mean(top1) - np.mean(base)) / (np.mean(oracle) - np.mean(base))
  got = table["best_of_top_1"]["oracle_gain_kept"]
  assert got.mean == pytest.approx(share) and got.resolved and got.low <= share <= got.high
  assert table["oracle"]["oracle_gain_kept"].mean == pytest.approx(1.0)
  assert ((table["best_of_top_1"]["runs"], table["best_of_top_3"]["runs"],
           table["oracle"]["runs"]) == (1, 3, 4))
  assert table["best_of_top_3"]["mean_score"].mean <= table["oracle"]["mean_score"].mean + 1e-12
  assert all(v["cases"] == 6 for v in table.values())
  # below MIN_CASES cases: the share without an interval, and why
  two = {r["method"]: r for r in study_tables.retrieval_table(_rows(seeds=(0, 1))[:10],
                                                              list("abcd"), "average", ks=(1,))}
  assert (two["best_of_top_1"]["cases"] == 2
          and not two["best_of_top_1"]["oracle_gain_kept"].resolved)


def test_short_names_drop_shared_words_and_say_so():
  names = ["spot_toy_sentiment_movies_taskless_v100", "spot_toy_topic_taskless_v100",
           "spot_toy_sentiment_travel_taskless_v100", "spot_toy_sum_taskless_v100"]
  short, caption = report_figures.short_names(names)
  assert list(short.values()) == ["sent_movies", "topic", "sent_travel", "sum"]
  assert "prefix 'spot_toy_'" in caption and "suffix '_taskless_v100'" in caption
  assert "sent = sentiment" in caption
  short, _ = report_figures.short_names(["a_x", "b_x"])
  assert short == {"a_x": "a", "b_x": "b"}


def test_label_colour_contrasts_with_the_cell():
  from matplotlib import colormaps  # pylint: disable=g-import-not-at-top
  assert (report_figures.text_colour((0.0, 0.0, 0.0)) == "white"
          and report_figures.text_colour((1.0, 1.0, 1.0)) == "black")
  rdbu = colormaps["RdBu"]
  assert report_figures.text_colour(rdbu(0.0)) == "white" and report_figures.text_colour(
      rdbu(1.0)) == "white"  # dark ends
  assert report_figures.text_colour(rdbu(0.5)) == "black"  # the light middle
  for value in np.linspace(0, 1, 11):  # every cell's label has a contrast ratio of at least 4.5
    rgb = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rdbu(value)[:3]]
    lum = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]
    ratio = ((lum + 0.05) / 0.05 if report_figures.text_colour(rdbu(value)) == "black"
             else 1.05 / (lum + 0.05))
    assert ratio >= 4.5, (value, ratio)


def test_cluster_order_groups_related_tasks():
  sim = np.array([[1, .9, .1, .2], [.9, 1, .15, .1], [.1, .15, 1, .95], [.2, .1, .95, 1]])
  order = list(report_figures.cluster_order(sim))
  pos = {v: i for i, v in enumerate(order)}
  assert abs(pos[0] - pos[1]) == 1 and abs(pos[2] - pos[3]) == 1
  assert not math.isnan(sim.sum())

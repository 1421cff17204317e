"""Retrieval for a new target task (SPoT section 4) and the baselines it is compared with.

The target's task embedding is its prompt after `embedding_step` steps (a short ordinary run);
the library is ranked by similarity to it (entries of the target task itself are excluded), and
one strategy turns the top-k into a target run:

  best_of_top_k     k target runs, each initialised from one candidate's best prompt; the best
                    on validation is kept
  weighted_average  one run from sum_r alpha_r rho_r, alpha_r = sim_r / sum_l sim_l
  mixture           prompt-tune on an examples-proportional mixture of the top-k sources' data
                    plus the target's (registered at run time), then a target run from it
  smop_experts      SMoP with k experts, expert r initialised from rho_r compressed to l tokens
                    (`experts.py`); its router learns which source to use per input
  smop              SMoP of the same k and l from its usual (sampled-vocabulary) start
  generic           generic SPoT: one prompt on the mixture of every library task, then a
                    target run from it
  baseline          Prompt Tuning from the sampled-vocabulary start

Every run is one ordinary trainer run of the experiment runner, in its own directory
<work_dir>/runs/<label>-<key>, the key being the hash of everything that determines the run
(`keys.run_key`: task, seed, frozen model, lengths, budgets, metric, method and the values of its
starting prompt). A finished run is reused, an unfinished one resumes, and a run of other
settings gets another directory: a retrieval with another k, similarity, library or budget never
replaces an earlier one's runs, and shares the runs they have in common (the target's embedding
run, the baseline). The report goes to <work_dir>/retrieval-<key>.json, keyed the same way by
the retrieval's settings and the library's content (`retrieval_settings`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Callable, Optional, Sequence

import numpy as np

from spot_jax import experiment
from spot_jax import fileio
from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.experiment import RunOutcome, RunRequest
from spot_jax.spot import experts
from spot_jax.spot import keys
from spot_jax.spot import similarity
from spot_jax.spot.library import Entry
from spot_jax.spot import settings as settings_lib
from spot_jax.spot.settings import RunSettings

STRATEGIES = ("best_of_top_k", "weighted_average", "mixture", "smop_experts", "smop", "generic",
              "baseline")
RUNS = "runs"  # <work_dir>/runs/<label>-<run key>: every run of every retrieval in that folder
REPORT = "retrieval-{key}.json"  # <work_dir>/retrieval-<retrieval key>.json: one per retrieval


@dataclasses.dataclass(frozen=True)
class Ranked:
  """A library entry and its similarity to the target."""
  entry: Entry
  similarity: float


@dataclasses.dataclass(frozen=True)
class Options:
  """Retrieval options.

  Attributes:
    k: how many top-ranked sources a strategy uses.
    metric: "average" or "per_token" (see `similarity.py`).
    seed: seed of the target runs.
    expert_length: l, tokens per SMoP expert.
    compression: "first" or "mean_pool" (source prompt -> expert).
  """
  k: int = 3
  metric: str = "average"
  seed: int = 0
  expert_length: int = 5
  compression: str = "mean_pool"

  def __post_init__(self):
    validate.positive_int(self.k, "--k")
    validate.one_of(self.metric, "--similarity", similarity.METRICS)
    validate.one_of(self.compression, "--compression", experts.COMPRESSIONS)


def _train(settings: RunSettings, task: str, work_dir: pathlib.Path, label: str, seed: int, *,
           init: Optional[np.ndarray] = None, init_note: str = "sampled vocabulary",
           smop: Optional[dict] = None, evaluate: bool = True, verbose: bool = False) -> RunOutcome:
  """One run alone in <work_dir>/runs/<label>-<key>: one directory per distinct run (`keys.py`)."""
  key = keys.run_key(settings, task, seed, init=init, smop=smop, evaluate=evaluate)
  request = RunRequest(task, seed, name=f"{label}-{key}", init=init, init_note=init_note)
  recipe = settings_lib.recipe(settings, task, smop=smop, evaluate=evaluate)
  return experiment.run(recipe, work_dir / RUNS, [request], alone=True, verbose=verbose).outcomes[0]


def target_embedding(settings: RunSettings, target: str, work_dir: pathlib.Path, seed: int,
                     verbose: bool = False) -> RunOutcome:
  """Trains the target's prompt for the early-step budget; its export is the task embedding."""
  short = dataclasses.replace(settings, train_steps=settings.embedding_step)
  return _train(short, target, work_dir, "embedding", seed, evaluate=False, verbose=verbose)


def rank(embedding: np.ndarray, entries: Sequence[Entry], metric: str,
         exclude_task: Optional[str] = None) -> list[Ranked]:
  """Library entries by decreasing similarity of their task embeddings to `embedding`."""
  pool = [e for e in entries if e.task != exclude_task]
  if not pool:
    raise ConfigError(f"the library has no source other than the target {exclude_task!r}; add "
                      f"source prompts with `python -m spot_jax.library add`")
  sims = similarity.similarities(embedding, [e.embedding for e in pool], metric)
  return [Ranked(pool[i], float(sims[i])) for i in similarity.rank(sims)]


def register_runtime_mixture(prefix: str, task_names: Sequence[str]) -> str:
  """An examples-proportional mixture of `task_names`, registered under a content-derived name."""
  from tasks import mixtures  # pylint: disable=g-import-not-at-top
  names = sorted(set(task_names))
  digest = hashlib.sha256("|".join(names).encode()).hexdigest()[:10]
  return mixtures.register_mixture(f"{prefix}_{digest}", names)


def _check_lengths(settings: RunSettings, chosen: Sequence[Ranked]) -> None:
  for r in chosen:
    if r.entry.prompt.shape[0] != settings.prompt_length:
      raise ConfigError(f"library entry {r.entry.id!r} has a prompt of {r.entry.prompt.shape[0]} "
                        f"tokens; the target prompt has --prompt_length={settings.prompt_length} "
                        "(they must match)")


def run_strategy(strategy: str, settings: RunSettings, target: str, ranked: Sequence[Ranked],
                 all_entries: Sequence[Entry], work_dir: pathlib.Path, options: Options,
                 log: Callable[[str], None] = print) -> dict:
  """Runs one strategy; returns {"strategy", "score", "chosen", "similarities", "run_dir", ...}.

  Every run goes to its own keyed directory under <work_dir>/runs (see `_train`), so the runs
  of another k, metric or library are others, and the same ones are reused.
  """
  validate.one_of(strategy, "--strategy", STRATEGIES)
  top = list(ranked[:options.k])
  sims = {r.entry.id: r.similarity for r in top}
  seed = options.seed
  result = {"strategy": strategy, "chosen": [r.entry.id for r in top], "similarities": sims}
  if strategy == "best_of_top_k":
    _check_lengths(settings, top)
    tried, dirs = {}, {}
    for r in top:
      run = _train(settings, target, work_dir, f"best_of_top_k.{r.entry.id}", seed,
                   init=r.entry.prompt, init_note=f"library entry {r.entry.id}")
      tried[r.entry.id], dirs[r.entry.id] = run.score, run.run_dir
      log(f"  {strategy}: from {r.entry.id} (similarity {r.similarity:.4f}) -> {run.score:.4g}")
    best = max(tried, key=lambda i: tried[i])
    result.update(score=tried[best], chosen=[best], tried=tried, tried_run_dirs=dirs,
                  run_dir=dirs[best])
  elif strategy == "weighted_average":
    _check_lengths(settings, top)
    init = similarity.weighted_average([r.entry.prompt for r in top], [r.similarity for r in top])
    run = _train(settings, target, work_dir, strategy, seed, init=init,
                 init_note="weighted average of " + ", ".join(sims))
    result.update(score=run.score, run_dir=run.run_dir,
                  alphas={i: s / sum(sims.values()) for i, s in sims.items()})
  elif strategy in ("mixture", "generic"):
    if strategy == "mixture":
      members = [r.entry.task for r in top] + [target]
    else:
      members = sorted({e.task for e in all_entries if e.task != target})
      result.update(chosen=members, similarities={})
    mixture = register_runtime_mixture(f"spot_{strategy}", members)
    source = _train(settings, mixture, work_dir, f"{strategy}.source", seed, evaluate=False)
    run = _train(settings, target, work_dir, strategy, seed, init=source.prompt(),
                 init_note=f"prompt tuned on {mixture} ({', '.join(sorted(set(members)))})")
    result.update(score=run.score, run_dir=run.run_dir, source_run_dir=source.run_dir,
                  mixture=mixture, mixture_tasks=sorted(set(members)))
  elif strategy == "smop_experts":
    init = experts.expert_prompts([r.entry.prompt for r in top], options.expert_length,
                                  options.compression)
    run = _train(settings, target, work_dir, f"{strategy}.{options.compression}", seed, init=init,
                 smop={"num_prompts": len(top), "length": options.expert_length},
                 init_note=f"SMoP experts from {', '.join(sims)} ({options.compression})")
    result.update(score=run.score, run_dir=run.run_dir, compression=options.compression)
  elif strategy == "smop":
    run = _train(settings, target, work_dir, strategy, seed,
                 smop={"num_prompts": len(top), "length": options.expert_length})
    result.update(score=run.score, run_dir=run.run_dir, chosen=[], similarities={})
  else:  # baseline
    run = _train(settings, target, work_dir, strategy, seed)
    result.update(score=run.score, run_dir=run.run_dir, chosen=[], similarities={})
  return result


def retrieval_settings(settings: RunSettings, target: str, entries: Sequence[Entry],
                       strategies: Sequence[str], options: Options, library: str = "") -> dict:
  """Everything that determines a retrieval's result (its key is the hash of this)."""
  return {"run": keys.settings_record(settings, target, options.seed),
          "library": library, "library_content": keys.library_record(entries),
          "strategies": list(strategies), "options": dataclasses.asdict(options)}


def retrieve(settings: RunSettings, target: str, entries: Sequence[Entry],
             strategies: Sequence[str], work_dir: str | pathlib.Path, options: Options,
             library: str = "", log: Callable[[str], None] = print) -> dict:
  """The whole retrieval: embedding, ranking, then each strategy; returns a JSON-able report.

  The report's "key" hashes `retrieval_settings`; `write_report` stores it under that key, so a
  retrieval with other settings in the same `work_dir` keeps the earlier report, and one with
  the same settings reuses every run (nothing is trained again) and writes the same report.
  """
  work_dir = pathlib.Path(work_dir)
  for s in strategies:
    validate.one_of(s, "--strategy", STRATEGIES)
  if not entries:
    raise ConfigError("the library has no usable entries; add source prompts with "
                      "`python -m spot_jax.library add`")
  wrong = [e.id for e in entries if e.embedding.shape[-1] != settings.embed_dim]
  if wrong:
    raise ConfigError(f"library entries {wrong} have embedding size "
                      f"{entries[0].embedding.shape[-1]}, the model's is {settings.embed_dim}; use "
                      "the library of this model")
  recorded = retrieval_settings(settings, target, entries, strategies, options, library)
  emb_run = target_embedding(settings, target, work_dir, options.seed)
  ranked = rank(emb_run.embedding(), entries, options.metric, exclude_task=target)
  log(f"target {target}: task embedding = prompt at step {settings.embedding_step} "
      f"({emb_run.embedding_path}); ranking by {options.metric} similarity:")
  for i, r in enumerate(ranked):
    log(f"  {i + 1}. {r.entry.id} ({r.entry.task}) similarity {r.similarity:.4f}")
  results = [run_strategy(s, settings, target, ranked, entries, work_dir, options, log)
             for s in strategies]
  for res in results:
    log(f"{res['strategy']}: score {res['score']:.4g} (chose {', '.join(res['chosen']) or '-'}) "
        f"in {res['run_dir']}")
  return {"key": keys.digest(recorded), "target": target, "metric": settings.metric_for(target),
          "similarity": options.metric, "k": options.k, "seed": options.seed,
          "library": library, "embedding_run_dir": emb_run.run_dir,
          "embedding_file": str(emb_run.embedding_path),
          "ranking": [{"id": r.entry.id, "task": r.entry.task, "similarity": r.similarity}
                      for r in ranked],
          "results": results, "settings": recorded}


def write_report(work_dir: str | pathlib.Path, report: dict) -> pathlib.Path:
  """Writes `report` to <work_dir>/retrieval-<key>.json (atomically); returns the path."""
  path = pathlib.Path(work_dir) / REPORT.format(key=report["key"])
  fileio.atomic_write_bytes(path, json.dumps(report, indent=1).encode())
  return path

"""SPoT's own pipeline in the demo: a source-prompt library and retrieval by task embedding.

  1. every source prompt (one ordinary run each) enters a prompt library
     (`spot_jax.spot.library`) with its task embedding: its prompt at the embedding step;
  2. the target's task embedding for seed s is the prompt of its Prompt Tuning run of seed s at
     the same step (`RunDir.embedding_prompt`: the step the run's record names);
  3. retrieval (`spot_jax.spot.retrieve.rank`, cosine of average tokens) ranks the library; the
     most similar source's best prompt starts the SPoT run of that seed.

A source whose validation accuracy is not at least MIN_GAIN points above its task's chance did
not learn its task: `screen` names it, and retrieval ranks the other sources only (every source
stays in the library, which ATTEMPT and MPT read whole). The suite's RELATED map plays no part in
the choice: `Choice.related` only checks it afterwards. The control "spot_unrelated" starts from
the best prompt of UNRELATED[target][0].
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping, Optional, Sequence

from spot_jax.demo import methods
from spot_jax.errors import ConfigError
from spot_jax.experiment import RunOutcome, RunRequest
from spot_jax.spot import library as prompt_library
from spot_jax.spot import retrieve as retrieval

SIMILARITY = "average"
MIN_GAIN = 10.0  # points above chance a source's accuracy must reach to enter retrieval
EVERY_SOURCE_LEFT_OUT = ("no source learned its task (every one left out): retrieval ranks them "
                         "all; give the sources more --source_steps")


@dataclasses.dataclass(frozen=True)
class LeftOut:
  """A source left out of retrieval: it did not learn its task.

  Attributes:
    task: the source task key.
    accuracy: its validation accuracy (%; None: not evaluated).
    chance: its task's chance accuracy (%).
  """
  task: str
  accuracy: Optional[float]
  chance: float

  def line(self) -> str:
    shown = "none" if self.accuracy is None else f"{self.accuracy:.1f}%"
    return (f"source {self.task} left out of retrieval: accuracy {shown}, not {MIN_GAIN:g} "
            f"points above chance ({self.chance:.1f}%)")

  def to_json(self) -> dict:
    return {"task": self.task, "accuracy": self.accuracy, "chance": round(self.chance, 1)}


def screen(sources: Sequence[RunOutcome], chance: Mapping[str, float]) -> list[LeftOut]:
  """The sources whose accuracy is below chance[task] + MIN_GAIN (or missing), in source order."""
  out = []
  for run in sources:
    accuracy = methods.accuracy(run)
    if accuracy is None or accuracy < chance[run.label] + MIN_GAIN:
      out.append(LeftOut(run.label, accuracy, float(chance[run.label])))
  return out


@dataclasses.dataclass(frozen=True)
class Choice:
  """What retrieval picked for one (target, seed).

  Attributes:
    target, seed: the target run it starts.
    source: the chosen library entry (a source task key).
    similarity: its similarity to the target's task embedding.
    ranking: every (source, similarity), most similar first.
    related: whether `source` is in the suite's RELATED[target] (a check, not the choice).
  """
  target: str
  seed: int
  source: str
  similarity: float
  ranking: tuple[tuple[str, float], ...]
  related: bool

  def to_json(self) -> dict:
    return {"target": self.target, "seed": self.seed, "source": self.source,
            "similarity": round(self.similarity, 6), "related": self.related,
            "ranking": [[s, round(v, 6)] for s, v in self.ranking]}


def build_library(root: pathlib.Path,
                  sources: Sequence[RunOutcome]) -> list[prompt_library.Entry]:
  """Adds each finished source run to the library at `root` (once); returns its entries.

  Entry ids are the sources' task keys; a rerun finds them there and adds nothing.
  """
  library = prompt_library.Library(root)
  present = set(library.ids())
  for run in sources:
    if run.label in present:
      continue
    library.add(entry_id=run.label, task=run.task, run_id=pathlib.Path(run.run_dir).name,
                seed=run.seed, fingerprint=run.fingerprint, prompt=run.prompt(),
                embedding=run.embedding(), score=run.score, metric=run.metric or methods.METRIC,
                embedding_step=run.embedding_step)
  entries, problems = library.load()
  if problems:
    raise ConfigError(f"the demo's library {root} has damaged entries ({problems[0]}); delete "
                      f"{root} and run the demo again")
  return entries


def choose(entries: Sequence[prompt_library.Entry], targets_pt: Sequence[RunOutcome],
           related: Mapping[str, Sequence[str]],
           left_out: Sequence[LeftOut] = ()) -> dict[tuple[str, int], Choice]:
  """Retrieval's source for every Prompt Tuning target run (its early prompt is the embedding),
  among the entries not `left_out` (all of them when every one is: `EVERY_SOURCE_LEFT_OUT`)."""
  dropped = {x.task for x in left_out}
  candidates = [e for e in entries if e.id not in dropped] or list(entries)
  out = {}
  for pt in targets_pt:
    ranked = retrieval.rank(pt.embedding(), candidates, SIMILARITY, exclude_task=pt.task)
    top = ranked[0]
    out[(pt.label, pt.seed)] = Choice(
        pt.label, pt.seed, top.entry.id, top.similarity,
        tuple((r.entry.id, r.similarity) for r in ranked), top.entry.id in related[pt.label])
  return out


def spot_requests(choices: Mapping[tuple[str, int], Choice],
                  entries: Sequence[prompt_library.Entry], targets: Sequence[str],
                  seeds: Sequence[int], train_examples: Optional[int] = None) -> list[RunRequest]:
  """SPoT's runs: seed s of each target starts from the best prompt retrieval chose for it
  (trained on the target's first `train_examples` examples; None: all)."""
  by_id = {e.id: e for e in entries}
  out = []
  for target in targets:
    for seed in seeds:
      c = choices[(target, seed)]
      out.append(methods.request(
          target, seed, by_id[c.source].prompt,
          f"retrieved library entry {c.source} (similarity {c.similarity:.4f})", train_examples))
  return out


def unrelated_requests(entries: Sequence[prompt_library.Entry],
                       unrelated: Mapping[str, Sequence[str]], targets: Sequence[str],
                       seeds: Sequence[int], train_examples: Optional[int] = None
                       ) -> list[RunRequest]:
  """The control: every seed of a target starts from UNRELATED[target][0]'s best prompt."""
  by_id = {e.id: e for e in entries}
  return [methods.request(t, s, by_id[unrelated[t][0]].prompt,
                          f"unrelated source {unrelated[t][0]} (control)", train_examples)
          for t in targets for s in seeds]


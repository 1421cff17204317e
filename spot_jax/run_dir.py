"""The run directory: the one owner of its layout. Every reader and writer of a run asks it.

  run.json                        the run's record (`RunRecord`): task, seed, prompt method, the
                                  frozen backbone (config, checkpoint, fingerprint, vocabulary),
                                  the task-embedding step, the best score; written when the run
                                  starts and updated when it ends
  checkpoints/<step>/             training states (orbax), oldest first; a state is finished once
                                  orbax renamed it into place (`_CHECKPOINT_METADATA` inside)
  checkpoints/<step>.corrupt[.N]  a damaged state moved aside on restart (never deleted)
  checkpoints/<step>.orbax-checkpoint-tmp-*   a state being written (ignored by every reader)
  best/<step>/, best/metric.json  the state of the best evaluation so far and its metric
  prompts/prompt_step_<N>.npy     the effective prompt at step N (every checkpoint, the
                                  embedding step and SAVE_PROMPT_STEPS)
  prompts/prompt_best.npy         the effective prompt of the best evaluation
  prompts/<name>_step_<N>.npy     arrays a method exports beside its prompt (DePT: offset_...),
                                  and prompts/<name>_best.npy; see `companion_file`
  prompts/prompt_params_step_<N>.npz  the raw prompt parameters at step N (t5x.train runs, whose
                                  states are t5x's own checkpoints)
  eval/, tensorboard/             seqio's evaluation logs, TensorBoard events
  rank_classification.json        the exported prompt's rank-classification accuracy and what
                                  it was computed from (`spot_jax.experiment.rank`)
  config.gin                      the operative gin configuration of the latest start (as
                                  t5x saves it), when gin configured the run; a resume with
                                  another one first moves the earlier one to
                                  config.until_step_<N>.gin (N: the step it reached)

A run directory is written by `spot_jax.train` (and every layer above it: the demo, the study,
retrieval); `spot_jax.eval`, `spot_jax.infer`, `spot_jax.library add`, the SPoT layer, the prompt
initialisers and the t5x contrib read it through this type only.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from typing import Any, Callable, Iterator, Optional, Union

from spot_jax import fileio
from spot_jax.errors import ConfigError

RECORD = "run.json"
RECORD_FORMAT = "spot_jax.run/1"
PROMPT_STEP_RE = re.compile(r"^prompt_step_(\d+)\.npy$")
PROMPT_FILE_RE = re.compile(r"^prompt_(step_\d+|best)\.npy$")  # an exported prompt
CORRUPT_SUFFIX = ".corrupt"
# What orbax writes inside a state directory only when the state is complete.
_FINISHED_MARKER = "_CHECKPOINT_METADATA"
_STATE_ITEM = "default"

Step = Union[int, str]  # a step number, or "best"


@dataclasses.dataclass(frozen=True)
class BestMetric:
  """best/metric.json: the evaluation that selected best/<step> and prompt_best.npy."""
  step: int
  metric: str
  value: float


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """run.json: what a run is, so that anything reading it needs no other flag.

  Attributes:
    task: the seqio task or mixture the prompt trained on.
    seed: the run's seed (prompt initialisation, data order, dropout keys).
    method: the prompt module: {"class": name, <scalar attributes>} (empty for model tuning).
    backbone: {"config": T5Config fields, "checkpoint": path or None (random backbone),
      "fingerprint": spot_jax.backbone.fingerprint(...), "vocabulary": {"kind": "sentencepiece",
      "path": ..., "extra_ids": n} or {"kind": "byte"} or None}. Paths inside the package's
      embedded folder are stored as "embedded:<relative path>" (see `spot_jax.embedded`).
    task_module: the module(s) registering `task` (MIXTURE_OR_TASK_MODULE).
    train_steps: the run's final step.
    embedding_step: the step whose exported prompt is the run's task embedding.
    metric: the metric selecting the best prompt ("task/metric" or "metric"), or None.
    score: its best value so far (None before the first evaluation).
    finished: True once the run reached `train_steps`.
    init: where the trained parameters started, in words: the source run and step of a SPoT
      transfer ("run <dir>, step <N> (prompts/<file>)"), a prompt file, a library entry, an
      initialiser with its settings ("sampled_vocab(num_most_frequent=5000)"); a resumed run
      keeps its first start's.
  """
  task: str
  seed: int
  method: dict
  backbone: dict
  task_module: Optional[str] = None
  train_steps: int = 0
  embedding_step: Optional[int] = None
  metric: Optional[str] = None
  score: Optional[float] = None
  finished: bool = False
  init: str = ""

  @property
  def fingerprint(self) -> dict:
    return dict(self.backbone.get("fingerprint") or {})

  def to_json(self) -> dict:
    return {"format": RECORD_FORMAT, **dataclasses.asdict(self)}

  @classmethod
  def from_json(cls, data: Any, where: str) -> "RunRecord":
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
      raise ConfigError(f"{where} is not a spot_jax run record (format {RECORD_FORMAT!r}); give "
                        "the directory of a spot_jax.train run")
    names = {f.name for f in dataclasses.fields(cls)}
    try:
      return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError as e:
      raise ConfigError(f"{where} is incomplete ({e}); the run directory was written by another "
                        f"version, or damaged") from None


def _under(*parts: str, doc: str) -> property:
  """A path of the layout, below the run directory."""
  return property(lambda self: self.path.joinpath(*parts), doc=doc)


class RunDir:
  """A run directory (see the module docstring for its layout).

  Attributes:
    path: the directory, absolute.
  """

  def __init__(self, path: Union[str, os.PathLike]):
    self.path = pathlib.Path(path).expanduser().absolute()

  def __repr__(self) -> str:
    return f"RunDir({str(self.path)!r})"

  def __fspath__(self) -> str:
    return str(self.path)

  # --- paths (the layout of the module docstring) -----------------------------------------

  checkpoints = _under("checkpoints", doc="checkpoints/: the training states")
  best = _under("best", doc="best/: the best evaluation's state and its metric")
  metric_path = _under("best", "metric.json", doc="best/metric.json: the best evaluation's metric")
  prompts = _under("prompts", doc="prompts/: the exported prompts and companions")
  eval_logs = _under("eval", doc="eval/: seqio's evaluation logs")
  tensorboard = _under("tensorboard", doc="tensorboard/: TensorBoard events")
  record_path = _under(RECORD, doc="run.json: the run's record")
  config_path = _under("config.gin", doc="config.gin: the operative gin configuration")
  rank_path = _under("rank_classification.json",
                     doc="rank_classification.json: the prompt's rank-classification accuracy")

  def state_path(self, step: int) -> pathlib.Path:
    """checkpoints/<step> (a training state)."""
    return self.checkpoints / str(int(step))

  def best_state_path(self, step: int) -> pathlib.Path:
    return self.best / str(int(step))

  def prompt_path(self, step: Step) -> pathlib.Path:
    """prompts/prompt_best.npy for "best", else prompts/prompt_step_<step>.npy."""
    if step == "best":
      return self.prompts / "prompt_best.npy"
    return self.prompts / f"prompt_step_{int(step)}.npy"

  def prompt_params_path(self, step: int) -> pathlib.Path:
    """prompts/prompt_params_step_<step>.npz (written by the t5x integration)."""
    return self.prompts / f"prompt_params_step_{int(step)}.npz"

  # --- listing ----------------------------------------------------------------------------

  @staticmethod
  def _finished_steps(folder: pathlib.Path) -> list[int]:
    """Finished states in `folder`, oldest first: `<digits>/` holding orbax's marker and item.

    Damaged states moved aside (`<step>.corrupt`), orbax's temporaries
    (`<step>.orbax-checkpoint-tmp-*`) and anything half-written are skipped.
    """
    if not folder.is_dir():
      return []
    steps = [int(p.name) for p in folder.iterdir()
             if p.name.isdigit() and p.is_dir() and (p / _FINISHED_MARKER).is_file()
             and (p / _STATE_ITEM).is_dir()]
    return sorted(steps)

  def state_steps(self) -> list[int]:
    """The steps of the finished training states in checkpoints/, oldest first."""
    return self._finished_steps(self.checkpoints)

  def best_steps(self) -> list[int]:
    """The steps of the finished states in best/ (at most one in a healthy run)."""
    return self._finished_steps(self.best)

  def latest_state_step(self) -> Optional[int]:
    steps = self.state_steps()
    return steps[-1] if steps else None

  def moved_aside(self) -> list[pathlib.Path]:
    """Damaged states moved aside in checkpoints/ and best/ (`<step>.corrupt[.N]`)."""
    out = []
    for folder in (self.checkpoints, self.best):
      if folder.is_dir():
        out += sorted(p for p in folder.iterdir() if CORRUPT_SUFFIX in p.name)
    return out

  def prompt_steps(self) -> list[int]:
    """N of every prompts/prompt_step_N.npy, ascending (temporaries are not matched)."""
    if not self.prompts.is_dir():
      return []
    return sorted(int(m.group(1)) for p in self.prompts.iterdir()
                  if (m := PROMPT_STEP_RE.match(p.name)))

  def latest_prompt_step(self) -> Optional[int]:
    steps = self.prompt_steps()
    return steps[-1] if steps else None

  # --- the record and the best metric ------------------------------------------------------

  def read_record(self) -> Optional[RunRecord]:
    """run.json, or None when the directory has none; a damaged one is a ConfigError."""
    if not self.record_path.is_file():
      return None
    try:
      data = json.loads(self.record_path.read_text())
    except (OSError, ValueError) as e:
      raise ConfigError(f"{self.record_path} cannot be read ({e}); restore it or use a new run "
                        f"directory") from None
    return RunRecord.from_json(data, str(self.record_path))

  def write_record(self, record: RunRecord) -> None:
    """Writes run.json atomically (the caller writes from one process only)."""
    fileio.atomic_write_bytes(self.record_path, json.dumps(record.to_json(), indent=1).encode())

  def write_config(self, text: str, resumed_step: Optional[int] = None) -> None:
    """Writes config.gin atomically; a different one of a run resumed at `resumed_step` is kept
    as config.until_step_<resumed_step>.gin first (a fresh start replaces it)."""
    path = self.config_path
    if path.is_file():
      old = path.read_text()
      if old == text:
        return
      if resumed_step is not None:
        aside, n = path.with_name(f"config.until_step_{int(resumed_step)}.gin"), 1
        while aside.exists():
          aside, n = path.with_name(f"config.until_step_{int(resumed_step)}.{n}.gin"), n + 1
        fileio.atomic_write_bytes(aside, old.encode())
    fileio.atomic_write_bytes(path, text.encode())

  def best_metric(self) -> Optional[BestMetric]:
    """best/metric.json, or None before the first best evaluation."""
    if not self.metric_path.is_file():
      return None
    try:
      data = json.loads(self.metric_path.read_text())
      return BestMetric(int(data["step"]), str(data["metric"]), float(data["value"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ConfigError(f"{self.metric_path} cannot be read ({e}); restart the run (it moves a "
                        f"damaged best/ aside) or remove best/") from None

  def write_best_metric(self, best: BestMetric) -> None:
    record = {"step": int(best.step), "metric": best.metric, "value": float(best.value)}
    fileio.atomic_write_bytes(self.metric_path, json.dumps(record).encode())

  # --- the exported prompts -------------------------------------------------------------

  def exported_prompt(self) -> tuple[pathlib.Path, Optional[int]]:
    """(prompt file, its step or None for best) this run serves: best, else the latest step.

    Raises:
      ConfigError: no exported prompt.
    """
    best = self.prompt_path("best")
    if best.is_file():
      return best, None
    step = self.latest_prompt_step()
    if step is None:
      raise ConfigError(f"{self.path} holds no exported prompt (prompts/prompt_best.npy or "
                        f"prompts/prompt_step_N.npy); give the MODEL_DIR of a spot_jax.train run")
    return self.prompt_path(step), step

  def embedding_prompt(self) -> tuple[pathlib.Path, int]:
    """(file, step) of the run's task embedding: the prompt at its record's embedding step.

    Raises:
      ConfigError: no record naming an embedding step, or its prompt was not exported.
    """
    record = self.read_record()
    step = None if record is None else record.embedding_step
    if step is None:
      raise ConfigError(f"{self.path} records no task-embedding step (run.json); give "
                        f"--embedding_step, or train the run with spot_jax.train")
    path = self.prompt_path(step)
    if not path.is_file():
      raise ConfigError(f"{self.path}: the task embedding {path.name} (step {step}) was not "
                        f"exported; the run stopped before step {step}")
    return path, step

  # --- reading training states --------------------------------------------------------------

  def candidate_states(self, which: Step | None = None, prefer_best: bool = True
                       ) -> list[pathlib.Path]:
    """The states `restore_params` tries, in order.

    Args:
      which: a step number (checkpoints/<step> only), "best", "latest", or None (best/ first
        when `prefer_best`, then the checkpoints from the newest down).
      prefer_best: with which=None, try best/ before checkpoints/.
    """
    if which not in (None, "best", "latest"):
      return [self.state_path(int(which))]
    out = []
    if which == "best" or (which is None and prefer_best):
      out += [self.best_state_path(s) for s in reversed(self.best_steps())]
    if which != "best":
      out += [self.state_path(s) for s in reversed(self.state_steps())]
    return out

  def prompt_params(self, warn: Callable[[str], None] = print) -> Any:
    """The `prompt/` subtree of the state the exported prompt came from (best/, or the state of
    the exported step): what a router, an attention network or MPT's factors are read from.

    Raises:
      ConfigError: no exported prompt, no readable state, or a state without prompt parameters.
    """
    _, step = self.exported_prompt()
    params, source = self.restore_params("best" if step is None else step, warn=warn)
    if "prompt" not in params:
      raise ConfigError(f"{source} holds no prompt parameters; give a prompt-tuning run")
    return params["prompt"]

  def restore_params(self, which: Step | None = None, *, prefer_best: bool = True,
                     warn: Callable[[str], None] = print, sharding: Any = None
                     ) -> tuple[Any, pathlib.Path]:
    """The trained parameters ({"prompt": ...}, or the whole tree for model tuning) of a state.

    Falls back past damaged states (one warning line each, naming the state and the file) to
    the next candidate, as the trainer does on restart; nothing is moved or written. Arrays are
    placed with `sharding` (default: this process's first device); in a multi-process job every
    process calls this alike.

    Raises:
      ConfigError: no such state, or none readable (one line naming the states and the cause).
    """
    from spot_jax import orbax_io  # pylint: disable=g-import-not-at-top
    candidates = self.candidate_states(which, prefer_best)
    damaged = []
    for path in candidates:
      if not (path / _STATE_ITEM).is_dir():
        continue
      try:
        state = orbax_io.read_state(path / _STATE_ITEM, sharding)
      except orbax_io.DamagedCheckpoint as e:
        damaged.append(e)
        continue
      for bad in damaged:
        warn(f"warning: the training state {bad.path} cannot be read ({bad.reason}); used "
             f"{path} instead")
      if "params" not in state:
        raise ConfigError(f"{path} holds no trained parameters; give the MODEL_DIR of a "
                          f"spot_jax.train run")
      return state["params"], path
    if damaged:
      raise ConfigError(f"no readable training state in {self.path} ({damaged[0].path}: "
                        f"{damaged[0].reason}); restore the files or retrain the run")
    looked = ("checkpoints/" + str(which) if which not in (None, "best", "latest")
              else "best/<step>" if which == "best" else "best/<step> and checkpoints/<step>")
    raise ConfigError(f"no training state found under {str(self.path)!r} (looked for {looked}); "
                      f"give the MODEL_DIR of a spot_jax.train run")

  def files(self) -> Iterator[pathlib.Path]:
    """Every file under the run directory (for copies and byte-identity checks)."""
    return (p for p in sorted(self.path.rglob("*")) if p.is_file())
def companion_file(prompt_file: str | os.PathLike, name: str) -> pathlib.Path:
  """The array `name` exported beside a prompt file.

  prompts/prompt_step_<N>.npy -> prompts/<name>_step_<N>.npy; prompt_best.npy -> <name>_best.npy.
  """
  path = pathlib.Path(prompt_file)
  if not path.name.startswith("prompt_"):
    raise ValueError(f"{path.name} is not an exported prompt file (prompt_step_<N>.npy or "
                     f"prompt_best.npy)")
  return path.with_name(name + path.name[len("prompt"):])

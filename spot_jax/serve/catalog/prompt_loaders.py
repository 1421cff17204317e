"""Where served prompts come from: prompt modules, .npy files, run directories, PEFT adapters.

  from_module     a prompt module and its parameter subtree (Residual and MPT prompts are
                  folded; ATTEMPT keeps its sources, target and attention network)
  from_npy        a [L, E] .npy (spot-jax exports, google-research/prompt-tuning's format); an
                  exported DePT prompt brings the offset exported beside it
  from_run_dir    a `spot_jax.train` run directory: prompts/prompt_best.npy, else the latest
                  prompts/prompt_step_N.npy; SMoP, ATTEMPT and multi-task MPT runs (a 3-D
                  export) also restore their parameters from the state, DePT runs read their
                  offset from prompts/offset_{best,step_N}.npy
  from_library    a SPoT prompt library entry, `LIBRARY_DIR#ENTRY_ID` (its best prompt), refused
                  when the entry was trained against another frozen model
  load            any of the above by path (a directory holding adapter_config.json is a
                  PEFT adapter, see `peft_io` and `peft_mpt`; on a decoder-only model a
                  CAUSAL_LM one, see `peft_causal`)
  load_all        `load`, with one entry per task of a multi-task run or adapter ("NAME/k")

Multi-task prompts (ATTEMPT with several targets, MPT) serve one task per entry: `task` picks
it (its `task_index` in training); `load_all` makes them all. Deep prompts (prefix tuning,
P-tuning v2) come from their run directories (the exported record of `spot_jax.prompts.deep`,
which needs the served model's config) and from PEFT PREFIX_TUNING adapters; they are served
as entries without an input prompt.
"""
from __future__ import annotations

import pathlib
import sys
from typing import Any, Optional

import flax.linen as nn
import numpy as np

from spot_jax.backbones import kinds
from spot_jax.errors import ConfigError
from spot_jax.run_dir import PROMPT_FILE_RE, RunDir, companion_file
from spot_jax.prompts import (DEEP_PROMPT_METHODS, ULPT, Attempt, DePT, MultitaskPrompt,
                              PromptTuning, ResidualPrompt, SMoP)
from spot_jax.prompts import attempt as attempt_lib
from spot_jax.prompts import deep as deep_lib
from spot_jax.prompts.dept import OFFSET
from spot_jax.serve.catalog.table import SMOP_EVAL_ROUTING, Attention, ServedPrompt
from spot_jax.backbones.t5.config import T5Config


def from_module(name: str, module: nn.Module, params: Any, source: str = "",
                task: Optional[int] = None) -> ServedPrompt:
  """The served form of a prompt module's parameters (its `prompt/` subtree).

  PromptTuning: its prompt; ResidualPrompt: the folded P'; ULPT: the folded (Z P) diag(s) + b;
  SMoP: its prompts (folded for ResidualSMoP), router and the routing it uses at evaluation;
  DePT: its prompt and folded offset; MultitaskPrompt: task `task`'s folded P* o (U V);
  Attempt: its sources and task `task`'s target with the attention network. `task` defaults to
  the module's `default_task`.
  """
  params = nn.meta.unbox(params)
  if isinstance(module, DEEP_PROMPT_METHODS):
    raise ConfigError(f"a {type(module).__name__} needs the model's config to serve; use "
                      f"from_deep(name, parts, config) with module.export_prompt(params, config)")
  if isinstance(module, DePT):
    folded = module.fold(params)
    return ServedPrompt(name, folded["prompt"], source=source, offset=folded["offset"])
  if isinstance(module, SMoP):  # ResidualSMoP too: export_prompt folds its prompts
    routing = SMOP_EVAL_ROUTING[module.routing]
    router = params["router"]["kernel"] if "router" in params else None
    return ServedPrompt(name, module.export_prompt(params), router, routing, source)
  if isinstance(module, (PromptTuning, ResidualPrompt, ULPT)):
    return ServedPrompt(name, module.export_prompt(params), source=source)
  if isinstance(module, MultitaskPrompt):
    return ServedPrompt(name, np.asarray(module.fold(params, task)["prompt"]), source=source)
  if isinstance(module, Attempt):
    task = module.default_task if task is None else task
    return attempt_entry(name, module.export_prompt(params), params, task,
                         module.resolved_temperature(), source)
  raise ConfigError(f"cannot serve a {type(module).__name__}; valid prompt modules: PromptTuning, "
                    f"ResidualPrompt, ULPT, SMoP, ResidualSMoP, DePT, MultitaskPrompt, Attempt; "
                    f"PrefixTuning and PTuningV2 through from_deep")


def from_deep(name: str, parts: dict, config: Optional[Any], source: str) -> ServedPrompt:
  """A deep prompt's entry (no input prompt) from its parts, checked against `config`."""
  if config is None:
    raise ConfigError(f"{source} is a deep prompt; serving it needs the model's config")
  if kinds.kind_of(config) == "t5":
    deep_lib.check_fits(parts, config, source)
  else:
    check_decoder_prefixes(parts, config, source)
  return ServedPrompt(name, np.zeros((1, 0, config.emb_dim), np.float32), source=source,
                      deep=parts)


def check_decoder_prefixes(parts: dict, config: Any, source: str) -> None:
  """Refuses, in one line, deep prompt parts a decoder-only `config` cannot take: only decoder
  self-attention prefixes [layers, 2, P, K, D] or P-tuning v2 tokens [layers, P, E] of its
  shape."""
  other = sorted(set(parts) - {"decoder", "decoder_tokens"})
  if other:
    raise ConfigError(f"{source} holds {other[0]!r} prefixes; a decoder-only model has only the "
                      f"decoder's self-attention (give a prompt trained on this model)")
  if len(parts) != 1:
    raise ConfigError(f"{source} holds both decoder prefixes and decoder prompt tokens; give one")
  if "decoder_tokens" in parts:
    tokens = parts["decoder_tokens"]
    if tokens.ndim != 3 or tokens.shape[0] != config.num_layers or (
        tokens.shape[2] != config.emb_dim):
      raise ConfigError(f"{source} has decoder prompt tokens of shape {tokens.shape}; the model "
                        f"takes [{config.num_layers}, P, {config.emb_dim}] (give a prompt trained "
                        f"on this model)")
    return
  kv = parts["decoder"]
  want = (config.num_layers, 2, config.num_kv_heads, config.head_dim)
  if kv.ndim != 5 or (kv.shape[:2] + kv.shape[3:]) != want:
    raise ConfigError(f"{source} has decoder prefixes of shape {kv.shape}; the model takes "
                      f"[{config.num_layers}, 2, P, {config.num_kv_heads}, {config.head_dim}] "
                      f"(give a prompt trained on this model)")


def attempt_entry(name: str, candidates: np.ndarray, params: Any, task: int,
                  temperature: Optional[float], source: str = "") -> ServedPrompt:
  """An ATTEMPT entry: its sources and target `task` (of the [S + K, m, E] export) as the entry's
  prompts, the attention network of `params` (the run's `prompt/` subtree).

  Args:
    temperature: the run's softmax temperature (None: the default, E * e).
  """
  params = nn.meta.unbox(params)
  num_targets = int(np.shape(params["prompts"])[0])
  num_sources = candidates.shape[0] - num_targets
  if num_sources < 1 or not 0 <= task < num_targets:
    raise ConfigError(f"ATTEMPT prompt {name!r} has {num_targets} targets and {num_sources} "
                      f"sources; task {task} is not one of its targets (0..{num_targets - 1})")
  net = {k: np.asarray(v, np.float32) for k, v in params["attention"].items()}
  embed = candidates.shape[2]
  temperature = attempt_lib.default_temperature(embed) if temperature is None else temperature
  prompts = np.concatenate([candidates[:num_sources], candidates[num_sources + task][None]])
  attention = Attention(net["down_kernel"], net["up_kernel"], net["layer_norm_scale"],
                        net["layer_norm_bias"], float(temperature), target=num_sources)
  return ServedPrompt(name, prompts, routing="attempt", source=source, attention=attention)


def read_npy(path: str) -> np.ndarray:
  """A float array from a .npy file, with one-line errors for unreadable files."""
  try:
    array = np.load(path, allow_pickle=False)
  except (OSError, ValueError, EOFError) as e:
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ConfigError(f"{path} is not a readable .npy file ({why}); give a prompt saved with "
                      f"numpy.save") from None
  if isinstance(array, np.ndarray) and deep_lib.is_record(array):
    return array  # a deep prompt's record (see `from_run_dir`)
  if not isinstance(array, np.ndarray) or not np.issubdtype(array.dtype, np.floating):
    raise ConfigError(f"{path} holds {getattr(array, 'dtype', type(array))} data; a prompt is a "
                      f"float [L, E] array")
  return array.astype(np.float32)


def from_npy(name: str, path: str) -> ServedPrompt:
  """A plain [L, E] prompt from a .npy file (a [k, l, E] SMoP export needs its run directory).

  An exported prompt (prompt_step_N.npy, prompt_best.npy) of a DePT run brings the input offset
  exported beside it (offset_step_N.npy, offset_best.npy).
  """
  array = read_npy(path)
  if deep_lib.is_record(array):
    raise ConfigError(f"{path} is a deep prompt's record; give its run directory (MODEL_DIR), "
                      f"which serves it with the model's config")
  if array.ndim == 3:
    raise ConfigError(f"{path} holds {array.shape[0]} SMoP prompts {array.shape} without their "
                      f"router; give the run directory (MODEL_DIR) instead")
  if array.ndim != 2:
    raise ConfigError(f"{path} has shape {array.shape}; a prompt file holds one [L, E] prompt")
  offset, source = _exported_offset(pathlib.Path(path))
  return ServedPrompt(name, array, source=path + source, offset=offset)


def _exported_offset(prompt_file: pathlib.Path) -> tuple[Optional[np.ndarray], str]:
  """(DePT's offset exported beside `prompt_file`, " + <its file>"), or (None, "")."""
  if not PROMPT_FILE_RE.match(prompt_file.name):
    return None, ""
  file = companion_file(prompt_file, OFFSET)
  if not file.is_file():
    return None, ""
  return read_npy(str(file)), f" + {file.name}"


def from_run_dir(name: str, path: str, smop_routing: str = "linear", task: int = 0,
                 attempt_temperature: Optional[float] = None,
                 config: Optional[T5Config] = None) -> ServedPrompt:
  """The prompt a training run exported (folded for Residual and MPT runs).

  Args:
    name: the served name.
    path: the run directory (relative or absolute).
    smop_routing: the SMoP run's routing (a key of SMOP_EVAL_ROUTING), when it is one.
    task: the task of a multi-task run (ATTEMPT with several targets, multi-task MPT).
    attempt_temperature: an ATTEMPT run's temperature (None: the default, E * e); the run
      directory does not record it.
    config: the served model (needed for deep prompt runs).
  """
  run_dir = RunDir(path)
  file, _ = run_dir.exported_prompt()
  array = read_npy(str(file))
  if deep_lib.is_record(array):
    return from_deep(name, deep_lib.from_record(array, str(file)), config, str(file))
  if array.ndim == 2:
    offset, extra = _exported_offset(file)
    return ServedPrompt(name, array, source=str(file) + extra, offset=offset)
  params = run_dir.prompt_params(warn=_warn)
  if "attention" in params:
    return attempt_entry(name, array, params, task, attempt_temperature, f"{file} + attention")
  if "task_cols" in params:  # a multi-task MPT run exports its [K, L, E] folded task prompts
    if not 0 <= task < array.shape[0]:
      raise ConfigError(f"{run_dir} holds {array.shape[0]} MPT task prompts; task {task} is "
                        f"not one (0..{array.shape[0] - 1})")
    return ServedPrompt(name, array[task], source=f"{file} task {task}")
  if smop_routing not in SMOP_EVAL_ROUTING:
    raise ConfigError(f"SMoP routing {smop_routing!r} is unknown; valid: "
                      f"{', '.join(SMOP_EVAL_ROUTING)}")
  routing = SMOP_EVAL_ROUTING[smop_routing]
  router = params.get("router", {}).get("kernel") if routing != "mean" else None
  if routing != "mean" and router is None:
    raise ConfigError(f"{run_dir.path}'s SMoP state has no router; pass --smop_routing=stochastic "
                      f"or single for router-less SMoP runs")
  # the exported file, not the state's raw prompts: a Residual SMoP run exports them folded
  return ServedPrompt(name, array, None if router is None else np.asarray(router), routing,
                      f"{file} + router")


def num_tasks(path: str) -> int:
  """How many tasks the prompt at `path` serves (> 1: a multi-task run or MPT adapter)."""
  p = pathlib.Path(path)
  if library_reference(path) is not None or not p.is_dir():
    return 1
  if (p / "adapter_config.json").exists():
    from spot_jax.serve.export import peft_mpt  # pylint: disable=g-import-not-at-top
    if peft_mpt.adapter_type(str(p)) != peft_mpt.PEFT_TYPE:
      return 1
    return int(peft_mpt.read_adapter(str(p))["task_cols"].shape[0])
  run = RunDir(p)
  file, _ = run.exported_prompt()
  array = read_npy(str(file))
  if deep_lib.is_record(array) or array.ndim == 2:
    return 1
  params = run.prompt_params(warn=_warn)
  if "attention" in params:
    return int(np.shape(params["prompts"])[0])
  return int(array.shape[0]) if "task_cols" in params else 1


def _warn(line: str) -> None:
  print(line, file=sys.stderr)


LIBRARY_SEPARATOR = "#"


def library_reference(path: str) -> Optional[tuple[str, str]]:
  """(library directory, entry id) when `path` reads `LIBRARY_DIR#ENTRY_ID`, else None."""
  if LIBRARY_SEPARATOR not in path:
    return None
  root, entry_id = path.rsplit(LIBRARY_SEPARATOR, 1)
  return (root, entry_id) if (pathlib.Path(root) / "library.json").is_file() else None


def from_library(name: str, root: str, entry_id: str,
                 fingerprint: Optional[dict] = None) -> ServedPrompt:
  """The best prompt of library entry `entry_id`; refused if `fingerprint` names another model.

  Args:
    name: the served name.
    root, entry_id: the library directory and the entry.
    fingerprint: the serving backbone's `spot_jax.backbone` (None: not checked).
  """
  from spot_jax import backbone as backbone_lib  # pylint: disable=g-import-not-at-top
  from spot_jax.spot import library as prompt_library  # pylint: disable=g-import-not-at-top
  entry = prompt_library.Library(root).get(entry_id)
  if fingerprint is not None and not backbone_lib.same_model(entry.fingerprint, fingerprint):
    raise ConfigError(f"library entry {entry_id!r} was trained against frozen model "
                      f"{backbone_lib.describe(entry.fingerprint)}, not the one served "
                      f"({backbone_lib.describe(fingerprint)}); give the --model and "
                      f"--checkpoint it was trained with")
  return ServedPrompt(name, np.asarray(entry.prompt, np.float32),
                      source=f"{root}{LIBRARY_SEPARATOR}{entry_id}")


def load(name: str, path: str, smop_routing: str = "linear",
         config: Optional[T5Config] = None, fingerprint: Optional[dict] = None, task: int = 0,
         attempt_temperature: Optional[float] = None) -> ServedPrompt:
  """A served prompt from a run directory, a .npy file, a PEFT adapter or a library entry.

  Args:
    name, path: the served name and where the prompt is (`LIBRARY_DIR#ENTRY_ID` for a library
      entry).
    smop_routing: the routing of an SMoP run (see `from_run_dir`).
    config: the serving model; a PEFT adapter made for another model is refused.
    fingerprint: the serving backbone's fingerprint; a library entry of another model is refused.
    task: the task of a multi-task run or MPT adapter.
    attempt_temperature: an ATTEMPT run's temperature (None: E * e).
  """
  reference = library_reference(path)
  if reference is not None:
    return from_library(name, *reference, fingerprint=fingerprint)
  p = pathlib.Path(path)
  if p.is_dir() and (p / "adapter_config.json").exists():
    from spot_jax.serve.export import peft_io, peft_mpt  # pylint: disable=g-import-not-at-top
    if config is not None and kinds.kind_of(config) == "decoder":
      return _causal_adapter(name, str(p), config)
    if peft_mpt.adapter_type(str(p)) == peft_mpt.PEFT_TYPE:
      arrays = peft_mpt.read_adapter(str(p), config)
      if not 0 <= task < arrays["task_cols"].shape[0]:
        raise ConfigError(f"{p} holds {arrays['task_cols'].shape[0]} MPT tasks; task {task} is "
                          f"not one")
      prompt = MultitaskPrompt(arrays["shared"].shape[0], arrays["task_cols"].shape[0],
                               arrays["task_cols"].shape[2]).task_prompts(arrays)[task]
      return ServedPrompt(name, prompt, source=f"{p} task {task}")
    if peft_io.peft_type(str(p)) == peft_io.PREFIX_TUNING:
      if config is None:
        raise ConfigError(f"{p} is a peft prefix adapter; serving it needs the model's config")
      return from_deep(name, peft_io.read_prefix_adapter(str(p), config), config, str(p))
    return ServedPrompt(name, peft_io.read_adapter(str(p), config), source=str(p))
  if p.is_dir():
    return from_run_dir(name, str(p), smop_routing, task, attempt_temperature, config)
  if p.is_file():
    return from_npy(name, str(p))
  raise ConfigError(f"prompt {name!r}: {path} does not exist; give a run directory (MODEL_DIR), "
                    f"a .npy prompt, a PEFT adapter directory or LIBRARY_DIR#ENTRY_ID")


def _causal_adapter(name: str, path: str, config: Any) -> ServedPrompt:
  """A PEFT CAUSAL_LM prompt- or prefix-tuning adapter on a decoder-only model (`peft_causal`)."""
  from spot_jax.serve.export import peft_causal, peft_io  # pylint: disable=g-import-not-at-top
  if peft_io.peft_type(path) == peft_io.PREFIX_TUNING:
    return from_deep(name, {"decoder": peft_causal.read_prefix_adapter(path, config)}, config,
                     path)
  return ServedPrompt(name, peft_causal.read_prompt_adapter(path, config), source=path)


def load_all(name: str, path: str, **kwargs: Any) -> list[ServedPrompt]:
  """`load`'s entry, or one entry per task ("NAME/0", "NAME/1", ...) of a multi-task prompt.

  Args:
    name, path: as `load`'s.
    **kwargs: `load`'s other arguments (not `task`).
  """
  count = num_tasks(path)
  if count == 1:
    return [load(name, path, **kwargs)]
  return [load(f"{name}/{k}", path, task=k, **kwargs) for k in range(count)]

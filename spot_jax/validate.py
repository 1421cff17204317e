"""Checks of user settings, each refusing a bad value in one line that names it.

Every check takes the value and the setting's name as the user wrote it (a flag `--steps`, a gin
macro `TRAIN_STEPS`, a module attribute `SMoP.num_prompts`), returns the value normalised
(`int`, `float`, `pathlib.Path`, a tuple) and otherwise raises `spot_jax.errors.ConfigError`:

  --steps=0 must be a positive integer, e.g. --steps=1000
  SMoP.gumbel_temperature=0.0 must be a number > 0
  level=1.5 must be in (0, 1), e.g. level=0.95
  --method='smpo' is unknown (did you mean 'smop'?); valid: prompt_tuning, smop
  --input '/tmp/x.tsv' does not exist; give a .tsv file of inputs

`example` (a valid value) and `note` (why the bound) make a message more specific where a
bare bound would leave the user guessing.
"""
from __future__ import annotations

import difflib
import math
import numbers
import os
import pathlib
import tempfile
from typing import Any, Optional, Sequence

from spot_jax.errors import ConfigError


def _refuse(setting: str, value: Any, valid: str, note: Optional[str],
            example: Optional[Any]) -> ConfigError:
  why = f" ({note})" if note else ""
  eg = f", e.g. {setting}={example}" if example is not None else ""
  return ConfigError(f"{setting}={value!r} must be {valid}{why}{eg}")


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_int(value: Any, setting: str, *, minimum: int = 1, optional: bool = False,
                 note: Optional[str] = None, example: Optional[Any] = None) -> Optional[int]:
  """`value` as an int if it is an integer (not a bool) >= `minimum` (1 by default).

  With `optional`, None (a flag left unset) passes and comes back as None.
  """
  if optional and value is None:
    return None
  if not _is_int(value) or value < minimum:
    valid = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    raise _refuse(setting, value, valid, note, example)
  return int(value)


def _number(value: Any, setting: str, low: float, strict: bool, unit: Optional[str],
            note: Optional[str], example: Optional[Any], finite: bool) -> float:
  if not _is_number(value) or math.isnan(value) or (finite and math.isinf(value)) \
      or value < low or (strict and value == low):
    noun = f"a number of {unit}" if unit else "a number"
    valid = f"{noun} {'>' if strict else '>='} {low:g}"
    raise _refuse(setting, value, valid, note, example)
  return float(value)


def positive(value: Any, setting: str, *, unit: Optional[str] = None, finite: bool = True,
             note: Optional[str] = None, example: Optional[Any] = None) -> float:
  """`value` as a float if it is a finite number > 0; `unit` ("points") names what it counts.

  `finite=False` lets +inf through (a learning rate may diverge on purpose; the trainer stops
  such a run at its first non-finite loss).
  """
  return _number(value, setting, 0, True, unit, note, example, finite)


def non_negative(value: Any, setting: str, *, unit: Optional[str] = None, finite: bool = True,
                 note: Optional[str] = None, example: Optional[Any] = None) -> float:
  """`value` as a float if it is a finite number >= 0 (`finite=False`: +inf too)."""
  return _number(value, setting, 0, False, unit, note, example, finite)


def fraction(value: Any, setting: str, *, low_closed: bool = False, high_closed: bool = False,
             note: Optional[str] = None, example: Optional[Any] = None) -> float:
  """`value` as a float if it lies in (0, 1), or [0, 1), (0, 1] or [0, 1] as the flags say.

  A level, a power or a probability; a dropout rate is `fraction(rate, ..., low_closed=True)`.
  """
  inside = _is_number(value) and (0 <= value if low_closed else 0 < value) and (
      value <= 1 if high_closed else value < 1)
  if not inside:
    interval = f"{'[' if low_closed else '('}0, 1{']' if high_closed else ')'}"
    raise _refuse(setting, value, f"in {interval}", note, example)
  return float(value)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_size(value: Any, setting: str) -> int:
  """A memory size such as "24GiB", "80GB", "16384MiB" or a number of bytes, in bytes (> 0)."""
  text = str(value).strip().replace(" ", "").lower()
  number = text.rstrip("kmgtib")
  unit = text[len(number):]
  try:
    size = float(number) * _UNITS[unit]
  except (KeyError, ValueError):
    size = float("nan")
  if not math.isfinite(size) or size < 1:
    raise ConfigError(f"{setting}={value!r} must be a memory size such as 24GiB, 80GB or "
                      f"16384MiB")
  return int(size)


def close_names(name: str, candidates: Sequence[str], n: int = 3, cutoff: float = 0.6
                ) -> list[str]:
  """The candidates closest to `name` (difflib), best first, compared case-insensitively."""
  lowered = {}
  for candidate in candidates:
    lowered.setdefault(str(candidate).lower(), candidate)
  close = difflib.get_close_matches(str(name).lower(), list(lowered), n=n, cutoff=cutoff)
  return [lowered[c] for c in close]


def one_of(value: Any, setting: str, valid: Sequence[Any]) -> Any:
  """`value` if it is one of `valid`; otherwise refused with the closest names suggested."""
  if value in valid:
    return value
  close = close_names(str(value), [str(v) for v in valid]) if isinstance(value, str) else []
  hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
  names = ", ".join(str(v) for v in valid)
  raise ConfigError(f"{setting}={value!r} is unknown{hint}; valid: {names}")


def non_empty(values: Any, setting: str, give: str) -> tuple:
  """`values` as a tuple if it holds at least one item; `give` says what to give instead."""
  items = tuple(values) if values is not None else ()
  if not items:
    raise ConfigError(f"{setting} is empty; give {give}")
  return items


def existing_file(path: str | os.PathLike, setting: str, give: str) -> pathlib.Path:
  """`path` (user-expanded) if it is an existing file; `give` says what file is wanted."""
  target = pathlib.Path(path).expanduser()
  if not target.exists():
    raise ConfigError(f"{setting} {str(path)!r} does not exist; give {give}")
  if not target.is_file():
    raise ConfigError(f"{setting} {str(path)!r} is a directory, not a file; give {give}")
  return target


def existing_dir(path: str | os.PathLike, setting: str, give: str) -> pathlib.Path:
  """`path` (user-expanded) if it is an existing directory; `give` says what folder is wanted."""
  folder = pathlib.Path(path).expanduser()
  if not folder.exists():
    raise ConfigError(f"{setting} {str(path)!r} does not exist; give {give}")
  if not folder.is_dir():
    raise ConfigError(f"{setting} {str(path)!r} is a file, not a directory; give {give}")
  return folder


def output_file(path: str | os.PathLike, setting: str) -> pathlib.Path:
  """`path` made absolute if a file can be written there; checked before any work.

  The folder must already exist and take a new file (a probe file is written and removed), and
  `path` must not be a directory. An existing file is left alone: it is replaced only when the
  command writes its result (through `fileio.atomic_open`).
  """
  target = pathlib.Path(path).expanduser().absolute()
  folder = target.parent
  if target.is_dir():
    raise ConfigError(f"{setting} {str(path)!r} is a directory; give a file path")
  if not folder.is_dir():
    what = "is not a directory" if folder.exists() else "does not exist"
    raise ConfigError(f"{setting} {str(path)!r}: {str(folder)!r} {what}; give a file in an "
                      f"existing directory")
  reason = write_refused(folder, f".{target.name}.")
  if reason:
    raise ConfigError(f"{setting} {str(path)!r}: cannot write in {str(folder)!r} "
                      f"({reason}); give a file in a directory you can write to")
  return target


def write_refused(folder: pathlib.Path, prefix: str) -> Optional[str]:
  """None if a new file can be made in `folder` (a probe is written and removed), else why not."""
  try:
    fd, probe = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".probe")
    os.close(fd)
    os.unlink(probe)
  except OSError as e:
    return str(e.strerror or e)
  return None

"""The values gin hands to the configurables, checked before the run and named when refused.

`check_types(roots)` compares every literal value the run's configuration binds (directly or
through a `%MACRO`) with the type hint of the parameter it lands on: int, float, str, bool,
None, unions, Literal, callables, sequences and mappings (entry by entry). A mismatch is one
line naming the setting, e.g.

  LEARNING_RATE='0.3' (optimizers.adafactor.learning_rate): must be a number or a callable,
  got '0.3'
  SAVE_PROMPT_STEPS=[10, 'x'] (train.CheckpointConfig.save_prompt_steps): entry 1 ('x') must
  be an integer

Parameters whose hints name other classes are left to the code that uses them. When that code
refuses a value (a `ConfigError` raised inside a configurable call), `name_setting(error)`
leads its message with the binding that supplied the value, found from gin's note of the call
and the parameter the message names:

  LEARNING_RATE=-1 (optimizers.adafactor.learning_rate): learning_rate=-1 must be a number > 0
"""
from __future__ import annotations

import collections.abc
import re
import sys
import types
import typing
from typing import Any, Iterable, Optional

from spot_jax.cli import gin_overrides
from spot_jax.errors import ConfigError, one_line

_NO_VALUE = object()  # a bound value that holds a reference to a configurable: not checked


def _resolve(value: Any, depth: int = 0) -> tuple[Any, Optional[str]]:
  """(literal value, macro name) of a bound value, following `%MACRO`s; _NO_VALUE for others."""
  key = gin_overrides.macro_key(value)
  if key is not None:
    bound = gin_overrides.bindings(key)
    if "value" not in bound or depth > 20:
      return _NO_VALUE, key[0]
    inner, _ = _resolve(bound["value"], depth + 1)
    return inner, key[0]
  return (_NO_VALUE if _holds_reference(value) else value), None


def _holds_reference(value: Any) -> bool:
  if isinstance(value, (list, tuple, set)):
    return any(_holds_reference(v) for v in value)
  if isinstance(value, dict):
    return any(_holds_reference(k) or _holds_reference(v) for k, v in value.items())
  return not isinstance(value, (int, float, str, bytes, type(None)))


def _hints(obj: Any) -> dict[str, Any]:
  """Parameter -> evaluated type hint of a function or (data)class; unresolvable ones left out."""
  owners = [c for c in reversed(getattr(obj, "__mro__", ())) if c is not object] or [obj]
  hints: dict[str, Any] = {}
  for owner in owners:
    namespace = vars(sys.modules.get(owner.__module__, typing))
    for name, hint in dict(getattr(owner, "__annotations__", {})).items():
      if isinstance(hint, str):
        try:
          hint = eval(hint, dict(namespace), {})  # pylint: disable=eval-used  (the module's own hint)
        except Exception:  # pylint: disable=broad-except  (a name only imported for type checkers)
          hints.pop(name, None)
          continue
      hints[name] = hint
  return hints


_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.Iterable,
              collections.abc.Collection)
_MAPPINGS = (dict, collections.abc.Mapping)
_NAMES = {bool: "True or False", int: "an integer", float: "a number", str: "a string",
          type(None): "None"}


def _describe(hint: Any) -> Optional[str]:
  """What a value of `hint` is, in words; None for types this module does not check."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if hint in _NAMES:
    return _NAMES[hint]
  if origin in (typing.Union, types.UnionType):
    words = [_describe(a) for a in args]
    return None if None in words else " or ".join(words)
  if origin is typing.Literal:
    return "one of " + ", ".join(map(repr, args))
  if origin is collections.abc.Callable or hint is collections.abc.Callable:
    return "a callable"
  if origin in _SEQUENCES or hint in (list, tuple):
    return "a list"
  if origin in _MAPPINGS or hint is dict:
    return "a dict"
  return None


def problem(value: Any, hint: Any) -> Optional[str]:
  """Why `value` does not fit `hint` ("must be ..., got ..."), or None
  (it fits, or is unchecked)."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  expected = _describe(hint)
  if expected is None:
    return None
  if origin in (typing.Union, types.UnionType):
    fits = any(problem(value, a) is None for a in args)
  elif origin is typing.Literal:
    fits = value in args
  elif origin is collections.abc.Callable or hint is collections.abc.Callable:
    fits = callable(value)
  elif origin in _SEQUENCES or hint in (list, tuple):
    if not isinstance(value, (list, tuple)):
      return f"must be {expected}, got {value!r}"
    if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[X, Y]: one hint per entry
      if len(args) != len(value):
        return f"must have {len(args)} entries, got {value!r}"
      item_hints = list(args)
    else:  # list[X], Sequence[X], tuple[X, ...]
      item_hints = [args[0] if args else Any] * len(value)
    for i, (item, item_hint) in enumerate(zip(value, item_hints)):
      inner = problem(item, item_hint)
      if inner:
        return f"entry {i} ({item!r}) {inner.split(', got ')[0]}"
    return None
  elif origin in _MAPPINGS or hint is dict:
    if not isinstance(value, dict):
      return f"must be {expected}, got {value!r}"
    key_hint, value_hint = args if len(args) == 2 else (Any, Any)
    for key, item in value.items():
      inner = problem(key, key_hint) or problem(item, value_hint)
      if inner:
        return f"entry [{key!r}] ({item!r}) {inner.split(', got ')[0]}"
    return None
  elif hint is bool:
    fits = isinstance(value, bool)
  elif hint is int:
    fits = isinstance(value, int) and not isinstance(value, bool)
  elif hint is float:
    fits = isinstance(value, (int, float)) and not isinstance(value, bool)
  else:
    fits = isinstance(value, hint)
  return None if fits else f"must be {expected}, got {value!r}"


def _setting(scope: str, selector: str, param: str, value: Any, macro: Optional[str]) -> str:
  """How a user finds the setting: `MACRO=value (scope/module.Configurable.param)`."""
  short = ".".join(selector.split(".")[-2:])
  where = f"{scope + '/' if scope else ''}{short}.{param}"
  return f"{macro}={value!r} ({where})" if macro else f"{where}={value!r}"


def check_types(keys: Iterable[gin_overrides.ConfigKey]) -> None:
  """Raises a ConfigError naming the first bound value (of `keys`) that does not fit its hint."""
  for scope, selector in sorted(keys):
    if selector == gin_overrides.MACRO:
      continue
    found = gin_overrides.configurable(selector)
    if found is None:
      continue
    hints = _hints(found.wrapped)
    for param, raw in sorted(gin_overrides.bindings((scope, selector)).items()):
      if param not in hints:
        continue
      value, macro = _resolve(raw)
      if value is _NO_VALUE:
        continue
      why = problem(value, hints[param])
      if why:
        raise ConfigError(f"{_setting(scope, selector, param, value, macro)}: {why}")


# gin's note on an error raised inside a configurable call (innermost call first).
_CALL = re.compile(r"In call to configurable '(?P<name>[^']+)' \(.*?\)(?: in scope "
                   r"'(?P<scope>[^']*)')?")


def name_setting(error: ConfigError) -> ConfigError:
  """`error` led by the gin setting that supplied the value it refuses, when that is clear.

  The setting is a parameter bound for the innermost configurable gin called, whose name the
  error's first line mentions (exactly one such). Otherwise, or when the message already names
  the macro, `error` comes back as it was.
  """
  call = _CALL.search(str(error))
  if call is None:
    return error
  found = gin_overrides.configurable(call["name"])
  if found is None:
    return error
  line = one_line(error)
  scope = call["scope"] or ""
  parts = scope.split("/") if scope else []
  bound: dict[str, tuple[str, Any]] = {}
  for i in range(len(parts) + 1):  # outer scopes first, inner ones override
    key = ("/".join(parts[:i]), found.selector)
    bound.update({p: (key[0], v) for p, v in gin_overrides.bindings(key).items()})
  named = [p for p in bound if re.search(rf"\b{re.escape(p)}\b", line)]
  if len(named) != 1:
    return error
  param = named[0]
  key_scope, raw = bound[param]
  value, macro = _resolve(raw)
  if value is _NO_VALUE or (macro and macro in line):
    return error
  if str(value) not in line and repr(value) not in line:
    return error  # the message names the parameter's word, not the value it refuses
  return ConfigError(f"{_setting(key_scope, found.selector, param, value, macro)}: {line}")

"""Command-line gin overrides: parsed one at a time (an error names its flag), and refused when
the final configuration never uses them.

gin binds anything it can parse: `--gin.PROMPT_LENGTH=7` defines a macro that nothing reads, and
`--gin.prompts.SMoP.num_prompts=8` configures a class the run never builds. Both would train
silently with other values than the user asked for. Here, "used" is read off gin's parsed
configuration: starting from the configurables the program calls (its roots), follow every
`@reference` and `%MACRO` in the bound values, with gin's scoping rules (a scoped reference
`@train/X()` runs X in scope `train`; an unscoped one keeps the caller's scope). An override
whose (scope, configurable) or macro is never reached changes nothing and is an error, with
close names suggested, unless `--allow_unused_gin_overrides` is given.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Iterable, Optional, Sequence

import gin
from gin import config_parser

from spot_jax.cli import one_line
from spot_jax.errors import ConfigError

MACRO = "gin.macro"
ConfigKey = tuple[str, str]  # (scope, complete selector), gin's key of one configurable's bindings


def parse_override(binding: str) -> None:
  """Parses one `KEY=VALUE` binding; a malformed one is a ConfigError naming its flag."""
  try:
    gin.parse_config(binding)
  except SyntaxError as e:
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    detail = next((l for l in lines if l.startswith("Failed to parse")), lines[0] if lines else "")
    raise ConfigError(f"--gin.{binding}: gin cannot parse it ({detail}); values are Python literals "
                      f"(strings keep their quotes: --gin.MODEL_DIR=\"'/tmp/run'\"), @name() "
                      f"references or %MACROS") from None
  except (ValueError, KeyError, TypeError, ImportError, AttributeError) as e:
    raise ConfigError(f"--gin.{binding}: {one_line(e)}") from None


def override_key(binding: str) -> ConfigKey:
  """The gin config key a parsed `KEY=VALUE` binding sets (macros: (NAME, "gin.macro"))."""
  for statement in config_parser.ConfigParser(binding, gin.config.ParserDelegate()):
    if isinstance(statement, config_parser.BindingStatement):
      scope, selector, arg_name = statement.scope, statement.selector, statement.arg_name
      if not arg_name:
        return (f"{scope}/{selector}" if scope else selector, MACRO)
      return gin.config.ParsedBindingKey.parse((scope, selector, arg_name)).config_key
  raise ConfigError(f"--gin.{binding} is not a binding; overrides look like --gin.TRAIN_STEPS=100")


def resolve_roots(roots: Sequence[str]) -> Optional[list[str]]:
  """Complete gin selectors of `roots` ("module.function"), or None if one is not configured."""
  selectors = []
  for root in roots:
    module, _, name = root.rpartition(".")
    fn = getattr(importlib.import_module(module), name)
    configurable = gin.config._inverse_lookup(fn)  # pylint: disable=protected-access
    if configurable is None:
      return None
    selectors.append(configurable.selector)
  return selectors


def used_keys(root_selectors: Iterable[str]) -> set[ConfigKey]:
  """Every config key the roots' calls read, following references and macros through scopes."""
  config = gin.config._CONFIG  # pylint: disable=protected-access
  used: set[ConfigKey] = set()
  visited: set[tuple[tuple[str, ...], str]] = set()
  stack = [((), selector) for selector in root_selectors]
  while stack:
    scope, selector = stack.pop()
    if (scope, selector) in visited:
      continue
    visited.add((scope, selector))
    for i in range(len(scope) + 1):
      key = ("/".join(scope[:i]), selector)
      if key not in config:
        continue
      used.add(key)
      for ref in gin.config.iterate_references(config[key]):
        stack.append((tuple(ref.scopes) if ref.scopes else scope, ref.configurable.selector))
  return used


def default_roots(keys_from_files: Iterable[ConfigKey]) -> list[str]:
  """Without declared roots: the configurables the gin files bind and nothing references."""
  config = gin.config._CONFIG  # pylint: disable=protected-access
  referenced = {ref.configurable.selector for ref in gin.config.iterate_references(config)}
  return sorted({sel for scope, sel in keys_from_files
                 if not scope and sel != MACRO and sel not in referenced})


def _short(selector: str) -> str:
  return ".".join(selector.split(".")[-2:])


def _names_in_use(used: Iterable[ConfigKey]) -> list[str]:
  """What a user could have meant: the macros and `configurable.parameter` names in use."""
  names = set()
  for scope, selector in used:
    if selector == MACRO:
      names.add(scope)
      continue
    configurable = gin.config._REGISTRY.get_match(selector)  # pylint: disable=protected-access
    params = set(gin.config._CONFIG.get((scope, selector), {}))  # pylint: disable=protected-access
    if configurable is not None:
      try:
        params |= set(inspect.signature(configurable.wrapped).parameters) - {"self", "args", "kwargs"}
      except (TypeError, ValueError):
        pass
    prefix = f"{scope}/" if scope else ""
    names |= {f"{prefix}{_short(selector)}.{p}" for p in params}
  return sorted(names)


def suggest(key: ConfigKey, binding: str, candidates: Sequence[str]) -> list[str]:
  """Close names (difflib), compared case-insensitively."""
  word = key[0] if key[1] == MACRO else binding.split("=", 1)[0].strip()
  lowered = {c.lower(): c for c in candidates}
  close = [lowered[c] for c in difflib.get_close_matches(word.lower(), list(lowered), n=3, cutoff=0.6)]
  # PROMPT_LENGTH -> prompts.PromptTuning.length: same last word, another spelling
  tail = word.lower().split(".")[-1].split("_")[-1]
  close += [c for low, c in lowered.items() if low.split(".")[-1] == tail and c not in close]
  return close[:3]


def check_unused(bindings: Sequence[str], keys: Sequence[ConfigKey], root_selectors: Sequence[str]) -> None:
  """Raises a one-line ConfigError listing the overrides the configuration never reads."""
  used = used_keys(root_selectors)
  unused = [(b, k) for b, k in zip(bindings, keys) if k not in used]
  if not unused:
    return
  candidates = _names_in_use(used)
  parts = []
  for binding, key in unused:
    what = f"the macro {key[0]}" if key[1] == MACRO else f"{_short(key[1])}" + (
        f" in scope {key[0]!r}" if key[0] else "")
    close = suggest(key, binding, candidates)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    parts.append(f"--gin.{binding} (nothing in this configuration uses {what}{hint})")
  noun = "this gin override changes" if len(parts) == 1 else f"these {len(parts)} gin overrides change"
  raise ConfigError(f"{noun} nothing: {'; '.join(parts)}; fix or remove "
                    f"{'it' if len(parts) == 1 else 'them'}, or pass --allow_unused_gin_overrides")

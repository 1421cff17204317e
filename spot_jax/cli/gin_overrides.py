"""gin's side of the command lines: parsing files and `--gin.X=V` overrides into one-line
errors that name the file (and line) or the flag, and refusing overrides the final
configuration never uses.

gin binds anything it can parse: `--gin.PROMPT_LENGTH=7` defines a macro that nothing reads, and
`--gin.prompts.SMoP.num_prompts=8` configures a class the run never builds. Both would train
silently with other values than the user asked for. Here, "used" is read off gin's parsed
configuration: starting from the configurables the program calls (its roots), follow every
`@reference` and `%MACRO` in the bound values, with gin's scoping rules (a scoped reference
`@train/X()` runs X in scope `train`; an unscoped one keeps the caller's scope). An override
whose (scope, configurable) or macro is never reached changes nothing and is an error, with
close names suggested, unless `--allow_unused_gin_overrides` is given.

gin keeps its parsed configuration in private module state; `_gin_state()` is the one place in
spot-jax that reads it. Everything else goes through this module's functions.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import os
import re
import tokenize
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Sequence

import gin
from gin import config_parser

from spot_jax import validate
from spot_jax.errors import ConfigError, one_line

MACRO = "gin.macro"
ConfigKey = tuple[str, str]  # (scope, complete selector), gin's key of one configurable's bindings


class GinState(NamedTuple):
  """gin's parsed configuration and registry (read-only views by convention).

  Attributes:
    config: {(scope, complete selector): {parameter: value}}; a macro NAME is
      (NAME, "gin.macro") -> {"value": value}.
    get_match: the registered configurable a (partial) selector names, or None.
    inverse_lookup: the configurable registered for a Python function or class, or None.
  """
  config: Mapping[ConfigKey, Mapping[str, Any]]
  get_match: Callable[[str], Any]
  inverse_lookup: Callable[[Any], Any]


def _gin_state() -> GinState:
  """The only access to gin's private module state (gin offers no public reader for it)."""
  config = gin.config
  return GinState(config._CONFIG, config._REGISTRY.get_match, config._inverse_lookup)  # pylint: disable=protected-access


def config_keys() -> set[ConfigKey]:
  """The (scope, selector) keys bound so far (configurables and macros)."""
  return set(_gin_state().config)


def bindings(key: ConfigKey) -> Mapping[str, Any]:
  """{parameter: value} bound for one (scope, selector), empty if none."""
  return dict(_gin_state().config.get(key, {}))


def configurable(selector: str) -> Any:
  """gin's registered configurable for `selector` (it has .wrapped, .selector), or None."""
  try:
    return _gin_state().get_match(selector)
  except ValueError:  # an ambiguous partial selector
    return None


def macro_key(reference: Any) -> Optional[ConfigKey]:
  """The config key of the macro a `%MACRO` reference reads, or None for other references."""
  if (isinstance(reference, gin.config.ConfigurableReference)
      and reference.configurable.selector == MACRO):
    return ("/".join(reference.scopes), MACRO)
  return None


# --- parsing, with errors that name their source ----------------------------------------------

_LOCATION = re.compile(r'\n  In file "(?P<file>[^"]*)", line (?P<line>\d+)\n    (?P<text>[^\n]*)')
_INCLUDE = re.compile(r"""^\s*include\s+['"](?P<file>[^'"]+)['"]""")


def _token_error(error: BaseException) -> Optional[tuple[str, int]]:
  """(message, line) of a tokenize.TokenError, also when gin re-raised it with a longer text."""
  if isinstance(error, tokenize.TokenError):
    if len(error.args) == 2:
      return error.args[0], error.args[1][0]
    found = re.match(r"\('(?P<message>[^']*)', \((?P<line>\d+), \d+\)\)", str(error))
    if found:
      return found["message"], int(found["line"])
  return None


def describe_error(error: BaseException, source: str) -> str:
  """One line for a gin parse error of `source` (a file or a binding): where, then what.

  gin's SyntaxErrors carry their file and line; other errors get 'In file "...", line N' added
  to their text for each file that encloses them (the innermost first); a tokenize.TokenError
  (an unclosed bracket or string) carries only its line, in the file the first enclosing
  `include` names, or in `source` itself.
  """
  places = [(m["file"], int(m["line"]), m["text"]) for m in _LOCATION.finditer(str(error))]
  token = _token_error(error)
  if isinstance(error, SyntaxError):
    what = error.msg
    if error.filename:
      places.insert(0, (error.filename, error.lineno, error.text or ""))
  elif token is not None:
    what = f"the file ends inside an unclosed bracket or string ({token[0]})"
    included = _INCLUDE.match(places[0][2]) if places else None
    places.insert(0, (included["file"] if included else source, token[1], ""))
  else:
    what = one_line(error)
  if not places:
    return f"{source}: {what}"
  file, line, text = places[0]
  here = f", line {line}" + (f" ({text.strip()})" if text.strip() else "")
  if len(places) == 1 and (file == source or file.endswith("/" + source.lstrip("./"))):
    return f"{source}{here}: {what}"
  outer = "; ".join(f"{f}, line {n}" for f, n, _ in places[1:])
  return f"{source}: {file}{here}{' (included from ' + outer + ')' if outer else ''}: {what}"


def _not_a_path_probe(record: logging.LogRecord) -> bool:
  # gin looks for each file under every search path, and its package-resource reader logs an
  # ERROR line on the root logger for each place the file is not; a file found nowhere is
  # reported by gin's own exception.
  return not (record.getMessage().startswith("Path not found: ") and
              record.pathname.endswith(os.path.join("gin", "resource_reader.py")))


def parse_file(path: str, flag: str = "--gin_file") -> None:
  """Parses one gin file (and its includes); any error is a ConfigError naming the file and line."""
  logging.root.addFilter(_not_a_path_probe)
  try:
    gin.parse_config_file(path)
  except Exception as e:  # pylint: disable=broad-except  (gin raises many types for bad text)
    raise ConfigError(f"{flag}={describe_error(e, path)}") from None
  finally:
    logging.root.removeFilter(_not_a_path_probe)


def finalize() -> None:
  """gin.finalize(); a macro that is used but never set (or left %gin.REQUIRED) is one line."""
  try:
    gin.finalize()
  except Exception as e:  # pylint: disable=broad-except  (gin's finalize hooks check the bindings)
    text = one_line(e)
    unset = re.search(r"No bindings specified for '([^']+)/gin\.macro'", text)
    required = re.search(r"(\S+)/macro\.value set to `%gin\.REQUIRED`", text)
    if unset:
      raise ConfigError(f"the macro {unset[1]} is used but never set; give --gin.{unset[1]}=... or "
                        "a gin file that sets it (gin/models/ files set MODEL, gin/prompts/ files "
                        "PROMPT)") from None
    if required:
      raise ConfigError(f"{required[1]} is required: give --gin.{required[1]}=... (strings keep "
                        f"their quotes: --gin.MODEL_DIR=\"'/tmp/run'\")") from None
    raise ConfigError(f"the gin configuration is inconsistent: {text}") from None


def parse_override(binding: str, flag: str = "--gin.") -> None:
  """Parses one `KEY=VALUE` binding; a malformed one is a ConfigError naming its flag."""
  try:
    gin.parse_config(binding)
  except (SyntaxError, tokenize.TokenError) as e:
    token = _token_error(e)
    detail = e.msg if isinstance(e, SyntaxError) else f"{token[0] if token else one_line(e)}"
    raise ConfigError(f"{flag}{binding}: gin cannot parse it ({detail}); values are Python "
                      "literals (strings keep their quotes: --gin.MODEL_DIR=\"'/tmp/run'\"), "
                      "@name() references or %MACROS") from None
  except Exception as e:  # pylint: disable=broad-except  (unknown configurable or parameter, ...)
    raise ConfigError(f"{flag}{binding}: {one_line(e)}") from None


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
    found = _gin_state().inverse_lookup(fn)
    if found is None:
      return None
    selectors.append(found.selector)
  return selectors


def used_keys(root_selectors: Iterable[str]) -> set[ConfigKey]:
  """Every config key the roots' calls read, following references and macros through scopes."""
  config = _gin_state().config
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


def macros_read(root_selectors: Iterable[str]) -> set[str]:
  """The names of the macros (`%NAME`) the roots' calls read, whether bound or not."""
  config = _gin_state().config
  names = set()
  for key in used_keys(root_selectors):
    for ref in gin.config.iterate_references(config[key]):
      if ref.configurable.selector == MACRO:
        names.add("/".join(ref.scopes))
  return names


def default_roots(keys_from_files: Iterable[ConfigKey]) -> list[str]:
  """Without declared roots: the configurables the gin files bind and nothing references."""
  config = _gin_state().config
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
    found = configurable(selector)
    params = set(bindings((scope, selector)))
    if found is not None:
      try:
        params |= set(inspect.signature(found.wrapped).parameters) - {"self", "args", "kwargs"}
      except (TypeError, ValueError):
        pass
    prefix = f"{scope}/" if scope else ""
    names |= {f"{prefix}{_short(selector)}.{p}" for p in params}
  return sorted(names)


def suggest(key: ConfigKey, binding: str, candidates: Sequence[str]) -> list[str]:
  """Close names (`validate.close_names`), and names of the same last word."""
  word = key[0] if key[1] == MACRO else binding.split("=", 1)[0].strip()
  lowered = {c.lower(): c for c in candidates}
  close = validate.close_names(word, candidates)
  # PROMPT_LENGTH -> prompts.PromptTuning.length: same last word, another spelling
  tail = word.lower().split(".")[-1].split("_")[-1]
  close += [c for low, c in lowered.items() if low.split(".")[-1] == tail and c not in close]
  return close[:3]


def check_unused(bindings: Sequence[str], keys: Sequence[ConfigKey],
                 root_selectors: Sequence[str]) -> None:
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
  noun = ("this gin override changes" if len(parts) == 1
          else f"these {len(parts)} gin overrides change")
  raise ConfigError(f"{noun} nothing: {'; '.join(parts)}; fix or remove "
                    f"{'it' if len(parts) == 1 else 'them'}, or pass --allow_unused_gin_overrides")

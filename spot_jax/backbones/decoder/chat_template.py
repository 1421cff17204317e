"""A model's chat template, rendered with jinja2 exactly as transformers' `apply_chat_template`.

A Hugging Face model directory keeps its template in `chat_template.jinja` or under
"chat_template" in `tokenizer_config.json` (a string, or a list of {"name", "template"} whose
"default" entry is the chat template). The template sees `messages`, `add_generation_prompt`,
`tools`, `documents`, the tokenizer's named special tokens (`bos_token`, `eos_token`, ...) and any
extra keyword arguments, in a sandboxed environment with transformers' globals (`raise_exception`,
`strftime_now`, `tojson` without HTML escaping, `dict`, `namespace`) and its block settings
(`trim_blocks`, `lstrip_blocks`, loop controls, the `{% generation %}` tag).

The rendered text already holds the special tokens the template writes (a Llama 3 template
writes `<|begin_of_text|>`): tokenize it without adding BOS again, as transformers does
(`add_special_tokens=False`).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
from typing import Any, Mapping, Optional, Sequence

from spot_jax.errors import ConfigError

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"


class ChatTemplateError(ConfigError):
  """A template that is missing, malformed, or fails to render the messages given."""


def _token_text(value: Any) -> Optional[str]:
  """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
  if isinstance(value, Mapping):
    value = value.get("content")
  return value if isinstance(value, str) else None


def _plain(value: Any) -> Any:
  """Plain JSON data only, as transformers hands the template (no objects with methods)."""
  if value is None or type(value) in (str, int, float, bool):
    return value
  if isinstance(value, Mapping):
    return {_plain(k): _plain(v) for k, v in value.items()}
  if isinstance(value, tuple):
    return tuple(_plain(v) for v in value)
  if isinstance(value, list):
    return [_plain(v) for v in value]
  for kind in (bool, str, int, float):
    if isinstance(value, kind):
      return kind(value)
  if hasattr(value, "item"):  # numpy scalars
    return _plain(value.item())
  raise ChatTemplateError(f"chat message value {value!r} is not JSON data; messages hold "
                          "strings, numbers, lists and objects")


def _environment():
  """transformers' jinja environment for chat templates."""
  import jinja2  # pylint: disable=g-import-not-at-top
  from jinja2 import ext, nodes  # pylint: disable=g-import-not-at-top
  from jinja2.sandbox import ImmutableSandboxedEnvironment  # pylint: disable=g-import-not-at-top

  class Generation(ext.Extension):
    """`{% generation %}...{% endgeneration %}`: renders its body (assistant-mask tracking is
    not needed to render)."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
      return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  class Namespace(jinja2.utils.Namespace):
    """jinja's namespace without underscore-prefixed attributes (transformers' rule)."""

    def __init__(*args, **kwargs):  # pylint: disable=no-method-argument
      self, args = args[0], args[1:]
      attrs = dict(*args, **kwargs)
      for name in attrs:
        Namespace.check(name)
      jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
      Namespace.check(name)
      jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def check(name):
      if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"chat templates cannot store underscore-prefixed attributes ({name!r})")

  class TemplateDict:
    def __call__(self, *args, **kwargs):
      return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
      return dict.fromkeys(*args, **kwargs)

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[Generation, ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                     dict=TemplateDict(), namespace=Namespace)
  return env


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """A chat template and the special tokens it may write.

  Attributes:
    source: the jinja2 template text.
    special_tokens: the tokenizer's named special tokens ({"bos_token": "<s>", ...}).
    origin: where the template was read (for error messages).
  """
  source: str
  special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
  origin: str = "chat template"

  def __post_init__(self):
    if not isinstance(self.source, str) or not self.source.strip():
      raise ChatTemplateError(f"{self.origin}: the chat template is empty; give a jinja2 "
                              "template text")
    import jinja2  # pylint: disable=g-import-not-at-top
    try:
      compiled = _environment().from_string(self.source)
    except jinja2.TemplateSyntaxError as e:
      raise ChatTemplateError(f"{self.origin}: chat template does not parse: {e.message} "
                              f"(line {e.lineno})") from None
    object.__setattr__(self, "_compiled", compiled)

  @property
  def bos_token(self) -> Optional[str]:
    return self.special_tokens.get("bos_token")

  @property
  def eos_token(self) -> Optional[str]:
    return self.special_tokens.get("eos_token")

  def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False,
             tools: Optional[Sequence[Mapping[str, Any]]] = None,
             documents: Optional[Sequence[Mapping[str, Any]]] = None, **kwargs: Any) -> str:
    """The text transformers' `apply_chat_template(messages, tokenize=False, ...)` gives.

    Args:
      messages: [{"role": ..., "content": ...}, ...]; keys whose value is None are dropped, as
        transformers drops them.
      add_generation_prompt: end with the header of an assistant turn.
      tools, documents: passed to the template as transformers passes them.
      **kwargs: further template variables; they override the special tokens of the same name.

    Raises:
      ChatTemplateError: a message that is not an object, or a template that fails to render
        (its own `raise_exception` included), named with the template's origin.
    """
    import jinja2  # pylint: disable=g-import-not-at-top
    chat = []
    for i, message in enumerate(messages):
      if not isinstance(message, Mapping):
        raise ChatTemplateError(f"message {i} is {type(message).__name__}, not an object with "
                                "'role' and 'content'")
      chat.append({k: _plain(v) for k, v in message.items() if v is not None})
    variables = {**self.special_tokens, **_plain(dict(kwargs))}
    try:
      return self._compiled.render(  # pytype: disable=attribute-error
          messages=chat, tools=_plain(tools), documents=_plain(documents),
          add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as e:
      raise ChatTemplateError(f"{self.origin}: chat template failed to render: "
                              f"{e.message or type(e).__name__}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as e:
      raise ChatTemplateError(f"{self.origin}: chat template failed to render: "
                              f"{type(e).__name__}: {e}") from None


def _select(value: Any, origin: str) -> str:
  """The chat template of a tokenizer_config.json's "chat_template" entry."""
  if isinstance(value, str):
    return value
  if isinstance(value, list):
    named = {e.get("name"): e.get("template") for e in value if isinstance(e, Mapping)}
    if "default" in named:
      return named["default"]
    raise ChatTemplateError(f"{origin}: \"chat_template\" lists templates "
                            f"{sorted(str(n) for n in named)} and none is named 'default'")
  raise ChatTemplateError(f"{origin}: \"chat_template\" must be a string or a list of "
                          "{\"name\", \"template\"} objects")


def load_chat_template(model_dir: str | pathlib.Path) -> Optional[ChatTemplate]:
  """The chat template of a Hugging Face model directory, or None when it has none.

  `chat_template.jinja` takes precedence over tokenizer_config.json's "chat_template" (as
  transformers loads them); the special tokens come from tokenizer_config.json, then
  special_tokens_map.json for those it lacks.
  """
  root = pathlib.Path(model_dir)
  config_path = root / TOKENIZER_CONFIG
  config: dict = {}
  if config_path.is_file():
    try:
      config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
      raise ChatTemplateError(f"{config_path}: not a JSON object ({e})") from None
  tokens = {k: t for k in SPECIAL_TOKENS if (t := _token_text(config.get(k))) is not None}
  map_path = root / "special_tokens_map.json"
  if map_path.is_file():
    try:
      extra = json.loads(map_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
      raise ChatTemplateError(f"{map_path}: not a JSON object ({e})") from None
    for k in SPECIAL_TOKENS:
      if k not in tokens and (t := _token_text(extra.get(k))) is not None:
        tokens[k] = t
  template_path = root / TEMPLATE_FILE
  if template_path.is_file():
    return ChatTemplate(template_path.read_text(encoding="utf-8"), tokens, str(template_path))
  if config.get("chat_template") is None:
    return None
  return ChatTemplate(_select(config["chat_template"], str(config_path)), tokens,
                      str(config_path))

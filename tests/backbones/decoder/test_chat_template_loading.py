"""Chat templates read from a model directory, rendered as transformers renders them."""
import json

import pytest

from spot_jax.backbones.decoder import chat_template as chat_lib
from spot_jax.errors import ConfigError

# A template using what transformers' environment provides: namespace, loop controls,
# raise_exception, tojson without HTML escaping, bos_token and add_generation_prompt.
TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}"
    "{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{% set ns.n = ns.n + 1 %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] | trim }}{{ eos_token }}\n"
    "{% if loop.index > 8 %}{% break %}{% endif %}"
    "{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief & <exact>."},
            {"role": "user", "content": "  2+2=?  ", "name": None},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]


def _tokenizer():
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  return tok


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("tools", [None, [{"name": "calc", "description": "a < b"}]])
def test_render_equals_transformers(tmp_path, add_generation_prompt, tools):
  transformers = pytest.importorskip("transformers")
  reference = transformers.PreTrainedTokenizerFast(
      tokenizer_object=_tokenizer(), bos_token="<s>", eos_token="</s>", unk_token="<unk>")
  reference.chat_template = TEMPLATE
  reference.save_pretrained(str(tmp_path))
  template = chat_lib.load_chat_template(tmp_path)
  assert template is not None and template.bos_token == "<s>" and template.eos_token == "</s>"
  expected = reference.apply_chat_template(MESSAGES, tools=tools, tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
  assert template.render(MESSAGES, tools=tools,
                         add_generation_prompt=add_generation_prompt) == expected


def test_template_sources_and_their_precedence(tmp_path):
  assert chat_lib.load_chat_template(tmp_path) is None  # no files: no template
  config = {"bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "D{{ eos_token }}"}]}
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  (tmp_path / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<pad>",
                                                                "eos_token": "<other>"}))
  template = chat_lib.load_chat_template(tmp_path)
  assert template.render([]) == "D</s>"  # the "default" entry; the config's EOS wins
  assert template.special_tokens == {"bos_token": "<s>", "eos_token": "</s>",
                                     "pad_token": "<pad>"}
  (tmp_path / "chat_template.jinja").write_text("J{{ bos_token }}")
  assert chat_lib.load_chat_template(tmp_path).render([]) == "J<s>"


@pytest.mark.parametrize("files, call, expected", [
    ({"tokenizer_config.json": "{"}, None, "not a JSON object"),
    ({"tokenizer_config.json": json.dumps({"chat_template": [{"name": "x", "template": "y"}]})},
     None, "none is named 'default'"),
    ({"tokenizer_config.json": json.dumps({"chat_template": 3})}, None, "must be a string"),
    ({"chat_template.jinja": "{% for %}"}, None, "does not parse"),
    ({"chat_template.jinja": "   "}, None, "is empty"),
    ({"chat_template.jinja": TEMPLATE}, [{"role": "robot", "content": "x"}],
     "failed to render: unknown role robot"),
    ({"chat_template.jinja": TEMPLATE}, ["hello"], "message 0 is str"),
])
def test_bad_templates_are_one_line_errors(tmp_path, files, call, expected):
  for name, text in files.items():
    (tmp_path / name).write_text(text)
  with pytest.raises(ConfigError) as info:
    chat_lib.load_chat_template(tmp_path).render(call)
  assert expected in str(info.value) and "\n" not in str(info.value)

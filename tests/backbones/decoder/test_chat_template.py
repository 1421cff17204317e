"""Chat templates of Llama 3, Gemma 3 and Qwen 2.5 render as transformers' apply_chat_template.

The three templates are written here in the shape their models ship (tokenizer_config.json's
"chat_template"): Llama 3.2's (BOS, a system header with the knowledge and today's dates,
tools as JSON), Gemma 3's (BOS, the system text folded into the first user turn, "model" for
the assistant, alternation enforced) and Qwen 2.5's (a default system message, <|im_start|>
turns, tools). Nothing is downloaded.
"""
import pytest

from spot_jax.backbones.decoder import chat_template as chat_lib

LLAMA_3 = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role == 'tool' %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" + message.content + "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
        {{- message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

GEMMA_3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

QWEN_2_5 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. ' }}
        {{- 'You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first)
          or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# (template, bos, eos) as the models' tokenizer_config.json name them.
MODELS = {"llama_3": (LLAMA_3, "<|begin_of_text|>", "<|eot_id|>"),
          "gemma_3": (GEMMA_3, "<bos>", "<eos>"),
          "qwen_2_5": (QWEN_2_5, None, "<|im_end|>")}
SYSTEM = {"role": "system", "content": "  You add numbers & answer \"briefly\". "}
CHAT = [{"role": "user", "content": "What is 2 + 2? "},
        {"role": "assistant", "content": "4! <b>four</b>"},
        {"role": "user", "content": "And 3 + 3?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b, é",
                                            "parameters": {"a": "number", "b": "number"}}}]


def _reference(tmp_path, template: str, bos, eos):
  """transformers' tokenizer with this template, saved as a model directory is."""
  transformers = pytest.importorskip("transformers")
  from tokenizers import Tokenizer, models  # pylint: disable=g-import-not-at-top
  tok = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
  special = {"bos_token": bos} if bos else {}
  reference = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos,
                                                   unk_token="<unk>", **special)
  reference.chat_template = template
  reference.save_pretrained(str(tmp_path))
  return reference


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("system", [False, True], ids=["no_system", "system"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_rendering_equals_transformers(tmp_path, model, system, add_generation_prompt):
  template, bos, eos = MODELS[model]
  reference = _reference(tmp_path, template, bos, eos)
  ours = chat_lib.load_chat_template(tmp_path)
  assert ours is not None and ours.bos_token == bos and ours.eos_token == eos
  for end in (1, 2, 3):  # the conversation up to each turn
    messages = ([SYSTEM] if system else []) + CHAT[:end]
    kwargs = {"date_string": "26 Jul 2024"} if model == "llama_3" else {}
    expected = reference.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             **kwargs)
    assert ours.render(messages, add_generation_prompt=add_generation_prompt,
                       **kwargs) == expected


@pytest.mark.parametrize("model", ["llama_3", "qwen_2_5"])
def test_tools_render_as_transformers_renders_them(tmp_path, model):
  template, bos, eos = MODELS[model]
  reference = _reference(tmp_path, template, bos, eos)
  ours = chat_lib.load_chat_template(tmp_path)
  messages = [SYSTEM] + CHAT[:1]
  expected = reference.apply_chat_template(messages, tools=TOOLS, tokenize=False,
                                           add_generation_prompt=True, date_string="1 Jan 2025")
  assert ours.render(messages, tools=TOOLS, add_generation_prompt=True,
                     date_string="1 Jan 2025") == expected


def test_llama_dates_today_without_a_date_string(tmp_path):
  """strftime_now: the template's own clock, as transformers gives it."""
  import datetime  # pylint: disable=g-import-not-at-top
  template, bos, eos = MODELS["llama_3"]
  _reference(tmp_path, template, bos, eos)
  text = chat_lib.load_chat_template(tmp_path).render(CHAT[:1])
  assert f"Today Date: {datetime.datetime.now().strftime('%d %b %Y')}" in text


def test_a_template_raising_is_one_line(tmp_path):
  template, bos, eos = MODELS["gemma_3"]
  _reference(tmp_path, template, bos, eos)
  with pytest.raises(chat_lib.ChatTemplateError, match="roles must alternate") as info:
    chat_lib.load_chat_template(tmp_path).render(CHAT[:1] + CHAT[:1])
  assert "\n" not in str(info.value)

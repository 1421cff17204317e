"""Instruction tasks from chat JSONL: the tokens equal transformers' rendering of the chat, the
loss weights are 0 on every token but the assistant's, and bad input is one line naming the
file and line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import seqio

from spot_jax import data
from spot_jax.errors import ConfigError
from tasks import chat

# A Llama-3-shaped template (BOS, headers, <|eot_id|> ending each turn, a generation header).
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('no role ' + m['role']) }}{% endif %}"
    "<|start_header_id|> {{ m['role'] }} <|end_header_id|> {{ m['content'] | trim }} <|eot_id|> "
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|> assistant <|end_header_id|> "
    "{% endif %}")
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>"]
WORDS = ["system", "user", "assistant", "tool", "be", "brief", "what", "is", "two", "plus",
         "three", "four", "five", "and", "then", "?", "question", "answer", ":", "the"]
CONVERSATION = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "what is two plus two ?"},
                {"role": "assistant", "content": "four"},
                {"role": "user", "content": "and two plus three ?"},
                {"role": "assistant", "content": "then five"}]
LENGTHS = {"inputs": 40, "targets": 8}


def _model_dir(path, template=TEMPLATE):
  """A Hugging Face tokenizer directory (word-level, Llama 3's special tokens), as transformers
  saves it; returns (path, the transformers tokenizer)."""
  transformers = pytest.importorskip("transformers")
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  vocab = {w: i for i, w in enumerate(["<unk>"] + SPECIAL + WORDS)}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  reference = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
      unk_token="<unk>", additional_special_tokens=SPECIAL[2:])
  if template is not None:
    reference.chat_template = template
  path.mkdir(parents=True, exist_ok=True)
  reference.save_pretrained(str(path))
  return str(path), reference


def _jsonl(path, rows) -> str:
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return str(path)


def _batch(name: str, split: str = "train", rows: int = 8):
  cfg = data.DatasetConfig(name, LENGTHS, split=split, batch_size=rows, shuffle=False,
                           feature_layout="decoder_only")
  return next(data.train_batches(cfg))


def test_assistant_tokens_alone_are_weighted_and_equal_transformers(tmp_path):
  model_dir, reference = _model_dir(tmp_path / "model")
  rows = [{"messages": CONVERSATION},
          {"prompt": [CONVERSATION[1]], "completion": [CONVERSATION[2]]},
          {"prompt": "what is two plus three ?", "completion": "five"}]
  name = chat.register_chat_task("test_chat_weights_v1", train=_jsonl(tmp_path / "t.jsonl", rows),
                                 tokenizer=model_dir)
  batch = _batch(name, rows=4)  # one example per assistant turn: 2 + 1 + 1
  eos = reference.convert_tokens_to_ids("<|end_of_text|>")
  turns = [(CONVERSATION[:3], "four"), (CONVERSATION, "then five"),
           (CONVERSATION[1:3], "four"),
           ([{"role": "user", "content": "what is two plus three ?"},
             {"role": "assistant", "content": "five"}], "five")]
  for tokens, weights, (messages, answer) in zip(batch["decoder_target_tokens"],
                                                 batch["decoder_loss_weights"], turns):
    real = tokens[tokens > 0]
    # transformers' ids of the whole chat, without the BOS the model puts first itself
    expected = reference.apply_chat_template(messages, tokenize=True, return_dict=False)
    expected = list(getattr(expected, "input_ids", expected))
    assert expected[0] == reference.bos_token_id
    np.testing.assert_array_equal(real, expected[1:] + [eos])
    trained = tokens[weights > 0]
    assert reference.decode(trained) == f"{answer} <|eot_id|> <|end_of_text|>"
    assert weights[tokens == 0].sum() == 0 and weights.sum() == len(trained)


def test_plain_template_is_prompt_then_completion(tmp_path):
  model_dir, reference = _model_dir(tmp_path / "model", template=None)
  rows = [{"prompt": "question : what is two plus two ? answer :", "completion": "four"}]
  for template in ("plain", "model"):  # a model without a template: plain for prompt/completion
    name = chat.register_chat_task(f"test_chat_plain_{template}_v1",
                                   train=_jsonl(tmp_path / "p.jsonl", rows),
                                   tokenizer=model_dir, template=template)
    batch = _batch(name, rows=1)
    tokens, weights = batch["decoder_target_tokens"][0], batch["decoder_loss_weights"][0]
    prompt = reference.encode(rows[0]["prompt"], add_special_tokens=False)
    assert list(tokens[weights == 0][:len(prompt)]) == prompt
    assert reference.decode(tokens[weights > 0]) == "four <|end_of_text|>"


def test_a_jinja_file_replaces_the_model_template(tmp_path):
  model_dir, _ = _model_dir(tmp_path / "model", template=None)
  template = tmp_path / "mine.jinja"
  template.write_text("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
                      "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}")
  name = chat.register_chat_task("test_chat_jinja_v1", tokenizer=model_dir, template=str(template),
                                 train=_jsonl(tmp_path / "j.jsonl", [{"messages": CONVERSATION}]))
  examples = list(seqio.get_mixture_or_task(name).source.get_dataset("train", shuffle=False)
                  .as_numpy_iterator())
  assert [e["targets_pretokenized"].decode() for e in examples] == ["four", "then five"]
  vocab = seqio.get_mixture_or_task(name).output_features["targets"].vocabulary
  assert [vocab.decode(e["targets"].tolist()) for e in examples] == ["four", "then five"]
  assert examples[0]["inputs_pretokenized"].decode() == (
      "system : be brief user : what is two plus two ? assistant :")


BAD = [
    ([{"prompt": "what is two ?"}], "t.jsonl line 1 has neither \"messages\" nor \"prompt\" and "
     "\"completion\" (its keys: 'prompt')"),
    ([{"messages": CONVERSATION}, {"messages": [{"role": "robot", "content": "four"}]}],
     "t.jsonl line 2: messages message 0 has the unknown role 'robot'; valid: system, user, "
     "assistant, tool"),
    (["", {"messages": [{"role": "tool", "content": "4"}, CONVERSATION[2]]}],
     "failed to render: no role tool"),
    ([{"messages": CONVERSATION[:2]}], "t.jsonl line 1: no assistant message to train on"),
    ([{"prompt": "what is two plus two ?", "completion": "  "}],
     "t.jsonl line 1: the completion"),
    (["{\"messages\": "], "t.jsonl line 1 is not JSON"),
    ([{"messages": [{"role": "user"}]}], "t.jsonl line 1: messages message 0 is not an object"),
]


@pytest.mark.parametrize("rows, message", BAD)
def test_bad_rows_are_one_line_naming_file_and_line(tmp_path, rows, message):
  model_dir, _ = _model_dir(tmp_path / "model")
  path = _jsonl(tmp_path / "t.jsonl", rows)
  with pytest.raises(ConfigError) as info:
    chat.register_chat_task("test_chat_bad_v1", train=path, tokenizer=model_dir)
  text = str(info.value)
  assert message in text and "\n" not in text and "t.jsonl line" in text, text
  assert "test_chat_bad_v1" not in seqio.TaskRegistry.names()


def test_completion_that_tokenizes_to_nothing_is_refused(tmp_path):
  model_dir, _ = _model_dir(tmp_path / "model", template=None)
  path = _jsonl(tmp_path / "t.jsonl", [{"prompt": "what is two ?", "completion": " "}])
  with pytest.raises(ConfigError, match=r"t.jsonl line 1: the completion ' ' tokenizes to "
                                        r"nothing"):
    chat.register_chat_task("test_chat_empty_v1", train=path, tokenizer=model_dir)


def test_messages_without_a_template_are_refused(tmp_path):
  model_dir, _ = _model_dir(tmp_path / "model", template=None)
  path = _jsonl(tmp_path / "t.jsonl", [{"messages": CONVERSATION}])
  for template, why in (("model", "has none (no chat_template.jinja"),
                        ("plain", "template='plain' uses none")):
    with pytest.raises(ConfigError, match="t.jsonl line 1: chat messages need a chat template "
                                          "and") as info:
      chat.register_chat_task("test_chat_none_v1", train=path, tokenizer=model_dir,
                              template=template)
    assert why in str(info.value)


def test_registering_again_is_a_no_op_and_another_name_is_refused(tmp_path):
  model_dir, _ = _model_dir(tmp_path / "model")
  path = _jsonl(tmp_path / "t.jsonl", [{"messages": CONVERSATION}])
  first = chat.register_chat_task("test_chat_again_v1", train=path, tokenizer=model_dir)
  task = seqio.get_mixture_or_task(first)
  assert chat.register_chat_task(first, train=path, tokenizer=model_dir) == first
  assert seqio.get_mixture_or_task(first) is task
  with pytest.raises(ConfigError, match="must be a word ending with a version"):
    chat.register_chat_task("no_version", train=path, tokenizer=model_dir)
  with pytest.raises(ConfigError, match="valid: 'model', 'plain' or the path of a .jinja"):
    chat.register_chat_task("test_chat_x_v1", train=path, tokenizer=model_dir, template="llama")


def test_infer_reads_a_chat_task_as_training_does(tmp_path):
  """`infer --task` gives the model the rendered inputs, without the EOS a raw text would get,
  and the answer as the target it compares with."""
  from spot_jax.serve.model import inputs as serve_inputs  # pylint: disable=g-import-not-at-top
  model_dir, reference = _model_dir(tmp_path / "model")
  path = _jsonl(tmp_path / "t.jsonl", [{"messages": CONVERSATION[:3]}])
  name = chat.register_chat_task("test_chat_infer_v1", train=path, validation=path,
                                 tokenizer=model_dir)
  (example,), _ = serve_inputs.task_examples(name, "validation", LENGTHS["inputs"])
  expected = reference.apply_chat_template(CONVERSATION[:2], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
  expected = list(getattr(expected, "input_ids", expected))
  assert list(example.tokens) == expected[1:]  # no BOS (the model's), no EOS
  assert example.target == "four"

"""PEFT's MetaMathQA -> GSM8K benchmark as an instruction task (`peft_metamathqa_v1`).

The data are PEFT's (peft `method_comparison/MetaMathQA/data.py`): train is MetaMathQA-395K
without the examples whose `query + " " + response` exceeds 1,300 characters; validation 50
questions of GSM8K's train split (numpy seed 0, shuffled indices); test GSM8K's test split
(1,319). Each example is `{"prompt": "Question: <query> Think step by step.\\nAnswer:",
"completion": "<response>"}` (PEFT's query template, the response appended as PEFT appends it),
the plain template (no chat template: the base model), and the answer is GSM8K's number
(`tasks.answers`, "gsm8k").

Prepare the files once on a machine with internet access (needs `pip install datasets`):
  python -m tasks.metamathqa --output_dir=/data/metamathqa
then register the task from a module of yours (MIXTURE_OR_TASK_MODULE='metamath_tasks.py'):
  from tasks import metamathqa
  metamathqa.register("/data/metamathqa", tokenizer="/models/Llama-3.2-3B")
"""
from __future__ import annotations

import json
import os
import sys
from typing import Iterable, List, Mapping, Sequence

import numpy as np

TASK = "peft_metamathqa_v1"
QUERY_TEMPLATE = "Question: {query} Think step by step.\nAnswer:"
CHAR_LIMIT = 1300
VALID_SIZE = 50
SPLITS = ("train", "validation", "test")


def _rows(examples: Iterable[Mapping[str, str]]) -> List[dict]:
  return [{"prompt": QUERY_TEMPLATE.format(query=e["query"]), "completion": e["response"]}
          for e in examples]


def splits(metamath: Sequence[Mapping[str, str]], gsm8k_train: Sequence[Mapping[str, str]],
           gsm8k_test: Sequence[Mapping[str, str]]) -> dict[str, List[dict]]:
  """PEFT's three splits as prompt/completion rows; examples are {"query", "response"}."""
  train = [e for e in metamath if len(f"{e['query']} {e['response']}") <= CHAR_LIMIT]
  rng = np.random.RandomState(0)  # np.random.seed(0); np.random.shuffle, as PEFT draws them
  indices = np.arange(len(gsm8k_train))
  rng.shuffle(indices)
  validation = [gsm8k_train[int(i)] for i in indices[:VALID_SIZE]]
  return {"train": _rows(train), "validation": _rows(validation), "test": _rows(gsm8k_test)}


def write(rows: Mapping[str, List[dict]], output_dir: str) -> None:
  """`<output_dir>/<split>.jsonl` for each split."""
  os.makedirs(output_dir, exist_ok=True)
  for split, split_rows in rows.items():
    path = os.path.join(output_dir, f"{split}.jsonl")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in split_rows)
    os.replace(path + ".tmp", path)


def prepare(output_dir: str) -> None:  # pragma: no cover  (needs the Hub)
  """Downloads MetaMathQA and GSM8K with `datasets` and writes the three files."""
  import datasets  # pylint: disable=g-import-not-at-top
  metamath = datasets.load_dataset("meta-math/MetaMathQA")["train"]
  gsm8k = datasets.load_dataset("openai/gsm8k", "main")
  rename = lambda ds: [{"query": e["question"], "response": e["answer"]} for e in ds]
  write(splits(list(metamath), rename(gsm8k["train"]), rename(gsm8k["test"])), output_dir)


def register(data_dir: str, tokenizer: str, name: str = TASK) -> str:
  """Registers the task from `<data_dir>/{train,validation,test}.jsonl` in the model's ids."""
  from tasks import chat  # pylint: disable=g-import-not-at-top
  files = {split: os.path.join(data_dir, f"{split}.jsonl") for split in SPLITS}
  return chat.register_chat_task(name, **files, tokenizer=tokenizer, template="plain",
                                 answer="gsm8k")


def main(argv: List[str]) -> int:  # pragma: no cover  (needs the Hub)
  from spot_jax import cli  # pylint: disable=g-import-not-at-top
  parser = cli.ArgumentParser(prog="tasks.metamathqa", description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", required=True, help="where to write the three files")
  prepare(parser.parse_args(argv).output_dir)
  return 0


if __name__ == "__main__":  # pragma: no cover
  from spot_jax import cli as _cli  # pylint: disable=g-import-not-at-top
  sys.exit(_cli.run(main, sys.argv[1:], "tasks.metamathqa"))

"""Pretraining data of the toy models: the SentencePiece vocabulary, span corruption and task
batches for the toy T5, plain text and task sequences for the toy decoder.

Everything is a pure function of a seed, so `python -m spot_jax.embedded.pretrain` (and
`pretrain_decoder`) see the same batches on every machine. Batches have t5x's features: int32
[B, T] / [B, S] for the encoder-decoder, [B, L] for the decoder-only model.
"""
from __future__ import annotations

import io
from typing import Iterator, Sequence

import numpy as np
import sentencepiece as spm

from tasks import embedded as suite

SPM_VOCAB_SIZE = 400
NOISE_DENSITY = 0.15
MEAN_SPAN_LENGTH = 3.0
PAD_ID, EOS_ID = 0, 1


def vocabulary_text(num_corpus_sentences: int = 20000, seed: int = 0) -> list[str]:
  """The text the SentencePiece model is trained on: the corpus plus the train split of the 12
  tasks of the first suite (`suite.VOCABULARY_TASKS`, pinned so that tasks added later do not
  change the committed vocabulary)."""
  lines = suite.corpus(num_corpus_sentences, seed)
  for key in suite.VOCABULARY_TASKS:
    inputs, targets = suite.examples(key, "train")
    lines += list(inputs[:500]) + list(targets[:500])
  return lines


def train_sentencepiece(lines: Sequence[str], vocab_size: int = SPM_VOCAB_SIZE) -> bytes:
  """A unigram SentencePiece model (T5's ids: pad 0, eos 1, unk 2, no bos), as bytes.

  Single-threaded and unshuffled, so the same lines give the same model bytes.
  """
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
      model_type="unigram", pad_id=PAD_ID, eos_id=EOS_ID, unk_id=2, bos_id=-1,
      character_coverage=1.0, split_digits=True, hard_vocab_limit=False, num_threads=1,
      input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)
  return model.getvalue()


def _segments(rng: np.random.RandomState, total: int, parts: int) -> np.ndarray:
  """`total` split into `parts` positive lengths at random cut points."""
  cuts = np.sort(rng.choice(np.arange(1, total), parts - 1, replace=False)) if parts > 1 else []
  return np.diff(np.concatenate([[0], cuts, [total]])).astype(int)


def span_corruption(rng: np.random.RandomState, tokens: Sequence[int], sentinel_start: int
                    ) -> tuple[list[int], list[int]]:
  """T5's span corruption: about 15% of tokens in spans of mean length 3 are replaced by
  sentinels (ids sentinel_start, sentinel_start - 1, ...) in the inputs; the targets list each
  sentinel followed by the tokens it hides."""
  n = len(tokens)
  num_noise = min(max(int(round(n * NOISE_DENSITY)), 1), n - 1)
  num_spans = max(min(int(round(num_noise / MEAN_SPAN_LENGTH)), num_noise, n - num_noise), 1)
  noise, keep = _segments(rng, num_noise, num_spans), _segments(rng, n - num_noise, num_spans)
  inputs, targets, pos = [], [], 0
  for i in range(num_spans):
    inputs += list(tokens[pos:pos + keep[i]])
    pos += keep[i]
    inputs.append(sentinel_start - i)
    targets += [sentinel_start - i] + list(tokens[pos:pos + noise[i]])
    pos += noise[i]
  return inputs, targets


def _pad(rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
  out = np.zeros((len(rows), length), np.int32)
  for i, row in enumerate(rows):
    row = list(row[:length - 1]) + [EOS_ID]
    out[i, :len(row)] = row
  return out


def to_batch(inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
             input_length: int, target_length: int) -> dict[str, np.ndarray]:
  """Token lists (no EOS) -> t5x features, EOS appended, truncated to the lengths."""
  enc, dec = _pad(inputs, input_length), _pad(targets, target_length)
  dec_in = np.concatenate([np.zeros_like(dec[:, :1]), dec[:, :-1]], axis=1)
  return {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in,
          "decoder_target_tokens": dec, "decoder_loss_weights": (dec > 0).astype(np.int32)}


def pretraining_batches(sp: spm.SentencePieceProcessor, *, seed: int, batch_size: int,
                        input_length: int, target_length: int, task_fraction: float = 0.5,
                        tasks: Sequence[str] = suite.PRETRAIN_SOURCES
                        ) -> Iterator[dict[str, np.ndarray]]:
  """Endless batches: span corruption on the corpus and, for `task_fraction` of each batch,
  examples of `tasks` (uniformly mixed) with their task-name prefixes."""
  rng = np.random.RandomState(seed)
  sentinel_start = sp.get_piece_size() + suite.EXTRA_IDS - 1
  encoded = {k: ([sp.encode(x) for x in suite.examples(k, "train")[0]],
                 [sp.encode(y) for y in suite.examples(k, "train")[1]]) for k in tasks}
  num_tasks = int(round(batch_size * task_fraction))
  while True:
    inputs, targets = [], []
    for _ in range(batch_size - num_tasks):
      tokens: list[int] = []
      while len(tokens) < input_length + 8:
        tokens += sp.encode(suite.corpus_sentence(rng))
      # Inputs keep 1 - density + density / mean_span of the tokens; leave room for EOS.
      keep = int((input_length - 2) / (1 - NOISE_DENSITY + NOISE_DENSITY / MEAN_SPAN_LENGTH))
      x, y = span_corruption(rng, tokens[:keep], sentinel_start)
      inputs.append(x)
      targets.append(y)
    for _ in range(num_tasks):
      key = tasks[rng.randint(len(tasks))]
      i = rng.randint(len(encoded[key][0]))
      inputs.append(encoded[key][0][i])
      targets.append(encoded[key][1][i])
    yield to_batch(inputs, targets, input_length, target_length)


def decoder_row(tokens: Sequence[int], targets: Sequence[int] = ()) -> tuple[list[int], list[int]]:
  """A decoder-only row in the trainer's layout (`spot_jax.models.decoder_only`): (tokens EOS
  [targets EOS], loss weights). Plain text (no targets) is scored on every token; a task example
  on its targets only, the part a prompt is later trained to produce."""
  row = list(tokens) + [EOS_ID]
  if not targets:
    return row, [1] * len(row)
  answer = list(targets) + [EOS_ID]
  return row + answer, [0] * len(row) + [1] * len(answer)


def decoder_pretraining_batches(sp: spm.SentencePieceProcessor, *, seed: int, batch_size: int,
                                length: int, task_fraction: float = 0.5,
                                tasks: Sequence[str] = suite.PRETRAIN_SOURCES
                                ) -> Iterator[dict[str, np.ndarray]]:
  """Endless decoder-only batches [B, length]: whole corpus sentences (as many as fit, one EOS at
  the end) and, for `task_fraction` of each batch, examples of `tasks` (uniformly mixed) as
  "<task name> <inputs> EOS <targets> EOS". Features: decoder_target_tokens (right-padded with
  0), decoder_input_tokens (shifted right, 0 first; the model puts its BOS there) and
  decoder_loss_weights."""
  rng = np.random.RandomState(seed)
  encoded = {k: ([sp.encode(x) for x in suite.examples(k, "train")[0]],
                 [sp.encode(y) for y in suite.examples(k, "train")[1]]) for k in tasks}
  num_tasks = int(round(batch_size * task_fraction))
  while True:
    rows = []
    for _ in range(batch_size - num_tasks):
      tokens = sp.encode(suite.corpus_sentence(rng))[:length - 1]
      while True:
        more = sp.encode(suite.corpus_sentence(rng))
        if len(tokens) + len(more) > length - 1:
          break  # the sentence that does not fit is drawn and dropped, so rows stay whole
        tokens += more
      rows.append(decoder_row(tokens))
    for _ in range(num_tasks):
      key = tasks[rng.randint(len(tasks))]
      i = rng.randint(len(encoded[key][0]))
      rows.append(decoder_row(encoded[key][0][i], encoded[key][1][i]))
    targets = np.zeros((batch_size, length), np.int32)
    weights = np.zeros((batch_size, length), np.int32)
    for i, (row, weight) in enumerate(rows):
      if len(row) > length:
        raise ValueError(f"a pretraining row of {len(row)} tokens does not fit {length}")
      targets[i, :len(row)], weights[i, :len(row)] = row, weight
    inputs = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
    yield {"decoder_target_tokens": targets, "decoder_input_tokens": inputs,
           "decoder_loss_weights": weights}

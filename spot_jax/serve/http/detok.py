"""Text of generated ids as they come, each id decoded a bounded number of times.

`Detokenizer(vocab, eos_id)` follows `inputs.decode(vocab, ids, eos_id)` exactly (the text of the
ids up to the first end id) without decoding every id again per chunk:

  Byte          the UTF-8 bytes go through an incremental decoder (errors="ignore", as
                `vocabulary.Byte.decode`).
  other         the offsets method of vLLM and TGI: decode ids[prefix:] and ids[prefix:read];
                the new suffix is taken once it does not end in "\\ufffd" (an incomplete UTF-8
                character of byte pieces); then prefix, read = read, len(ids). The window starts
                on text already taken, so a SentencePiece leading space or a byte piece's
                context is decoded alike in both.

`extend(ids)` adds ids, `finish()` takes what is held back; `text` is then the whole decode.
`peek()` is the whole decode so far (what an engine searches for stop strings).
"""
from __future__ import annotations

import codecs
from typing import Any, Iterable, Optional

from spot_jax import vocabulary


class Detokenizer:
  """Incremental decode of one sequence's ids.

  Attributes:
    vocab: a `spot_jax.vocabulary` vocabulary or a decoder tokenizer (`decode(ids) -> str`).
    text: the text of the ids taken so far (a prefix of the whole decode; all of it after
      `finish`).
    ended: an end id came (later ids are padding: never decoded).
    redecodes: windows whose text was not their text in context (then all ids were decoded).
  """

  def __init__(self, vocab: Any, eos_id: int):
    self.vocab = vocab
    self._ends = frozenset(int(i) for i in (eos_id, getattr(vocab, "eos_id", None),
                                            *getattr(vocab, "eos_ids", ())) if i is not None)
    self._ids: list[int] = []
    self._prefix = self._read = 0
    self._held: Optional[str] = None
    self._bytes = (codecs.getincrementaldecoder("utf-8")(errors="ignore")
                   if isinstance(vocab, vocabulary.Byte) else None)
    self.text = ""
    self.ended = False
    self.redecodes = 0

  def extend(self, ids: Iterable[int]) -> None:
    """Adds generated ids (those after an end id are dropped) and takes their text when whole."""
    start = len(self._ids)
    for i in ids:
      if self.ended:
        break
      i = int(i)
      if i in self._ends:
        self.ended = True
      else:
        self._ids.append(i)
    if self._bytes is not None:
      top = vocabulary.Byte._SPECIAL + vocabulary.Byte._BYTES  # pylint: disable=protected-access
      data = bytes(i - 3 for i in self._ids[start:] if 3 <= i < top)
      self.text += self._bytes.decode(data)
    elif len(self._ids) > self._read:
      self._take(final=False)

  def finish(self) -> str:
    """Takes the text held back (an incomplete character stays as the whole decode has it)."""
    if self._bytes is not None:
      self.text += self._bytes.decode(b"", final=True)
    elif len(self._ids) > self._read:
      self._take(final=True)
    return self.text

  def peek(self) -> str:
    """The whole decode so far, held-back text included (an incomplete character as the whole
    decode has it: "\ufffd", or nothing for Byte), without taking it."""
    if self._bytes is not None or len(self._ids) == self._read:
      return self.text  # Byte: the incremental decoder holds only an incomplete character
    if self._held is None:
      self._held = self.vocab.decode(self._ids[self._prefix:self._read])
    new = self.vocab.decode(self._ids[self._prefix:])
    if new.startswith(self._held):
      return self.text + new[len(self._held):]
    return self.vocab.decode(self._ids)

  def _take(self, final: bool) -> None:
    ids, decode = self._ids, self.vocab.decode
    if self._held is None:  # the window's text so far: decoded once per window
      self._held = decode(ids[self._prefix:self._read]) if self._read > self._prefix else ""
    held = self._held
    new = decode(ids[self._prefix:])
    if not final and (len(new) <= len(held) or new.endswith("\ufffd")):
      return
    if new.startswith(held):
      self.text += new[len(held):]
    else:  # a vocabulary whose text of a window is not its text in context: decode it all
      self.text = decode(ids)
      self.redecodes += 1
    self._prefix, self._read, self._held = self._read, len(ids), None

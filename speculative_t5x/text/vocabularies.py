"""Vocabularies for decoding without seqio (which imports TensorFlow): seqio's decoding rule on the
sentencepiece library. seqio's own vocabularies work wherever these do; these serve a process
that reads no seqio task (`make demo`, a GPU image without TensorFlow).

Both follow `seqio.Vocabulary.decode`: ids past the vocabulary become UNK, and the ids after the
first EOS are dropped. tests/test_vocabularies.py checks them against seqio's.
"""

from __future__ import annotations

from typing import Sequence

import sentencepiece


class Vocabulary:
  """seqio.Vocabulary's decoding rule; a subclass turns the kept ids into text (`_decode`)."""

  eos_id: int
  unk_id: int | None
  vocab_size: int

  def decode(self, ids: Sequence[int]):
    ids = [int(i) for i in ids]
    if self.unk_id is not None:
      ids = [self.unk_id if i >= self.vocab_size else i for i in ids]
    if self.eos_id in ids:
      ids = ids[: ids.index(self.eos_id) + 1]
    return self._decode(ids)

  def _decode(self, ids: list[int]):
    raise NotImplementedError


class SentencePieceVocabulary(Vocabulary):
  """seqio.SentencePieceVocabulary(path) without extra ids: pieces, EOS and UNK of the model."""

  def __init__(self, sentencepiece_model_file: str):
    self.tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model_file))
    self.vocab_size = self.tokenizer.GetPieceSize()
    self.eos_id = self.tokenizer.eos_id()
    self.unk_id = self.tokenizer.unk_id()

  def encode(self, text: str) -> list[int]:
    return self.tokenizer.EncodeAsIds(text)

  def _decode(self, ids: list[int]) -> str:
    return self.tokenizer.DecodeIds(ids)


class PassThroughVocabulary(Vocabulary):
  """seqio.PassThroughVocabulary(size, eos_id): ids are their own text."""

  unk_id = None

  def __init__(self, size: int, eos_id: int = 1):
    self.vocab_size = size
    self.eos_id = eos_id

  def encode(self, ids):
    return ids

  def _decode(self, ids: list[int]) -> list[int]:
    return ids

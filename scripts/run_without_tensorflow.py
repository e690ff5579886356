"""Runs one of this repository's scripts where TensorFlow is not installed: `make demo`, which
installs requirements-decoding.txt alone (TensorFlow's install takes longer than the demo), or a
GPU image with JAX but no TensorFlow, whose 260 MB wheel cannot be carried there.

Decoding, its timing and the demo need JAX alone; TensorFlow is seqio's dependency (seqio's tasks
read their data through tf.data). This runner puts in `seqio`'s place a module with the two
vocabularies a script that reads no seqio task uses, `SentencePieceVocabulary` (on the
sentencepiece library, with seqio's encode and decode) and `PassThroughVocabulary`, and in
`speculative_t5x.tasks`'s place its constants alone; then it runs the script as `__main__`.
Anything else of seqio's, or of the tasks module's, raises an error naming this runner: a script
that reads a task (`--task=...`, training, inference on a split) cannot run this way.

  python scripts/run_without_tensorflow.py scripts/demo.py [the script's flags]

tests/test_run_without_tensorflow.py checks the vocabularies against seqio's own.
"""

from __future__ import annotations

import pathlib
import runpy
import sys
import types
from typing import Sequence

import sentencepiece

REPO = pathlib.Path(__file__).resolve().parents[1]
# speculative_t5x.tasks's constants that scripts read without a task (copied: that module imports
# seqio and TensorFlow); tests/test_run_without_tensorflow.py checks them against it.
TASK_CONSTANTS = {
    "DEMO_ENDE_TASK": "demo_ende",
    "DEMO_VOCABULARY_FILE": "sentencepiece.model",
    "TRANSLATE_EN_DE_PREFIX": "translate English to German: ",
}


class Vocabulary:
  """seqio.Vocabulary's decoding rule: ids past the vocabulary become UNK, the ids after the first
  EOS are dropped (`_decode` turns the rest into text)."""

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


class _StandIn(types.ModuleType):
  """A module whose missing attributes raise an error naming this runner."""

  def __getattr__(self, name: str):
    raise AttributeError(
        f"{self.__name__}.{name} is not available under scripts/run_without_tensorflow.py, which "
        "stands in for seqio without TensorFlow: run the script directly where TensorFlow and "
        "seqio are installed"
    )


def _demo_data_dir() -> pathlib.Path:
  return REPO / "data" / "demo_ende"


def install() -> None:
  """Puts the stand-ins for `seqio` and `speculative_t5x.tasks` in sys.modules."""
  seqio = _StandIn("seqio")
  seqio.Vocabulary = Vocabulary
  seqio.SentencePieceVocabulary = SentencePieceVocabulary
  seqio.PassThroughVocabulary = PassThroughVocabulary
  seqio.EncDecFeatureConverter = type("EncDecFeatureConverter", (), {})  # a class attribute only
  tasks = _StandIn("speculative_t5x.tasks")
  tasks.__dict__.update(TASK_CONSTANTS)
  tasks.demo_data_dir = _demo_data_dir
  sys.modules["seqio"] = seqio
  sys.modules["speculative_t5x.tasks"] = tasks


def main(argv: Sequence[str]) -> None:
  if len(argv) < 2 or not argv[1].endswith(".py"):
    sys.exit("usage: python scripts/run_without_tensorflow.py SCRIPT.py [flags]")
  install()
  sys.argv = list(argv[1:])
  sys.path.insert(0, str(pathlib.Path(argv[1]).resolve().parent))
  runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
  main(sys.argv)

"""speculative_t5x/text/vocabularies.py encodes and decodes as seqio's own vocabularies, and the
demo runs where TensorFlow and seqio are not installed."""

import re

import numpy as np
import seqio

from conftest import NOT_FOR_DECODING, REPO_ROOT, make_demo_process
from speculative_t5x.text import demo_data
from speculative_t5x.text import vocabularies

MODEL = str(demo_data.DEFAULT_DEMO_DATA_DIR / demo_data.DEMO_VOCABULARY_FILE)


def _test_sentences(count: int) -> list[str]:
  lines = (demo_data.DEFAULT_DEMO_DATA_DIR / "test.tsv").read_text(encoding="utf-8").splitlines()
  return [text for line in lines[:count] for text in line.split("\t")[:2]]


def test_sentencepiece_vocabulary_encodes_and_decodes_as_seqios():
  ours, theirs = vocabularies.SentencePieceVocabulary(MODEL), seqio.SentencePieceVocabulary(MODEL)
  assert (ours.vocab_size, ours.eos_id, ours.unk_id) == (
      theirs.vocab_size,
      theirs.eos_id,
      theirs.unk_id,
  )
  rng = np.random.default_rng(0)
  for text in _test_sentences(100):
    ids = ours.encode(text)
    assert ids == list(theirs.encode(text))
    assert ours.decode(ids) == theirs.decode(ids)
    # A decode runs on to padding, EOS mid-sequence, ids past the vocabulary: cut and UNK alike.
    noisy = list(ids) + [theirs.eos_id] + rng.integers(0, ours.vocab_size + 50, 5).tolist()
    noisy[len(ids) // 2] = ours.vocab_size + 3
    assert ours.decode(noisy) == theirs.decode(noisy)


def test_pass_through_vocabulary_decodes_as_seqios():
  ours, theirs = vocabularies.PassThroughVocabulary(9, eos_id=1), seqio.PassThroughVocabulary(
      9, eos_id=1
  )
  assert (ours.vocab_size, ours.eos_id) == (theirs.vocab_size, theirs.eos_id)
  for ids in ([4, 5, 1, 6, 0], [3, 3], [1]):
    assert list(ours.decode(ids)) == list(theirs.decode(ids))


def test_the_decoding_requirements_hold_none_of_the_tasks_dependencies():
  lines = (REPO_ROOT / "requirements-decoding.txt").read_text().splitlines()
  names = {re.split(r"[<>=\[ ]", line)[0] for line in lines if line and not line.startswith("#")}
  assert {"jax", "flax", "orbax-checkpoint", "sentencepiece"} <= names
  assert not {name.replace("-", "_") for name in names} & set(NOT_FOR_DECODING)


def test_a_script_runs_without_seqio_and_a_task_is_refused(tmp_path):
  # The demo's flag check runs with seqio, TensorFlow and the rest of what `make demo` does not
  # install made unimportable (tests/test_demo.py runs the whole demo so); the benchmark's --task
  # needs a seqio task, which is refused with the fix.
  demo = make_demo_process("demo.py", "--temperatures=-1")
  assert demo.returncode == 1
  assert "--temperatures=-1" in demo.stderr + demo.stdout
  assert "blocked" not in demo.stderr + demo.stdout
  bench = make_demo_process("benchmark.py", "--task=demo_ende", f"--output_dir={tmp_path / 'b'}")
  assert bench.returncode != 0
  assert "reading a seqio task needs seqio and TensorFlow" in bench.stderr + bench.stdout

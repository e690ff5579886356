"""scripts/run_without_tensorflow.py: its stand-in vocabularies encode and decode as seqio's own,
its task constants are speculative_t5x.tasks's, and a script runs under it without seqio."""

import re
import sys

import numpy as np
import pytest
import seqio

from conftest import NOT_FOR_DECODING, REPO_ROOT, make_demo_process
from speculative_t5x import tasks

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import run_without_tensorflow as runner  # noqa: E402

MODEL = str(tasks.DEFAULT_DEMO_DATA_DIR / tasks.DEMO_VOCABULARY_FILE)


def _test_sentences(count: int) -> list[str]:
  lines = (tasks.DEFAULT_DEMO_DATA_DIR / "test.tsv").read_text(encoding="utf-8").splitlines()
  return [text for line in lines[:count] for text in line.split("\t")[:2]]


def test_sentencepiece_vocabulary_encodes_and_decodes_as_seqios():
  ours, theirs = runner.SentencePieceVocabulary(MODEL), seqio.SentencePieceVocabulary(MODEL)
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
  ours, theirs = runner.PassThroughVocabulary(9, eos_id=1), seqio.PassThroughVocabulary(9, eos_id=1)
  assert (ours.vocab_size, ours.eos_id) == (theirs.vocab_size, theirs.eos_id)
  for ids in ([4, 5, 1, 6, 0], [3, 3], [1]):
    assert list(ours.decode(ids)) == list(theirs.decode(ids))


def test_task_constants_are_the_task_modules():
  for name, value in runner.TASK_CONSTANTS.items():
    assert getattr(tasks, name) == value
  assert runner._demo_data_dir() == tasks.DEFAULT_DEMO_DATA_DIR


def test_the_decoding_requirements_hold_none_of_the_tasks_dependencies():
  lines = (REPO_ROOT / "requirements-decoding.txt").read_text().splitlines()
  names = {re.split(r"[<>=\[ ]", line)[0] for line in lines if line and not line.startswith("#")}
  assert {"jax", "flax", "orbax-checkpoint", "sentencepiece"} <= names
  assert not {name.replace("-", "_") for name in names} & set(NOT_FOR_DECODING)


def test_a_script_runs_without_seqio_and_a_task_is_refused(tmp_path):
  # The demo's flag check runs under the runner with seqio, TensorFlow and the rest of what `make
  # demo` does not install made unimportable (tests/test_demo.py runs the whole demo so); the
  # benchmark's --task needs a seqio task, which the stand-in refuses by name.
  demo = make_demo_process("demo.py", "--temperatures=-1")
  assert demo.returncode == 1
  assert "--temperatures=-1" in demo.stderr + demo.stdout
  assert "blocked" not in demo.stderr + demo.stdout
  bench = make_demo_process("benchmark.py", "--task=demo_ende", f"--output_dir={tmp_path / 'b'}")
  assert bench.returncode != 0
  assert "not available under scripts/run_without_tensorflow.py" in bench.stderr + bench.stdout


def test_usage_without_a_script():
  with pytest.raises(SystemExit, match="usage"):
    runner.main(["run_without_tensorflow.py"])

"""text/input_data.py: what a run reads (a seqio task's inputs, a file's lines, random ids)."""

import pathlib

import jax
import numpy as np
import pytest

from speculative_t5x.text import input_data

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_random_tokens_avoid_special_ids():
  tokens = np.asarray(input_data.random_tokens(jax.random.PRNGKey(0), 6, (4, 50)))
  assert tokens.dtype == np.int32 and tokens.shape == (4, 50)
  assert tokens.min() >= 3 and tokens.max() < 6


def test_random_inputs_end_in_eos_then_padding():
  inputs = input_data.random_inputs(vocab_size=20, num_examples=5, length=8, seed=3, eos_id=1)
  assert inputs.dtype == np.int32 and inputs.shape == (5, 8)
  for row in inputs:
    n = int(np.flatnonzero(row == 1)[0]) + 1  # one EOS, after n - 1 ordinary tokens
    assert 4 <= n <= 8 and np.all(row[: n - 1] >= 3) and np.all(row[n:] == 0)
  np.testing.assert_array_equal(inputs, input_data.random_inputs(20, 5, 8, seed=3))
  with pytest.raises(ValueError, match="num_examples >= 1"):
    input_data.random_inputs(20, 0, 8)


class _CharVocabulary:
  """Each character one token (its code point modulo 50, plus 3); EOS = 1."""

  eos_id = 1
  vocab_size = 53

  def encode(self, text):
    return [ord(ch) % 50 + 3 for ch in text]


def test_encode_texts_pads_and_names_texts_that_do_not_fit():
  inputs = input_data.encode_texts(["ab", "abcdefghij"], _CharVocabulary())
  assert inputs.shape == (2, 16)  # 11 tokens with EOS, rounded up to a multiple of 8
  assert list(inputs[0, :4]) == [ord("a") % 50 + 3, ord("b") % 50 + 3, 1, 0]
  assert input_data.encode_texts(["ab"], _CharVocabulary(), length=5).shape == (1, 5)
  with pytest.raises(
      ValueError,
      match=r"1 of the 2 inputs \(first: input 2, 11 tokens with EOS"
      r".*exceed the 'inputs' length 8",
  ):
    input_data.encode_texts(["ab", "abcdefghij"], _CharVocabulary(), length=8)


def test_read_lines_and_check_vocabulary(tmp_path):
  path = tmp_path / "lines.txt"
  path.write_text(" one \n\ntwo\nthree\n")
  assert input_data.read_lines(str(path)) == ["one", "two", "three"]
  assert input_data.read_lines(str(path), 2) == ["one", "two"]
  path.write_text("\n \n")
  with pytest.raises(ValueError, match="has no non-empty lines"):
    input_data.read_lines(str(path))
  input_data.check_vocabulary(_CharVocabulary(), 53, "chars")
  with pytest.raises(ValueError, match="chars has 53 pieces but the models' vocab_size is 40"):
    input_data.check_vocabulary(_CharVocabulary(), 40, "chars")


def test_load_inputs_random_and_from_a_file(tmp_path):
  task, vocabulary, inputs = input_data.load_inputs(50, {"inputs": 8, "targets": 4}, num_examples=3)
  assert task == input_data.RANDOM_TASK and vocabulary.eos_id == 1 and inputs.shape == (3, 8)
  assert all(1 in row for row in inputs)

  spm = str(REPO / "demo_models" / "sentencepiece.model")
  lines = tmp_path / "inputs.txt"
  lines.write_text("Open the file\n\nSave\n")
  task, vocabulary, inputs = input_data.load_inputs(
      8000, {"inputs": 8}, input_file=str(lines), sentencepiece_model=spm
  )
  assert task == "inputs" and inputs.shape == (2, 8)
  assert list(inputs[1][inputs[1] > 0]) == vocabulary.encode("Save") + [vocabulary.eos_id]
  with pytest.raises(ValueError, match="not both"):
    input_data.load_inputs(8000, {"inputs": 8}, task="demo_ende", input_file=str(lines))
  with pytest.raises(ValueError, match="has 8000 pieces but the models' vocab_size is 100"):
    input_data.load_inputs(100, {"inputs": 8}, input_file=str(lines), sentencepiece_model=spm)
  with pytest.raises(ValueError, match="num_examples >= 1"):
    input_data.load_inputs(50, {"inputs": 8}, num_examples=0)

"""What a run reads: a seqio task's inputs, the lines of a text file, or random token ids, each
row EOS-ended and 0-padded."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x.text import vocabularies

FIRST_NON_SPECIAL_ID = 3  # T5 vocabularies: 0 = PAD, 1 = EOS, 2 = UNK.
RANDOM_TASK = "random"  # the task label of random inputs.


def random_tokens(rng: jax.Array, vocab_size: int, shape: Sequence[int]) -> jax.Array:
  """Random non-special token ids (none is PAD, EOS or UNK) -> int32 array of `shape`."""
  if vocab_size <= FIRST_NON_SPECIAL_ID:
    raise ValueError(f"vocab_size {vocab_size} leaves no ordinary tokens after PAD, EOS and UNK.")
  return jax.random.randint(rng, tuple(shape), FIRST_NON_SPECIAL_ID, vocab_size, jnp.int32)


def random_inputs(
    vocab_size: int, num_examples: int, length: int, seed: int = 0, eos_id: int = 1
) -> np.ndarray:
  """[num_examples, length] int32: n_i - 1 random tokens, EOS, 0-padding; n_i drawn from
  [max(1, length // 2), length]."""
  if num_examples < 1 or length < 1:
    raise ValueError(
        f"random inputs need num_examples >= 1 and length >= 1, got {num_examples} "
        f"and {length}."
    )
  tokens = np.asarray(random_tokens(jax.random.PRNGKey(seed), vocab_size, (num_examples, length)))
  lengths = np.random.default_rng(seed).integers(max(1, length // 2), length + 1, num_examples)
  return pad_sequences([list(row[: n - 1]) + [eos_id] for row, n in zip(tokens, lengths)], length)


def pad_sequences(sequences: Sequence[Sequence[int]], length: int) -> np.ndarray:
  """Token sequences, each at most `length` long -> [len(sequences), length] int32, 0-padded."""
  inputs = np.zeros((len(sequences), length), np.int32)
  for i, sequence in enumerate(sequences):
    inputs[i, : len(sequence)] = sequence
  return inputs


def read_lines(path: str, limit: int | None = None) -> list[str]:
  """The non-empty lines of a text file, stripped; the first `limit` of them when it is set."""
  with open(path, encoding="utf-8") as f:
    lines = [line for line in (line.strip() for line in f) if line]
  if not lines:
    raise ValueError(f"{path} has no non-empty lines: give a file with one input per line.")
  return lines[:limit] if limit else lines


def check_vocabulary(vocabulary: Any, vocab_size: int, source: str) -> None:
  """Raises ValueError if `vocabulary` (from `source`) has ids the models' vocab_size lacks."""
  if vocabulary.vocab_size > vocab_size:
    raise ValueError(
        f"{source} has {vocabulary.vocab_size} pieces but the models' vocab_size is "
        f"{vocab_size}: use the models' vocabulary."
    )


def encode_texts(
    texts: Sequence[str], vocabulary: Any, length: int | None = None, multiple: int = 8
) -> np.ndarray:
  """Texts tokenized, EOS-ended, 0-padded -> [len(texts), length] int32 (None: the longest,
  rounded up to a `multiple`). Raises ValueError, naming the first, if a text does not fit."""
  if not texts:
    raise ValueError("no texts to encode.")
  sequences = [list(vocabulary.encode(text)) + [vocabulary.eos_id] for text in texts]
  longest = max(len(sequence) for sequence in sequences)
  if length is None:
    length = -(-longest // multiple) * multiple
  too_long = [i for i, sequence in enumerate(sequences) if len(sequence) > length]
  if too_long:
    first = too_long[0]
    raise ValueError(
        f"{len(too_long)} of the {len(texts)} inputs (first: input {first + 1}, "
        f"{len(sequences[first])} tokens with EOS: {texts[first][:60]!r}) exceed the "
        f"'inputs' length {length}: raise the 'inputs' feature length "
        "(TASK_FEATURE_LENGTHS) or shorten them."
    )
  return pad_sequences(sequences, length)


def check_input_source(
    task: str | None,
    split: str,
    input_file: str | None,
    sentencepiece_model: str | None,
    num_examples: int,
) -> None:
  """What `load_inputs` will read, checked without reading it. Raises ValueError naming the
  fix."""
  if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)):
    raise ValueError(f"num_examples must be an integer >= 0, got {num_examples!r}.")
  if num_examples < 0:
    raise ValueError(f"num_examples must be >= 0 (0: every example), got {num_examples}.")
  if task is not None and input_file is not None:
    raise ValueError(f"give a task ({task}) or an input file ({input_file}), not both.")
  if task is not None:
    tasks = _tasks()
    tasks.check_split(tasks.get_task(task), split, "the split")
    return
  if input_file is not None:
    if not sentencepiece_model:
      raise ValueError(f"the input file {input_file!r} needs a sentencepiece model to tokenize it.")
    for path, what in ((input_file, "input file"), (sentencepiece_model, "sentencepiece model")):
      if not os.path.isfile(path):
        raise ValueError(f"the {what} {path!r} does not exist (or is not a file).")
    return
  if num_examples < 1:
    raise ValueError(f"random inputs need num_examples >= 1, got {num_examples}.")


def _tasks():
  """speculative_t5x.text.tasks, imported where a task is read: a sweep of a file or of random
  inputs runs without seqio and TensorFlow."""
  try:
    from speculative_t5x.text import tasks  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError(
        f"reading a seqio task needs seqio and TensorFlow, which cannot be imported here ({e}): "
        "install the package with its dependencies (pip install -e .), or give an input file "
        "or random inputs instead of a task."
    ) from e
  return tasks


def load_inputs(
    vocab_size: int,
    task_feature_lengths: Mapping[str, int],
    *,
    task: str | None = None,
    split: str = "test",
    input_file: str | None = None,
    sentencepiece_model: str | None = None,
    num_examples: int = 0,
    seed: int = 0,
    eos_id: int = 1,
) -> tuple[str, vocabularies.Vocabulary, np.ndarray]:
  """A sweep's examples -> (label, vocabulary, encoder inputs [N, Le] int32, EOS-ended and
  0-padded), from a `task`'s `split` (truncated as in T5X), the lines of an `input_file`
  (tokenized with `sentencepiece_model`), or else `num_examples` random ones. `num_examples`
  caps the first two (0: all); task_feature_lengths: {'inputs': Le, ...}."""
  check_input_source(task, split, input_file, sentencepiece_model, num_examples)
  length = int(task_feature_lengths["inputs"])
  if task:
    tasks = _tasks()
    seqio_task = tasks.get_task(task)
    vocabulary = seqio_task.output_features["targets"].vocabulary
    check_vocabulary(vocabulary, vocab_size, f"task {task}")
    return (
        f"{task}:{split}",
        vocabulary,
        tasks.feature_arrays(
            seqio_task, split, "inputs", task_feature_lengths, num_examples or None
        ),
    )
  if input_file:
    vocabulary = vocabularies.SentencePieceVocabulary(sentencepiece_model)
    check_vocabulary(vocabulary, vocab_size, sentencepiece_model)
    lines = read_lines(input_file, num_examples or None)
    return (
        pathlib.Path(input_file).stem,
        vocabulary,
        encode_texts(lines, vocabulary, length),
    )
  return (
      RANDOM_TASK,
      vocabularies.PassThroughVocabulary(vocab_size, eos_id=eos_id),
      random_inputs(vocab_size, num_examples, length, seed, eos_id),
  )

"""A feature drafter's draft vocabulary: the most frequent target tokens of a seqio task's split
(`FeatureDrafter.draft_vocab`; gin: `feature_drafter.frequent_tokens`)."""

import functools

import gin
import numpy as np

from speculative_t5x import drafters
from speculative_t5x.text import tasks

_COUNT_BATCH = 4096  # target sequences per bincount in `_token_counts`


# gin: feature_drafter.frequent_tokens, the name the configs give a draft vocabulary.
@gin.configurable(module="feature_drafter")
def frequent_tokens(
    mixture_or_task_name: str = gin.REQUIRED,
    size: int = gin.REQUIRED,
    split: str = "train",
) -> tuple[int, ...]:
  """The `size` most frequent target token ids of a seqio task's split (EOS included, padding
  not), ties to the lower id, sorted ascending: a `FeatureDrafter.draft_vocab`. The counts are
  read once per process and split (gin evaluates a macro holding this call several times)."""
  drafters._check_int("frequent_tokens", "size", size, 1)  # noqa: SLF001
  task = tasks.get_task(mixture_or_task_name)
  vocab_size = task.output_features["targets"].vocabulary.vocab_size
  if size > vocab_size:
    raise ValueError(
        f"frequent_tokens.size {size} > the vocabulary's {vocab_size} pieces: give at most "
        f"{vocab_size} (or no draft vocabulary at all for the full one)."
    )
  counts = _token_counts(mixture_or_task_name, split).copy()
  counts[0] = -1  # padding is never a draft.
  order = np.lexsort((np.arange(vocab_size), -counts))
  return tuple(sorted(int(i) for i in order[:size]))


@functools.lru_cache(maxsize=None)
def _token_counts(mixture_or_task_name: str, split: str) -> np.ndarray:
  """How often each target token id occurs in the split -> [V] int64 (read once per process, in
  padded batches: the padding's count, at id 0, is not one `frequent_tokens` reads)."""
  task = tasks.get_task(mixture_or_task_name)
  vocab_size = task.output_features["targets"].vocabulary.vocab_size
  counts = np.zeros(vocab_size, np.int64)
  targets = task.get_dataset(split=split, shuffle=False).map(lambda example: example["targets"])
  for batch in targets.padded_batch(_COUNT_BATCH).as_numpy_iterator():
    counts += np.bincount(batch.ravel(), minlength=vocab_size)[:vocab_size]
  return counts

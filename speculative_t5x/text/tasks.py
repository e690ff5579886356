"""seqio tasks: WMT En-De and CNN/DailyMail as T5 defines them, and an offline En-De demo task.

Importing this module registers (T5's names, so T5X gin files carry over unchanged):

  wmt_t2t_ende_v003   wmt_t2t_translate/de-en:1.0.0, "translate English to German: " + en -> de,
                      metric `bleu`.
  cnn_dailymail_v002  cnn_dailymail:3.4.0, "summarize: " + article -> highlights, metric `rouge`.
  demo_ende           the gettext corpus written by benchmarks/build_demo_corpus.py, with the
                      translation prefix of WMT, metric `bleu`.

Every task tokenizes inputs and targets with one vocabulary and ends both with EOS, like T5's
preprocessors: translate/summarize -> seqio.preprocessors.tokenize -> CacheDatasetPlaceholder ->
append_eos_after_trim. The WMT and CNN/DM tasks use T5's vocabulary by default
(`DEFAULT_VOCABULARY_PATH`, on GCS); `register_tasks(vocabulary, suffix)` registers the same tasks
under suffixed names with any other vocabulary (tests use seqio's small test model).

Feature lengths shorter than the data: sequences are truncated, as in T5X. With
`task_feature_lengths` set, `append_eos_after_trim` cuts a feature to length - 1 tokens, keeping the
beginning, and appends EOS, so a truncated target still ends in EOS; the T5X feature converter then
pads to the length. Nothing is dropped and no error is raised; `count_truncated` counts the
examples a given set of lengths cuts, for a script to log.

Registering a name again replaces the earlier task, so re-importing or re-registering never raises.
"""

import dataclasses
import difflib
import os
import pathlib
import re
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import sacrebleu
import seqio
import tensorflow as tf

from speculative_t5x import validation
from speculative_t5x.text import demo_data

# T5X's VOCABULARY in t5_1_1/base.gin: 32000 pieces that already include the 100 sentinel ids.
DEFAULT_VOCABULARY_PATH = "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model"

WMT_ENDE_TASK = "wmt_t2t_ende_v003"
CNN_DAILYMAIL_TASK = "cnn_dailymail_v002"
WMT_ENDE_TFDS_NAME = "wmt_t2t_translate/de-en:1.0.0"
CNN_DAILYMAIL_TFDS_NAME = "cnn_dailymail:3.4.0"
SUMMARIZE_PREFIX = "summarize: "


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
# Where `rouge` splits a text without newlines into sentences for rougeLsum.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")


def get_vocabulary(path: Optional[str] = None) -> seqio.SentencePieceVocabulary:
  """A SentencePiece vocabulary (loaded lazily, on first use); T5's own when `path` is None."""
  return seqio.SentencePieceVocabulary(path or DEFAULT_VOCABULARY_PATH)


def output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
  """T5's DEFAULT_OUTPUT_FEATURES: inputs (optional) and targets, both ending in EOS."""
  return {
      "inputs": seqio.Feature(vocabulary, add_eos=True, required=False),
      "targets": seqio.Feature(vocabulary, add_eos=True),
  }


# ----------------------------------------------------------------------------- metrics


def _check_pairs(targets: Sequence[str], predictions: Sequence[str]) -> None:
  if len(targets) != len(predictions):
    raise ValueError(
        f"{len(targets)} targets but {len(predictions)} predictions: a metric needs "
        "one prediction per target, in the same order"
    )
  if not targets:
    raise ValueError("no targets and predictions to score: the metric of an empty set is undefined")


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """Corpus BLEU in [0, 100] of detokenized predictions against one reference each.

  sacrebleu with T5's settings (t5.evaluation.metrics.bleu): the "intl" tokenizer, case-sensitive,
  exponential smoothing with value 0, no effective order. Returns {"bleu": score}.
  """
  _check_pairs(targets, predictions)
  score = sacrebleu.corpus_bleu(
      list(predictions),
      [list(targets)],
      smooth_method="exp",
      smooth_value=0.0,
      force=False,
      lowercase=False,
      tokenize="intl",
      use_effective_order=False,
  )
  return {"bleu": score.score}


def _sentences_on_lines(text: str) -> str:
  """One sentence per line, which rougeLsum needs; model output has no newlines of its own."""
  if "\n" in text:
    return text
  return "\n".join(s for s in _SENTENCE_BREAK.split(text) if s)


def rouge(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """Mean ROUGE-1/2/L/Lsum F-measures in [0, 100] (rouge-score with the Porter stemmer).

  rougeLsum is the summary-level LCS over sentences: texts without newlines are split after
  ".", "!" and "?". The mean over examples is exact and deterministic (T5 reports the median of a
  random bootstrap of this mean, which lies close to it). Returns {"rouge1": ..., "rouge2": ..., "rougeL": ...,
  "rougeLsum": ...}.
  """
  _check_pairs(targets, predictions)
  # Imported here: rouge-score imports nltk, which is slow to import, and only ROUGE tasks need it.
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top

  scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
  scores = [
      scorer.score(_sentences_on_lines(t), _sentences_on_lines(p))
      for t, p in zip(targets, predictions)
  ]
  return {key: 100.0 * float(np.mean([s[key].fmeasure for s in scores])) for key in ROUGE_TYPES}


# ----------------------------------------------------------------------------- preprocessors


@seqio.map_over_dataset
def translate_en_de(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """{"en", "de"} -> {"inputs": "translate English to German: " + en, "targets": de}."""
  return {
      "inputs": tf.strings.join([demo_data.TRANSLATE_EN_DE_PREFIX, example["en"]]),
      "targets": example["de"],
  }


@seqio.map_over_dataset
def summarize(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """{"article", "highlights"} -> {"inputs": "summarize: " + article, "targets": highlights}."""
  return {
      "inputs": tf.strings.join([SUMMARIZE_PREFIX, example["article"]]),
      "targets": example["highlights"],
  }


@seqio.map_over_dataset
def parse_tsv_en_de(line: tf.Tensor) -> dict[str, tf.Tensor]:
  """A corpus line `english<TAB>german` -> {"en", "de"}; any other number of fields is an error."""
  fields = tf.strings.split(line, "\t")
  with tf.control_dependencies(
      [
          tf.debugging.assert_equal(
              tf.size(fields),
              2,
              message="demo corpus lines must be 'english<TAB>german'; rebuild the "
              "corpus with benchmarks/build_demo_corpus.py",
          )
      ]
  ):
    return {"en": tf.identity(fields[0]), "de": tf.identity(fields[1])}


_TOKENIZE_AND_APPEND_EOS = (
    seqio.preprocessors.tokenize,
    seqio.CacheDatasetPlaceholder(),
    seqio.preprocessors.append_eos_after_trim,
)


# ----------------------------------------------------------------------------- registration


def _add_task(name: str, **kwargs) -> str:
  """Registers a task, replacing one of the same name (so registration is idempotent)."""
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(name, **kwargs)
  return name


def register_tasks(vocabulary: seqio.Vocabulary, suffix: str = "") -> tuple[str, str]:
  """Registers WMT En-De and CNN/DailyMail with `vocabulary` as `wmt_t2t_ende_v003{suffix}` and
  `cnn_dailymail_v002{suffix}`; returns the two names."""
  features = output_features(vocabulary)
  wmt = _add_task(
      WMT_ENDE_TASK + suffix,
      source=seqio.TfdsDataSource(tfds_name=WMT_ENDE_TFDS_NAME),
      preprocessors=[translate_en_de, *_TOKENIZE_AND_APPEND_EOS],
      output_features=features,
      metric_fns=[bleu],
  )
  cnn = _add_task(
      CNN_DAILYMAIL_TASK + suffix,
      source=seqio.TfdsDataSource(tfds_name=CNN_DAILYMAIL_TFDS_NAME),
      preprocessors=[summarize, *_TOKENIZE_AND_APPEND_EOS],
      output_features=features,
      metric_fns=[rouge],
  )
  return wmt, cnn


class _DemoCorpusSource(seqio.TextLineDataSource):
  """TSV files of the demo corpus; a missing file says how to build it instead of a TF error."""

  def list_shards(self, split: str) -> Sequence[str]:
    if split not in self._split_to_filepattern:
      raise ValueError(
          f"the demo corpus has splits {', '.join(demo_data.DEMO_SPLITS)}, not {split!r}"
      )
    files = super().list_shards(split)
    if not all(tf.io.gfile.glob(f) for f in files):
      raise FileNotFoundError(
          f"demo corpus file {self._split_to_filepattern[split]} is missing: build the corpus with "
          "`python benchmarks/build_demo_corpus.py --output_dir=DIR` and set $"
          + demo_data.DEMO_DATA_ENV
          + "=DIR (or call register_demo_task(data_dir=DIR))"
      )
    return files


def register_demo_task(
    data_dir: Optional[Union[str, os.PathLike]] = None,
    vocabulary: Optional[seqio.Vocabulary] = None,
    name: str = demo_data.DEMO_ENDE_TASK,
) -> str:
  """Registers the offline En-De task reading `{train,validation,test}.tsv` in `data_dir`.

  `data_dir` defaults to `demo_data.demo_data_dir()`, `vocabulary` to the corpus's own `sentencepiece.model`
  there. Files are only read when a dataset is requested, so registering never needs the corpus.
  """
  data_dir = pathlib.Path(data_dir) if data_dir is not None else demo_data.demo_data_dir()
  vocabulary = vocabulary or get_vocabulary(str(data_dir / demo_data.DEMO_VOCABULARY_FILE))
  return _add_task(
      name,
      source=_DemoCorpusSource(
          {split: str(data_dir / f"{split}.tsv") for split in demo_data.DEMO_SPLITS}
      ),
      preprocessors=[parse_tsv_en_de, translate_en_de, *_TOKENIZE_AND_APPEND_EOS],
      output_features=output_features(vocabulary),
      metric_fns=[bleu],
  )


# ----------------------------------------------------------------------------- look-up


def get_task(name: str) -> seqio.Task:
  """The registered task (or mixture) `name`; an unknown name raises with the closest names."""
  validation.check_text(name, "the task or mixture name")
  registered = sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))
  if name not in registered:
    close = difflib.get_close_matches(name, registered, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    raise validation.InvalidInputError(
        f"unknown task or mixture {name!r}: {hint}Give a registered name (in gin, "
        "MIXTURE_OR_TASK_NAME, which the configs/tasks/ files set), or register the task before "
        "it is named (speculative_t5x.tasks registers the project's when imported; gin: `import "
        f"speculative_t5x.text.tasks`). Registered: {', '.join(registered) or 'none'}."
    )
  return seqio.get_mixture_or_task(name)


def check_split(task: Union[seqio.Task, seqio.Mixture], split: Any, setting: str) -> None:
  """Raises InvalidInputError, naming `setting` (e.g. 'SPLIT' or '--split'), unless `split` is a
  split's name that `task`'s source lists. A source that lists none (TFDS mock data, a mixture)
  accepts any name; reading the split then tells."""
  validation.check_text(split, f"{setting} (a split's name, e.g. 'validation')")
  source = getattr(task, "source", None)
  splits = sorted(getattr(source, "splits", None) or ())
  if splits and split not in splits:
    raise validation.InvalidInputError(
        f"{setting} {split!r} is not a split of {task.name}: use one of {splits}."
    )


@dataclasses.dataclass(frozen=True)
class TruncationCount:
  """How many of `examples` have a feature longer (EOS included) than its feature length."""

  examples: int
  truncated: dict[str, int]

  def __str__(self) -> str:
    parts = ", ".join(f"{key} {n}" for key, n in self.truncated.items())
    return f"{parts} of {self.examples} examples are truncated"


def count_truncated(
    task: Union[str, seqio.Task],
    split: str,
    feature_lengths: Mapping[str, int],
    max_examples: Optional[int] = None,
) -> TruncationCount:
  """Counts the examples of `task`/`split` that `feature_lengths` will truncate, per feature.

  Reads the tokenized examples untrimmed (EOS included) and compares their lengths with
  `feature_lengths`; `max_examples` limits the count to the first examples of the split.
  """
  feature_lengths = validation.check_feature_lengths(feature_lengths, "feature_lengths")
  if max_examples is not None:
    validation.check_integer(max_examples, "max_examples", 1)
  task = get_task(task) if isinstance(task, str) else task
  unknown = set(feature_lengths) - set(task.output_features)
  if unknown:
    raise ValueError(
        f"feature_lengths names {sorted(unknown)}, which task {task.name!r} does not "
        f"have; its features are {sorted(task.output_features)}"
    )
  dataset = task.get_dataset(
      sequence_length=None, split=split, shuffle=False, use_cached=False, try_in_mem_cache=False
  )
  if max_examples is not None:
    dataset = dataset.take(max_examples)
  dataset = dataset.map(lambda ex: {key: tf.size(ex[key]) for key in feature_lengths})
  examples, truncated = 0, dict.fromkeys(feature_lengths, 0)
  for lengths in dataset.as_numpy_iterator():
    examples += 1
    for key, limit in feature_lengths.items():
      truncated[key] += int(lengths[key] > limit)
  return TruncationCount(examples, truncated)


register_tasks(get_vocabulary())
register_demo_task()


def feature_arrays(
    task: Union[str, seqio.Task],
    split: str,
    feature: str,
    feature_lengths: Mapping[str, int],
    limit: Optional[int] = None,
) -> np.ndarray:
  """The tokenized `feature` of a split's first `limit` examples (all if None), in order, through
  the task's pipeline at `feature_lengths` (so truncated as in T5X, see the module docstring),
  zero-padded -> [N, feature_lengths[feature]] int32."""
  feature_lengths = validation.check_feature_lengths(feature_lengths, "feature_lengths", [feature])
  if limit is not None:
    validation.check_integer(limit, "limit (examples to read)", 1)
  task = get_task(task) if isinstance(task, str) else task
  if feature not in task.output_features:
    raise validation.InvalidInputError(
        f"task {task.name!r} has no feature {feature!r}: use one of "
        f"{sorted(task.output_features)}."
    )
  length = feature_lengths[feature]
  ds = task.get_dataset(
      dict(feature_lengths), split=split, shuffle=False, use_cached=False, try_in_mem_cache=False
  )
  rows = []
  for example in ds.as_numpy_iterator():
    rows.append(np.pad(example[feature], (0, length - len(example[feature]))))
    if limit is not None and len(rows) >= limit:
      break
  if not rows:
    raise ValueError(f"split {split!r} of task {task.name!r} has no examples.")
  return np.stack(rows).astype(np.int32)

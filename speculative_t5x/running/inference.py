"""Inference over a seqio task split: speculative decoding (or the baseline), predictions, metrics.

The library behind scripts/infer.py. A run is configured the T5X way: configs/runs/infer.gin binds
`inference.InferConfig` to T5X's macros (MIXTURE_OR_TASK_NAME, TASK_FEATURE_LENGTHS,
INFER_OUTPUT_DIR) and ours (DECODER, GAMMA, TEMPERATURE, BATCH_SIZE, SPLIT), and its `pair` to
`pairs.PairConfig` (configs/runs/pair.gin: TARGET_CONFIG, CHECKPOINT_PATH, DRAFTER,
DRAFTER_CHECKPOINT_PATH, RESTORE_DTYPE, RANDOM_INIT_SEED); a configs/drafters/ file sets DRAFTER.
`gin_utils.parse_gin_flags` reads the files and bindings, `InferConfig()` builds and checks the
configuration, `infer` runs.

`infer` decodes the split in global batches of `batch_size` rows, each example with its own random
stream (`example_keys`: the seed and its index in the split), so the tokens do not depend on the
batch size or on how many processes and devices decode them. With several processes
(speculative_t5x/running/multihost.py, scripts/infer.py's T5X flags) each process reads its shard of the
split and feeds its rows of every global batch; the last batches are padded (copies of a
process's last example, dropped), so every call has one shape and compiles once. Process 0
gathers every process's predictions and statistics and writes, to `output_dir`:
  predictions.jsonl  one JSON object per example: {"inputs", "targets", "prediction", "stats"}
                     (texts as in the task; stats as below);
  metrics.json       the task's metrics, the aggregate decoding statistics (speculative: alpha,
                     acceptance rate, tokens per target call, by `decoding.SpeculativeStats`), the
                     truncation counts, where the weights came from, and the settings;
  config.gin         the run's gin configuration, if `infer` is given it (scripts/infer.py does).
The directory is checked before anything loads (writable; holding no other run's outputs unless
`overwrite`, scripts/infer.py's --overwrite), and the three files are written under temporary
names once every example of the split has been decoded and gathered, in the split's order, and
renamed into place together (`run_dir.OutputDir`): a refused, failed or interrupted run leaves the
directory as it was, an overwriting one replaces the other run whole. The
aggregate statistics are pooled over every example (summed counts, then ratios), whichever
process decoded it.

Per-example statistics. Speculative decoding reports `decoding.STAT_NAMES` (target_calls,
drafter_calls, drafted_tokens, accepted_tokens, beta_sum, beta_count) from the decoding loop itself.
The baseline reports target_calls only: one per generated token, EOS included.

Feature lengths shorter than the data: as in T5X, the seqio pipeline truncates (it keeps the first
length - 1 tokens and appends EOS; see speculative_t5x/text/tasks.py), and nothing is dropped. `infer`
counts the truncated examples first (`tasks.count_truncated`), logs the counts and writes them to
metrics.json. The metric compares predictions with the full, untruncated target texts.

Weights come from `pairs.load_pair` (which documents checkpoints and random weights); a drafter
fitted on target sequences (the n-gram tables) is fitted on up to `ngram_fit_examples` targets of
the task's `ngram_fit_split`. The baseline loads no drafter, whatever DRAFTER says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import pathlib
import time
from typing import Any, Iterator, Mapping, Sequence

from absl import logging
import gin
import jax
import jax.numpy as jnp
import numpy as np
import seqio
import tqdm

from speculative_t5x import decoding
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import validation
from speculative_t5x.measuring import auto_shape
from speculative_t5x.measuring import step_costs
from speculative_t5x.running import multihost
from speculative_t5x.running import partitioning
from speculative_t5x.running import run_dir
from speculative_t5x.text import tasks
from speculative_t5x.weights import pairs

DECODERS = ("speculative", "baseline")
AUTO = "auto"  # GAMMA: the draft shape chosen on the device (`auto_shape.Auto`)
AUTO_EXAMPLES = 16  # GAMMA 'auto': examples whose target outputs the acceptance is measured on
FEATURES = ("inputs", "targets")
PREDICTIONS_FILE = "predictions.jsonl"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.gin"


# ----------------------------------------------------------------------------- configuration


@gin.configurable(module="inference")
@dataclasses.dataclass(frozen=True)
class InferConfig:
  """One inference run (configs/runs/infer.gin binds every field to a macro).

  mixture_or_task_name: a registered seqio task (speculative_t5x.tasks registers ours).
  task_feature_lengths: {'inputs': Le, 'targets': Lt}; Lt is also the decode budget.
  output_dir: where predictions.jsonl and metrics.json go (created if absent).
  pair: the target, the drafter and their weights (`pairs.PairConfig`).
  decoder: 'speculative' (needs pair.drafter) or 'baseline' (T5X's temperature_sample, the target
    alone; pair.drafter is ignored).
  gamma: drafts per target call, or 'auto': the draft shape chosen on this device before decoding
    (`auto`, one process only), its decision and every number behind it in metrics.json
    ('auto_shape'). auto: the `auto_shape.Auto` of gamma 'auto' (None: `auto_shape.Auto()`,
    chains of 1-4 drafts). temperature, topk, topp: the sampling distribution (0: greedy).
  batch_size, split, max_examples: which examples, how many per call (None: the whole split).
  decode_seed: example i of the split decodes with rng fold_in(PRNGKey(decode_seed), i)
    (`example_keys`), whatever its batch, its row or the process that decodes it.
  ngram_fit_split, ngram_fit_examples: the targets a drafter that `learns_from_targets` is fitted
    on (the first ngram_fit_examples of that split).
  """

  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  output_dir: str
  pair: pairs.PairConfig
  decoder: str = "speculative"
  gamma: int | str = 4
  temperature: float = 0.0
  topk: int = 0
  topp: float = 0.0
  batch_size: int = 32
  split: str = "test"
  max_examples: int | None = None
  decode_seed: int = 0
  ngram_fit_split: str = "train"
  ngram_fit_examples: int = 10000
  auto: auto_shape.Auto | None = None

  def __post_init__(self):
    unset = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is gin.REQUIRED]
    if unset:
      raise gin_utils.ConfigError(
          f"InferConfig field(s) {unset} are %gin.REQUIRED but not set: "
          "bind the macros of configs/runs/infer.gin, e.g. "
          "--gin.INFER_OUTPUT_DIR=\"'/tmp/out'\""
      )
    if not isinstance(self.pair, pairs.PairConfig):
      raise gin_utils.ConfigError(
          f"InferConfig.pair must be a pairs.PairConfig "
          "(configs/runs/infer.gin binds it to @pairs.PairConfig()), got "
          f"{self.pair!r}"
      )
    if not isinstance(self.decoder, str) or self.decoder not in DECODERS:
      raise gin_utils.ConfigError(f"DECODER {self.decoder!r} is not one of {DECODERS}")
    if self.speculative and self.pair.drafter is None:
      raise gin_utils.ConfigError(
          "DECODER 'speculative' needs a DRAFTER: include a "
          "configs/drafters/ file (e.g. --gin_file="
          "configs/drafters/t5.gin), or set DECODER = 'baseline'"
      )
    lengths = self.task_feature_lengths
    if (
        not isinstance(lengths, Mapping)
        or set(lengths) != set(FEATURES)
        or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths.values()
        )
    ):
      raise gin_utils.ConfigError(
          f"TASK_FEATURE_LENGTHS {self.task_feature_lengths!r} must give "
          "positive integer lengths for exactly 'inputs' and 'targets', "
          "e.g. {'inputs': 64, 'targets': 64}"
      )
    if self.auto is not None and not isinstance(self.auto, auto_shape.Auto):
      raise gin_utils.ConfigError(
          f"InferConfig.auto must be an @auto_shape.Auto() or None, got {self.auto!r}"
      )
    if self.auto is not None and self.gamma != AUTO:
      raise gin_utils.ConfigError(
          f"InferConfig.auto is set but GAMMA is {self.gamma!r}: set GAMMA = '{AUTO}' to choose "
          "the draft shape on the device, or drop InferConfig.auto"
      )
    for name, value, low in (
        ("BATCH_SIZE", self.batch_size, 1),
        ("GAMMA", None if self.gamma == AUTO else self.gamma, 1),
        ("max_examples", self.max_examples, 1),
        ("ngram_fit_examples", self.ngram_fit_examples, 1),
        ("decode_seed", self.decode_seed, 0),
    ):
      if value is not None and (
          not isinstance(value, int) or isinstance(value, bool) or value < low
      ):
        raise gin_utils.ConfigError(
            f"{name} must be an integer >= {low}"
            + (f" or '{AUTO}'" if name == "GAMMA" else "")
            + f", got {value!r}"
        )
    try:
      for name, value in (
          ("MIXTURE_OR_TASK_NAME", self.mixture_or_task_name),
          ("INFER_OUTPUT_DIR", self.output_dir),
          ("SPLIT", self.split),
          ("ngram_fit_split", self.ngram_fit_split),
      ):
        validation.check_text(value, name)
    except validation.InvalidInputError as e:
      raise gin_utils.ConfigError(str(e)) from e
    try:
      validation.check_sampling(
          self.temperature, self.topk, self.topp, vocab_size=self.pair.target_config.vocab_size
      )
    except validation.InvalidInputError as e:
      raise gin_utils.ConfigError(
          f"{e} (TEMPERATURE, inference.InferConfig.topk and .topp set the sampling)"
      ) from e

  @property
  def speculative(self) -> bool:
    return self.decoder == "speculative"

  @property
  def loaded_pair(self) -> pairs.PairConfig:
    """The pair this run loads: without its drafter for the baseline."""
    return self.pair if self.speculative else dataclasses.replace(self.pair, drafter=None)


# ----------------------------------------------------------------------------- models


def build_model(
    config: InferConfig, task: seqio.Task
) -> tuple[models.EncoderDecoderModel, pairs.Pair, auto_shape.Choice | None]:
  """-> (model, its loaded pair: params on the device and their sources, the draft shape's
  `auto_shape.Choice` where GAMMA is 'auto', else None). With several processes the target's
  checkpoint is left unread (`t5x_checkpoints.LazyArray`s): each process reads only its
  devices' slices of it (`partitioning.Partitioner.place_params_per_process`). Where auto
  chooses the baseline, the model is the baseline's."""
  vocabulary = task.output_features["targets"].vocabulary
  pair = pairs.load_pair(
      config.loaded_pair,
      vocabulary.eos_id,
      fit_targets=lambda: _fit_targets(task, config),
      lazy_target=jax.process_count() > 1,
  )
  module = network.Transformer(pair.target_config)
  baseline = models.EncoderDecoderModel(module, vocabulary, vocabulary)
  if pair.drafter is None:
    return baseline, pair, None
  choice, shape = None, {"gamma": config.gamma}
  if config.gamma == AUTO:
    choice = choose_draft_shape(config, task, pair)
    if choice.shape is None:
      return baseline, pair, choice
    shape = {"draft_shape": choice.shape}
  model = models.SpeculativeEncoderDecoderModel(
      module, pair.drafter, vocabulary, vocabulary, **shape
  )
  return model, pair, choice


def choose_draft_shape(
    config: InferConfig, task: seqio.Task, pair: pairs.Pair
) -> auto_shape.Choice:
  """GAMMA 'auto': the acceptance per position along the target's own outputs for the split's
  first AUTO_EXAMPLES examples, then `auto_shape.Auto.choose` on this process's default device,
  at the run's lengths and temperature (printed, and logged)."""
  auto = config.auto or auto_shape.Auto()
  lengths = dict(config.task_feature_lengths)
  shard = seqio.ShardInfo(index=0, num_shards=1)
  first = [
      example
      for _, example in itertools.islice(_shard_examples(task, config, shard), AUTO_EXAMPLES)
  ]
  tokens = model_batch(first, len(first), lengths, pair.target_config.vocab_size)
  geometry = step_costs.DecodeGeometry.for_decoding(
      lengths["inputs"], lengths["targets"], auto.max_block
  )
  choice = auto.choose_for_pair(
      pair,
      np.asarray(tokens["encoder_input_tokens"]),
      lengths["targets"],
      geometry,
      config.temperature,
      task.output_features["targets"].vocabulary,
      f"examples of the {config.split} split",
  )
  logging.info("%s", choice.summary())
  print(choice.summary())
  return choice


def _fit_targets(task: seqio.Task, config: InferConfig) -> np.ndarray:
  """The targets a drafter is fitted on -> [N, Lt] (zero-padded)."""
  try:
    return tasks.feature_arrays(
        task,
        config.ngram_fit_split,
        "targets",
        config.task_feature_lengths,
        config.ngram_fit_examples,
    )
  except ValueError as e:
    raise gin_utils.ConfigError(
        f"{e} The drafter is fitted on its targets: set "
        "inference.InferConfig.ngram_fit_split to a split with examples"
    ) from e


# ----------------------------------------------------------------------------- data


def get_task(config: InferConfig) -> seqio.Task:
  """The configured task, checked to be a task, to have the split and the features 'inputs' and
  'targets', and to have vocabularies the models' vocab_size covers."""
  try:
    task = tasks.get_task(config.mixture_or_task_name)
  except ValueError as e:
    raise gin_utils.ConfigError(f"MIXTURE_OR_TASK_NAME: {e}") from e
  if not isinstance(task, seqio.Task):
    raise gin_utils.ConfigError(
        f"MIXTURE_OR_TASK_NAME {task.name!r} is a mixture: infer decodes "
        f"one task; name one of {sorted(t.name for t in task.tasks)}"
    )
  try:
    tasks.check_split(task, config.split, "SPLIT")
  except ValueError as e:
    raise gin_utils.ConfigError(str(e)) from e
  missing = [feature for feature in FEATURES if feature not in task.output_features]
  if missing:
    raise gin_utils.ConfigError(
        f"task {task.name} has no feature(s) {missing} (it has {sorted(task.output_features)}): "
        f"infer decodes 'targets' from 'inputs'; name a task with both"
    )
  vocab_size = config.pair.target_config.vocab_size
  for feature in FEATURES:
    vocabulary = task.output_features[feature].vocabulary
    if vocab_size < vocabulary.vocab_size:
      raise gin_utils.ConfigError(
          f"TARGET_CONFIG vocab_size {vocab_size} < the {vocabulary.vocab_size} pieces of "
          f"{task.name}'s vocabulary: set VOCAB_SIZE to cover it (a drafter has the target's "
          f"vocab_size, pairs.PairConfig checks; feature {feature!r})"
      )
  return task


def _shard_examples(
    task: seqio.Task, config: InferConfig, shard: seqio.ShardInfo
) -> Iterator[tuple[int, dict]]:
  """(index in the split, tokenized and truncated example) for the examples of `shard`, in order.

  seqio shards at the data source when the source has as many files as shards, and then an
  example's index in the split is unknown; here the split is sharded at the examples (seqio's
  other mode, `tf.data.Dataset.shard`): example i goes to shard i % num_shards, and keeps i.
  """
  dataset = task.get_dataset(
      dict(config.task_feature_lengths),
      split=config.split,
      shuffle=False,
      use_cached=False,
      try_in_mem_cache=False,
  )
  if config.max_examples is not None:
    dataset = dataset.take(config.max_examples)
  dataset = dataset.enumerate().shard(shard.num_shards, shard.index)
  for index, example in dataset.as_numpy_iterator():
    yield int(index), example


def model_batch(
    examples: Sequence[Mapping[str, np.ndarray]],
    batch_size: int,
    lengths: Mapping[str, int],
    vocab_size: int | None = None,
) -> dict[str, np.ndarray]:
  """EncDecFeatureConverter's model features for decoding, padded to `batch_size` rows with
  copies of the last example: encoder_input_tokens [B, Le]; decoder_input_tokens [B, Lt] (zeros:
  decoding starts from BOS, only the shape counts).

  Raises `validation.InvalidInputError` for no examples or more than `batch_size`, and for an
  example whose 'inputs' are missing, empty, longer than lengths['inputs'] or (given
  `vocab_size`) hold ids outside [0, vocab_size): a task whose vocabulary is not the model's.
  """
  if not 1 <= len(examples) <= batch_size:
    raise validation.InvalidInputError(
        f"model_batch got {len(examples)} examples for batch_size {batch_size}: give 1 to "
        f"{batch_size}."
    )
  for i, example in enumerate(examples):
    inputs = example.get("inputs")
    if inputs is None or not 1 <= len(inputs) <= lengths["inputs"]:
      raise validation.InvalidInputError(
          f"example {i} of the batch has inputs {inputs!r}, but each needs 1 to "
          f"lengths['inputs'] = {lengths['inputs']} tokens: read examples through the task's "
          "pipeline at these feature lengths (it tokenizes and truncates them)."
      )
    inputs = np.asarray(inputs)
    limit = np.inf if vocab_size is None else vocab_size
    outside = inputs[(inputs < 0) | (inputs >= limit)]
    if outside.size:
      raise validation.InvalidInputError(
          f"example {i} of the batch has input ids {sorted(set(outside.tolist()))}, negative or "
          f">= the model's vocab_size {vocab_size}: the task's vocabulary is not the model's (set "
          "VOCAB_SIZE to cover it, or use the model's vocabulary)."
      )
  rows = list(examples) + [examples[-1]] * (batch_size - len(examples))
  encoder = np.zeros((batch_size, lengths["inputs"]), np.int32)
  for i, example in enumerate(rows):
    encoder[i, : len(example["inputs"])] = example["inputs"]
  return {
      "encoder_input_tokens": encoder,
      "decoder_input_tokens": np.zeros((batch_size, lengths["targets"]), np.int32),
  }


# ----------------------------------------------------------------------------- outputs

OUTPUT_FILES = (PREDICTIONS_FILE, METRICS_FILE, CONFIG_FILE)


def output_dir(config: InferConfig, overwrite: bool = False) -> run_dir.OutputDir:
  """The run's output directory (`run_dir.OutputDir`): INFER_OUTPUT_DIR, with OUTPUT_FILES;
  `.check()` it before anything loads."""
  return run_dir.OutputDir(
      config.output_dir,
      OUTPUT_FILES,
      "INFER_OUTPUT_DIR",
      overwrite,
      overwrite_hint="pass --overwrite (inference.infer(..., overwrite=True))",
  )


@contextlib.contextmanager
def atomic_writer(path: pathlib.Path) -> Iterator[Any]:
  """A text file handle on a temporary file beside `path`, renamed to `path` on success and
  removed on any error, so `path` is either absent, the old file, or complete."""
  path = pathlib.Path(path)
  output = run_dir.OutputDir(path.parent, [path.name], str(path.parent))
  with output:
    with output.stage(path.name) as f:
      yield f
    output.commit()


def _row_stats(stats: Mapping[str, np.ndarray], decodes: np.ndarray, eos_id: int) -> list[dict]:
  """Per-example statistics of a batch's rows (see the module docstring): the speculative loop's
  counts [B] each, or (the baseline, `stats` empty) one target call per decoded token."""
  if stats:
    stats = decoding.SpeculativeStats.from_dict(stats).as_dict()
    stats = {name: np.asarray(value) for name, value in stats.items()}
    return [{name: value[i].item() for name, value in stats.items()} for i in range(len(decodes))]
  return [{"target_calls": int(n)} for n in decoding.decoded_lengths(decodes, eos_id)]


def _summary(stats: Sequence[Mapping[str, float]], speculative: bool) -> dict:
  """Aggregate statistics, pooled over every example: `decoding.SpeculativeStats.summary` of the
  summed counts for speculative decoding, totals otherwise."""
  totals = {name: np.array([s[name] for s in stats]) for name in stats[0]}
  if speculative:
    return decoding.SpeculativeStats.from_dict(totals).summary()
  return {name: float(np.sum(values)) for name, values in totals.items()}


# ----------------------------------------------------------------------------- decoding


def configured_partitioner(**kwargs) -> partitioning.Partitioner:
  """`partitioning.Partitioner(**kwargs)` as gin configures it (NUM_PARTITIONS,
  configs/runs/partitioning.gin), a setting it refuses as a gin_utils.ConfigError."""
  try:
    return partitioning.Partitioner(**kwargs)
  except (TypeError, ValueError) as e:
    raise gin_utils.ConfigError(
        f"partitioning.Partitioner (NUM_PARTITIONS, configs/runs/partitioning.gin): "
        f"{str(e).splitlines()[0]}"
    ) from e


def example_keys(decode_seed: jax.Array, index: jax.Array) -> jax.Array:
  """Each example's PRNG key, fold_in(PRNGKey(decode_seed), its index in the split) -> [B, 2]:
  the same whatever the process, the batch or the row that decodes it."""
  base = jax.random.PRNGKey(decode_seed)
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.maximum(index, 0))


def example_predict(
    model: models.EncoderDecoderModel,
    partitioner: partitioning.Partitioner,
    param_shardings: Any,
    decode_length: int,
    topk: int,
    topp: float,
    greedy: bool,
) -> Any:
  """The jitted decode of a global batch, one random stream per example:
  `fn(params, encoder_tokens [B, Le], index [B], decode_seed, temperature) -> (decodes [B, Lt],
  {stat name: [B]} (empty for the baseline), index [B])`.

  The batch decodes in one loop (`model.predict_batch_with_aux`) with one key per example,
  `example_keys(decode_seed, index)` (`sampling.uniforms`), so each row's tokens depend on its
  example's index alone, not on the rows beside it. Rows of padding carry index -1. The params
  are placed by `param_shardings` (`partitioner.params_shardings(model)`), the tokens and the
  indices split over the mesh's 'data' axis; the outputs are replicated, so every process reads
  every row. greedy: the loop's greedy specialization (`temperature` is then unused).
  """

  def fn(params, tokens, index, decode_seed, temperature):
    batch = {
        "encoder_input_tokens": tokens,
        "decoder_input_tokens": jnp.zeros((tokens.shape[0], decode_length), jnp.int32),
    }
    decoder_params = {"temperature": 0.0 if greedy else temperature, "topk": topk, "topp": topp}
    decodes, aux = model.predict_batch_with_aux(
        params, batch, example_keys(decode_seed, index), decoder_params=decoder_params
    )
    return decodes, aux.get("speculative_stats", {}), index

  data, replicated = partitioner.data_sharding, partitioner.replicated
  return jax.jit(
      fn,
      in_shardings=(param_shardings, data, data, replicated, replicated),
      out_shardings=replicated,
  )


# ----------------------------------------------------------------------------- the run


def infer(
    config: InferConfig,
    gin_config: str | None = None,
    partitioner: partitioning.Partitioner | None = None,
    overwrite: bool = False,
) -> dict:
  """Decodes the configured split, writes predictions.jsonl and metrics.json; returns the latter.

  One process or several (`multihost`): each process decodes its shard of the split
  (`partitioner.get_data_layout`) as its rows of each global batch of `batch_size` rows;
  processes whose devices hold the same rows (a 'model' axis across processes) decode the same
  shard, and only the first of them counts its results; process 0 gathers every process's
  predictions and statistics and writes the files. Each example decodes
  with its own random stream (`example_keys`), so the outputs do not depend on the number of
  processes, devices or the batch size.

  gin_config: the run's gin configuration (`gin.config_str()`), written to output_dir/config.gin
  with the predictions and the metrics. The output directory (`output_dir`) is checked first,
  before anything loads: writable, and holding no other run's outputs unless `overwrite` (then
  the other run's files are replaced, all of them). The outputs are written under temporary
  names and renamed into place together once every example is decoded (`run_dir.OutputDir`), so
  a refused, failed or interrupted run leaves the directory as it was.
  partitioner: the mesh and its rules (default `partitioning.Partitioner()`, gin-configurable:
  configs/runs/partitioning.gin); BATCH_SIZE must divide over its 'data' axis.
  """
  outputs = output_dir(config, overwrite)
  if multihost.is_writer():
    outputs.check()
  if config.speculative and config.gamma == AUTO and jax.process_count() > 1:
    raise gin_utils.ConfigError(
        f"GAMMA '{AUTO}' times the draft shape's costs on one process's device, and this run has "
        f"{jax.process_count()} processes, which could choose differently: run it once on one "
        "process (its metrics.json records the choice), then give that GAMMA"
    )
  task = get_task(config)
  lengths = dict(config.task_feature_lengths)
  truncation = tasks.count_truncated(task, config.split, lengths, config.max_examples)
  if truncation.examples == 0:
    raise gin_utils.ConfigError(f"split {config.split!r} of {task.name} has no examples")
  log = logging.warning if any(truncation.truncated.values()) else logging.info
  log(
      "TASK_FEATURE_LENGTHS %s: %s (split %s); as in T5X, a truncated sequence keeps its first "
      "length - 1 tokens and EOS.",
      lengths,
      truncation,
      config.split,
  )
  partitioner = partitioner or configured_partitioner()
  try:
    layout = partitioner.get_data_layout(config.batch_size)
  except ValueError as e:
    raise gin_utils.ConfigError(f"BATCH_SIZE {config.batch_size}: {e}") from e
  rows = layout.rows
  shard = seqio.ShardInfo(index=layout.shard_id, num_shards=layout.num_shards)
  shard_size = -(-truncation.examples // shard.num_shards)  # the largest shard
  steps = -(-shard_size // rows)
  multihost.check_same_everywhere(
      {"examples": truncation.examples, "batch_size": config.batch_size, "steps": steps}
  )

  model, pair, choice = build_model(config, task)
  vocabulary = task.output_features["targets"].vocabulary
  shardings = partitioner.params_shardings(model)
  placed = False
  try:
    speculative = isinstance(model, models.SpeculativeEncoderDecoderModel)
    params = partitioner.place_params_per_process(
        model, pair.params if speculative else pair.target_params, shardings
    )
    placed = True
  finally:  # a process whose slices cannot be read (damaged, NaN or inf) stops every process
    multihost.all_succeeded(placed, "reading its slices of the parameters")
  greedy = sampling.is_greedy(config.temperature)
  predict = example_predict(
      model, partitioner, shardings, lengths["targets"], config.topk, config.topp, greedy
  )
  examples = _shard_examples(task, config, shard)
  records = []
  start = time.perf_counter()
  with tqdm.tqdm(
      total=truncation.examples,
      unit="example",
      desc=f"{config.decoder} {task.name}",
      disable=not multihost.is_writer(),
  ) as bar:
    for _ in range(steps):
      batch = list(itertools.islice(examples, rows))
      index = np.full((rows,), -1, np.int32)
      index[: len(batch)] = [i for i, _ in batch]
      inputs = [example for _, example in batch] or [{"inputs": np.array([model.eos_id])}]
      tokens = model_batch(inputs, rows, lengths, model.module.config.vocab_size)
      global_tokens, global_index = partitioner.place_process_batch(
          (tokens["encoder_input_tokens"], index), config.batch_size
      )
      decodes, stats, decoded_index = jax.device_get(
          predict(
              params,
              global_tokens,
              global_index,
              np.uint32(config.decode_seed),
              np.float32(config.temperature),
          )
      )
      row_stats = _row_stats(stats, decodes, model.eos_id)
      position = {int(i): row for row, i in enumerate(decoded_index) if i >= 0}
      for i, example in batch:
        row = position[i]
        records.append(_record(task, vocabulary, i, example, decodes[row], row_stats[row]))
      bar.update(min(config.batch_size, bar.total - bar.n))
  seconds = time.perf_counter() - start

  # A replica set's processes decoded the same examples: the first one's records count.
  records = _gathered(records if layout.is_first_host_in_replica_set else [], truncation.examples)
  targets = [record["targets"] for record in records]
  predictions = [record["prediction"] for record in records]
  metrics = {}
  for metric_fn in task.predict_metric_fns:
    metrics.update(metric_fn(targets, predictions))
  drafter = pair.drafter
  result = {
      "task": task.name,
      "split": config.split,
      "examples": len(predictions),
      "metrics": metrics,
      "decoding": _summary(
          [record["stats"] for record in records],
          isinstance(model, models.SpeculativeEncoderDecoderModel),
      ),
      "truncated": {"examples": truncation.examples, **truncation.truncated},
      "weights": pair.sources,
      "random_weights": pair.random_weights,
      "settings": {
          "decoder": config.decoder,
          "drafter": None if drafter is None else type(drafter).__name__,
          "drafter_repr": None if drafter is None else repr(drafter),
          "gamma": config.gamma if config.speculative else None,
          "draft_shape": (
              model.draft_shape.describe()
              if isinstance(model, models.SpeculativeEncoderDecoderModel)
              else None
          ),
          "temperature": config.temperature,
          "topk": config.topk,
          "topp": config.topp,
          "batch_size": config.batch_size,
          "task_feature_lengths": lengths,
          "decode_seed": config.decode_seed,
          "processes": jax.process_count(),
          "devices": jax.device_count(),
          "mesh": dict(partitioner.mesh.shape),
      },
      "seconds": {"decoding_incl_compile": seconds},
      "auto_shape": None if choice is None else choice.as_dict(),
  }
  written = not multihost.is_writer()
  try:
    if multihost.is_writer():
      with outputs:
        with outputs.stage(PREDICTIONS_FILE) as out:
          for record in records:
            line = {key: record[key] for key in ("inputs", "targets", "prediction", "stats")}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
        outputs.stage_text(METRICS_FILE, json.dumps(result, indent=2) + "\n")
        if gin_config is not None:
          outputs.stage_text(CONFIG_FILE, gin_config)
        outputs.commit()
      written = True
  finally:
    multihost.all_succeeded(written, f"writing {outputs.path} (process 0)")
  logging.info("%s metrics: %s; decoding: %s", task.name, metrics, result["decoding"])
  return result


def _record(
    task: seqio.Task,
    vocabulary: seqio.Vocabulary,
    index: int,
    example: Mapping[str, Any],
    tokens: np.ndarray,
    stats: Mapping[str, Any],
) -> dict:
  """One line of predictions.jsonl, with the example's index in the split."""
  return {
      "index": index,
      "inputs": example["inputs_pretokenized"].decode("utf-8"),
      "targets": task.postprocess_fn(
          example["targets_pretokenized"].decode("utf-8"), example=example, is_target=True
      ),
      "prediction": task.postprocess_fn(
          vocabulary.decode(tokens.tolist()), example=example, is_target=False
      ),
      "stats": dict(stats),
  }


def _gathered(records: Sequence[dict], examples: int) -> list[dict]:
  """Every process's records, in the split's order; raises RuntimeError unless each of the
  `examples` indices appears exactly once (no partial output may pass for complete)."""
  everyone = [json.loads(text) for text in multihost.gather_texts([json.dumps(r) for r in records])]
  everyone.sort(key=lambda record: record["index"])
  indices = [record["index"] for record in everyone]
  if indices != list(range(examples)):
    missing = sorted(set(range(examples)) - set(indices))
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    raise RuntimeError(
        f"the processes decoded {len(indices)} examples of {examples}: missing {missing[:20]}, "
        f"repeated {repeated[:20]}; nothing is written"
    )
  return everyone

"""Inference over a seqio task split: speculative decoding (or the baseline), predictions, metrics.

The library behind scripts/infer.py. A run is configured the T5X way: configs/runs/infer.gin binds
`inference.InferConfig` to T5X's macros (MIXTURE_OR_TASK_NAME, TASK_FEATURE_LENGTHS,
CHECKPOINT_PATH, INFER_OUTPUT_DIR) and ours (TARGET_CONFIG, DRAFTER_CONFIG,
DRAFTER_CHECKPOINT_PATH, DECODER, DRAFTER_KIND, GAMMA, TEMPERATURE, BATCH_SIZE, SPLIT,
RESTORE_DTYPE, RANDOM_INIT_SEED); `parse_gin` reads the files and bindings, `infer` runs.

`infer` decodes the split in order, `batch_size` examples per jitted call (the last batch is
padded with copies of its last example, so every call has one shape and compiles once), and
writes to `output_dir`:
  predictions.jsonl  one JSON object per example: {"inputs", "targets", "prediction", "stats"}
                     (texts as in the task; stats as in `STAT_NAMES` below);
  metrics.json       the task's metrics, the aggregate decoding statistics (speculative: alpha,
                     acceptance rate, tokens per target call via `decoding.stats_summary`), the
                     truncation counts, where the weights came from, and the settings.
Each file is written to a temporary file in `output_dir` and renamed into place, so an
interrupted run leaves no half-written file.

Per-example statistics. Speculative decoding reports `decoding.STAT_NAMES` (target_calls,
drafter_calls, drafted_tokens, accepted_tokens, beta_sum, beta_count) from the decoding loop itself.
The baseline reports target_calls only: one per generated token, EOS included.

Feature lengths shorter than the data: as in T5X, the seqio pipeline truncates (it keeps the first
length - 1 tokens and appends EOS; see speculative_t5x/tasks.py), and nothing is dropped. `infer`
counts the truncated examples first (`tasks.count_truncated`), logs the counts and writes them to
metrics.json. The metric compares predictions with the full, untruncated target texts.

Weights. CHECKPOINT_PATH and DRAFTER_CHECKPOINT_PATH name T5X checkpoints or directories written
by `checkpoints.save_model` (for a `save_pair` directory, name its `target/` and `drafter/`
members). A path of None means random weights, allowed only with RANDOM_INIT_SEED set (tests and
demos: no trained checkpoint exists here); metrics.json then labels them, and a warning is logged.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import re
import tempfile
import time
from typing import Any, Iterator, Mapping, Sequence

from absl import logging
import gin
import jax
import jax.numpy as jnp
import numpy as np
import seqio
import tqdm

from speculative_t5x import checkpoints
from speculative_t5x import decoding
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import tasks

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DECODERS = ("speculative", "baseline")
DRAFTER_KINDS = ("t5", "unigram", "bigram", "prompt_lookup")
FEATURES = ("inputs", "targets")
PREDICTIONS_FILE = "predictions.jsonl"
METRICS_FILE = "metrics.json"
RANDOM_WEIGHTS = "RANDOM weights (RANDOM_INIT_SEED={seed}), not a trained model"
_REQUIRED_MACRO = re.compile(r"^(\w+) = %gin\.REQUIRED$", re.MULTILINE)


class ConfigError(ValueError):
  """A problem with the run's configuration, fixed in gin (the message names the macro)."""


# ----------------------------------------------------------------------------- configuration


@gin.configurable(module="inference")
@dataclasses.dataclass(frozen=True)
class InferConfig:
  """One inference run (configs/runs/infer.gin binds every field to a macro).

  mixture_or_task_name: a registered seqio task (speculative_t5x.tasks registers ours).
  task_feature_lengths: {'inputs': Le, 'targets': Lt}; Lt is also the decode budget.
  output_dir: where predictions.jsonl and metrics.json go (created if absent).
  target_config, checkpoint_path: the target model and its checkpoint (None: random weights).
  decoder: 'speculative' or 'baseline' (T5X's temperature_sample, the target alone).
  drafter_kind: 't5' (drafter_config and drafter_checkpoint_path), 'unigram' or 'bigram' (tables
    fit on up to `ngram_fit_examples` targets of `ngram_fit_split`), or 'prompt_lookup'.
  gamma: drafts per target call. temperature, topk, topp: the sampling distribution (0: greedy).
  batch_size, split, max_examples: which examples, how many per call (None: the whole split).
  restore_dtype: dtype the parameters are cast to ('bfloat16' for the real sizes, as T5X's
    RestoreCheckpointConfig; 'float32' for tiny test models; None keeps them as stored).
  random_init_seed: seed of random weights for a model whose checkpoint path is None (the
    target's; a T5 drafter's is random_init_seed + 1).
  decode_seed: batch i decodes with rng fold_in(PRNGKey(decode_seed), i).
  """
  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  output_dir: str
  target_config: network.T5Config
  checkpoint_path: str | None
  drafter_config: network.T5Config | None = None
  drafter_checkpoint_path: str | None = None
  decoder: str = "speculative"
  drafter_kind: str = "t5"
  gamma: int = 4
  temperature: float = 0.0
  topk: int = 0
  topp: float = 0.0
  batch_size: int = 32
  split: str = "test"
  max_examples: int | None = None
  restore_dtype: str | None = "bfloat16"
  random_init_seed: int | None = None
  decode_seed: int = 0
  ngram_fit_split: str = "train"
  ngram_fit_examples: int = 10000

  def __post_init__(self):
    unset = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is gin.REQUIRED]
    if unset:
      raise ConfigError(f"InferConfig field(s) {unset} are %gin.REQUIRED but not set: bind "
                        "the macros of configs/runs/infer.gin, e.g. "
                        "--gin.INFER_OUTPUT_DIR=\"'/tmp/out'\"")
    if self.decoder not in DECODERS:
      raise ConfigError(f"DECODER {self.decoder!r} is not one of {DECODERS}")
    if self.drafter_kind not in DRAFTER_KINDS:
      raise ConfigError(f"DRAFTER_KIND {self.drafter_kind!r} is not one of {DRAFTER_KINDS}")
    lengths = dict(self.task_feature_lengths or {})
    if set(lengths) != set(FEATURES) or not all(
        isinstance(n, int) and n > 0 for n in lengths.values()):
      raise ConfigError(f"TASK_FEATURE_LENGTHS {self.task_feature_lengths!r} must give positive "
                        "integer lengths for exactly 'inputs' and 'targets', e.g. "
                        "{'inputs': 64, 'targets': 64}")
    for name, value, low in (("BATCH_SIZE", self.batch_size, 1), ("GAMMA", self.gamma, 1),
                             ("max_examples", self.max_examples, 1)):
      if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                or value < low):
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    if self.random_init_seed is None:
      missing = [macro for macro, path, needed in (
          ("CHECKPOINT_PATH", self.checkpoint_path, True),
          ("DRAFTER_CHECKPOINT_PATH", self.drafter_checkpoint_path, self.uses_t5_drafter))
                 if needed and not path]
      if missing:
        raise ConfigError(f"{' and '.join(missing)} not set: give the checkpoint(s) (e.g. "
                          f"--gin.{missing[0]}=\"'gs://your-bucket/model/checkpoint_N'\"), or set "
                          "RANDOM_INIT_SEED for random weights (tests and demos only)")
    if self.uses_t5_drafter and self.drafter_config is None:
      raise ConfigError("DRAFTER_KIND 't5' needs DRAFTER_CONFIG: include a configs/models/ file "
                        "and set e.g. DRAFTER_CONFIG = %T5_1_1_SMALL")
    if self.uses_t5_drafter and self.drafter_config.vocab_size != self.target_config.vocab_size:
      raise ConfigError(f"DRAFTER_CONFIG vocab_size {self.drafter_config.vocab_size} != "
                        f"TARGET_CONFIG vocab_size {self.target_config.vocab_size}: speculative "
                        "decoding needs one vocabulary")

  @property
  def uses_t5_drafter(self) -> bool:
    return self.decoder == "speculative" and self.drafter_kind == "t5"


def rewrite_gin_args(argv: Sequence[str]) -> list[str]:
  """T5X's shorthand: --gin.NAME=value -> --gin_bindings=NAME = value."""
  rewritten = []
  for arg in argv:
    if arg.startswith("--gin."):
      name, equals, value = arg[len("--gin."):].partition("=")
      if not equals:
        raise ConfigError(f"{arg} has no value: write --gin.{name}=value")
      arg = f"--gin_bindings={name} = {value}"
    rewritten.append(arg)
  return rewritten


def unset_required_macros() -> list[str]:
  """Names of the parsed gin macros still bound to %gin.REQUIRED."""
  return sorted(_REQUIRED_MACRO.findall(gin.config_str()))


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str] = ()) -> InferConfig:
  """Parses gin files (paths relative to the working directory or the repository) and bindings,
  then builds the `InferConfig`. A macro left at %gin.REQUIRED raises a ConfigError naming it."""
  if not gin_files:
    raise ConfigError("no gin file given: pass --gin_file=configs/runs/infer.gin (or a file "
                      "including it, e.g. configs/paper/ende_small_t0.gin)")
  gin.add_config_file_search_path(str(REPO_ROOT))
  gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings), finalize_config=False)
  missing = unset_required_macros()
  if missing:
    raise ConfigError(f"gin macro(s) {', '.join(missing)} are %gin.REQUIRED but not set: bind "
                      f"them, e.g. --gin.{missing[0]}=\"'value'\" (strings need inner quotes), or "
                      "include a file that sets them (configs/tasks/, configs/models/)")
  gin.finalize()
  return InferConfig()


# ----------------------------------------------------------------------------- models


def _cast(params: Any, dtype: str | None) -> Any:
  """Floating-point leaves cast to `dtype` (None: unchanged)."""
  if dtype is None:
    return params
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      params)


def _t5_params(config: network.T5Config, path: str | None, seed: int | None,
               dtype: str | None) -> tuple[dict, str]:
  """(params, where they came from) from a checkpoint, or random when `path` is None."""
  if path:
    return checkpoints.restore_params(config, path, dtype=dtype), f"checkpoint {path}"
  logging.warning("Random weights (RANDOM_INIT_SEED=%d): predictions mean nothing.", seed)
  params = network.init_params(config, jax.random.PRNGKey(seed))
  return _cast(params, dtype), RANDOM_WEIGHTS.format(seed=seed)


def _fit_targets(task: seqio.Task, config: InferConfig) -> Iterator[np.ndarray]:
  dataset = task.get_dataset(dict(config.task_feature_lengths), split=config.ngram_fit_split,
                             shuffle=False, use_cached=False, try_in_mem_cache=False)
  for example in dataset.take(config.ngram_fit_examples).as_numpy_iterator():
    yield example["targets"]


def _drafter(config: InferConfig, task: seqio.Task, eos_id: int) -> tuple[Any, Any, str]:
  """(drafter_module for SpeculativeEncoderDecoderModel, its params, where they came from)."""
  vocab_size = config.target_config.vocab_size
  if config.drafter_kind == "t5":
    seed = None if config.random_init_seed is None else config.random_init_seed + 1
    params, source = _t5_params(config.drafter_config, config.drafter_checkpoint_path, seed,
                                config.restore_dtype)
    return network.Transformer(config.drafter_config), params, source
  if config.drafter_kind == "prompt_lookup":
    return (drafters_lib.PromptLookupDrafter(vocab_size=vocab_size, eos_id=eos_id), {},
            "prompt lookup in the inputs and the decoded prefix")
  table = {"unigram": drafters_lib.UnigramDrafter, "bigram": drafters_lib.BigramDrafter}
  drafter = table[config.drafter_kind](vocab_size=vocab_size, eos_id=eos_id)
  targets = list(_fit_targets(task, config))
  if not targets:
    raise ConfigError(f"split {config.ngram_fit_split!r} of {task.name} has no examples to fit "
                      f"the {config.drafter_kind} drafter on: set "
                      "inference.InferConfig.ngram_fit_split")
  return (drafter, drafter.fit(targets, vocab_size),
          f"{config.drafter_kind} table fit on {len(targets)} {config.ngram_fit_split} targets")


def build_model(config: InferConfig, task: seqio.Task) -> tuple[Any, Any, dict[str, str]]:
  """-> (model, params on the device, {'target': source, 'drafter': source})."""
  vocabulary = task.output_features["targets"].vocabulary
  module = network.Transformer(config.target_config)
  params, source = _t5_params(config.target_config, config.checkpoint_path,
                              config.random_init_seed, config.restore_dtype)
  weights = {"target": source}
  if config.decoder == "baseline":
    model = models.EncoderDecoderModel(module, vocabulary, vocabulary)
  else:
    eos_id = vocabulary.eos_id
    drafter_module, drafter_params, weights["drafter"] = _drafter(config, task, eos_id)
    model = models.SpeculativeEncoderDecoderModel(module, drafter_module, vocabulary, vocabulary,
                                                  gamma=config.gamma)
    params = {"target": params, "drafter": drafter_params}
  return model, jax.device_put(params), weights


# ----------------------------------------------------------------------------- data


def get_task(config: InferConfig) -> seqio.Task:
  """The configured task, checked to be a task, to have the split, and to have a vocabulary the
  models' vocab_size covers."""
  try:
    task = tasks.get_task(config.mixture_or_task_name)
  except ValueError as e:
    raise ConfigError(f"MIXTURE_OR_TASK_NAME: {e}") from e
  if not isinstance(task, seqio.Task):
    raise ConfigError(f"MIXTURE_OR_TASK_NAME {task.name!r} is a mixture: infer decodes one task; "
                      f"name one of {sorted(t.name for t in task.tasks)}")
  splits = task.source.splits  # empty where a source does not list them (TFDS mock data)
  if splits and config.split not in splits:
    raise ConfigError(f"SPLIT {config.split!r} is not a split of {task.name}: use one of "
                      f"{sorted(splits)}")
  vocabulary = task.output_features["targets"].vocabulary
  for name, model_config in (("TARGET_CONFIG", config.target_config),
                             ("DRAFTER_CONFIG", config.drafter_config if config.uses_t5_drafter
                              else None)):
    if model_config is not None and model_config.vocab_size < vocabulary.vocab_size:
      raise ConfigError(f"{name} vocab_size {model_config.vocab_size} < the "
                        f"{vocabulary.vocab_size} pieces of {task.name}'s vocabulary: set "
                        "VOCAB_SIZE to cover it")
  return task


def _batches(task: seqio.Task, config: InferConfig) -> Iterator[list[dict]]:
  """Lists of up to `batch_size` tokenized, truncated examples of the split, in order."""
  dataset = task.get_dataset(dict(config.task_feature_lengths), split=config.split, shuffle=False,
                             use_cached=False, try_in_mem_cache=False)
  if config.max_examples is not None:
    dataset = dataset.take(config.max_examples)
  batch = []
  for example in dataset.as_numpy_iterator():
    batch.append(example)
    if len(batch) == config.batch_size:
      yield batch
      batch = []
  if batch:
    yield batch


def model_batch(examples: Sequence[Mapping[str, np.ndarray]], batch_size: int,
                lengths: Mapping[str, int]) -> dict[str, np.ndarray]:
  """EncDecFeatureConverter's model features for decoding, padded to `batch_size` rows with
  copies of the last example: encoder_input_tokens [B, Le]; decoder_input_tokens [B, Lt] (zeros:
  decoding starts from BOS, only the shape counts)."""
  rows = list(examples) + [examples[-1]] * (batch_size - len(examples))
  encoder = np.zeros((batch_size, lengths["inputs"]), np.int32)
  for i, example in enumerate(rows):
    encoder[i, :len(example["inputs"])] = example["inputs"]
  return {"encoder_input_tokens": encoder,
          "decoder_input_tokens": np.zeros((batch_size, lengths["targets"]), np.int32)}


# ----------------------------------------------------------------------------- outputs


@contextlib.contextmanager
def atomic_writer(path: pathlib.Path) -> Iterator[Any]:
  """A text file handle on a temporary file beside `path`, renamed to `path` on success and
  removed on any error, so `path` is either absent, the old file, or complete."""
  with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent,
                                   prefix=f".{path.name}.", suffix=".tmp", delete=False) as f:
    try:
      yield f
    except BaseException:
      f.close()
      os.unlink(f.name)
      raise
  os.chmod(f.name, 0o644)  # temporary files are 0600; results are ordinary files.
  os.replace(f.name, path)


def _decoded_lengths(decodes: np.ndarray, eos_id: int) -> np.ndarray:
  """Tokens generated per row [B], EOS included (the whole row if it has no EOS)."""
  is_eos = decodes == eos_id
  return np.where(is_eos.any(axis=1), is_eos.argmax(axis=1) + 1, decodes.shape[1])


def _row_stats(aux: Mapping[str, Any], decodes: np.ndarray, eos_id: int, rows: int) -> list[dict]:
  if "speculative_stats" in aux:
    stats = {k: np.asarray(v)[:rows] for k, v in aux["speculative_stats"].items()}
    return [{k: v[i].item() for k, v in stats.items()} for i in range(rows)]
  return [{"target_calls": int(n)} for n in _decoded_lengths(decodes[:rows], eos_id)]


def _summary(stats: Sequence[Mapping[str, float]], speculative: bool) -> dict:
  """Aggregate statistics: `decoding.stats_summary` for speculative decoding, totals otherwise."""
  totals = {k: np.array([s[k] for s in stats]) for k in stats[0]}
  if speculative:
    return decoding.stats_summary(totals)
  return {k: float(np.sum(v)) for k, v in totals.items()}


def infer(config: InferConfig) -> dict:
  """Decodes the configured split, writes predictions.jsonl and metrics.json; returns the latter."""
  task = get_task(config)
  lengths = dict(config.task_feature_lengths)
  truncation = tasks.count_truncated(task, config.split, lengths, config.max_examples)
  if truncation.examples == 0:
    raise ConfigError(f"split {config.split!r} of {task.name} has no examples")
  log = logging.warning if any(truncation.truncated.values()) else logging.info
  log("TASK_FEATURE_LENGTHS %s: %s (split %s); as in T5X, a truncated sequence keeps its first "
      "length - 1 tokens and EOS.", lengths, truncation, config.split)

  model, params, weights = build_model(config, task)
  vocabulary = task.output_features["targets"].vocabulary
  predict = model.jit_predict(topk=config.topk, topp=config.topp)
  temperature = jnp.float32(config.temperature)
  output_dir = pathlib.Path(config.output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)

  targets, predictions, all_stats = [], [], []
  start = time.perf_counter()
  with atomic_writer(output_dir / PREDICTIONS_FILE) as out, tqdm.tqdm(
      total=truncation.examples, unit="example", desc=f"{config.decoder} {task.name}") as bar:
    for index, examples in enumerate(_batches(task, config)):
      rng = jax.random.fold_in(jax.random.PRNGKey(config.decode_seed), index)
      decodes, aux = predict(params, model_batch(examples, config.batch_size, lengths), rng,
                             temperature)
      decodes = np.asarray(decodes)
      row_stats = _row_stats(aux, decodes, model.eos_id, len(examples))
      for example, tokens, stats in zip(examples, decodes, row_stats):
        target = task.postprocess_fn(example["targets_pretokenized"].decode("utf-8"),
                                     example=example, is_target=True)
        prediction = task.postprocess_fn(vocabulary.decode(tokens.tolist()), example=example,
                                         is_target=False)
        out.write(json.dumps({"inputs": example["inputs_pretokenized"].decode("utf-8"),
                              "targets": target, "prediction": prediction, "stats": stats},
                             ensure_ascii=False) + "\n")
        targets.append(target)
        predictions.append(prediction)
      all_stats.extend(row_stats)
      bar.update(len(examples))
  seconds = time.perf_counter() - start

  speculative = config.decoder == "speculative"
  metrics = {}
  for metric_fn in task.predict_metric_fns:
    metrics.update(metric_fn(targets, predictions))
  result = {
      "task": task.name, "split": config.split, "examples": len(predictions),
      "metrics": metrics, "decoding": _summary(all_stats, speculative),
      "truncated": {"examples": truncation.examples, **truncation.truncated},
      "weights": weights,
      "random_weights": any(w.startswith("RANDOM") for w in weights.values()),
      "settings": {"decoder": config.decoder,
                   "drafter_kind": config.drafter_kind if speculative else None,
                   "gamma": config.gamma if speculative else None,
                   "temperature": config.temperature, "topk": config.topk,
                   "topp": config.topp, "batch_size": config.batch_size,
                   "task_feature_lengths": lengths, "decode_seed": config.decode_seed},
      "seconds": {"decoding_incl_compile": seconds},
  }
  with atomic_writer(output_dir / METRICS_FILE) as f:
    f.write(json.dumps(result, indent=2) + "\n")
  logging.info("%s metrics: %s; decoding: %s", task.name, metrics, result["decoding"])
  return result

"""Training T5 1.1 models T5X-style: optimizer, train step, seqio input, BLEU eval, checkpoints.

`train` is what `scripts/train.py` runs (gin-configured, like T5X's `train_script.train`):

* input: a seqio task or mixture through `get_dataset` and `seqio.EncDecFeatureConverter` (packed
  or padded), shuffled with a fixed seed and repeated; resuming at step s skips s batches, so a
  resumed run sees the batches an uninterrupted one would have;
* what is trained (`Trainee`): the T5 1.1 `model_config` on the references
  (`models.EncoderDecoderModel.loss_fn`: cross-entropy plus z-loss, optional label smoothing), or
  with `distillation` a drafter distilled against a frozen target (`distillation.Distiller`: a
  DistillSpec divergence on references, the target's decodes or the drafter's own samples);
* optimizer: optax Adafactor (T5X's default) or AdamW, with a linear warmup and a constant,
  cosine, inverse-square-root or warmup-stable-decay schedule, and global-norm clipping;
* evaluation every `eval_period` steps: for a model, teacher-forced loss and accuracy, and greedy
  decodes (`jit_predict`, temperature 0) scored with the task's metrics (BLEU for translation);
  for a distilled drafter, the distillation loss and Table 3's alpha at T = 0 and T = 1;
* checkpoints: `orbax.checkpoint.CheckpointManager` under `model_dir/checkpoints`, holding the
  step, the parameters and the optimizer state; a rerun with the same `model_dir` continues from
  the latest one. The final parameters are also exported to `model_dir/model`, a model with
  `checkpoints.save_model` (the format `checkpoints.restore_model` and `pairs.save_pair` use), a
  drafter with `checkpoints.save_drafter_params`.

`distill_from` is the shorthand for the oldest distillation: cross-entropy on a target's own
decodes (greedy, or sampled at `distill_temperature`), i.e. `distillation.Distillation(distill_from,
divergence='cross_entropy', data='target')`; the data and the divergence DistillSpec compares are
`Distillation`'s settings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import time
import typing
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from absl import logging
import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import seqio
import tqdm

from speculative_t5x import drafters
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import validation
from speculative_t5x.running import run_dir
from speculative_t5x.text import demo_data
from speculative_t5x.text import tasks
from speculative_t5x.training import distillation as distillation_lib
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import pairs

Batch = Mapping[str, np.ndarray]
OPTIMIZERS = ("adafactor", "adamw")
SCHEDULES = ("constant", "cosine", "rsqrt", "wsd")
CHECKPOINTS_DIR = "checkpoints"
EXPORT_DIR = "model"
SUMMARY_FILE = "train_summary.json"
CONFIG_FILE = "config.gin"
# What a run writes in model_dir beside its checkpoints, together (`run_dir.OutputDir`).
OUTPUTS = (SUMMARY_FILE, CONFIG_FILE, EXPORT_DIR)
SHUFFLE_BUFFER = 10_000
# Cosine decay ends at this fraction of the peak learning rate.
COSINE_FINAL_FRACTION = 0.1
# Per-token metrics, averaged over several steps weighted by their tokens.
TOKEN_WEIGHTED_METRICS = ("loss", "z_loss", "accuracy", "beta", "agreement")


@flax.struct.dataclass
class TrainState:
  """What a checkpoint holds: the number of steps taken, the parameters, the optimizer state."""

  step: jax.Array
  params: Any
  opt_state: Any


# ----------------------------------------------------------------------------------------------
# Optimizer
# ----------------------------------------------------------------------------------------------
@gin.configurable(module="training", denylist=["num_steps"])
def make_optimizer(
    num_steps: int,
    name: str = "adafactor",
    learning_rate: float = 1e-2,
    warmup_steps: int = 0,
    schedule: str = "rsqrt",
    cooldown_steps: int = 0,
    weight_decay: float = 0.0,
    clip_norm: float | None = 1.0,
) -> optax.GradientTransformation:
  """An optax optimizer with a warmup and a decay schedule.

  name: 'adafactor' (optax's, factored second moments, updates scaled by the parameter RMS, as in
    T5X) or 'adamw'.
  learning_rate: the peak, reached after `warmup_steps` linear steps.
  schedule: after warmup, 'constant'; 'cosine' down to COSINE_FINAL_FRACTION of the peak at
    `num_steps`; 'rsqrt' (T5X's rsqrt_decay): peak * sqrt(warmup / step); or 'wsd' (warmup-
    stable-decay): the peak until the last `cooldown_steps`, then linearly down to 0 at
    `num_steps`.
  cooldown_steps: the length of 'wsd''s linear decay; 'wsd' only.
  clip_norm: global gradient-norm clipping (None: off).
  """
  if name not in OPTIMIZERS:
    raise gin_utils.ConfigError(
        f"unknown optimizer {name!r} (training.make_optimizer.name): use one of {OPTIMIZERS}."
    )
  if schedule not in SCHEDULES:
    raise gin_utils.ConfigError(
        f"unknown learning-rate schedule {schedule!r} (training.make_optimizer.schedule): use "
        f"one of {SCHEDULES}."
    )
  try:
    validation.check_integer(num_steps, "num_steps", 1)
    validation.check_integer(warmup_steps, "training.make_optimizer.warmup_steps", 0)
    validation.check_integer(cooldown_steps, "training.make_optimizer.cooldown_steps", 0)
    validation.check_number(weight_decay, "training.make_optimizer.weight_decay", 0.0)
  except validation.InvalidInputError as e:
    raise gin_utils.ConfigError(str(e)) from e
  for setting, value, meaning in (
      ("learning_rate", learning_rate, "the peak rate, reached after warmup_steps"),
      ("clip_norm", clip_norm, "the largest global gradient norm; None: no clipping"),
  ):
    if setting == "clip_norm" and value is None:
      continue
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not real or not np.isfinite(value) or value <= 0:
      raise gin_utils.ConfigError(
          f"training.make_optimizer.{setting} must be a finite number > 0 ({meaning}), got "
          f"{value!r}."
      )

  if (schedule == "wsd") != (cooldown_steps > 0):
    raise gin_utils.ConfigError(
        f"training.make_optimizer.cooldown_steps is {cooldown_steps} with schedule {schedule!r}: "
        "the linear cooldown is 'wsd''s alone; use schedule='wsd' with cooldown_steps > 0, or "
        "another schedule with cooldown_steps = 0."
    )
  if schedule == "wsd" and cooldown_steps > num_steps - warmup_steps:
    raise gin_utils.ConfigError(
        f"training.make_optimizer.cooldown_steps is {cooldown_steps}, more than the "
        f"{num_steps - warmup_steps} steps after warmup ({num_steps} steps, {warmup_steps} of "
        "warmup): lower it or train longer."
    )
  rate = learning_rate_schedule(num_steps, learning_rate, warmup_steps, schedule, cooldown_steps)
  if name == "adafactor":
    update = optax.adafactor(rate, weight_decay_rate=weight_decay or None)
  else:
    update = optax.adamw(rate, b1=0.9, b2=0.98, weight_decay=weight_decay)
  return update if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), update)


def learning_rate_schedule(
    num_steps: int, learning_rate: float, warmup_steps: int, schedule: str, cooldown_steps: int
) -> Callable[[jax.Array], jax.Array]:
  """`rate(step)`, make_optimizer's rate at a 0-based step (its docstring gives the schedules;
  the arguments are checked there)."""

  def rate(step):
    step = jnp.asarray(step, jnp.float32)
    warmup = jnp.minimum(1.0, (step + 1) / max(warmup_steps, 1))
    if schedule == "constant":
      decay = 1.0
    elif schedule == "cosine":
      progress = jnp.clip((step - warmup_steps) / max(num_steps - warmup_steps, 1), 0.0, 1.0)
      cosine = 0.5 * (1 + jnp.cos(jnp.pi * progress))
      decay = COSINE_FINAL_FRACTION + (1 - COSINE_FINAL_FRACTION) * cosine
    elif schedule == "wsd":
      decay = jnp.clip((num_steps - step) / cooldown_steps, 0.0, 1.0)
    else:
      decay = jnp.sqrt(max(warmup_steps, 1) / jnp.maximum(step + 1, max(warmup_steps, 1)))
    return learning_rate * warmup * decay

  return rate


def init_state(params: Any, optimizer: optax.GradientTransformation) -> TrainState:
  """Step 0: `params` and a fresh optimizer state."""
  return TrainState(step=jnp.asarray(0, jnp.int32), params=params, opt_state=optimizer.init(params))


LossFn = Callable[[Any, Any, Batch, jax.Array], tuple[jax.Array, dict]]


def make_train_step(
    loss_fn: LossFn, optimizer: optax.GradientTransformation
) -> Callable[[TrainState, Any, Batch, jax.Array], tuple[TrainState, dict]]:
  """A jitted `step(state, frozen, batch, rng) -> (state, metrics)`: one optimizer update on
  `loss_fn(params, frozen, batch, step_rng) -> (loss, metrics)`, step_rng being `rng` folded with
  the step (dropout, sampled data), `frozen` what the loss reads but never trains (a target's
  parameters, or None); the metrics gain the gradient norm."""

  def step(state: TrainState, frozen: Any, batch: Batch, rng: jax.Array):
    step_rng = jax.random.fold_in(rng, state.step)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, metrics), grads = grad_fn(state.params, frozen, batch, step_rng)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return jax.jit(step, donate_argnums=0)


# ----------------------------------------------------------------------------------------------
# Input
# ----------------------------------------------------------------------------------------------
def train_batches(
    task_name: str,
    feature_lengths: Mapping[str, int],
    batch_size: int,
    seed: int,
    pack: bool = True,
    start_step: int = 0,
) -> Iterator[dict]:
  """Endless training batches [batch_size, length] in EncDecFeatureConverter's layout.

  The order is fixed by `seed`; `start_step` skips that many batches (a resumed run).
  """
  task = tasks.get_task(task_name)
  dataset = task.get_dataset(
      dict(feature_lengths),
      split="train",
      shuffle=True,
      seed=seed,
      num_epochs=None,
      use_cached=False,
      shuffle_buffer_size=SHUFFLE_BUFFER,
  )
  dataset = seqio.EncDecFeatureConverter(pack=pack)(dataset, dict(feature_lengths))
  dataset = dataset.batch(batch_size, drop_remainder=True).skip(start_step).prefetch(2)
  return dataset.as_numpy_iterator()


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """Fixed evaluation batches: unpacked [batch_size, length] (the last padded with empty rows),
  the number of real rows in each, and the references (`targets_pretokenized`) in order."""

  batches: list[dict]
  rows: list[int]
  references: list[str]
  task: seqio.Task


def eval_set(
    task_name: str,
    split: str,
    feature_lengths: Mapping[str, int],
    batch_size: int,
    max_examples: int | None = None,
) -> EvalSet:
  """The first `max_examples` examples (all if None) of `split`, in file order."""
  task = tasks.get_task(task_name)
  dataset = task.get_dataset(
      dict(feature_lengths), split=split, shuffle=False, num_epochs=1, use_cached=False
  )
  if max_examples is not None:
    dataset = dataset.take(max_examples)
  references = [ex["targets_pretokenized"].decode("utf-8") for ex in dataset.as_numpy_iterator()]
  if not references:
    raise ValueError(f"task {task_name!r} split {split!r} has no examples to evaluate on.")
  converted = seqio.EncDecFeatureConverter(pack=False)(dataset, dict(feature_lengths))
  batches, rows = [], []
  for batch in converted.batch(batch_size).as_numpy_iterator():
    n = len(batch["encoder_input_tokens"])
    rows.append(n)
    batches.append({k: np.pad(v, ((0, batch_size - n), (0, 0))) for k, v in batch.items()})
  return EvalSet(batches, rows, references, task)


def detokenize(vocabulary: seqio.Vocabulary, decodes: np.ndarray, eos_id: int) -> list[str]:
  """decodes [B, L] -> texts, each cut at its first EOS."""
  texts = []
  for row in np.asarray(decodes).tolist():
    if eos_id in row:
      row = row[: row.index(eos_id)]
    texts.append(vocabulary.decode([t for t in row if t > 0]))
  return texts


def evaluate(
    model: models.EncoderDecoderModel,
    params: Any,
    examples: EvalSet,
    predict_fn: Callable | None = None,
    decode: bool = True,
) -> tuple[dict, list[str]]:
  """Teacher-forced loss / accuracy over `examples`, and (if `decode`) the task's metrics on
  greedy decodes -> (metrics, predictions)."""
  eval_fn = jax.jit(model.eval_fn)
  predict_fn = predict_fn or model.jit_predict()
  loss = correct = tokens = 0.0
  predictions = []
  for batch, n in zip(examples.batches, examples.rows):
    _, metrics = eval_fn(params, batch)
    count = float(metrics["tokens"])
    loss += float(metrics["loss"]) * count
    correct += float(metrics["accuracy"]) * count
    tokens += count
    if decode:
      decodes, _ = predict_fn(params, batch, jax.random.PRNGKey(0), 0.0)
      predictions += detokenize(model.output_vocabulary, decodes[:n], model.eos_id)
  results = {"eval_loss": loss / tokens, "eval_accuracy": correct / tokens}
  if decode:
    for metric_fn in examples.task.metric_fns:
      results.update(metric_fn(examples.references, predictions))
  return results, predictions


# ----------------------------------------------------------------------------------------------
# What is trained: a model on references, or a drafter distilled against a frozen target
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Trainee:
  """What the training loop trains and how; the loop (`train`) is the same for every trainee.

  init_params: rng -> fresh parameters.
  restore_params: a checkpoint directory (`train`'s init_from) -> parameters.
  loss_fn: (params, frozen, batch, rng) -> (loss, metrics with 'loss' and 'tokens').
  frozen: what loss_fn reads but never trains (a distillation's target parameters), or None.
  evaluate: params -> (metrics, a note for the log line), or None: no evaluation.
  export: (directory, params) -> None: writes the final parameters.
  shown: the metric the progress bar shows beside the loss.
  summary: what train_summary.json records about the trainee.
  """

  init_params: Callable[[jax.Array], Any]
  restore_params: Callable[[str], Any]
  loss_fn: LossFn
  frozen: Any
  evaluate: Callable[[Any], tuple[dict, str]] | None
  export: Callable[[str, Any], None]
  shown: str
  summary: dict


@typing.runtime_checkable
class SharesTarget(Protocol):
  """A drafter kind that shares parameters with its target (a feature head's embedding and
  logits kernel): training copies them in once, before the first step against the frozen target."""

  def init_from_target(self, params: Any, target_params: Any) -> Any:
    """Fresh `params` with what the drafter shares with the target copied in."""


def init_from_target(drafter: drafters.Drafter, params: Any, target_params: Any) -> Any:
  """`params` with what `drafter` shares with the target copied in (`SharesTarget`); a drafter
  that shares nothing keeps them as they are."""
  if isinstance(drafter, SharesTarget):
    return drafter.init_from_target(params, target_params)
  return params


def _network_config(drafter: drafters.Drafter) -> network.T5Config | None:
  """The T5 network a drafter's step runs, recorded in a run's summary (None: no such network)."""
  stepped = drafters.stepped_network(drafter)
  return None if stepped is None else stepped[0]


def _feature_shapes(lengths: Mapping[str, int]) -> dict:
  return {
      "encoder_input_tokens": (1, lengths["inputs"]),
      "decoder_input_tokens": (1, lengths["targets"]),
  }


def reference_trainee(
    model_config: network.T5Config,
    vocabulary: seqio.Vocabulary,
    lengths: Mapping[str, int],
    examples: EvalSet | None,
    z_loss: float = 1e-4,
    label_smoothing: float = 0.0,
) -> Trainee:
  """A T5 1.1 `model_config` trained on the task's references (`models.EncoderDecoderModel`'s
  cross-entropy plus z-loss); evaluated on `examples` (teacher-forced loss and accuracy, the
  task's metrics on greedy decodes); exported with `checkpoints.save_model`."""
  model = models.EncoderDecoderModel(
      network.Transformer(model_config),
      vocabulary,
      vocabulary,
      z_loss=z_loss,
      label_smoothing=label_smoothing,
  )
  predict_fn = model.jit_predict()

  def evaluate_params(params):
    results, predictions = evaluate(model, params, examples, predict_fn)
    return results, f" | e.g. {predictions[0]!r} (reference {examples.references[0]!r})"

  return Trainee(
      init_params=lambda rng: model.get_initial_variables(rng, _feature_shapes(lengths))["params"],
      restore_params=lambda path: checkpoints.restore_params(model_config, path),
      loss_fn=lambda params, frozen, batch, rng: model.loss_fn(params, batch, rng),
      frozen=None,
      evaluate=evaluate_params if examples is not None else None,
      export=lambda directory, params: checkpoints.save_model(
          directory, params, model_config, overwrite=True
      ),
      shown="accuracy",
      summary={"model_config": json.loads(checkpoints.config_to_json(model_config))},
  )


def distillation_trainee(
    settings: distillation_lib.Distillation,
    drafter: drafters.Drafter,
    eos_id: int,
    lengths: Mapping[str, int],
    examples: EvalSet | None,
    z_loss: float = 1e-4,
    seed: int = 0,
) -> Trainee:
  """`drafter` (checked by `distillation.checked_drafter`) distilled against the frozen target of
  `settings` (`distillation.Distiller`, the target restored here); evaluated on `examples` (the
  loss metrics, Table 3's alpha at T = 0 and 1); exported with `checkpoints.save_drafter_params`."""
  shapes = _feature_shapes(lengths)
  target_params, target_config = settings.restore_target()
  distiller = distillation_lib.Distiller(settings, drafter, target_config, eos_id, z_loss)
  as_arrays = lambda params: jax.tree.map(jnp.asarray, params)
  evaluate_fn = distiller.make_evaluate(lengths["targets"], seed) if examples is not None else None

  def evaluate_params(params):
    return evaluate_fn(params, target_params, examples.batches, examples.rows), ""

  network_config = _network_config(drafter)
  return Trainee(
      init_params=lambda rng: as_arrays(
          init_from_target(drafter, drafter.init_params(rng, shapes), target_params)
      ),
      restore_params=lambda path: as_arrays(
          checkpoints.restore_drafter_with_target(drafter, path, target_params)
      ),
      loss_fn=distiller.loss_fn,
      frozen=target_params,
      evaluate=evaluate_params if examples is not None else None,
      export=lambda directory, params: checkpoints.save_drafter_params(
          drafter, directory, params, overwrite=True
      ),
      shown="beta",
      summary={
          "model_config": (
              json.loads(checkpoints.config_to_json(network_config)) if network_config else None
          ),
          "drafter": type(drafter).__name__,
          "distillation": settings.as_dict(),
          "target_config": json.loads(checkpoints.config_to_json(target_config)),
      },
  )


# ----------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------
def checkpoint_manager(model_dir: str | os.PathLike, max_to_keep: int = 2) -> ocp.CheckpointManager:
  """An orbax CheckpointManager of TrainStates under `model_dir/checkpoints`."""
  directory = os.path.join(os.path.abspath(os.fspath(model_dir)), CHECKPOINTS_DIR)
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
  return ocp.CheckpointManager(directory, options=options)


def save_state(manager: ocp.CheckpointManager, state: TrainState) -> None:
  """Saves `state` as checkpoint `state.step` and waits for the write to finish."""
  manager.save(int(state.step), args=ocp.args.StandardSave(state), force=True)
  manager.wait_until_finished()


def restore_latest(manager: ocp.CheckpointManager, state: TrainState) -> TrainState:
  """The latest checkpoint of `manager` restored into `state`'s structure, or `state` if none."""
  step = manager.latest_step()
  if step is None:
    return state
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  try:
    return manager.restore(step, args=ocp.args.StandardRestore(abstract))
  except ValueError as e:
    raise gin_utils.ConfigError(
        f"the checkpoint of step {step} in {manager.directory} does not fit this run's model "
        f"and optimizer ({str(e).splitlines()[0][:300]}): resume it with the settings it was "
        "written with (its config.gin), or give this run a new model_dir."
    ) from e


def checkpoint_steps(model_dir: str | os.PathLike) -> list[int]:
  """The steps of the complete checkpoints under `model_dir/checkpoints` (orbax names each
  after its step; one being written has a temporary name), read without orbax and without
  creating anything."""
  directory = os.path.join(os.fspath(model_dir), CHECKPOINTS_DIR)
  if not os.path.isdir(directory):
    return []
  return sorted(
      int(name)
      for name in os.listdir(directory)
      if name.isdigit() and os.path.isdir(os.path.join(directory, name))
  )


def _model_differences(recorded: Mapping, this_run: Mapping) -> list[str]:
  """What makes the model recorded in a train_summary.json (its "model_config" and "drafter")
  another model than this run's (the same entries): '<field> <recorded> vs <this run's>' for the
  drafter's class and for every T5Config field, where the parameter shapes differ."""
  differences = []
  if recorded.get("drafter") != this_run.get("drafter"):
    differences.append(f"drafter {recorded.get('drafter')} vs {this_run.get('drafter')}")
  old, new = recorded.get("model_config"), this_run.get("model_config")
  if (old is None) != (new is None):
    differences.append(f"model_config {old} vs {new}")
  elif old is not None:
    try:
      old_shapes = network.param_shapes(checkpoints.config_from_json(json.dumps(old)))
    except ValueError as e:
      return [f"model_config {old} (which no longer reads: {e}) vs {new}"]
    if old_shapes != network.param_shapes(checkpoints.config_from_json(json.dumps(new))):
      differences += [
          f"{field} {old.get(field)!r} vs {new.get(field)!r}"
          for field in sorted(set(old) | set(new))
          if old.get(field) != new.get(field)
      ]
  return differences


def check_resume(model_dir: str, num_steps: int, this_run: Mapping) -> tuple[int, dict]:
  """Before anything is written: the run that `model_dir` holds, if any, is one this run may
  resume -> (the step of its latest checkpoint, 0 for none; its train_summary.json).

  this_run: the entries of this run's summary that name its model ("model_config", "drafter").
  Raises gin_utils.ConfigError naming both values when num_steps is below the checkpoint's step,
  when the recorded model is another one (`_model_differences`), and when the checkpoints have
  no summary to say what they are."""
  steps = checkpoint_steps(model_dir)
  if not steps:
    return 0, {}
  step = steps[-1]
  if not os.path.exists(os.path.join(model_dir, SUMMARY_FILE)):
    raise gin_utils.ConfigError(
        f"model_dir {model_dir} holds checkpoints (the latest of step {step}) but no "
        f"{SUMMARY_FILE} saying which model they are of: give this run a new model_dir, or "
        f"remove {os.path.join(model_dir, CHECKPOINTS_DIR)} to start over there."
    )
  recorded = _read_summary(model_dir)
  if num_steps < step:
    raise gin_utils.ConfigError(
        f"training.train.num_steps (NUM_STEPS) = {num_steps} is below step {step}, the latest "
        f"checkpoint in {model_dir}, which a rerun resumes from: give NUM_STEPS >= {step} to "
        f"resume that run (NUM_STEPS = {step}: it is complete), or a new model_dir for a run "
        f"of {num_steps} steps."
    )
  differences = _model_differences(recorded, this_run)
  if differences:
    raise gin_utils.ConfigError(
        f"model_dir {model_dir} holds a run of another model (step {step}): "
        f"{'; '.join(differences)} (recorded in its {SUMMARY_FILE} vs this run's): resume it "
        "with its own settings (its config.gin), or give this run a new model_dir."
    )
  return step, recorded


# ----------------------------------------------------------------------------------------------
# The training loop
# ----------------------------------------------------------------------------------------------
def _mean_metrics(metrics: Sequence[dict]) -> dict:
  """Token-weighted means of the per-token metrics, plain means of the rest, over several steps'
  metrics."""
  metrics = jax.device_get(list(metrics))
  tokens = np.array([m["tokens"] for m in metrics], np.float64)
  mean = {}
  for key in metrics[0]:
    values = np.array([m[key] for m in metrics], np.float64)
    weighted = key in TOKEN_WEIGHTED_METRICS
    mean[key] = float(np.sum(values * tokens) / np.sum(tokens) if weighted else np.mean(values))
  return mean


def _read_summary(model_dir: str) -> dict:
  path = os.path.join(model_dir, SUMMARY_FILE)
  if not os.path.exists(path):
    return {}
  try:
    with open(path) as f:
      summary = json.load(f)
  except (OSError, ValueError) as e:
    raise gin_utils.ConfigError(
        f"{path} cannot be read ({e}): it records the run in model_dir; give this run a new "
        "model_dir."
    ) from e
  if not isinstance(summary, dict):
    raise gin_utils.ConfigError(
        f"{path} holds a JSON {type(summary).__name__}, not a run's summary: give this run a "
        "new model_dir."
    )
  return summary


def _distillation_settings(
    distillation: distillation_lib.Distillation | None,
    distill_from: str | None,
    distill_temperature: float,
) -> distillation_lib.Distillation | None:
  """The run's `Distillation`: `distillation`, or the `distill_from` shorthand (cross-entropy on
  the target's decodes at `distill_temperature`), or None."""
  if distillation is not None and not isinstance(distillation, distillation_lib.Distillation):
    raise gin_utils.ConfigError(
        f"training.train.distillation must be a distillation.Distillation (in gin, "
        f"@distillation.Distillation()), got {distillation!r}."
    )
  if distill_from is not None and (
      not isinstance(distill_from, (str, os.PathLike)) or not os.fspath(distill_from)
  ):
    raise gin_utils.ConfigError(
        f"training.train.distill_from must be a checkpoints.save_model directory's path or "
        f"None, got {distill_from!r}."
    )
  if distill_from is None:
    if distill_temperature != 0.0:
      raise gin_utils.ConfigError(
          f"distill_temperature = {distill_temperature} without distill_from: it is the "
          "temperature of distill_from's target; set distill_from, or for a Distillation set "
          "its data_temperature."
      )
    return distillation
  if distillation is not None:
    raise gin_utils.ConfigError(
        "both distill_from and distillation are set: distill_from is the shorthand for "
        "Distillation(target_dir, divergence='cross_entropy', data='target'); keep one."
    )
  return distillation_lib.Distillation(
      os.fspath(distill_from),
      divergence="cross_entropy",
      data="target",
      data_temperature=distill_temperature,
  )


def _check_reference_training(
    model_config: network.T5Config | None,
    drafter: drafters.Drafter | None,
    vocabulary: seqio.Vocabulary,
) -> None:
  """Training on references needs a model_config that fits the vocabulary, and no drafter."""
  if drafter is not None:
    raise gin_utils.ConfigError(
        "training.train.drafter is trained by distillation only: set training.train.distillation "
        "(data='references', divergence='cross_entropy' trains it on the references), or "
        "unset the drafter and give model_config."
    )
  if model_config is None:
    raise gin_utils.ConfigError(
        "training.train needs model_config (MODEL_CONFIG in configs/runs/train.gin): the T5 1.1 "
        "architecture to train."
    )
  if not isinstance(model_config, network.T5Config):
    raise gin_utils.ConfigError(
        f"training.train.model_config must be a network.T5Config (MODEL_CONFIG = %T5_1_1_TINY "
        f"after including configs/models/t5_1_1_tiny.gin), got {model_config!r}."
    )
  if model_config.vocab_size < vocabulary.vocab_size:
    raise gin_utils.ConfigError(
        f"model vocab_size {model_config.vocab_size} < the task vocabulary's "
        f"{vocabulary.vocab_size} pieces: set the config's vocab_size to at least "
        f"{vocabulary.vocab_size}."
    )


def _checked_drafter(
    settings: distillation_lib.Distillation,
    drafter: drafters.Drafter | None,
    model_config: network.T5Config | None,
    pack: bool,
    label_smoothing: float,
    vocabulary: seqio.Vocabulary,
    lengths: Mapping[str, int],
) -> tuple[drafters.Drafter, int]:
  """The drafter a distillation trains (`drafter`, or the T5Drafter of `model_config`) and the
  EOS id, checked with the run's settings (`distillation.checked_drafter`) before anything is
  built."""
  if pack:
    raise gin_utils.ConfigError(
        "distillation needs unpacked batches (the target decodes one input per row): set "
        "training.train.pack = False."
    )
  if label_smoothing:
    raise gin_utils.ConfigError(
        f"label_smoothing = {label_smoothing} does not apply to distillation (the target gives "
        "the soft labels): set training.train.label_smoothing = 0."
    )
  if drafter is None and model_config is None:
    raise gin_utils.ConfigError(
        "distillation needs a drafter: set training.train.drafter, or model_config for a "
        "T5Drafter of that architecture."
    )
  if drafter is not None and model_config is not None and _network_config(drafter) != model_config:
    raise gin_utils.ConfigError(
        f"training.train has both a drafter ({type(drafter).__name__}) and a model_config it does "
        "not run: give the drafter's architecture once (MODEL_CONFIG = None with a drafter, or "
        "no drafter for drafters.T5Drafter(model_config))."
    )
  return distillation_lib.checked_drafter(
      settings,
      drafter or drafters.T5Drafter(model_config),
      vocabulary.vocab_size,
      vocabulary.eos_id,
      _feature_shapes(lengths),
  )


# The integer settings of `train`: (the least value, what it means).
_INTEGER_SETTINGS = {
    "batch_size": (1, "training rows per step"),
    "num_steps": (1, "the step training ends at"),
    "eval_period": (0, "steps between evaluations; 0: never"),
    "eval_batch_size": (1, "rows per evaluation batch"),
    "checkpoint_period": (1, "steps between checkpoints"),
    "keep_checkpoints": (1, "checkpoints kept"),
    "log_period": (1, "steps between log lines"),
    "seed": (0, "the data order and the initialization"),
    "eval_examples": (1, "examples evaluated on; None: the whole split"),
}


def _check_run_settings(
    model_dir: str | os.PathLike,
    task_feature_lengths: Any,
    integers: Mapping[str, Any],
    switches: Mapping[str, Any],
    init_from: str | os.PathLike | None,
    numbers: Mapping[str, tuple[Any, float | None, str]] | None = None,
) -> str:
  """The run's plain settings, checked before anything is read, built or written -> model_dir as
  an absolute path. Raises gin_utils.ConfigError naming the setting and what to give."""
  if not isinstance(model_dir, (str, os.PathLike)) or not os.fspath(model_dir):
    raise gin_utils.ConfigError(f"model_dir must be a directory's path, got {model_dir!r}.")
  run_dir.check_writable(model_dir, "model_dir")
  model_dir = os.path.abspath(os.fspath(model_dir))
  try:
    validation.check_feature_lengths(
        task_feature_lengths, "training.train.task_feature_lengths", ["inputs", "targets"]
    )
    for name, value in integers.items():
      if name == "eval_examples" and value is None:
        continue
      minimum, meaning = _INTEGER_SETTINGS[name]
      validation.check_integer(value, f"training.train.{name}", minimum, meaning=meaning)
    for name, value in switches.items():
      validation.check_boolean(value, f"training.train.{name}")
    for name, (value, maximum, meaning) in (numbers or {}).items():
      validation.check_number(value, f"training.train.{name}", 0, maximum, meaning=meaning)
  except validation.InvalidInputError as e:
    raise gin_utils.ConfigError(str(e)) from e
  if init_from is not None:
    if not isinstance(init_from, (str, os.PathLike)) or not os.fspath(init_from):
      raise gin_utils.ConfigError(
          f"training.train.init_from must be a checkpoint directory's path or None, got "
          f"{init_from!r}."
      )
    path = gin_utils.resolve_path(init_from)
    if "://" not in path and not os.path.exists(path):
      raise gin_utils.ConfigError(
          f"training.train.init_from {os.fspath(init_from)!r} does not exist: give a checkpoint "
          "directory the trainee restores (a model's save_model directory, a drafter's "
          "save_drafter_params directory), or None to start from fresh parameters."
      )
  return model_dir


def _checked_task(name: Any, eval_split: str | None) -> seqio.Task | seqio.Mixture:
  """The task (or mixture) `name` (tasks.get_task), with `eval_split` if one is evaluated."""
  try:
    task = tasks.get_task(name)
  except ValueError as e:
    raise gin_utils.ConfigError(f"training.train.mixture_or_task_name: {e}") from e
  if eval_split is not None:
    try:
      tasks.check_split(task, eval_split, "training.train.eval_split")
    except ValueError as e:
      raise gin_utils.ConfigError(f"{e} Or set eval_period = 0 to train without evaluating.") from e
  return task


@gin.configurable(module="training", denylist=["model_dir", "on_checked", "gin_config"])
def train(
    model_dir: str | os.PathLike,
    model_config: network.T5Config | None = None,
    mixture_or_task_name: str = gin.REQUIRED,
    task_feature_lengths: Mapping[str, int] = gin.REQUIRED,
    batch_size: int = 32,
    num_steps: int = 1000,
    pack: bool = True,
    z_loss: float = 1e-4,
    label_smoothing: float = 0.0,
    eval_period: int = 500,
    eval_split: str = "validation",
    eval_examples: int | None = 256,
    eval_batch_size: int = 64,
    checkpoint_period: int = 500,
    keep_checkpoints: int = 2,
    log_period: int = 10,
    seed: int = 0,
    drafter: drafters.Drafter | None = None,
    distillation: distillation_lib.Distillation | None = None,
    distill_from: str | os.PathLike | None = None,
    distill_temperature: float = 0.0,
    init_from: str | os.PathLike | None = None,
    eval_before_training: bool = False,
    progress: bool = True,
    on_checked: Callable[[], None] | None = None,
    gin_config: str | None = None,
) -> dict:
  """Trains on the task's train split up to `num_steps`; returns the summary.

  Without `distillation`, trains the T5 1.1 `model_config` on the task's references. With it
  (a `distillation.Distillation`), trains `drafter` (default `drafters.T5Drafter(model_config)`;
  give one of the two) against that frozen target: the step minimizes the distillation loss,
  evaluation reports Table 3's alpha at T = 0 and 1 with the loss, and the export is the
  drafter's `checkpoints.save_drafter_params`. `distill_from` (a `save_model` directory) is the shorthand for
  `Distillation(distill_from, divergence='cross_entropy', data='target',
  data_temperature=distill_temperature)`: sequence-level distillation on the target's decodes.
  Distillation needs `pack=False` (one input per row) and no label smoothing; `z_loss` applies to
  the drafter's logits.

  Resumes from the latest checkpoint in `model_dir` if there is one; otherwise starts from
  `init_from` (a checkpoint directory the trainee's `restore_params` reads, e.g. a drafter
  trained on references) if given, else from fresh parameters. Writes checkpoints every
  `checkpoint_period` steps and at the end, evaluates every `eval_period` steps and at the end
  (0: never; with `eval_before_training` also at step 0 of a fresh run, as T5X's
  run_eval_before_training: the baseline a run improves on), exports the final parameters to
  `model_dir/model` and writes `model_dir/train_summary.json` (config, distillation settings,
  steps, wall time, losses, eval metrics) with every checkpoint and at the end, so a run that is
  stopped keeps its history up to its last checkpoint. Settings are checked before anything is built
  or written (gin_utils.ConfigError), and so is the run `model_dir` holds (`check_resume`: a
  num_steps below its checkpoint's step, another model); then `on_checked()` is called, if
  given, before any work (scripts/train.py checks the unused gin bindings there). A rerun of a
  complete run (num_steps its step) writes nothing and returns its summary, with
  "already_complete": True.

  gin_config: the run's gin configuration, written to `model_dir/config.gin` with each summary
  (without it, an earlier run's config.gin goes with the first summary: it would not describe
  this run). A resumed run's first checkpoint also removes the earlier export (model/), which
  would describe an older step; the export of this run comes at its end.
  The summary, config.gin and the export are written under temporary names and renamed into
  place together (`run_dir.OutputDir`), each checkpoint and its summary with SIGINT held back, so
  an interrupted run leaves them describing one run at one checkpoint.
  """
  model_dir = _check_run_settings(
      model_dir,
      task_feature_lengths,
      dict(
          batch_size=batch_size,
          num_steps=num_steps,
          eval_period=eval_period,
          eval_batch_size=eval_batch_size,
          checkpoint_period=checkpoint_period,
          keep_checkpoints=keep_checkpoints,
          log_period=log_period,
          seed=seed,
          eval_examples=eval_examples,
      ),
      dict(pack=pack, eval_before_training=eval_before_training, progress=progress),
      init_from,
      dict(
          z_loss=(z_loss, None, "the weight of the log-partition penalty"),
          label_smoothing=(label_smoothing, 0.99, "the probability spread over the vocabulary"),
      ),
  )
  lengths = dict(task_feature_lengths)
  task = _checked_task(mixture_or_task_name, eval_split if eval_period else None)
  vocabulary = task.output_features["targets"].vocabulary
  settings = _distillation_settings(distillation, distill_from, distill_temperature)
  if settings is None:
    _check_reference_training(model_config, drafter, vocabulary)
  else:
    drafter, eos_id = _checked_drafter(
        settings, drafter, model_config, pack, label_smoothing, vocabulary, lengths
    )
  optimizer = make_optimizer(num_steps)  # its settings are checked here too
  if settings is None:
    this_model = {"model_config": json.loads(checkpoints.config_to_json(model_config))}
  else:
    network_config = _network_config(drafter)
    this_model = {
        "model_config": (
            json.loads(checkpoints.config_to_json(network_config)) if network_config else None
        ),
        "drafter": type(drafter).__name__,
    }
  start, summary = check_resume(model_dir, num_steps, this_model)
  outputs = run_dir.OutputDir(model_dir, OUTPUTS, "model_dir")
  if on_checked is not None:
    on_checked()
  exported = os.path.isdir(os.path.join(model_dir, EXPORT_DIR))
  if start == num_steps and summary.get("steps") == num_steps and exported:
    logging.warning("%s: the run is complete at step %d; nothing to train.", model_dir, start)
    return {**summary, "already_complete": True}
  examples = (
      eval_set(mixture_or_task_name, eval_split, lengths, eval_batch_size, eval_examples)
      if eval_period
      else None
  )
  if settings is None:
    trainee = reference_trainee(
        model_config, vocabulary, lengths, examples, z_loss, label_smoothing
    )
  else:
    trainee = distillation_trainee(settings, drafter, eos_id, lengths, examples, z_loss, seed)

  params = trainee.init_params(jax.random.PRNGKey(seed))
  if init_from is not None and not start:
    params = trainee.restore_params(gin_utils.resolve_path(init_from))
  manager = checkpoint_manager(model_dir, keep_checkpoints)
  state = restore_latest(manager, init_state(params, optimizer))
  start = int(state.step)
  summary = summary if start else {}
  # The summary is written with every checkpoint: entries past the restored step are from steps
  # this run repeats.
  history = [entry for entry in summary.get("history", []) if entry["step"] <= start]
  step_fn = make_train_step(trainee.loss_fn, optimizer)
  batches = train_batches(mixture_or_task_name, lengths, batch_size, seed, pack, start)
  rng = jax.random.PRNGKey(seed + 1)
  pending, last_train, last_eval = [], summary.get("train", {}), summary.get("eval", {})
  seconds = summary.get("train_seconds", 0.0)
  bar = tqdm.tqdm(
      total=num_steps,
      initial=start,
      disable=not progress,
      dynamic_ncols=True,
      mininterval=5.0,
      desc=os.path.basename(model_dir),
  )

  def write_summary(params: Any, step: int, seconds: float, export: bool = False) -> dict:
    summary = {
        **trainee.summary,
        "parameters": int(sum(np.size(x) for x in jax.tree.leaves(params))),
        "task": mixture_or_task_name,
        "task_feature_lengths": lengths,
        "batch_size": batch_size,
        "pack": pack,
        "init_from": None if init_from is None else os.fspath(init_from),
        "steps": step,
        "train_seconds": seconds,
        "train": last_train,
        "eval": last_eval,
        "history": history,
    }
    with outputs:
      if export:
        trainee.export(os.fspath(outputs.stage_dir(EXPORT_DIR)), jax.device_get(params))
      outputs.stage_text(SUMMARY_FILE, json.dumps(summary, indent=1))
      if gin_config is not None:
        outputs.stage_text(CONFIG_FILE, gin_config)
      outputs.commit()
    return summary

  def run_eval(step: int, params: Any) -> dict:
    metrics, note = trainee.evaluate(params)
    history.append({"step": step, **metrics})
    bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()) + note)
    return metrics

  started = time.perf_counter()
  if eval_before_training and trainee.evaluate is not None and start == 0:
    last_eval = run_eval(0, state.params)
  for step in range(start + 1, num_steps + 1):
    state, metrics = step_fn(state, trainee.frozen, next(batches), rng)
    pending.append(metrics)
    bar.update(1)
    if step % log_period == 0 or step == num_steps:
      last_train = _mean_metrics(pending)
      pending = []
      history.append({"step": step, **{f"train_{k}": v for k, v in last_train.items()}})
      shown = trainee.shown
      bar.set_postfix({"loss": f"{last_train['loss']:.3f}", shown: f"{last_train[shown]:.3f}"})
    if trainee.evaluate is not None and (step % eval_period == 0 or step == num_steps):
      last_eval = run_eval(step, state.params)
    if step % checkpoint_period == 0 or step == num_steps:
      with run_dir.signals_held():  # the checkpoint and the summary that describes it
        save_state(manager, state)
        write_summary(state.params, step, seconds + time.perf_counter() - started)
  bar.close()
  summary = write_summary(
      state.params, int(state.step), seconds + time.perf_counter() - started, export=True
  )
  manager.close()
  return summary


def export_pair(
    pair_dir: str | os.PathLike,
    target_run: str | os.PathLike,
    drafter_run: str | os.PathLike,
    storage_dtype: str = "float32",
    overwrite: bool = False,
) -> None:
  """Writes the models two scripts/train.py runs exported (each run's `EXPORT_DIR`) as a
  pair into `pair_dir` (`pairs.save_pair`), then each run's `SUMMARY_FILE` into its
  member's subdirectory and the demo corpus's vocabulary beside them.

  The drafter run may hold a T5 drafter or any kind `checkpoints.read_drafter` reads (e.g. a
  shared-encoder drafter). The floating-point parameters are stored as `storage_dtype` ('float32',
  or 'bfloat16' at half the size); the configs keep their compute dtype, the one
  `pairs.PairConfig.from_pair_dir` restores them in. An existing pair is replaced only with
  `overwrite` (else `FileExistsError`).
  """
  pair_dir = pathlib.Path(pair_dir)
  target_params, target_config = checkpoints.restore_model(
      os.path.join(target_run, EXPORT_DIR), dtype=storage_dtype
  )
  drafter_dir = os.path.join(drafter_run, EXPORT_DIR)
  drafter = checkpoints.read_drafter(drafter_dir)
  drafter_params = checkpoints.restore_drafter_params(drafter, drafter_dir, dtype=storage_dtype)
  pairs.save_pair(
      pair_dir, target_params, target_config, drafter_params, drafter, overwrite=overwrite
  )
  for member, run in zip(pairs.MEMBERS, (target_run, drafter_run)):
    shutil.copy(os.path.join(run, SUMMARY_FILE), pair_dir / member)
  shutil.copy(demo_data.demo_data_dir() / demo_data.DEMO_VOCABULARY_FILE, pair_dir)

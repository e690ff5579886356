"""Training T5 1.1 models T5X-style: optimizer, train step, seqio input, BLEU eval, checkpoints.

`train` is what `scripts/train.py` runs (gin-configured, like T5X's `train_script.train`):

* input: a seqio task or mixture through `get_dataset` and `seqio.EncDecFeatureConverter` (packed
  or padded), shuffled with a fixed seed and repeated; resuming at step s skips s batches, so a
  resumed run sees the batches an uninterrupted one would have;
* loss: `models.EncoderDecoderModel.loss_fn` (cross-entropy plus z-loss, optional label smoothing);
* optimizer: optax Adafactor (T5X's default) or AdamW, with a linear warmup and a constant,
  cosine or inverse-square-root schedule, and global-norm clipping;
* evaluation every `eval_period` steps: teacher-forced loss and accuracy, and greedy decodes
  (`jit_predict`, temperature 0) scored with the task's metrics (BLEU for translation);
* checkpoints: `orbax.checkpoint.CheckpointManager` under `model_dir/checkpoints`, holding the
  step, the parameters and the optimizer state; a rerun with the same `model_dir` continues from
  the latest one. The final parameters are also exported with `checkpoints.save_model` to
  `model_dir/model`, the format `checkpoints.restore_model` and `save_pair` use.

Distillation (`distill_from`): the targets of every training batch are replaced by a teacher's
own decodes of its inputs (greedy, or sampled at `distill_temperature`), so a drafter learns the
distribution it will be verified against, which raises alpha.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import seqio
import tqdm

from speculative_t5x import checkpoints
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import tasks

Batch = Mapping[str, np.ndarray]
OPTIMIZERS = ("adafactor", "adamw")
SCHEDULES = ("constant", "cosine", "rsqrt")
CHECKPOINTS_DIR = "checkpoints"
EXPORT_DIR = "model"
SUMMARY_FILE = "train_summary.json"
SHUFFLE_BUFFER = 10_000
# Cosine decay ends at this fraction of the peak learning rate.
COSINE_FINAL_FRACTION = 0.1


@flax.struct.dataclass
class TrainState:
  """What a checkpoint holds: the number of steps taken, the parameters, the optimizer state."""

  step: jax.Array
  params: Any
  opt_state: Any


# ----------------------------------------------------------------------------------------------
# Optimizer
# ----------------------------------------------------------------------------------------------
@gin.configurable(denylist=["num_steps"])
def make_optimizer(
    num_steps: int,
    name: str = "adafactor",
    learning_rate: float = 1e-2,
    warmup_steps: int = 0,
    schedule: str = "rsqrt",
    weight_decay: float = 0.0,
    clip_norm: float | None = 1.0,
) -> optax.GradientTransformation:
  """An optax optimizer with a warmup and a decay schedule.

  name: 'adafactor' (optax's, factored second moments, updates scaled by the parameter RMS, as in
    T5X) or 'adamw'.
  learning_rate: the peak, reached after `warmup_steps` linear steps.
  schedule: after warmup, 'constant'; 'cosine' down to COSINE_FINAL_FRACTION of the peak at
    `num_steps`; or 'rsqrt' (T5X's rsqrt_decay): peak * sqrt(warmup / step).
  clip_norm: global gradient-norm clipping (None: off).
  """
  if name not in OPTIMIZERS:
    raise ValueError(f"unknown optimizer {name!r}: use one of {OPTIMIZERS}.")
  if schedule not in SCHEDULES:
    raise ValueError(f"unknown learning-rate schedule {schedule!r}: use one of {SCHEDULES}.")
  if learning_rate <= 0 or warmup_steps < 0 or num_steps < 1:
    raise ValueError(
        f"need learning_rate > 0, warmup_steps >= 0 and num_steps >= 1, got "
        f"{learning_rate}, {warmup_steps}, {num_steps}."
    )

  def rate(step):
    step = jnp.asarray(step, jnp.float32)
    warmup = jnp.minimum(1.0, (step + 1) / max(warmup_steps, 1))
    if schedule == "constant":
      decay = 1.0
    elif schedule == "cosine":
      progress = jnp.clip((step - warmup_steps) / max(num_steps - warmup_steps, 1), 0.0, 1.0)
      cosine = 0.5 * (1 + jnp.cos(jnp.pi * progress))
      decay = COSINE_FINAL_FRACTION + (1 - COSINE_FINAL_FRACTION) * cosine
    else:
      decay = jnp.sqrt(max(warmup_steps, 1) / jnp.maximum(step + 1, max(warmup_steps, 1)))
    return learning_rate * warmup * decay

  if name == "adafactor":
    update = optax.adafactor(rate, weight_decay_rate=weight_decay or None)
  else:
    update = optax.adamw(rate, b1=0.9, b2=0.98, weight_decay=weight_decay)
  return update if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), update)


def init_state(
    model: models.EncoderDecoderModel,
    optimizer: optax.GradientTransformation,
    rng: jax.Array,
    feature_lengths: Mapping[str, int],
) -> TrainState:
  """Fresh parameters (`model.get_initial_variables`) and optimizer state at step 0."""
  shapes = {
      "encoder_input_tokens": (1, feature_lengths["inputs"]),
      "decoder_input_tokens": (1, feature_lengths["targets"]),
  }
  params = model.get_initial_variables(rng, shapes)["params"]
  return TrainState(step=jnp.asarray(0, jnp.int32), params=params, opt_state=optimizer.init(params))


def make_train_step(
    model: models.EncoderDecoderModel, optimizer: optax.GradientTransformation
) -> Callable[[TrainState, Batch, jax.Array], tuple[TrainState, dict]]:
  """A jitted `step(state, batch, dropout_rng) -> (state, metrics)`: one optimizer update on
  `model.loss_fn` (its metrics: loss, z_loss, accuracy, tokens) plus the gradient norm."""

  def step(state: TrainState, batch: Batch, dropout_rng: jax.Array):
    rng = jax.random.fold_in(dropout_rng, state.step)
    grad_fn = jax.value_and_grad(model.loss_fn, has_aux=True)
    (_, metrics), grads = grad_fn(state.params, batch, rng)
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
# Distillation
# ----------------------------------------------------------------------------------------------
def make_teacher_targets(
    teacher_dir: str | os.PathLike, vocabulary: seqio.Vocabulary, temperature: float, seed: int
) -> Callable[[dict, int], dict]:
  """`relabel(batch, step) -> batch` whose targets are the teacher's decodes of its inputs.

  `teacher_dir` is a `checkpoints.save_model` directory (e.g. a trained target's
  `model_dir/model`). The batch must be unpacked (a teacher decodes one input per row).
  """
  params, config = checkpoints.restore_model(teacher_dir)
  teacher = models.EncoderDecoderModel(network.Transformer(config), vocabulary, vocabulary)
  predict_fn = teacher.jit_predict()

  @jax.jit
  def to_batch(decodes: jax.Array) -> dict:
    inputs = jnp.pad(decodes, ((0, 0), (1, 0)))[:, :-1]
    return {
        "decoder_target_tokens": decodes,
        "decoder_input_tokens": inputs,
        "decoder_loss_weights": (decodes > 0).astype(jnp.int32),
    }

  def relabel(batch: dict, step: int) -> dict:
    if "encoder_segment_ids" in batch:
      raise ValueError("distillation needs unpacked batches: set training.train.pack = False.")
    rng = jax.random.fold_in(jax.random.PRNGKey(seed), step)
    decodes, _ = predict_fn(params, batch, rng, temperature)
    return dict(batch, **to_batch(decodes))

  return relabel


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
  return manager.restore(step, args=ocp.args.StandardRestore(abstract))


# ----------------------------------------------------------------------------------------------
# The training loop
# ----------------------------------------------------------------------------------------------
def _mean_metrics(metrics: Sequence[dict]) -> dict:
  """Token-weighted loss and accuracy, plain means of the rest, over several steps' metrics."""
  metrics = jax.device_get(list(metrics))
  tokens = np.array([m["tokens"] for m in metrics], np.float64)
  mean = {}
  for key in metrics[0]:
    values = np.array([m[key] for m in metrics], np.float64)
    weighted = key in ("loss", "z_loss", "accuracy")
    mean[key] = float(np.sum(values * tokens) / np.sum(tokens) if weighted else np.mean(values))
  return mean


def _read_summary(model_dir: str) -> dict:
  path = os.path.join(model_dir, SUMMARY_FILE)
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


@gin.configurable(denylist=["model_dir"])
def train(
    model_dir: str | os.PathLike,
    model_config: network.T5Config = gin.REQUIRED,
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
    distill_from: str | None = None,
    distill_temperature: float = 0.0,
    progress: bool = True,
) -> dict:
  """Trains `model_config` on the task's train split up to `num_steps`; returns the summary.

  Resumes from the latest checkpoint in `model_dir` if there is one. Writes checkpoints every
  `checkpoint_period` steps and at the end, evaluates every `eval_period` steps and at the end
  (0: never), exports the final parameters to `model_dir/model` (`checkpoints.save_model`) and
  writes `model_dir/train_summary.json` (config, steps, wall time, losses, eval metrics).
  `distill_from`: a `save_model` directory of a teacher whose decodes (at
  `distill_temperature`) replace the training targets; needs `pack=False`.
  """
  model_dir = os.path.abspath(os.fspath(model_dir))
  lengths = dict(task_feature_lengths)
  task = tasks.get_task(mixture_or_task_name)
  vocabulary = task.output_features["targets"].vocabulary
  if model_config.vocab_size < vocabulary.vocab_size:
    raise ValueError(
        f"model vocab_size {model_config.vocab_size} < the task vocabulary's "
        f"{vocabulary.vocab_size} pieces: set the config's vocab_size to at least "
        f"{vocabulary.vocab_size}."
    )
  if distill_from and pack:
    raise ValueError(
        "distill_from needs unpacked batches (the teacher decodes one input per "
        "row): set training.train.pack = False."
    )
  model = models.EncoderDecoderModel(
      network.Transformer(model_config),
      vocabulary,
      vocabulary,
      z_loss=z_loss,
      label_smoothing=label_smoothing,
  )
  optimizer = make_optimizer(num_steps)
  manager = checkpoint_manager(model_dir, keep_checkpoints)
  state = restore_latest(manager, init_state(model, optimizer, jax.random.PRNGKey(seed), lengths))
  start = int(state.step)
  summary = _read_summary(model_dir) if start else {}
  history = summary.get("history", [])
  step_fn = make_train_step(model, optimizer)
  batches = train_batches(mixture_or_task_name, lengths, batch_size, seed, pack, start)
  relabel = (
      make_teacher_targets(distill_from, vocabulary, distill_temperature, seed)
      if distill_from
      else None
  )
  examples = (
      eval_set(mixture_or_task_name, eval_split, lengths, eval_batch_size, eval_examples)
      if eval_period
      else None
  )
  predict_fn = model.jit_predict()
  dropout_rng = jax.random.PRNGKey(seed + 1)
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
  started = time.perf_counter()
  for step in range(start + 1, num_steps + 1):
    batch = next(batches)
    if relabel is not None:
      batch = relabel(batch, step)
    state, metrics = step_fn(state, batch, dropout_rng)
    pending.append(metrics)
    bar.update(1)
    if step % log_period == 0 or step == num_steps:
      last_train = _mean_metrics(pending)
      pending = []
      history.append({"step": step, **{f"train_{k}": v for k, v in last_train.items()}})
      bar.set_postfix(loss=f"{last_train['loss']:.3f}", acc=f"{last_train['accuracy']:.3f}")
    if step % checkpoint_period == 0 or step == num_steps:
      save_state(manager, state)
    if examples is not None and (step % eval_period == 0 or step == num_steps):
      last_eval, predictions = evaluate(model, state.params, examples, predict_fn)
      history.append({"step": step, **last_eval})
      bar.write(
          f"step {step}: "
          + ", ".join(f"{k} {v:.4g}" for k, v in last_eval.items())
          + f" | e.g. {predictions[0]!r} (reference {examples.references[0]!r})"
      )
  bar.close()
  seconds += time.perf_counter() - started
  checkpoints.save_model(
      os.path.join(model_dir, EXPORT_DIR),
      jax.device_get(state.params),
      model_config,
      overwrite=True,
  )
  summary = {
      "model_config": json.loads(checkpoints.config_to_json(model_config)),
      "parameters": int(sum(np.size(x) for x in jax.tree.leaves(state.params))),
      "task": mixture_or_task_name,
      "task_feature_lengths": lengths,
      "batch_size": batch_size,
      "pack": pack,
      "steps": int(state.step),
      "train_seconds": seconds,
      "train": last_train,
      "eval": last_eval,
      "distill_from": distill_from,
      "history": history,
  }
  with open(os.path.join(model_dir, SUMMARY_FILE), "w") as f:
    json.dump(summary, f, indent=1)
  manager.close()
  return summary

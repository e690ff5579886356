r"""The paper's Table 2 harness: batch-1 wall time of the baseline and of speculative decoding.

For a target, its drafters, an input source and every (temperature, gamma), on identical inputs
with the same rng, it measures per example, all settings of one example timed side by side in the
same rounds (`benchmark.time_calls`):
  - the wall time of the baseline (`EncoderDecoderModel` + `decoding.temperature_sample`) and of
    speculative decoding (`SpeculativeEncoderDecoderModel`): compilation excluded, a warm-up call,
    the median (and IQR) of --repeats calls, each ended by `block_until_ready`;
  - the wall time of each one's prefill (`model.prefill`: encoders and caches, the work before
    the decoding loop);
  - alpha (mean beta) and tokens per target call, from the run's own statistics;
and per drafter and temperature, on compiled decode steps at the run's encoder and cache lengths,
timed between the examples (ceil(--cost_repeats / examples) rounds after each example's decodes,
so the costs and the decodes sample the same minutes of the machine):
  - c, the drafter's single-token step time over the target's;
  - the verification cost, the target on gamma + 1 tokens over the target on 1 token.
Each row reports the measured speedup (baseline time per decoded token over speculative time per
decoded token: sampled decodes differ in length), the loop speedup (the same with each call's
prefill taken off: the decoding loop, which Theorem 3.8 models), Theorem 3.8's prediction with the
measured alpha and c, the hardware-aware prediction that also uses the measured verification cost,
and the efficiency = loop speedup / hardware-aware prediction (also with the tokens per target
call the run realized in place of E[tokens](alpha): the loop's own cost, without the luck of the
acceptances drawn).

Configuration is gin (configs/runs/benchmark.gin and the files including it; paths relative to the
repository root or the working directory); the default is configs/runs/benchmark_tiny.gin, a tiny
random pair that runs in about a minute on 2 CPU cores. With random weights (no CHECKPOINT_PATH /
DRAFTER_CHECKPOINT_PATH) the drafters are 'independent' (its own random weights) and 'copy' (the
target's weights: alpha ~ 1, c = 1): their alpha checks the mechanics and says nothing about real
drafters.

Inputs: random token ids (--num_examples of them, lengths up to the 'inputs' feature length), or
the lines of --input_file tokenized with --sentencepiece_model.

Writes results.json and results.md into --output_dir.

Usage:
  python scripts/benchmark.py                                   # tiny random pair
  python scripts/benchmark.py --gin_file=configs/runs/benchmark_small.gin --output_dir=/tmp/small
  python scripts/benchmark.py --gin_file=configs/runs/benchmark_small.gin --gammas=4 \
    --temperatures=0 --gin.TASK_FEATURE_LENGTHS="{'inputs': 128, 'targets': 32}"
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import platform
import sys
from typing import Mapping, Sequence

from absl import app
from absl import flags
from absl import logging
import gin
import jax
import jax.numpy as jnp
import numpy as np
import seqio
import tqdm

from speculative_t5x import benchmark
from speculative_t5x import checkpoints
from speculative_t5x import decoding
from speculative_t5x import inference
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import tasks
from speculative_t5x import theory

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_GIN_FILE = "configs/runs/benchmark_tiny.gin"
RANDOM_TASK = "random"
EOS_ID = 1

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", None, f"Gin run files (default {DEFAULT_GIN_FILE}).")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings; --gin.NAME=value is a shorthand.")
flags.DEFINE_string("output_dir", "/tmp/speculative_t5x/benchmark",
                    "Directory for results.json and results.md (created if absent).")
flags.DEFINE_list("gammas", None, "Gammas, e.g. 1,2,4,7 (default: BenchmarkSetup.gammas).")
flags.DEFINE_list("temperatures", None,
                  "Temperatures, e.g. 0,1 (default: BenchmarkSetup.temperatures).")
flags.DEFINE_integer("num_examples", 2, "Examples (batch 1 each); all lines of --input_file if 0.")
flags.DEFINE_integer("repeats", 3, "Timed decodes per example and setting.")
flags.DEFINE_integer("warmup", 1, "Untimed decodes after the compiling one.")
flags.DEFINE_integer("cost_repeats", benchmark.DEFAULT_REPEATS,
                     "Timed rounds per decode-step measurement (c and the verification cost), "
                     "spread over the examples (at least one round after each).")
flags.DEFINE_integer("steps_per_call", benchmark.DEFAULT_STEPS_PER_CALL,
                     "Decode steps per timed call when measuring c and the verification cost.")
flags.DEFINE_string("input_file", None, "Text file, one input per line (default: random tokens).")
flags.DEFINE_string("task", None, "seqio task whose split provides the inputs (e.g. demo_ende), "
                    "tokenized at TASK_FEATURE_LENGTHS with the task's vocabulary.")
flags.DEFINE_string("split", "test", "The --task split.")
flags.DEFINE_string("sentencepiece_model", None, "Sentencepiece model that tokenizes --input_file.")
flags.DEFINE_bool("costs_only", False, "Only time the decode steps (c and the verification cost, "
                  "per temperature) and write costs.json / costs.md: no decoding.")


@gin.configurable(module="benchmark_script")
@dataclasses.dataclass(frozen=True)
class BenchmarkSetup:
  """What configs/runs/benchmark*.gin choose.

  target_config, drafter_config: the two T5Configs (a 'copy' drafter uses the target's).
  checkpoint_path, drafter_checkpoint_path: checkpoints (`checkpoints.restore_params`); None means
    random weights (for the drafter: one row per kind in `random_drafters`).
  task_feature_lengths: {'inputs': Le, 'targets': decode length}.
  gammas, temperatures: the settings swept.
  random_drafters: kinds from `benchmark.RANDOM_DRAFTER_KINDS`.
  seed: weights, random inputs and decode rngs.
  """
  target_config: network.T5Config
  drafter_config: network.T5Config
  task_feature_lengths: Mapping[str, int]
  gammas: Sequence[int]
  temperatures: Sequence[float]
  checkpoint_path: str | None = None
  drafter_checkpoint_path: str | None = None
  random_drafters: Sequence[str] = benchmark.RANDOM_DRAFTER_KINDS
  seed: int = 0


def load_setup() -> BenchmarkSetup:
  gin.add_config_file_search_path(str(REPO_ROOT))
  gin.parse_config_files_and_bindings(FLAGS.gin_file or [DEFAULT_GIN_FILE], FLAGS.gin_bindings)
  setup = BenchmarkSetup()
  overrides = {}
  if FLAGS.gammas:
    overrides["gammas"] = tuple(int(g) for g in FLAGS.gammas)
  if FLAGS.temperatures:
    overrides["temperatures"] = tuple(float(t) for t in FLAGS.temperatures)
  setup = dataclasses.replace(setup, **overrides)
  for name in ("inputs", "targets"):
    if int(setup.task_feature_lengths.get(name, 0)) < 1:
      raise ValueError(f"TASK_FEATURE_LENGTHS {setup.task_feature_lengths} needs a positive "
                       f"'{name}' length.")
  if setup.target_config.vocab_size != setup.drafter_config.vocab_size:
    raise ValueError(f"drafter vocab_size {setup.drafter_config.vocab_size} != target "
                     f"vocab_size {setup.target_config.vocab_size}: speculative decoding needs one "
                     "vocabulary.")
  return setup


def load_models(setup: BenchmarkSetup) -> tuple[dict, dict[str, tuple[network.T5Config, dict]]]:
  """-> target params, {drafter label: (config, params)}."""
  if setup.checkpoint_path:
    target_params = checkpoints.restore_params(setup.target_config, setup.checkpoint_path)
  else:
    target_params = benchmark.random_params(setup.target_config, setup.seed)
  if setup.drafter_checkpoint_path:
    name = pathlib.PurePath(str(setup.drafter_checkpoint_path).rstrip("/")).name
    drafters = {name: (setup.drafter_config, checkpoints.restore_params(
        setup.drafter_config, setup.drafter_checkpoint_path))}
  else:
    if not setup.random_drafters:
      raise ValueError("no DRAFTER_CHECKPOINT_PATH and no random_drafters: nothing to benchmark.")
    labels = {"independent": "random, independent", "copy": "random, copy of target"}
    drafters = {labels.get(kind, kind): benchmark.random_drafter(
        kind, setup.target_config, target_params, setup.drafter_config, setup.seed + 1)
                for kind in setup.random_drafters}
  return target_params, drafters


def load_inputs(setup: BenchmarkSetup) -> tuple[str, seqio.Vocabulary, np.ndarray]:
  """-> task name, vocabulary, encoder inputs [num_examples, Le] int32 (EOS-ended, 0-padded)."""
  length = int(setup.task_feature_lengths["inputs"])
  vocab_size = setup.target_config.vocab_size
  if FLAGS.task:
    if FLAGS.input_file:
      raise ValueError("give --task or --input_file, not both.")
    task = tasks.get_task(FLAGS.task)
    vocabulary = task.output_features["targets"].vocabulary
    if vocabulary.vocab_size > vocab_size:
      raise ValueError(f"task {FLAGS.task} has {vocabulary.vocab_size} pieces but the models' "
                       f"vocab_size is {vocab_size}: use the models' vocabulary.")
    inputs = tasks.feature_arrays(task, FLAGS.split, "inputs", setup.task_feature_lengths,
                                  FLAGS.num_examples or None)
    return f"{FLAGS.task}:{FLAGS.split}", vocabulary, inputs
  if FLAGS.input_file:
    if not FLAGS.sentencepiece_model:
      raise ValueError("--input_file needs --sentencepiece_model to tokenize it.")
    vocabulary = seqio.SentencePieceVocabulary(FLAGS.sentencepiece_model)
    if vocabulary.vocab_size > vocab_size:
      raise ValueError(f"{FLAGS.sentencepiece_model} has {vocabulary.vocab_size} pieces but the "
                       f"models' vocab_size is {vocab_size}: use the models' vocabulary.")
    lines = [line.strip() for line in pathlib.Path(FLAGS.input_file).read_text().splitlines()]
    lines = [line for line in lines if line]
    if FLAGS.num_examples:
      lines = lines[:FLAGS.num_examples]
    if not lines:
      raise ValueError(f"{FLAGS.input_file} has no non-empty lines.")
    sequences = [list(vocabulary.encode(line)) + [vocabulary.eos_id] for line in lines]
    too_long = [i for i, sequence in enumerate(sequences) if len(sequence) > length]
    if too_long:
      raise ValueError(f"{len(too_long)} line(s) of {FLAGS.input_file} (first: line "
                       f"{too_long[0] + 1}, {len(sequences[too_long[0]])} tokens with EOS) exceed "
                       f"the 'inputs' length {length}: raise TASK_FEATURE_LENGTHS['inputs'] or "
                       "shorten the lines.")
    task = pathlib.Path(FLAGS.input_file).stem
  else:
    if FLAGS.num_examples < 1:
      raise ValueError("random inputs need --num_examples >= 1.")
    vocabulary = seqio.PassThroughVocabulary(vocab_size, eos_id=EOS_ID)
    rng = np.random.default_rng(setup.seed)
    tokens = np.asarray(benchmark.random_tokens(jax.random.PRNGKey(setup.seed), vocab_size,
                                                (FLAGS.num_examples, length)))
    lengths = rng.integers(max(1, length // 2), length + 1, FLAGS.num_examples)
    sequences = [list(row[:n - 1]) + [EOS_ID] for row, n in zip(tokens, lengths)]
    task = RANDOM_TASK
  inputs = np.zeros((len(sequences), length), np.int32)
  for i, sequence in enumerate(sequences):
    inputs[i, :len(sequence)] = sequence
  return task, vocabulary, inputs


def decoded_length(decodes: np.ndarray, eos_id: int) -> int:
  """decodes [1, L] -> tokens up to and including the first EOS (L if none)."""
  eos = np.flatnonzero(np.asarray(decodes)[0] == eos_id)
  return int(eos[0]) + 1 if eos.size else int(decodes.shape[-1])


def time_example(settings: Mapping, batch: dict, rng, temperature: float, eos_id: int) -> dict:
  """Times every setting's decode of one example, and its prefill (the encoders and caches, the
  part before the decoding loop), side by side (`benchmark.time_calls`).

  Args:
    settings: key -> (jitted predict fn, jitted prefill fn, params); 'baseline' is the T5X loop,
      the others speculative (their aux output holds the speculative stats).
  Returns:
    key -> {'timing', 'prefill', 'decodes', 'length'(, 'stats')}.
  """
  temperature = jnp.float32(temperature)
  calls = {}
  for key, (predict, prefill, params) in settings.items():
    calls["decode", key] = (predict, (params, batch, rng, temperature))
    calls["prefill", key] = (prefill, (params, batch))
  timings = benchmark.time_calls(calls, repeats=FLAGS.repeats, warmup=FLAGS.warmup)
  results = {}
  for key in settings:
    fn, args = calls["decode", key]
    decodes, aux = jax.device_get(fn(*args))
    results[key] = {"timing": timings["decode", key], "prefill": timings["prefill", key],
                    "decodes": decodes, "length": decoded_length(decodes, eos_id)}
    if key != "baseline":
      results[key]["stats"] = {k: np.sum(v) for k, v in aux["speculative_stats"].items()}
  return results


def per_token_ms(results: Sequence[dict], loop_only: bool = False) -> float:
  """Total time over total decoded tokens (EOS included) across examples, in ms; with loop_only,
  each example's prefill time (median) is taken off its decode time (median) first."""
  ms = sum(r["timing"].median_ms - (r["prefill"].median_ms if loop_only else 0.0)
           for r in results)
  return ms / sum(r["length"] for r in results)


def summarize_times(timings: Sequence[benchmark.Timing]) -> dict:
  """Per-example timings -> mean of the medians and mean IQR, in ms."""
  return {"mean_median_ms": float(np.mean([t.median_ms for t in timings])),
          "mean_iqr_ms": float(np.mean([t.iqr_ms for t in timings])),
          "per_example": [t.as_dict() for t in timings]}


def make_row(task, drafter, temperature, gamma, costs: benchmark.DecodeCosts, baseline, results):
  """One table row from the baseline's and the speculative run's per-example results."""
  stats = {name: sum(float(r["stats"][name]) for r in results) for name in decoding.STAT_NAMES}
  summary = decoding.stats_summary(stats)
  # beta is a float32 sum of minima; rounding can put it a hair above 1.
  alpha = min(summary["alpha"], 1.0)
  c, verify_cost = costs.c, costs.verify_cost(gamma)
  # Per token: sampled decodes of the two differ in length (the same law, different draws).
  speedup = per_token_ms(baseline) / per_token_ms(results)
  loop_speedup = per_token_ms(baseline, loop_only=True) / per_token_ms(results, loop_only=True)
  predicted_hw = theory.speedup_hardware_aware(alpha, gamma, c, verify_cost)
  # The same with the iteration's network work timed together (cache interference included).
  predicted_in_situ = theory.expected_tokens(alpha, gamma) / costs.iteration_cost(gamma)
  # predicted_hw with the tokens per target call this run realized instead of E[tokens](alpha):
  # over a few hundred tokens the acceptances drawn, and the drafts cut by EOS, move them apart.
  predicted_hw_realized = (predicted_hw * summary["tokens_per_target_call"]
                           / theory.expected_tokens(alpha, gamma))
  matches = [bool(np.array_equal(b["decodes"], r["decodes"])) for b, r in zip(baseline, results)]
  return {
      "task": task, "drafter": drafter, "temperature": temperature, "gamma": gamma,
      "alpha": alpha, "tokens_per_target_call": summary["tokens_per_target_call"],
      "acceptance_rate": summary["acceptance_rate"], "c": c, "verify_cost": verify_cost,
      "speedup": speedup, "loop_speedup": loop_speedup,
      "predicted": theory.speedup(alpha, gamma, c), "predicted_hw": predicted_hw,
      "efficiency": loop_speedup / predicted_hw,
      "predicted_hw_realized": predicted_hw_realized,
      "efficiency_realized": loop_speedup / predicted_hw_realized,
      "iteration_cost": costs.iteration_cost(gamma),
      "interference_ms": costs.interference_ms(gamma), "predicted_in_situ": predicted_in_situ,
      "efficiency_in_situ": loop_speedup / predicted_in_situ,
      "baseline_ms": summarize_times([b["timing"] for b in baseline]),
      "speculative_ms": summarize_times([r["timing"] for r in results]),
      "baseline_prefill_ms": summarize_times([b["prefill"] for b in baseline]),
      "speculative_prefill_ms": summarize_times([r["prefill"] for r in results]),
      "baseline_tokens": [b["length"] for b in baseline],
      "speculative_tokens": [r["length"] for r in results],
      # At temperature 0 the outputs must be identical; at other temperatures they differ in
      # general (the same distribution, sampled with different draws).
      "outputs_match_baseline": float(np.mean(matches)), "stats": summary,
  }


def markdown(rows: list[dict], costs_by_temperature: Mapping[float, Mapping[str,
                                                                        benchmark.DecodeCosts]],
             header: str) -> str:
  """results.md: Table 2's layout plus the timings and predictions, then the step costs."""
  columns = ["task", "drafter", "temp", "gamma", "alpha", "tokens/call", "c", "verify cost",
             "baseline ms (IQR)", "speculative ms (IQR)", "prefill ms (base / spec)", "speedup",
             "loop speedup", "predicted", "predicted_hw", "efficiency", "efficiency (realized)",
             "iteration cost", "efficiency in situ"]
  lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for r in rows:
    b, s = r["baseline_ms"], r["speculative_ms"]
    lines.append("| " + " | ".join([
        r["task"], r["drafter"], f"{r['temperature']:g}", str(r["gamma"]), f"{r['alpha']:.3f}",
        f"{r['tokens_per_target_call']:.2f}", f"{r['c']:.3f}", f"{r['verify_cost']:.2f}",
        f"{b['mean_median_ms']:.1f} ({b['mean_iqr_ms']:.1f})",
        f"{s['mean_median_ms']:.1f} ({s['mean_iqr_ms']:.1f})",
        f"{r['baseline_prefill_ms']['mean_median_ms']:.1f} / "
        f"{r['speculative_prefill_ms']['mean_median_ms']:.1f}", f"{r['speedup']:.2f}",
        f"{r['loop_speedup']:.2f}", f"{r['predicted']:.2f}", f"{r['predicted_hw']:.2f}",
        f"{r['efficiency']:.2f}", f"{r['efficiency_realized']:.2f}", f"{r['iteration_cost']:.2f}",
        f"{r['efficiency_in_situ']:.2f}"]) + " |")
  lines += ["", "speedup: baseline over speculative time per decoded token (whole calls); loop "
            "speedup: the same with each call's prefill (encoders and caches, timed alongside) "
            "taken off, the part Theorem 3.8 models; efficiency: loop speedup / predicted_hw; "
            "efficiency (realized): the same with the tokens per target call the run realized in "
            "place of E[tokens](alpha), the loop's cost alone. iteration cost: gamma drafter "
            "steps and the verification timed together in one loop, over the target's step (apart they cost gamma * c + verify cost); efficiency "
            "in situ: loop speedup / (expected tokens per iteration / iteration cost), the "
            "speculative loop's own overhead (acceptance, writes, bookkeeping) alone.",
            "", "Decode-step costs (marginal time per step incl. standardization and draw, median "
            "over the timed rounds):", ""] + costs_markdown(costs_by_temperature)
  return "\n".join(lines) + "\n"


def costs_markdown(costs_by_temperature) -> list[str]:
  """The step-cost table (per temperature and drafter) as Markdown lines."""
  lines = ["| temp | drafter | target step ms | drafter step ms | c | verify cost by gamma | "
           "iteration cost by gamma | interference ms by gamma |", "|---|---|---|---|---|---|---|---|"]
  for temperature, costs in costs_by_temperature.items():
    for name, cost in costs.items():
      by_gamma = lambda f, digits: ", ".join(  # noqa: E731
          f"{g}: {f(g):.{digits}f}" for g in sorted(cost.verify))
      lines.append(f"| {temperature:g} | {name} | {cost.target_step.median_ms:.3f} | "
                   f"{cost.drafter_step.median_ms:.3f} | {cost.c:.3f} | "
                   f"{by_gamma(cost.verify_cost, 2)} | {by_gamma(cost.iteration_cost, 2)} | "
                   f"{by_gamma(cost.interference_ms, 3)} |")
  return lines


def write_costs(costs_by_temperature, setup: BenchmarkSetup) -> None:
  """--costs_only: costs.json and costs.md in --output_dir."""
  output_dir = pathlib.Path(FLAGS.output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  target = setup.target_config
  header = (f"Target {target.emb_dim}d x {target.num_encoder_layers}+{target.num_decoder_layers} "
            f"layers ({target.dtype}), feature lengths {dict(setup.task_feature_lengths)}, "
            f"{jax.default_backend()}; steps include standardization and draw.")
  (output_dir / "costs.json").write_text(json.dumps(
      {"command": sys.argv, "target_config": dataclasses.asdict(target),
       "costs": {f"t={t:g}": {n: c.as_dict() for n, c in costs.items()}
                 for t, costs in costs_by_temperature.items()}}, indent=2))
  table = "\n".join([header, ""] + costs_markdown(costs_by_temperature)) + "\n"
  (output_dir / "costs.md").write_text(table)
  print(table)


def main(argv):
  del argv
  setup = load_setup()
  target_params, drafters = load_models(setup)
  task, vocabulary, inputs = load_inputs(setup)
  gammas, temperatures = sorted(set(setup.gammas)), list(setup.temperatures)
  decode_length = int(setup.task_feature_lengths["targets"])

  geometry = benchmark.DecodeGeometry.for_decoding(inputs.shape[1], decode_length, max(gammas) + 1,
                                                   FLAGS.steps_per_call)
  if FLAGS.costs_only:
    logging.info("Timing decode steps for c and the verification cost (%s).", geometry)
    # Steps timed as the loops run them (network, standardization, draw), per temperature.
    write_costs({t: benchmark.measure_costs(setup.target_config, target_params, drafters, gammas,
                                            geometry, temperature=t, repeats=FLAGS.cost_repeats)
                 for t in temperatures}, setup)
    return
  cost_steps = benchmark.cost_steps(setup.target_config, target_params, drafters, gammas)

  target = network.Transformer(setup.target_config)
  baseline_model = models.EncoderDecoderModel(target, vocabulary, vocabulary)
  batches = [{"encoder_input_tokens": jnp.asarray(row[None]),
              "decoder_input_tokens": jnp.zeros((1, decode_length), jnp.int32)} for row in inputs]
  rngs = [jax.random.fold_in(jax.random.PRNGKey(setup.seed), i) for i in range(len(batches))]
  # setting -> (jitted predict, jitted prefill, params); drafters of one shape share functions.
  settings = {"baseline": (baseline_model.jit_predict(), jax.jit(baseline_model.prefill),
                           target_params)}
  functions = {}
  for name, (drafter_config, drafter_params) in drafters.items():
    for gamma in gammas:
      if (drafter_config, gamma) not in functions:
        model = models.SpeculativeEncoderDecoderModel(target, network.Transformer(drafter_config),
                                                      vocabulary, vocabulary, gamma=gamma)
        functions[drafter_config, gamma] = (model.jit_predict(), jax.jit(model.prefill))
      settings[name, gamma] = (*functions[drafter_config, gamma],
                               {"target": target_params, "drafter": drafter_params})
  # results[temperature][setting]: one result per example. The decode steps behind c and the
  # verification cost are timed between the examples, in the same minutes as the decodes.
  results = {t: {key: [] for key in settings} for t in temperatures}
  costs_by_temperature = {}
  cost_rounds = max(1, -(-FLAGS.cost_repeats // len(batches)))
  progress = tqdm.tqdm(total=len(temperatures) * len(batches), desc="examples", unit="example")
  for temperature in temperatures:
    cost_calls = benchmark.decode_step_calls(cost_steps, geometry, temperature=temperature)
    cost_seconds = {key: [] for key in cost_calls}
    for i, (batch, rng) in enumerate(zip(batches, rngs)):
      for key, result in time_example(settings, batch, rng, temperature,
                                             vocabulary.eos_id).items():
        results[temperature][key].append(result)
      for key, seconds in benchmark.time_rounds(cost_calls, repeats=cost_rounds,
                                                warmup=FLAGS.warmup if i == 0 else 0,
                                                compiled=i > 0).items():
        cost_seconds[key].append(seconds)
      progress.update()
    timings = benchmark.marginal_step_timings(
        {key: np.concatenate(seconds) for key, seconds in cost_seconds.items()}, geometry)
    costs_by_temperature[temperature] = benchmark.costs_from_timings(timings, list(drafters),
                                                                     gammas, geometry)
  rows = [make_row(task, name, t, gamma, costs_by_temperature[t][name], results[t]["baseline"],
                   results[t][name, gamma])
          for name in drafters for gamma in gammas for t in temperatures]
  progress.close()

  header = (f"Batch 1, {len(batches)} example(s) of task '{task}', {FLAGS.repeats} timed decodes "
            f"each (median per example, then the mean over examples); feature lengths "
            f"{dict(setup.task_feature_lengths)}; {jax.default_backend()} backend; decode-step "
            f"costs from {cost_rounds * len(batches)} rounds timed between the examples.")
  if not (setup.checkpoint_path and setup.drafter_checkpoint_path):
    header += (" Random weights: alpha and speedups check the mechanics only ('copy of target' "
               "drafts with the target's own weights, so alpha ~ 1 and c = 1).")
  run_info = {
      "command": sys.argv, "gin_config": gin.config_str(), "task": task,
      "num_examples": len(batches), "repeats": FLAGS.repeats, "warmup": FLAGS.warmup,
      "cost_rounds": cost_rounds * len(batches),
      "target_config": dataclasses.asdict(setup.target_config),
      "drafter_configs": {n: dataclasses.asdict(c) for n, (c, _) in drafters.items()},
      "checkpoint_path": setup.checkpoint_path,
      "drafter_checkpoint_path": setup.drafter_checkpoint_path,
      "task_feature_lengths": dict(setup.task_feature_lengths), "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
      "machine": platform.platform(),
  }
  output_dir = pathlib.Path(FLAGS.output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  (output_dir / "results.json").write_text(json.dumps(
      {"run": run_info, "rows": rows,
       "costs": {f"t={t:g}": {n: c.as_dict() for n, c in costs.items()}
                 for t, costs in costs_by_temperature.items()}},
      indent=2))
  table = markdown(rows, costs_by_temperature, header)
  (output_dir / "results.md").write_text(table)
  print(table)
  logging.info("Wrote %s and %s.", output_dir / "results.json", output_dir / "results.md")


if __name__ == "__main__":
  app.run(main, flags_parser=lambda argv: app.parse_flags_with_usage(
      inference.rewrite_gin_args(argv)))

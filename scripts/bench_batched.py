r"""Batched speculative decoding on this CPU: baseline vs speculative wall time per batch size.

The pair is random-weight and built so that acceptance is high and differs from row to row:
  - target: a T5 1.1 (sizes from the flags) whose decoder layers 1.. have their residual outputs
    (attention `out` and MLP `wo` kernels) scaled by --residual_scale, so decoder layer 0 carries
    most of the signal;
  - drafter ('truncated copy'): the same network cut after decoder layer 0, sharing the target's
    embedding, encoder, layer 0, final norm and output head.
Its alpha says nothing about real drafters; it exercises the batch mechanics. All rows of a batch
run in one `lax.while_loop` until the last row ends, so a batch takes as many iterations as its
slowest row: with ragged acceptance the mean target calls per row are below the loop's iterations
(reported as `ragged_efficiency` = mean / max target calls).

For each batch size and temperature, on identical inputs and rng: the wall time of the baseline
(`EncoderDecoderModel`, `temperature_sample`) and of speculative decoding, compilation excluded,
--repeats calls of each, interleaved (baseline, speculative, baseline, ...) so that both see the
same load on a shared CPU, each ended by `block_until_ready`. The speedup is the ratio of the
minimum wall times (the least disturbed runs); the median of the per-pair ratios and the ratio of
the minimum process CPU times (all threads; insensitive to waiting for a busy CPU, but it counts
work, not latency) are given too. Alpha
and target calls per row come from the run's own statistics; c (drafter step / target step, one
token) and the verification cost (target on gamma + 1 tokens / on 1 token) are measured at the
same batch size (minimum times), for Theorem 3.8's prediction and the hardware-aware one. At
temperature 0 the two outputs must be identical.

Writes results.json and results.md into --output_dir.

Usage:
  python scripts/bench_batched.py --output_dir=/tmp/bench_batched
  python scripts/bench_batched.py --batch_sizes=1,4 --temperatures=0 --repeats=3
"""
from __future__ import annotations

import json
import pathlib
import platform
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import seqio
import tqdm

from speculative_t5x import benchmark
from speculative_t5x import decoding
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import theory

EOS_ID = 1

FLAGS = flags.FLAGS
flags.DEFINE_list("batch_sizes", ["1", "4", "16"], "Batch sizes.")
flags.DEFINE_list("temperatures", ["0"], "Sampling temperatures (above 0 the two decodes sample "
                  "different sequences, so their lengths, and work, can differ).")
flags.DEFINE_integer("gamma", 4, "Drafted tokens per target call.")
flags.DEFINE_integer("input_length", 32, "Encoder input length (random tokens).")
flags.DEFINE_integer("decode_length", 32, "Decoded tokens per row (max_decode_len).")
flags.DEFINE_integer("repeats", 7, "Timed (baseline, speculative) pairs per setting.")
flags.DEFINE_integer("cost_repeats", 20, "Timed calls per cost measurement.")
flags.DEFINE_float("residual_scale", 0.1, "Scale of the target's decoder layers 1.. outputs.")
flags.DEFINE_integer("vocab_size", 512, "Target and drafter vocabulary.")
flags.DEFINE_integer("emb_dim", 512, "Target emb_dim.")
flags.DEFINE_integer("num_heads", 8, "Target heads (head_dim 64).")
flags.DEFINE_integer("mlp_dim", 2048, "Target mlp_dim.")
flags.DEFINE_integer("num_encoder_layers", 2, "Target encoder layers.")
flags.DEFINE_integer("num_decoder_layers", 8, "Target decoder layers.")
flags.DEFINE_integer("seed", 0, "Seed of the weights, inputs and decode rng.")
flags.DEFINE_string("output_dir", "/tmp/speculative_t5x/bench_batched", "Where results go.")


def truncated_copy_pair(config: network.T5Config, residual_scale: float, seed: int):
  """(target params, drafter config, drafter params): the target's decoder layers 1.. have their
  residual outputs scaled by `residual_scale`; the drafter is the target cut after decoder layer 0
  (the same arrays, no copy)."""
  def scaled(path, x):
    keys = [k.key for k in path]
    deep = keys[0] == "decoder" and keys[1].startswith("layers_") and keys[1] != "layers_0"
    return x * residual_scale if deep and keys[-2] in ("out", "wo") else x

  target = jax.tree_util.tree_map_with_path(scaled, benchmark.random_params(config, seed))
  drafter_decoder = {name: value for name, value in target["decoder"].items()
                     if not name.startswith("layers_") or name == "layers_0"}
  return target, config.replace(num_decoder_layers=1), dict(target, decoder=drafter_decoder)


def _row_summary(values: np.ndarray) -> dict:
  return {"min": float(values.min()), "median": float(np.median(values)),
          "max": float(values.max())}


def run_batch(batch_size: int, temperatures, target_config, target_params, drafter_config,
              drafter_params) -> list[dict]:
  """All measurements at one batch size -> one result dict per temperature."""
  vocab = seqio.PassThroughVocabulary(target_config.vocab_size, eos_id=EOS_ID)
  baseline = models.EncoderDecoderModel(network.Transformer(target_config), vocab, vocab)
  speculative = models.SpeculativeEncoderDecoderModel(
      network.Transformer(target_config), network.Transformer(drafter_config), vocab, vocab,
      gamma=FLAGS.gamma)
  rng_inputs, rng_decode = jax.random.split(jax.random.PRNGKey(FLAGS.seed))
  batch = {"encoder_input_tokens": benchmark.random_tokens(rng_inputs, target_config.vocab_size,
                                                           (batch_size, FLAGS.input_length)),
           "decoder_input_tokens": jnp.zeros((batch_size, FLAGS.decode_length), jnp.int32),
           "decoder_target_tokens": jnp.ones((batch_size, FLAGS.decode_length), jnp.int32)}
  pair = {"target": target_params, "drafter": drafter_params}
  geometry = benchmark.DecodeGeometry.for_decoding(FLAGS.input_length, FLAGS.decode_length,
                                                   FLAGS.gamma + 1)
  step = lambda config, params, k: benchmark.decode_step_timing(  # noqa: E731
      config, params, k, geometry, batch=batch_size, repeats=FLAGS.cost_repeats)
  target_step = step(target_config, target_params, 1)
  c = step(drafter_config, drafter_params, 1).min_ms / target_step.min_ms
  verify_cost = step(target_config, target_params, FLAGS.gamma + 1).min_ms / target_step.min_ms
  results = []
  for temperature in temperatures:
    base_fn, spec_fn = baseline.jit_predict(), speculative.jit_predict()
    base_args = (target_params, batch, rng_decode, temperature)
    spec_args = (pair, batch, rng_decode, temperature)
    base_out, spec_out = base_fn(*base_args), spec_fn(*spec_args)  # compile
    base_seconds, spec_seconds = [], []  # (wall, process CPU) pairs
    for _ in range(FLAGS.repeats):  # interleaved, so both see the same load on a shared CPU
      base_seconds.append(_seconds(base_fn, base_args))
      spec_seconds.append(_seconds(spec_fn, spec_args))
    (base_wall, base_cpu), (spec_wall, spec_cpu) = zip(*base_seconds), zip(*spec_seconds)
    base_time = benchmark.Timing.from_seconds(base_wall)
    spec_time = benchmark.Timing.from_seconds(spec_wall)
    stats = jax.device_get(spec_out[1]["speculative_stats"])
    alpha = decoding.stats_summary(stats)["alpha"]
    calls = np.asarray(stats["target_calls"], np.float64)
    per_row = (np.asarray(stats["accepted_tokens"]) + calls) / np.maximum(calls, 1)
    results.append({
        "batch_size": batch_size, "temperature": temperature, "gamma": FLAGS.gamma,
        "baseline_ms": base_time.as_dict(), "speculative_ms": spec_time.as_dict(),
        "speedup": base_time.min_ms / spec_time.min_ms,
        "speedup_median_of_pairs": float(np.median(np.divide(base_wall, spec_wall))),
        "cpu_time_ratio": min(base_cpu) / min(spec_cpu),
        "alpha": alpha, "c": c, "verify_cost": verify_cost,
        "target_step_ms": target_step.min_ms,
        "predicted_speedup": float(theory.speedup(alpha, FLAGS.gamma, c)),
        "predicted_speedup_hardware_aware": float(
            theory.speedup_hardware_aware(alpha, FLAGS.gamma, c, verify_cost)),
        "tokens_per_call_per_row": _row_summary(per_row),
        "target_calls_per_row": _row_summary(calls),
        "loop_iterations": int(calls.max()),
        "ragged_efficiency": float(calls.mean() / calls.max()),
        "decoded_tokens": {"baseline": int(np.count_nonzero(base_out[0])),
                           "speculative": int(np.count_nonzero(spec_out[0]))},
        "identical_to_baseline": bool(np.array_equal(np.asarray(base_out[0]),
                                                     np.asarray(spec_out[0]))),
    })
  return results


def _seconds(fn, args) -> tuple[float, float]:
  """(wall seconds, process CPU seconds of all threads) of one call."""
  wall, cpu = time.perf_counter(), time.process_time()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - wall, time.process_time() - cpu


_COLUMNS = ("batch", "temp", "baseline ms (min / median)", "speculative ms (min / median)",
            "speedup (min; median of pairs)", "CPU-time ratio", "alpha", "c", "verify cost",
            "Thm 3.8", "hw-aware", "tokens/call per row (min/med/max)", "ragged eff.", "identical")
_TEXT_COLUMNS = ("tokens/call per row (min/med/max)", "identical")  # left-aligned


def _markdown(results: list[dict], command: str) -> str:
  lines = [f"Command: `{command}`", "", "| " + " | ".join(_COLUMNS) + " |",
           "| " + " | ".join("---" if name in _TEXT_COLUMNS else "---:" for name in _COLUMNS)
           + " |"]
  for r in results:
    rows = r["tokens_per_call_per_row"]
    identical = "yes" if r["identical_to_baseline"] else ("no" if r["temperature"] == 0 else
                                                           "n/a (sampled)")
    cells = [f"{r['batch_size']}", f"{r['temperature']:g}",
             f"{r['baseline_ms']['min_ms']:.0f} / {r['baseline_ms']['median_ms']:.0f}",
             f"{r['speculative_ms']['min_ms']:.0f} / {r['speculative_ms']['median_ms']:.0f}",
             f"**{r['speedup']:.2f}x**; {r['speedup_median_of_pairs']:.2f}x",
             f"{r['cpu_time_ratio']:.2f}x", f"{r['alpha']:.2f}", f"{r['c']:.2f}",
             f"{r['verify_cost']:.2f}", f"{r['predicted_speedup']:.2f}x",
             f"{r['predicted_speedup_hardware_aware']:.2f}x",
             f"{rows['min']:.2f} / {rows['median']:.2f} / {rows['max']:.2f}",
             f"{r['ragged_efficiency']:.2f}", identical]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  target_config = network.T5Config(
      vocab_size=FLAGS.vocab_size, emb_dim=FLAGS.emb_dim, num_heads=FLAGS.num_heads, head_dim=64,
      mlp_dim=FLAGS.mlp_dim, num_encoder_layers=FLAGS.num_encoder_layers,
      num_decoder_layers=FLAGS.num_decoder_layers, mlp_activations=("gelu", "linear"),
      dropout_rate=0.0)
  target_params, drafter_config, drafter_params = truncated_copy_pair(
      target_config, FLAGS.residual_scale, FLAGS.seed)
  temperatures = [float(t) for t in FLAGS.temperatures]
  results = []
  for batch_size in tqdm.tqdm([int(b) for b in FLAGS.batch_sizes], desc="batch sizes"):
    results += run_batch(batch_size, temperatures, target_config, target_params, drafter_config,
                         drafter_params)
  command = " ".join(["python"] + sys.argv)
  output_dir = pathlib.Path(FLAGS.output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  (output_dir / "results.json").write_text(json.dumps(
      {"command": command, "machine": platform.processor() or platform.machine(),
       "jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
       "target_config": target_config.__dict__, "drafter": "truncated copy (decoder layer 0)",
       "residual_scale": FLAGS.residual_scale, "results": results}, indent=2, default=str))
  markdown = _markdown(results, command)
  (output_dir / "results.md").write_text(markdown)
  print(markdown)


if __name__ == "__main__":
  app.run(main)

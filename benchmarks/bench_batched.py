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

For each batch size, `sweep.sweep` measures one example of that many random rows: the baseline
and speculative decoding timed side by side (medians of --repeats rounds, compilation excluded),
then c and the verification cost on decode steps at the same batch size; its `report.SpeedupRow`
per temperature gives the speedups (per decoded token, and with the prefill taken off), alpha,
Theorem 3.8's prediction and the hardware-aware one (see speculative_t5x/measuring/report.py). Beside them:
tokens per target call per row and the ragged efficiency, from the run's own statistics. At
temperature 0 the two outputs must be identical.

Writes results.json and results.md into --output_dir.

Usage:
  python benchmarks/bench_batched.py --output_dir=/tmp/bench_batched
  python benchmarks/bench_batched.py --batch_sizes=1,4 --temperatures=0 --repeats=3
"""

from __future__ import annotations

import json
import platform
import sys

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from absl import flags
import jax
import numpy as np
import seqio

from speculative_t5x import drafters
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x import theory
from speculative_t5x.measuring import report
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import sweep
from speculative_t5x.measuring import workloads
from speculative_t5x.running import run_dir
from speculative_t5x.text import input_data

EOS_ID = 1
DRAFTER = "truncated copy (decoder layer 0)"

FLAGS = flags.FLAGS
flags.DEFINE_list("batch_sizes", ["1", "4", "16"], "Batch sizes.")
flags.DEFINE_list(
    "temperatures",
    ["0"],
    "Sampling temperatures (above 0 the two decodes sample "
    "different sequences, so their lengths, and work, can differ).",
)
flags.DEFINE_integer("gamma", 4, "Drafted tokens per target call.")
flags.DEFINE_integer("input_length", 32, "Encoder input length (random tokens).")
flags.DEFINE_integer("decode_length", 32, "Decoded tokens per row (max_decode_len).")
flags.DEFINE_integer(
    "repeats",
    7,
    "Timed rounds (baseline and speculative side by side) per " "setting; medians are reported.",
)
flags.DEFINE_integer("cost_repeats", 20, "Timed rounds per decode-step cost (c, verification).")
flags.DEFINE_integer(
    "steps_per_call",
    step_costs.DEFAULT_STEPS_PER_CALL,
    "Decode steps per timed call when measuring c and the verification cost.",
)
flags.DEFINE_float("residual_scale", 0.1, "Scale of the target's decoder layers 1.. outputs.")
flags.DEFINE_integer("vocab_size", 512, "Target and drafter vocabulary.")
flags.DEFINE_integer("emb_dim", 512, "Target emb_dim.")
flags.DEFINE_integer("num_heads", 8, "Target heads (head_dim 64).")
flags.DEFINE_integer("mlp_dim", 2048, "Target mlp_dim.")
flags.DEFINE_integer("num_encoder_layers", 2, "Target encoder layers.")
flags.DEFINE_integer("num_decoder_layers", 8, "Target decoder layers.")
flags.DEFINE_integer("seed", 0, "Seed of the weights, inputs and decode rng.")
flags.DEFINE_string("output_dir", "/tmp/speculative_t5x/bench_batched", "Where results go.")
run_dir.define_overwrite_flag()
OUTPUTS = ("results.json", "results.md")


def _spread(values: np.ndarray) -> dict:
  return {
      "min": float(values.min()),
      "median": float(np.median(values)),
      "max": float(values.max()),
  }


def batched_result(
    batch_size: int, row: report.SpeedupRow, speculative: report.ExampleResult
) -> dict:
  """One table line: the row and what only a batch has (per-row spread, ragged efficiency)."""
  calls = np.asarray(speculative.stats.target_calls, np.float64)
  accepted = np.asarray(speculative.stats.accepted_tokens, np.float64)
  per_row = np.array([theory.tokens_per_call(a, c) for a, c in zip(accepted, calls)])
  return {
      "batch_size": batch_size,
      **row.as_dict(),
      "tokens_per_call_per_row": _spread(per_row),
      "target_calls_per_row": _spread(calls),
      "loop_iterations": int(calls.max()),
      "ragged_efficiency": float(calls.mean() / calls.max()),
  }


_COLUMNS = (
    "batch",
    "temp",
    "baseline ms (min / median)",
    "speculative ms (min / median)",
    "speedup (per token; loop)",
    "efficiency",
    "alpha",
    "c",
    "verify cost",
    "Thm 3.8",
    "hw-aware",
    "tokens/call per row (min/med/max)",
    "ragged eff.",
    "identical",
)
_TEXT_COLUMNS = ("tokens/call per row (min/med/max)", "identical")  # left-aligned


def markdown(results: list[dict], command: str) -> str:
  lines = [
      f"Command: `{command}`",
      "",
      "| " + " | ".join(_COLUMNS) + " |",
      "| " + " | ".join("---" if name in _TEXT_COLUMNS else "---:" for name in _COLUMNS) + " |",
  ]
  for r in results:
    (base,), (spec,) = r["baseline_ms"]["per_example"], r["speculative_ms"]["per_example"]
    rows = r["tokens_per_call_per_row"]
    identical = (
        "yes"
        if r["outputs_match_baseline"] == 1
        else ("no" if r["temperature"] == 0 else "n/a (sampled)")
    )
    cells = [
        f"{r['batch_size']}",
        f"{r['temperature']:g}",
        f"{base['min_ms']:.0f} / {base['median_ms']:.0f}",
        f"{spec['min_ms']:.0f} / {spec['median_ms']:.0f}",
        f"**{r['speedup']:.2f}x**; {r['loop_speedup']:.2f}x",
        f"{r['efficiency']:.2f}",
        f"{r['alpha']:.2f}",
        f"{r['c']:.2f}",
        f"{r['verify_cost']:.2f}",
        f"{r['predicted']:.2f}x",
        f"{r['predicted_hw']:.2f}x",
        f"{rows['min']:.2f} / {rows['median']:.2f} / {rows['max']:.2f}",
        f"{r['ragged_efficiency']:.2f}",
        identical,
    ]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def truncated_copy_pair(
    config: network.T5Config, residual_scale: float, seed: int
) -> tuple[dict, network.T5Config, dict]:
  """A random target with a drafter that agrees with it often, at rates differing by row
  -> (target params, drafter config, drafter params).

  The target (`config`, random weights from `seed`) has the residual outputs of its decoder layers
  1.. (attention `out` and MLP `wo` kernels) scaled by `residual_scale`, so that decoder layer 0
  carries most of the signal; the drafter is that target cut after decoder layer 0 (its
  embedding, encoder, layer 0, final norm and head: the same arrays, no copy).
  """

  def scaled(path, x):
    keys = [k.key for k in path]
    deep = keys[0] == "decoder" and keys[1].startswith("layers_") and keys[1] != "layers_0"
    return x * residual_scale if deep and keys[-2] in ("out", "wo") else x

  target = jax.tree_util.tree_map_with_path(scaled, workloads.random_params(config, seed))
  drafter_decoder = {
      name: value
      for name, value in target["decoder"].items()
      if not name.startswith("layers_") or name == "layers_0"
  }
  return target, config.replace(num_decoder_layers=1), dict(target, decoder=drafter_decoder)


def main(argv):
  del argv
  output = run_dir.OutputDir(FLAGS.output_dir, OUTPUTS, "--output_dir", FLAGS.overwrite)
  output.check()  # before any work
  target_config = network.T5Config(
      vocab_size=FLAGS.vocab_size,
      emb_dim=FLAGS.emb_dim,
      num_heads=FLAGS.num_heads,
      head_dim=64,
      mlp_dim=FLAGS.mlp_dim,
      num_encoder_layers=FLAGS.num_encoder_layers,
      num_decoder_layers=FLAGS.num_decoder_layers,
      mlp_activations=("gelu", "linear"),
      dropout_rate=0.0,
  )
  target_params, drafter_config, drafter_params = truncated_copy_pair(
      target_config, FLAGS.residual_scale, FLAGS.seed
  )
  vocabulary = seqio.PassThroughVocabulary(FLAGS.vocab_size, eos_id=EOS_ID)
  results, costs = [], {}
  for batch_size in [int(b) for b in FLAGS.batch_sizes]:
    inputs = input_data.random_tokens(
        jax.random.PRNGKey(FLAGS.seed), FLAGS.vocab_size, (1, batch_size, FLAGS.input_length)
    )
    measured = sweep.sweep(
        target_config,
        target_params,
        {DRAFTER: (drafters.T5Drafter(drafter_config), drafter_params)},
        sweep.grid_settings([DRAFTER], [FLAGS.gamma]),
        FLAGS.temperatures,
        np.asarray(inputs),
        FLAGS.decode_length,
        vocabulary=vocabulary,
        task="random",
        seed=FLAGS.seed,
        repeats=FLAGS.repeats,
        cost_repeats=FLAGS.cost_repeats,
        steps_per_call=FLAGS.steps_per_call,
        progress=True,
    )
    results += [
        batched_result(batch_size, row, measured.results[row.temperature][DRAFTER, FLAGS.gamma][0])
        for row in measured.rows
    ]
    costs[f"batch={batch_size}"] = report.costs_as_dict(measured.costs)
  command = " ".join(["python"] + sys.argv)
  table = markdown(results, command)
  text = json.dumps(
      {
          "command": command,
          "machine": platform.processor() or platform.machine(),
          "jax": jax.__version__,
          "devices": [str(d) for d in jax.devices()],
          "target_config": target_config.__dict__,
          "drafter": DRAFTER,
          "residual_scale": FLAGS.residual_scale,
          "results": results,
          "costs": costs,
      },
      indent=2,
      default=str,
  )
  output.write({"results.json": text, "results.md": table})
  print(table)


if __name__ == "__main__":
  gin_utils.run(main)

r"""Draws the paper's theory figures, and measured against predicted speedup.

Writes PNGs into --output_dir:
  expected_tokens.png        Figure 2: E(# generated tokens) per target call, Eq. (1), against alpha
                             for several gamma.
  optimal_gamma.png          Figure 3: the gamma maximising Theorem 3.8 against alpha for several c,
                             and the speedup it gives.
  speedup_operations.png     Figure 4 and Table 1 (c = c_hat = 0): speedup and the operations factor
                             (Theorem 3.11) against alpha, and speedup against operations.
  measured_vs_predicted.png  only with --benchmark_json: each benchmark row's measured speedup
                             against its prediction, beside the paper's Table 2 rows (measured
                             on a TPU-v4, against Table 4's Theorem 3.8 values).

--benchmark_json is scripts/benchmark.py's results.json (its "rows", `report.SpeedupRow.as_dict`),
or a JSON list of records, one per benchmark row, each an object with
  alpha        acceptance rate measured in the run (mean beta),
  gamma        drafted tokens per iteration,
  c            drafter step time over target step time, measured in the run,
  speedup      measured walltime speedup over the baseline,
  predicted    Theorem 3.8 at (alpha, gamma, c),
and optionally predicted_hw, the hardware-aware prediction (the target's measured time on gamma + 1
tokens in place of one step). Other keys are ignored. For example:
  [{"alpha": 0.62, "gamma": 7, "c": 0.02, "speedup": 2.6, "predicted": 2.26, "predicted_hw": 2.1}]

Usage:
  python benchmarks/plot_theory.py --output_dir=/tmp/theory \
    [--benchmark_json=/tmp/speculative_t5x/benchmark/results.json]
"""

import json
import math
import pathlib

from speculative_t5x.running import bootstrap

bootstrap.start(tensorflow=False)  # first: keeps JAX off an absent TPU (no seqio task read)

from absl import app
from absl import flags
from absl import logging
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

from speculative_t5x import gin_utils
from speculative_t5x import theory  # noqa: E402
from speculative_t5x.projections import paper  # noqa: E402
from speculative_t5x.running import run_dir  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Directory the PNGs are written to (created if absent).")
flags.DEFINE_string(
    "benchmark_json",
    None,
    "Optional benchmark results: scripts/benchmark.py's results.json, or a JSON "
    "list of records with keys alpha, gamma, c, speedup, predicted and "
    "optionally predicted_hw (see the module docstring); adds "
    "measured_vs_predicted.png.",
)
flags.mark_flag_as_required("output_dir")
run_dir.define_overwrite_flag()
PLOTS = (
    "expected_tokens.png",
    "optimal_gamma.png",
    "speedup_operations.png",
    "measured_vs_predicted.png",
)

FIGURE_2_GAMMAS = (1, 2, 3, 5, 7, 10, math.inf)
FIGURE_3_COSTS = (0.01, 0.02, 0.05, 0.1, 0.2)
FIGURE_4_GAMMAS = (1, 2, 3, 5, 7, 10)
TABLE_1_POINTS = ((0.6, 2), (0.7, 3), (0.8, 2), (0.8, 5), (0.9, 2), (0.9, 10))
BENCHMARK_KEYS = ("alpha", "gamma", "c", "speedup", "predicted")
# The performance target: measured speedup at least 0.9 of the hardware-aware prediction.
EFFICIENCY_TARGET = 0.9
DPI = 150


def _gamma_label(gamma):
  return "γ = ∞" if math.isinf(gamma) else f"γ = {gamma}"


def _save(fig, path):
  fig.tight_layout()
  fig.savefig(path, dpi=DPI, format="png")  # path may be a temporary name (run_dir.OutputDir)
  plt.close(fig)
  logging.info("Wrote %s", path)
  return path


def plot_expected_tokens(path):
  """Figure 2: Eq. (1) against alpha, one curve per gamma."""
  alphas = np.linspace(0.0, 0.99, 199)
  fig, ax = plt.subplots(figsize=(6, 4.5))
  for gamma in FIGURE_2_GAMMAS:
    ax.plot(alphas, theory.expected_tokens(alphas, gamma), label=_gamma_label(gamma))
  ax.set(
      xlabel="α (acceptance rate)",
      ylabel="E(# generated tokens) per target call",
      title="Expected tokens per iteration, Eq. (1)",
      xlim=(0, 1),
      ylim=(1, 12),
  )
  ax.grid(alpha=0.3)
  ax.legend()
  return _save(fig, path)


def plot_optimal_gamma(path):
  """Figure 3: the integer gamma maximising Theorem 3.8 against alpha, one curve per c."""
  alphas = np.linspace(0.01, 0.95, 189)
  fig, (gamma_ax, speedup_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
  for c in FIGURE_3_COSTS:
    best_gammas, best_speedups = zip(*(theory.optimal_gamma(alpha, c) for alpha in alphas))
    gamma_ax.step(alphas, best_gammas, where="mid", label=f"c = {c}")
    speedup_ax.plot(alphas, best_speedups, label=f"c = {c}")
  gamma_ax.set(
      xlabel="α", ylabel="optimal γ", title="Optimal γ (Theorem 3.8, integer search)", yscale="log"
  )
  speedup_ax.axhline(1.0, color="gray", linestyle=":", label="no speedup")
  speedup_ax.set(xlabel="α", ylabel="speedup at the optimal γ", title="Best walltime improvement")
  for ax in (gamma_ax, speedup_ax):
    ax.grid(alpha=0.3, which="both")
    ax.legend()
  return _save(fig, path)


def plot_speedup_operations(path):
  """Figure 4 and Table 1: speedup and operations factor for several gamma, c = c_hat = 0."""
  alphas = np.linspace(0.0, 0.95, 96)
  fig, (alpha_ax, tradeoff_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
  for gamma in FIGURE_4_GAMMAS:
    speedups = theory.speedup(alphas, gamma, 0.0)
    operations = theory.operations_factor(alphas, gamma, 0.0)
    (line,) = alpha_ax.plot(alphas, speedups, label=f"{_gamma_label(gamma)} speedup")
    alpha_ax.plot(alphas, operations, color=line.get_color(), linestyle="--")
    tradeoff_ax.plot(operations, speedups, color=line.get_color(), label=_gamma_label(gamma))
  for alpha, gamma in TABLE_1_POINTS:
    operations = theory.operations_factor(alpha, gamma, 0.0)
    speedup = theory.speedup(alpha, gamma, 0.0)
    tradeoff_ax.plot(operations, speedup, "ko", markersize=4)
    tradeoff_ax.annotate(
        f"({alpha}, {gamma})",
        (operations, speedup),
        fontsize=7,
        xytext=(5, 3),
        textcoords="offset points",
    )
  alpha_ax.set(xlabel="α", ylabel="factor", title="Speedup (solid), operations (dashed); c = ĉ = 0")
  tradeoff_ax.set(
      xlabel="operations factor (Theorem 3.11)",
      ylabel="speedup (Theorem 3.8)",
      title="Speed bought with operations; dots: Table 1 (α, γ)",
      xlim=(1, 4),
  )
  for ax in (alpha_ax, tradeoff_ax):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  return _save(fig, path)


def load_benchmark(path):
  """Benchmark records from a results.json or a JSON list (formats in this module's docstring)."""
  records = json.loads(pathlib.Path(path).read_text())
  if isinstance(records, dict) and "rows" in records:
    records = records["rows"]
  if not isinstance(records, list) or not records:
    raise ValueError(
        f"{path}: expected scripts/benchmark.py's results.json or a non-empty JSON "
        f"list of records with keys {', '.join(BENCHMARK_KEYS)}"
    )
  for index, record in enumerate(records):
    missing = [key for key in BENCHMARK_KEYS if not isinstance(record, dict) or key not in record]
    if missing:
      raise ValueError(
          f"{path}: record {index} lacks {', '.join(missing)}; each record needs "
          f"{', '.join(BENCHMARK_KEYS)} (predicted_hw optional)"
      )
  return records


def plot_measured_vs_predicted(records, path):
  """Measured speedup against Theorem 3.8 (and the hardware-aware prediction where given), with
  the paper's Table 2 speedups against its Table 4 predictions for reference."""
  fig, ax = plt.subplots(figsize=(6, 5.5))
  predicted = [record["predicted"] for record in records]
  measured = [record["speedup"] for record in records]
  ax.plot(
      [row.expected_speedup for row in paper.TABLE_2],
      [row.speedup for row in paper.TABLE_2],
      "x",
      color="gray",
      label="paper, Table 2 (TPU-v4) vs Table 4",
  )
  ax.plot(predicted, measured, "o", label="Theorem 3.8 prediction")
  hardware_aware = [(r["predicted_hw"], r["speedup"]) for r in records if "predicted_hw" in r]
  if hardware_aware:
    ax.plot(*zip(*hardware_aware), "s", fillstyle="none", label="hardware-aware prediction")
  for record in records:
    ax.annotate(
        f"γ={record['gamma']}, α={record['alpha']:.2f}, c={record['c']:.2g}",
        (record["predicted"], record["speedup"]),
        fontsize=7,
        xytext=(4, 4),
        textcoords="offset points",
    )
  top = 1.1 * max(
      predicted
      + measured
      + [value for value, _ in hardware_aware]
      + [row.speedup for row in paper.TABLE_2]
  )
  ax.plot([0, top], [0, top], color="gray", label="measured = predicted")
  ax.plot(
      [0, top],
      [0, EFFICIENCY_TARGET * top],
      color="gray",
      linestyle=":",
      label=f"efficiency {EFFICIENCY_TARGET}",
  )
  ax.set(
      xlabel="predicted speedup",
      ylabel="measured speedup",
      xlim=(0, top),
      ylim=(0, top),
      title="Measured vs predicted speedup",
      aspect="equal",
  )
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return _save(fig, path)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  output = run_dir.OutputDir(FLAGS.output_dir, PLOTS, "--output_dir", FLAGS.overwrite).check()
  records = load_benchmark(FLAGS.benchmark_json) if FLAGS.benchmark_json else None
  with output:  # every plot under a temporary name, then all of them at once
    plot_expected_tokens(output.stage_dir("expected_tokens.png"))
    plot_optimal_gamma(output.stage_dir("optimal_gamma.png"))
    plot_speedup_operations(output.stage_dir("speedup_operations.png"))
    if records is not None:
      plot_measured_vs_predicted(records, output.stage_dir("measured_vs_predicted.png"))
    output.commit()


if __name__ == "__main__":
  gin_utils.run(main)

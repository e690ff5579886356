r"""Projects the paper's Table 2 rows onto this machine with Theorem 3.8 (a projection, not a run).

A T5-XXL target (11B parameters, 44 GB in float32) cannot be timed on a 24 GB CPU machine, so its
single-step time is extrapolated: a least-squares line of step time against parameter count
through the T5 1.1 small, base and large step times measured by `scripts/benchmark.py
--costs_only` (--costs_dirs, one per size; each directory's target is the size, its drafter
anything). c for each Table 2 drafter (T5-small, -base, -large) is then its measured step time
over that extrapolated XXL step time. The row's alpha and gamma are the paper's (Table 2); the
hardware-aware column also divides by the verification cost measured for the largest timed target
at that gamma (a proxy: the XXL's is not measurable here).

  python scripts/project_paper.py --costs_dirs=small:/tmp/costs_small,base:/tmp/costs_base,\
large:/tmp/costs_large --output=docs/projection.md
"""
from __future__ import annotations

import json
import pathlib

from absl import app
from absl import flags
import numpy as np

from speculative_t5x import theory

_COSTS_DIRS = flags.DEFINE_list("costs_dirs", None, "size:dir pairs (sizes small, base, large).")

# T5 1.1 parameter counts (millions) with T5X's dimensions, vocab 32128.
PARAMS_M = {"small": 77.0, "base": 247.6, "large": 783.2, "xxl": 11135.3}
# The paper's Table 2: (task, drafter, temperature, gamma, alpha, measured speedup).
TABLE_2 = [
    ("EnDe", "small", 0, 7, 0.75, 3.4), ("EnDe", "base", 0, 7, 0.80, 2.8),
    ("EnDe", "large", 0, 7, 0.82, 1.7), ("EnDe", "small", 1, 7, 0.62, 2.6),
    ("EnDe", "base", 1, 5, 0.68, 2.4), ("EnDe", "large", 1, 3, 0.71, 1.4),
    ("CNNDM", "small", 0, 5, 0.65, 3.1), ("CNNDM", "base", 0, 5, 0.73, 3.0),
    ("CNNDM", "large", 0, 3, 0.74, 2.2), ("CNNDM", "small", 1, 5, 0.53, 2.3),
    ("CNNDM", "base", 1, 3, 0.55, 2.2), ("CNNDM", "large", 1, 3, 0.56, 1.7)]


def _target_costs(directory: str) -> dict:
  """-> {temperature: the target's costs} (shared by every drafter of the run)."""
  by_temperature = json.loads((pathlib.Path(directory) / "costs.json").read_text())["costs"]
  return {float(t[2:]): next(iter(costs.values())) for t, costs in by_temperature.items()}


def main(argv):
  del argv
  if not _COSTS_DIRS.value:
    raise app.UsageError("--costs_dirs=small:DIR,base:DIR,large:DIR is required.")
  step_ms, verify = {}, {}  # [temperature][size]
  for item in _COSTS_DIRS.value:
    size, directory = item.split(":", 1)
    for temperature, costs in _target_costs(directory).items():
      step_ms.setdefault(temperature, {})[size] = costs["target_step_ms"]["median_ms"]
      verify.setdefault(temperature, {})[size] = {
          int(g): v for g, v in costs["verify_cost"].items()}
  xxl_ms = {}
  lines = []
  for temperature, steps in sorted(step_ms.items()):
    sizes = sorted(steps, key=PARAMS_M.get)
    slope, intercept = np.polyfit([PARAMS_M[s] for s in sizes], [steps[s] for s in sizes], 1)
    xxl_ms[temperature] = slope * PARAMS_M["xxl"] + intercept
    lines.append(f"t={temperature:g}: step times measured (float32, batch 1) " +
                 ", ".join(f"T5-{s} {steps[s]:.2f} ms" for s in sizes) +
                 f"; T5-XXL extrapolated linearly in parameters: {xxl_ms[temperature]:.0f} ms; "
                 f"verification cost from T5-{sizes[-1]}.")
  lines += ["",
           "| task | drafter | temp | gamma | alpha (paper) | c here | verify here | "
           "Thm 3.8 here | hw-aware here | paper measured |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for task, drafter, temperature, gamma, alpha, paper in TABLE_2:
    steps = step_ms.get(temperature)
    if steps is None or drafter not in steps:
      continue
    c = steps[drafter] / xxl_ms[temperature]
    largest = max(steps, key=PARAMS_M.get)
    if gamma not in verify[temperature][largest]:
      raise app.UsageError(f"{largest}'s costs have no verification cost at gamma={gamma}: run "
                           "benchmark.py --costs_only with --gammas=3,5,7.")
    v = verify[temperature][largest][gamma]
    lines.append(f"| {task} | T5-{drafter} | {temperature} | {gamma} | {alpha} | {c:.3f} | "
                 f"{v:.2f} | {theory.speedup(alpha, gamma, c):.2f}x | "
                 f"{theory.speedup_hardware_aware(alpha, gamma, c, v):.2f}x | {paper}x |")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)

r"""Projects the paper's Table 2 rows onto this machine with Theorem 3.8 (a projection, not a run).

A T5-XXL target (11B parameters, 44 GB in float32) cannot be timed on a 24 GB CPU machine, so its
single-step time is extrapolated: a least-squares line of step time against parameter count
through the T5 1.1 small, base and large step times measured by `scripts/benchmark.py
--costs_only` (--costs_dirs, one per size; each directory's target is the size, its drafter
anything). c for each Table 2 drafter (T5-small, -base, -large) is then its measured step time
over that extrapolated XXL step time. The row's alpha and gamma are the paper's (Table 2,
`paper.TABLE_2`); the hardware-aware column also divides by the verification cost measured for
the largest timed target at that gamma (a proxy: the XXL's is not measurable here).

  python benchmarks/project_paper.py --costs_dirs=small:/tmp/costs_small,base:/tmp/costs_base,\
large:/tmp/costs_large
"""

from __future__ import annotations

import json
import pathlib

from speculative_t5x.running import bootstrap

bootstrap.start(tensorflow=False)  # first: keeps JAX off an absent TPU (no seqio task read)

from absl import app
from absl import flags
import numpy as np

from speculative_t5x import gin_utils
from speculative_t5x import theory
from speculative_t5x.projections import paper

_COSTS_DIRS = flags.DEFINE_list("costs_dirs", None, "size:dir pairs (sizes small, base, large).")

# T5 1.1 parameter counts (millions) with T5X's dimensions, vocab 32128.
PARAMS_M = {"small": 77.0, "base": 247.6, "large": 783.2, "xxl": 11135.3}


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
          int(g): v for g, v in costs["verify_cost"].items()
      }
  xxl_ms = {}
  lines = []
  for temperature, steps in sorted(step_ms.items()):
    sizes = sorted(steps, key=PARAMS_M.get)
    slope, intercept = np.polyfit([PARAMS_M[s] for s in sizes], [steps[s] for s in sizes], 1)
    xxl_ms[temperature] = slope * PARAMS_M["xxl"] + intercept
    lines.append(
        f"t={temperature:g}: step times measured (float32, batch 1) "
        + ", ".join(f"T5-{s} {steps[s]:.2f} ms" for s in sizes)
        + f"; T5-XXL extrapolated linearly in parameters: {xxl_ms[temperature]:.0f} ms; "
        f"verification cost from T5-{sizes[-1]}."
    )
  lines += [
      "",
      "| task | drafter | temp | gamma | alpha (paper) | c here | verify here | "
      "Thm 3.8 here | hw-aware here | paper measured |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for row in paper.TABLE_2:
    steps = step_ms.get(row.temperature)
    if steps is None or row.drafter not in steps:
      continue
    c = steps[row.drafter] / xxl_ms[row.temperature]
    largest = max(steps, key=PARAMS_M.get)
    if row.gamma not in verify[row.temperature][largest]:
      raise app.UsageError(
          f"{largest}'s costs have no verification cost at gamma={row.gamma}: "
          "run benchmark.py --costs_only with --gammas=3,5,7."
      )
    v = verify[row.temperature][largest][row.gamma]
    lines.append(
        f"| {row.task} | T5-{row.drafter} | {row.temperature:g} | {row.gamma} | "
        f"{row.alpha} | {c:.3f} | {v:.2f} | {theory.speedup(row.alpha, row.gamma, c):.2f}x"
        f" | {theory.speedup_hardware_aware(row.alpha, row.gamma, c, v):.2f}x | "
        f"{row.speedup}x |"
    )
  print("\n".join(lines))


if __name__ == "__main__":
  gin_utils.run(main)

"""benchmarks/project_paper.py: Theorem 3.8 for Table 2's rows (`paper.TABLE_2`) with step times from
costs.json files."""

import json
import pathlib
import subprocess
import sys

from speculative_t5x.projections import paper

REPO = pathlib.Path(__file__).resolve().parents[2]


def _costs(directory, step_ms, verify):
  directory.mkdir()
  entry = {"target_step_ms": {"median_ms": step_ms}, "verify_cost": verify}
  (directory / "costs.json").write_text(
      json.dumps({"costs": {"t=0": {"any": entry}, "t=1": {"any": entry}}})
  )


def test_projection_uses_extrapolated_xxl_step(tmp_path):
  # Step time exactly proportional to parameters: 0.1 ms per million -> XXL 1113.53 ms.
  sizes = {"small": 77.0, "base": 247.6, "large": 783.2}
  for size, params in sizes.items():
    _costs(tmp_path / size, 0.1 * params, {"3": 1.5, "5": 1.5, "7": 2.0})
  dirs = ",".join(f"{s}:{tmp_path / s}" for s in sizes)
  out = subprocess.run(
      [sys.executable, str(REPO / "benchmarks" / "project_paper.py"), f"--costs_dirs={dirs}"],
      capture_output=True,
      text=True,
      check=True,
  ).stdout
  assert "T5-XXL extrapolated linearly in parameters: 1114 ms" in out
  # EnDe, T5-small, t=0, gamma 7, alpha 0.75: c = 7.7 / 1113.53 = 0.00691,
  # Thm 3.8 = (1 - 0.75^8) / (0.25 * (7 * 0.00691 + 1)) = 3.5996 / 1.0484 = 3.433;
  # hw-aware with verify cost 2.0: 3.5996 / (0.0484 + 2) = 1.757.
  row = next(line for line in out.splitlines() if line.startswith("| EnDe | T5-small | 0 |"))
  assert "| 0.007 | 2.00 | 3.43x | 1.76x | 3.4x |" in row
  # One line per Table 2 row, each ending in the paper's measured speedup.
  rows = [line for line in out.splitlines() if line.startswith(("| EnDe |", "| CNNDM |"))]
  assert len(rows) == len(paper.TABLE_2) == 12
  for line, row in zip(rows, paper.TABLE_2):
    assert line.startswith(
        f"| {row.task} | T5-{row.drafter} | {row.temperature:g} | {row.gamma} | " f"{row.alpha} |"
    ) and line.endswith(f"| {row.speedup}x |")


def test_table_2_rows_name_their_paper_config_files():
  names = {row.config_name for row in paper.TABLE_2}
  assert names == {path.stem for path in (REPO / "configs" / "paper").glob("*.gin")}
  first = paper.TABLE_2[0]
  assert (first.config_name, first.gamma, first.alpha, first.speedup) == (
      "ende_small_t0",
      7,
      0.75,
      3.4,
  )

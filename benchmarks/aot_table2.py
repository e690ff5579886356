r"""Every row of the paper's Table 2 compiled by XLA:TPU, on one chip and on model-parallel meshes.

For each row (configs/paper/: T5-XXL target, its T5 1.1 drafter, gamma, temperature and the
task's feature lengths, bfloat16 parameters, batch 1) and each mesh, runs
`scripts/aot_check.py --topology=... --paper_row=...` in its own process (gin's configuration
is global) and collects the reports into one table: XLA:TPU's peak memory per chip against the
chip's HBM, fits or not (a row the compiler cannot fit is reported with the sizes of its error),
lowering and compilation seconds, and the optimized HLO's per-iteration findings (`hlo_report`).

Meshes, as --meshes=SLICE:CHIPS:PARTITIONS,... (default: one v4 chip; a v4-8's 4 chips model-
parallel; a v4-16's 8 chips, two hosts' devices compiled from this one process):
  python benchmarks/aot_table2.py --output_dir=/tmp/aot_table2
  python benchmarks/aot_table2.py --meshes=v5litepod-4:1:1,v6e-4:4:4 --rows=ende_small_t0

Writes table2_tpu.json and table2_tpu.md into --output_dir, the reports of each compile in a
subdirectory; exits 1 if a compile failed for another reason than memory.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

from absl import app
from absl import flags

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from speculative_t5x.running import bootstrap

bootstrap.start(tensorflow=False)  # first: keeps JAX off an absent TPU (no seqio task read)

from speculative_t5x import gin_utils  # noqa: E402
from speculative_t5x.projections import paper  # noqa: E402
from speculative_t5x.running import run_dir  # noqa: E402
from speculative_t5x.tpu import tpu_topology  # noqa: E402

GIB = 2**30
FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", "/tmp/speculative_t5x/aot_table2", "Where the table goes.")
flags.DEFINE_list(
    "meshes", ["v4-8:1:1", "v4-8:4:4", "v4-16:8:8"], "SLICE:CHIPS:MODEL_PARTITIONS entries."
)
run_dir.define_overwrite_flag()
TABLES = ("table2_tpu.json", "table2_tpu.md")
flags.DEFINE_list(
    "rows", [row.config_name for row in paper.TABLE_2], "Table 2 rows (configs/paper/ names)."
)


def _mesh(entry: str) -> tuple[str, int, int]:
  try:
    name, chips, partitions = entry.split(":")
    tpu_topology.get_slice(name)
    return name, int(chips), int(partitions)
  except ValueError as e:
    raise app.UsageError(
        f"--meshes entry {entry!r}: give SLICE:CHIPS:MODEL_PARTITIONS, e.g. v4-8:4:4 ({e})"
    ) from e


def _run(row: str, mesh: tuple[str, int, int], directory: pathlib.Path) -> dict:
  name, chips, partitions = mesh
  command = [
      sys.executable,
      str(REPO_ROOT / "scripts" / "aot_check.py"),
      f"--topology={name}",
      f"--num_devices={chips}",
      f"--paper_row={row}",
      f"--gin.NUM_PARTITIONS={partitions}",
      f"--gin.AOT_OUTPUT_DIR='{directory}'",
      "--nowrite_hlo",
      *(["--overwrite"] if FLAGS.overwrite else []),
  ]
  start = time.perf_counter()
  done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
  report_path = directory / "aot_check.json"
  if done.returncode not in (0, 1) or not report_path.exists():
    return {"row": row, "slice_mesh": list(mesh), "error": done.stderr[-2000:], "ok": False}
  report = json.loads(report_path.read_text())
  report.pop("gin_config", None)
  return {
      **report,
      "row": row,
      "slice_mesh": list(mesh),
      "wall_seconds": time.perf_counter() - start,
  }


def _cell(report: dict) -> str:
  if "error" in report:
    return "compile error"
  if "out_of_memory" in report:
    used = report["out_of_memory"].get("used_bytes")
    return f"**does not fit** ({used / GIB:.1f} GiB)" if used else "**does not fit**"
  peak = report["peak_per_device_bytes"] / GIB
  hlo = report.get("hlo_report", {}).get("problems", [])
  verdict = "fits" if report["fits"] else "**does not fit**"
  return f"{peak:.2f} GiB, {verdict}" + (f", {len(hlo)} HLO finding(s)" if hlo else "")


def markdown(reports: list[dict], meshes: list[tuple[str, int, int]]) -> str:
  header = " | ".join(f"{n}, {c} chip(s), model {p}" for n, c, p in meshes)
  lines = [
      "XLA:TPU's memory analysis, peak per chip (arguments + outputs + temporaries - aliased), "
      "T5-XXL target, bfloat16, batch 1; compile seconds in brackets.",
      "",
      f"| row | drafter | gamma | T | lengths | {header} |",
      "|---|---|---|---|---|" + "---|" * len(meshes),
  ]
  rows = {row.config_name: row for row in paper.TABLE_2}
  for name in dict.fromkeys(r["row"] for r in reports):
    row = rows[name]
    cells = []
    for mesh in meshes:
      found = [r for r in reports if r["row"] == name and tuple(r["slice_mesh"]) == mesh]
      if not found:
        cells.append("-")
        continue
      seconds = found[0].get("compile_seconds")
      cells.append(_cell(found[0]) + (f" [{seconds:.0f} s]" if seconds is not None else ""))
    lengths = "64/64" if row.task == "EnDe" else "512/128"
    lines.append(
        f"| {name} | T5-{row.drafter} | {row.gamma} | {row.temperature:g} | {lengths} | "
        + " | ".join(cells)
        + " |"
    )
  return "\n".join(lines) + "\n"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  meshes = [_mesh(entry) for entry in FLAGS.meshes]
  known = {row.config_name for row in paper.TABLE_2}
  for row in FLAGS.rows:
    if row not in known:
      raise app.UsageError(f"--rows: {row!r} is not a Table 2 row: use some of {sorted(known)}.")
  cells = {
      (mesh, row): f"{row}_{mesh[0]}_{mesh[1]}x{mesh[2]}" for mesh in meshes for row in FLAGS.rows
  }
  # Before any work: writable, and no other run's table or compile reports unless --overwrite
  # (which the compiles are given too: each replaces its own reports whole).
  run_dir.OutputDir(
      FLAGS.output_dir, (*TABLES, *cells.values()), "--output_dir", FLAGS.overwrite
  ).check()
  table = run_dir.OutputDir(FLAGS.output_dir, TABLES, "--output_dir")
  tpu_topology.check_libtpu()
  output_dir = pathlib.Path(FLAGS.output_dir)
  reports = []
  for (mesh, row), cell in cells.items():
    reports.append(_run(row, mesh, output_dir / cell))
    print(f"{row} {mesh}: {_cell(reports[-1])}", flush=True)
    # The table so far, both files at once: a run that stops keeps the rows it has compiled.
    table.write({TABLES[0]: json.dumps(reports, indent=2), TABLES[1]: markdown(reports, meshes)})
  print(markdown(reports, meshes))
  if any("error" in r for r in reports):
    sys.exit(1)


if __name__ == "__main__":
  gin_utils.run(main)

"""benchmarks/plot_theory.py end to end: it writes every PNG, and rejects a malformed benchmark JSON.

The script runs in a subprocess, as users run it: importing it here would register its absl flags
in this process, where other script tests define flags of the same names.
"""

import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "plot_theory.py"
THEORY_PNGS = ("expected_tokens.png", "optimal_gamma.png", "speedup_operations.png")


def _run(*flags):
  return subprocess.run(
      [sys.executable, str(SCRIPT), *flags],
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )


def test_writes_all_pngs(tmp_path):
  benchmark_json = tmp_path / "benchmark.json"
  benchmark_json.write_text(
      json.dumps(
          [
              {
                  "alpha": 0.62,
                  "gamma": 7,
                  "c": 0.02,
                  "speedup": 2.1,
                  "predicted": 2.26,
                  "predicted_hw": 2.2,
                  "task": "ignored",
              },
              {"alpha": 0.53, "gamma": 5, "c": 0.02, "speedup": 1.7, "predicted": 1.89},
          ]
      )
  )
  output_dir = tmp_path / "plots"
  result = _run(f"--output_dir={output_dir}", f"--benchmark_json={benchmark_json}")
  assert result.returncode == 0, result.stderr
  for name in THEORY_PNGS + ("measured_vs_predicted.png",):
    png = output_dir / name
    assert png.exists(), name
    assert png.read_bytes().startswith(b"\x89PNG"), name
    assert png.stat().st_size > 10_000, name  # Axes, curves and labels, not a blank canvas.


def test_reads_the_benchmark_scripts_results_json(tmp_path):
  results = tmp_path / "results.json"
  results.write_text(
      json.dumps(
          {
              "run": {"task": "random"},
              "costs": {},
              "rows": [
                  {
                      "alpha": 0.7,
                      "gamma": 4,
                      "c": 0.05,
                      "speedup": 1.9,
                      "predicted": 2.3,
                      "predicted_hw": 2.0,
                      "loop_speedup": 2.0,
                  }
              ],
          }
      )
  )
  result = _run(f"--output_dir={tmp_path / 'plots'}", f"--benchmark_json={results}")
  assert result.returncode == 0, result.stderr
  assert (tmp_path / "plots" / "measured_vs_predicted.png").stat().st_size > 10_000


def test_benchmark_json_is_optional(tmp_path):
  result = _run(f"--output_dir={tmp_path}")
  assert result.returncode == 0, result.stderr
  assert sorted(path.name for path in tmp_path.iterdir()) == sorted(THEORY_PNGS)


def test_rejects_record_without_required_keys(tmp_path):
  benchmark_json = tmp_path / "benchmark.json"
  benchmark_json.write_text(json.dumps([{"alpha": 0.6, "gamma": 3, "speedup": 2.0}]))
  result = _run(f"--output_dir={tmp_path / 'plots'}", f"--benchmark_json={benchmark_json}")
  assert result.returncode != 0
  assert "record 0 lacks c, predicted" in result.stderr

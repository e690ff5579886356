"""benchmarks/bench_xxl_gpu.py at tiny shapes, in process: its results' fields, the budget's skipping
and Hugging Face's greedy output beside ours (the device run, prepared on the CPU)."""

import json
import pathlib

import pytest

from bench_conftest import load_bench
from conftest import make_demo_process

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_xxl_gpu.py"


@pytest.fixture(scope="module")
def bench():
  return load_bench("bench_xxl_gpu")


def test_stage_order_puts_the_important_rows_first(bench):
  names = [s.name for s in bench.stage_list(bench.Options())]
  assert names[:5] == [
      "setup",
      "baseline t=0",
      "chain small gamma 3 t=0",
      "chain small gamma 5 t=0",
      "chain small gamma 7 t=0",
  ]
  assert names.index("chain shared1 gamma 5 t=0") < names.index("chain small gamma 5 t=1")
  assert names.index("chain small gamma 5 t=1") < names.index("tree shared1 t=0")
  assert names[-1] == "hf" and len(names) == len(set(names))


def test_a_tiny_budget_skips_every_stage_and_says_so(bench, tmp_path):
  results = bench.run(
      bench.Options(
          output_dir=str(tmp_path), budget_s=0.5, hf_budget_s=0.1, compilation_cache_dir=""
      )
  )
  stages = results["stages"]
  assert stages[0]["stage"] == "setup" and stages[0]["status"] == "done"
  assert len(stages) > 10 and all(s["status"] == "skipped" for s in stages[1:])
  assert all("left of the budget" in s["reason"] for s in stages[1:])
  assert not results["failed"] and results["rows"] == []
  written = json.loads((tmp_path / "results.json").read_text())
  assert [s["status"] for s in written["stages"]] == [s["status"] for s in stages]
  assert "skipped" in (tmp_path / "results.md").read_text()


def test_tiny_run_measures_a_row_and_matches_hugging_face(bench, tmp_path):
  pytest.importorskip("torch", reason="the hf stage needs torch (the test extras)")
  pytest.importorskip("transformers", reason="the hf stage needs transformers (the test extras)")
  results = bench.run(
      bench.Options(
          output_dir=str(tmp_path),
          budget_s=600,
          hf_budget_s=60,
          repeats=2,
          cost_repeats=5,
          stages=("baseline", "chain small gamma 5 t=0", "hf"),
          compilation_cache_dir="",
      )
  )
  assert not results["failed"], results["stages"]
  assert [s["stage"] for s in results["stages"]] == [
      "setup",
      "baseline t=0",
      "chain small gamma 5 t=0",
      "hf",
  ]
  assert all(s["status"] == "done" for s in results["stages"])
  setup = results["setup"]
  assert setup["bandwidth"]["bytes_per_s"] > 0 and setup["target_bytes"] > 0
  assert setup["floor_ms_per_token"] == pytest.approx(
      setup["decoder_bytes_per_step"] / setup["bandwidth"]["bytes_per_s"] * 1e3
  )
  baseline = results["baseline"]["t=0"]
  assert baseline["ms_per_token"] > 0 and baseline["loop_over_floor"] > 0
  (row,) = results["rows"]
  assert (row["drafter"], row["gamma"], row["temperature"]) == ("small", 5, 0.0)
  assert row["outputs_match_baseline"] == 1.0  # greedy: exactly the baseline's tokens
  for field in ("alpha", "c", "verify_cost", "iteration_cost", "efficiency_in_situ", "speedup"):
    assert row[field] == row[field], field  # measured, not NaN
  assert 0.0 <= row["alpha"] <= 1.0 and row["c"] > 0
  # Table 2 from the measured c and verification cost (CNN/DM, T5-small, T = 0, gamma 5).
  (projected,) = results["table2_projected"]
  assert (projected["task"], projected["gamma"]) == ("CNNDM", 5)
  assert projected["c_measured"] == pytest.approx(row["c"])
  assert projected["projected_speedup_hw"] > 0
  hf = results["hf"]
  assert hf["greedy_identical"], hf["examples"]
  assert hf["hf_baseline_ms_per_token"] > 0 and hf["hf_assisted_ms_per_token"] > 0
  assert sum(results["compile_s"]["speculative"]) > 0
  markdown = (tmp_path / "results.md").read_text()
  assert "## Rows" in markdown and "## Hugging Face" in markdown and "Table 2 projected" in markdown


def test_the_device_bench_runs_without_tensorflow(tmp_path):
  """The GPU image has no TensorFlow: the bench runs where seqio and TensorFlow cannot be
  imported, as `make demo` does."""
  run = make_demo_process(
      "bench_xxl_gpu.py",
      "--sizes=tiny",
      f"--output_dir={tmp_path}",
      "--budget_s=60",
      "--hf_budget_s=5",
      "--stages=baseline",
      "--compilation_cache_dir=",
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert "blocked" not in run.stderr + run.stdout
  assert "baseline t=0" in (tmp_path / "results.md").read_text()

"""scripts/benchmark.py end to end: the tiny random pair, the demo pair on a task split, costs only,
and configuration errors before any model is built. No timing is asserted: speed is measured by
the benchmarks, never by tests."""

import json

import numpy as np
import pytest

from conftest import REPO_ROOT, require_demo_pair, run_script, script_process
from speculative_t5x import theory
from speculative_t5x.measuring import stopwatch

ROW_KEYS = {
    "task",
    "drafter",
    "temperature",
    "gamma",
    "alpha",
    "tokens_per_target_call",
    "c",
    "verify_cost",
    "speedup",
    "speedup_per_example",
    "loop_speedup",
    "predicted",
    "predicted_hw",
    "efficiency",
    "baseline_ms",
    "speculative_ms",
    "outputs_match_baseline",
}


def test_benchmark_script_end_to_end(tmp_path):
  """The default tiny random pair, 1 example, 3 repeats (medians: a single timing of a short
  decode can fall below its prefill's on a busy machine), gamma 2, temperature 0 (each setting
  compiles its own loop: the suite keeps them few; temperature 1 goes through the same sweep.sweep
  in tests/test_demo.py, and its step costs in test_benchmark_costs_only). A step of the tiny networks takes
  tens of microseconds, so the step costs are resolved from 64 extra steps (16 per call, the most
  a 16-token decode's cache admits) in 5 rounds: 16 extra steps were lost in the noise of a
  loaded machine. The draft shape is also chosen on this machine (BenchmarkSetup.auto, chains of
  1-2 drafts) and swept beside gamma 2, its decision recorded."""
  run_script(
      "benchmark.py",
      f"--output_dir={tmp_path}",
      "--gin.benchmark_config.BenchmarkSetup.auto=@auto_shape.Auto()",
      "--gin.auto_shape.Auto.max_gamma=2",
      "--gin.auto_shape.Auto.budget_s=0",
      "--num_examples=1",
      "--repeats=3",
      "--warmup=1",
      "--cost_repeats=5",
      "--steps_per_call=16",
      "--gammas=2",
      "--temperatures=0",
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 16}",
      cwd=tmp_path,
  )

  results = json.loads((tmp_path / "results.json").read_text())
  assert set(results) == {"run", "costs", "rows", "auto_shape"}
  chosen = {}
  for name, choice in results["auto_shape"]["0.0"].items():
    assert [p["label"] for p in choice["predictions"]] == ["gamma 1", "gamma 2"]
    costs = choice["costs"]
    assert choice["measurement"]["rounds"] >= 3 and set(costs["verify_cost"]) == {"3"}
    calls = set(costs["loop"]["ms_per_target_call"])
    assert set(costs["chain_call_cost"]) == {"1", "2"} and calls == {"gamma 1", "gamma 2"}
    assert choice["chosen"]["label"] in ("baseline", "gamma 1", "gamma 2") and choice["reason"]
    chosen[name] = choice["best_speculative"]["shape"]["gamma"]
  assert set(chosen) == {"random, independent", "random, copy of target"}
  assert results["run"]["task_feature_lengths"] == {"inputs": 8, "targets": 16}
  run = results["run"]
  assert run["input_bucket"] == 0 and run["encoder_lengths"] == {"8": 1}  # the feature length
  assert run["load_before"]["load_1m"] >= 0 and run["load_after"]["cpus"] >= 1
  assert run["busy"] == (stopwatch.busy_warning(run["load_before"]) is not None)
  rows = results["rows"]
  settings = {(r["drafter"], r["temperature"], r["gamma"]) for r in rows}
  assert settings == {
      (d, t, g)
      for d in ("random, independent", "random, copy of target")
      for t in (0.0,)
      for g in {2, *chosen.values()}  # the sweep's gammas and auto's best shapes
  }
  for row in rows:
    assert ROW_KEYS <= set(row)
    assert 0.0 <= row["alpha"] <= 1.0 and row["tokens_per_target_call"] >= 1.0
    assert row["c"] > 0 and row["verify_cost"] > 0
    assert row["outputs_match_baseline"] == 1.0  # greedy: identical to the baseline's output.
    assert row["iteration_cost"] > 0 and row["loop_speedup"] > 0
    predicted_in_situ = theory.expected_tokens(row["alpha"], row["gamma"]) / row["iteration_cost"]
    assert row["efficiency_in_situ"] == pytest.approx(row["loop_speedup"] / predicted_in_situ)
    realized = row["tokens_per_target_call"] / (row["gamma"] * row["c"] + row["verify_cost"])
    assert row["efficiency_realized"] == pytest.approx(row["loop_speedup"] / realized)
    # Speedups are per decoded token: baseline ms per token over speculative ms per token.
    base = [t["median_ms"] for t in row["baseline_ms"]["per_example"]]
    spec = [t["median_ms"] for t in row["speculative_ms"]["per_example"]]
    assert row["speedup"] == pytest.approx(
        (sum(base) / sum(row["baseline_tokens"])) / (sum(spec) / sum(row["speculative_tokens"]))
    )
    assert row["speedup_per_example"] == pytest.approx(np.mean(np.divide(base, spec)))
  for row in rows:
    if row["drafter"] == "random, copy of target":
      assert row["alpha"] > 0.9  # the drafter is the target: its argmax is the target's.
  assert set(results["costs"]) == {"t=0"}
  gammas = {str(g) for g in {2, *chosen.values()}}
  assert set(results["costs"]["t=0"]["random, copy of target"]["verify_cost"]) == gammas
  table = (tmp_path / "results.md").read_text()
  assert "| task | drafter | temp | gamma | alpha |" in table
  assert "## Auto draft shape" in table and "auto draft shape at temperature 0:" in table


def test_benchmark_costs_only(tmp_path):
  run_script(
      "benchmark.py",
      "--costs_only",
      f"--output_dir={tmp_path}",
      "--cost_repeats=5",
      "--steps_per_call=16",
      "--gammas=2",
      "--temperatures=0,1",
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 16}",
      "--gin.benchmark_config.BenchmarkSetup.random_drafters=('independent',)",
      cwd=tmp_path,
  )
  costs = json.loads((tmp_path / "costs.json").read_text())["costs"]
  assert set(costs) == {"t=0", "t=1"}
  for by_drafter in costs.values():
    for cost in by_drafter.values():
      assert cost["c"] > 0 and set(cost["verify_cost"]) == {"2"}
  assert not (tmp_path / "results.json").exists()  # no decoding in --costs_only


def test_benchmark_rejects_over_long_input_lines(tmp_path):
  spm = require_demo_pair() / "sentencepiece.model"
  lines = tmp_path / "inputs.txt"
  lines.write_text("short\n" + "a much longer line than eight tokens can hold, surely\n")
  completed = script_process(
      "benchmark.py",
      f"--output_dir={tmp_path}",
      f"--input_file={lines}",
      f"--sentencepiece_model={spm}",
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 16}",
      cwd=tmp_path,
  )
  assert completed.returncode != 0
  assert "exceed the 'inputs' length 8" in completed.stderr


def test_benchmark_inputs_from_a_task_split(tmp_path):
  """The demo pair (its shared-encoder drafter, restored as float32) on two sentences of the demo
  task's test split, each padded to its own multiple of 8 tokens."""
  require_demo_pair()
  run_script(
      "benchmark.py",
      "--gin_file=configs/demo/benchmark.gin",
      "--task=demo_ende",
      "--split=test",
      f"--output_dir={tmp_path}",
      "--num_examples=2",
      "--repeats=1",
      "--warmup=0",
      "--cost_repeats=2",
      "--steps_per_call=16",
      "--gammas=2",
      "--temperatures=0",
      "--input_bucket=8",
      cwd=REPO_ROOT,
  )
  results = json.loads((tmp_path / "results.json").read_text())
  assert results["run"]["task"] == "demo_ende:test" and results["run"]["num_examples"] == 2
  lengths = results["run"]["encoder_lengths"]
  assert sum(lengths.values()) == 2 and all(int(n) % 8 == 0 for n in lengths)
  assert max(map(int, lengths)) < results["run"]["task_feature_lengths"]["inputs"]
  (row,) = results["rows"]
  assert row["outputs_match_baseline"] == 1.0 and 0.0 < row["alpha"] < 1.0


def test_benchmark_paper_row_needs_its_checkpoints(tmp_path):
  """A configs/paper/ row after the run file leaves the checkpoints required: the run stops with
  a configuration error naming them, before any model is built."""
  completed = script_process(
      "benchmark.py",
      "--gin_file=configs/runs/benchmark.gin",
      "--gin_file=configs/paper/ende_small_t0.gin",
      "--gin.INFER_OUTPUT_DIR=None",
      f"--output_dir={tmp_path}",
      cwd=REPO_ROOT,
  )
  assert completed.returncode == 1
  assert "CHECKPOINT_PATH, DRAFTER_CHECKPOINT_PATH are %gin.REQUIRED" in completed.stderr
  assert not list(tmp_path.iterdir())

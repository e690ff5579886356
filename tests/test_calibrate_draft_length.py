"""scripts/calibrate_draft_length.py on the shipped demo pair."""

import json

from conftest import require_demo_pair, run_script


def test_calibrate_draft_length_writes_its_choice(tmp_path):
  require_demo_pair()
  out = run_script(
      "calibrate_draft_length.py",
      f"--gin.CALIBRATION_OUTPUT_DIR='{tmp_path}'",
      "--gin.NUM_TOKENS=50",
      "--gin.TEMPERATURES=(1.0,)",
      "--gin.GAMMAS=(1, 3)",
      "--gin_bindings=calibrate_draft_length.CalibrationSetup.batch_size=4",
      "--gin_bindings=calibrate_draft_length.CalibrationSetup.cost_repeats=3",
  )
  result = json.loads((tmp_path / "calibration.json").read_text())["t=1"]
  assert result["positions"] >= 50 and result["c"] > 0
  assert set(result["c_in_loop"]) == {"1", "3"}
  assert all(c >= result["c"] for c in result["c_in_loop"].values())
  assert set(result["verify_cost"]) == {"1", "3"}
  assert result["best"]["speedup"] == max(p["speedup"] for p in result["grid"])
  assert result["best_static"]["threshold"] == 0.0
  assert abs(sum(b["share"] for b in result["buckets"]) - 1.0) < 1e-9
  chosen = (tmp_path / "draft_length_t1.gin").read_text()
  assert f"draft_length.ConfidenceStop.threshold = {result['best']['threshold']:.4f}" in chosen
  assert "| adaptive (chosen) |" in out

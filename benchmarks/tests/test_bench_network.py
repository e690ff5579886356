"""benchmarks/bench_network.py: k-token decode timings of a network size."""

import json

from conftest import run_script


def test_bench_network_times_k_token_decodes(tmp_path):
  out = run_script(
      "bench_network.py",
      f"--output_dir={tmp_path}",
      "--sizes=tiny",
      "--ks=1,3",
      # A tiny network's step is about 0.02 ms: enough steps that the extra ones outweigh the
      # noise of a shared machine (with 4 steps per call they did not, once).
      "--repeats=5",
      "--steps_per_call=64",
      "--decode_length=80",
      "--encoder_length=8",
  )
  (row,) = json.loads((tmp_path / "bench_network.json").read_text())["rows"]
  assert row["size"] == "tiny" and set(row["ms"]) == {"1", "3"}
  assert row["ratio_to_k1"]["1"] == 1.0 and row["ms"]["3"]["median_ms"] > 0
  assert "| tiny |" in out

"""benchmarks/bench_cpu_dots.py: the demo target's decoder matmuls per k, in each variant."""

import json
import subprocess
import sys

from conftest import REPO_ROOT, run_script

_SAME_FUNCTION = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("bench_cpu_dots", sys.argv[1])
dots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dots)
params = dots.weights()
x = np.random.default_rng(1).standard_normal((3, dots.EMB)).astype(np.float32)
separate = dots.chain(np, params, x, "separate")
fused = dots.chain(np, dots.fused(params), x, "fused")
assert separate.shape == (3, dots.VOCAB), separate.shape
np.testing.assert_allclose(fused, separate, rtol=1e-4, atol=1e-4)
print("same")
"""


def test_the_fused_chain_computes_what_the_separate_one_does():
  """Concatenated kernels change the dots, not the function: the same logits, in NumPy (in a
  process of its own: the script defines absl flags that other in-process scripts define too)."""
  script = str(REPO_ROOT / "benchmarks" / "bench_cpu_dots.py")
  done = subprocess.run(
      [sys.executable, "-c", _SAME_FUNCTION, script], capture_output=True, text=True, timeout=300
  )
  assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-3000:]


def test_bench_cpu_dots_times_every_variant(tmp_path):
  out = run_script(
      "bench_cpu_dots.py", f"--output_dir={tmp_path}", "--ks=1,2", "--repeats=3", "--steps=1"
  )
  record = json.loads((tmp_path / "bench_cpu_dots.json").read_text())
  assert set(record["ms"]) == {
      f"{v} k={k}" for v in ("separate", "fused", "highest", "numpy") for k in (1, 2)
  }
  assert record["cores"] >= 1 and record["weights_mb"] > 60
  assert "| fused |" in out and "XLA_FLAGS=" in out

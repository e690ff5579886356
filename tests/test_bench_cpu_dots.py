"""scripts/bench_cpu_dots.py: the demo target's decoder matmuls per k, in each variant."""

import importlib.util
import json

import numpy as np

from conftest import REPO_ROOT, run_script


def load_script():
  spec = importlib.util.spec_from_file_location(
      "bench_cpu_dots", REPO_ROOT / "scripts" / "bench_cpu_dots.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_fused_chain_computes_what_the_separate_one_does():
  """Concatenated kernels change the dots, not the function: the same logits, in NumPy."""
  dots = load_script()
  params = dots.weights()
  x = np.random.default_rng(1).standard_normal((3, dots.EMB)).astype(np.float32)
  separate = dots.chain(np, params, x, "separate")
  fused = dots.chain(np, dots.fused(params), x, "fused")
  assert separate.shape == (3, dots.VOCAB)
  np.testing.assert_allclose(fused, separate, rtol=1e-4, atol=1e-4)


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

"""benchmarks/bench_interference.py: its flags refused before anything loads, and its stream stage
(the harness's other stages are tested in tests/test_benchmark.py; its timings are
measurements, never asserted)."""

import jax
import jax.numpy as jnp
import numpy as np

from bench_conftest import load_bench
from conftest import ScriptRuns
from speculative_t5x import network
from speculative_t5x.measuring import step_costs


def test_bench_interference_refuses_bad_flags_before_loading(tmp_path):
  cases = {
      "--stream_mb=0": "--stream_mb=['0']: give sizes > 0",
      "--stream_mb=big": "give numbers",
      f"--pair_dir={tmp_path}": "has no target/",
  }
  (tmp_path / "forks").mkdir()
  runs = ScriptRuns(tmp_path / "forks")
  for flag in cases:
    runs.add(flag, "bench_interference.py", f"--output_dir={tmp_path}", flag)
  runs.start()
  try:
    for flag, message in cases.items():
      returncode, _, stderr = runs[flag].result()
      assert returncode == 1, stderr[-2000:]
      assert message in stderr and "Traceback" not in stderr
  finally:
    runs.stop()


def test_a_stream_stage_reads_its_megabytes_and_passes_the_tokens_on():
  """The stage that stands in for a drafter's weights: X MB of float32, every byte read by a
  matrix-vector product each step, timed in the harness's loop beside a target step, where it
  leaves the target's input tokens as they were (the target's own steps are unchanged)."""
  stream = load_bench("bench_interference").StreamStage.of_megabytes(0.5, vocab_size=32)
  assert stream.params.size * 4 == 0.5 * 2**20 and stream.params.dtype == jnp.float32
  target = network.T5Config(
      vocab_size=32, emb_dim=8, num_heads=1, num_decoder_layers=1, head_dim=4, mlp_dim=8
  )
  stage = step_costs.Stage(target, network.init_params(target, jax.random.PRNGKey(0)), 1)
  geometry = step_costs.DecodeGeometry(4, 12, 2, 2)
  alone, args = step_costs.decode_step_call([stage], geometry, temperature=0.0)
  paired, paired_args = step_costs.decode_step_call([stream, stage], geometry, temperature=0.0)
  np.testing.assert_array_equal(alone(*args), paired(*paired_args))

"""benchmarks/bench_interference.py: its flags refused before anything loads (its stages are
benchmark's, tested in tests/test_benchmark.py; its timings are measurements, never asserted)."""

from conftest import ScriptRuns


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

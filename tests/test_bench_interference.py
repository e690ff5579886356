"""scripts/bench_interference.py: its flags refused before anything loads (its stages are
benchmark's, tested in tests/test_benchmark.py; its timings are measurements, never asserted)."""

from conftest import script_process


def test_bench_interference_refuses_bad_flags_before_loading(tmp_path):
  for flags, message in (
      (["--stream_mb=0"], "--stream_mb=['0']: give sizes > 0"),
      (["--stream_mb=big"], "give numbers"),
      ([f"--pair_dir={tmp_path}"], "has no target/"),
  ):
    completed = script_process("bench_interference.py", f"--output_dir={tmp_path}", *flags)
    assert completed.returncode == 1, completed.stderr[-2000:]
    assert message in completed.stderr and "Traceback" not in completed.stderr

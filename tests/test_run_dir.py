"""Tests of speculative_t5x/running/run_dir.py: an output directory is checked before any work, written
all at once, refused when it holds another run's outputs, and never left mixed by an error or an
interrupt."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from conftest import default_sigint
from speculative_t5x import gin_utils
from speculative_t5x.running import run_dir

NAMES = ("results.json", "results.md", "config.gin")
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _listing(path: pathlib.Path) -> list[str]:
  return sorted(p.name for p in path.iterdir())


def test_a_new_directory_is_created_only_when_the_run_writes(tmp_path):
  out = run_dir.OutputDir(tmp_path / "a" / "b", NAMES, "--output_dir").check()
  assert not (tmp_path / "a").exists()
  with out:
    out.stage_text("results.json", "{}")
    out.stage_text("config.gin", "X = 1")
    staged = _listing(tmp_path / "a" / "b")  # hidden until the commit
    assert [name.split(".")[1] for name in staged] == ["config", "results"], staged
    out.commit()
  assert _listing(tmp_path / "a" / "b") == ["config.gin", "results.json"]
  assert (tmp_path / "a" / "b" / "results.json").stat().st_mode & 0o777 == 0o644


def test_another_runs_outputs_are_refused_naming_them(tmp_path):
  (tmp_path / "results.md").write_text("old")
  (tmp_path / "unrelated.txt").write_text("kept")
  with pytest.raises(gin_utils.ConfigError) as error:
    run_dir.OutputDir(tmp_path, NAMES, "--output_dir").check()
  assert str(error.value).startswith(
      f"--output_dir {tmp_path} holds another run's outputs (results.md): give a new directory, "
      "or --overwrite to replace that run whole"
  )


def test_overwrite_replaces_the_other_run_whole(tmp_path):
  for name in NAMES:
    (tmp_path / name).write_text("old")
  (tmp_path / "unrelated.txt").write_text("kept")
  out = run_dir.OutputDir(tmp_path, NAMES, "--output_dir", overwrite=True).check()
  with out:
    out.stage_text("results.json", "new")
    out.commit()
  assert _listing(tmp_path) == ["results.json", "unrelated.txt"]  # no old results.md beside it
  assert (tmp_path / "results.json").read_text() == "new"


def test_an_error_before_commit_leaves_the_old_run_untouched(tmp_path):
  for name in NAMES:
    (tmp_path / name).write_text("old")
  out = run_dir.OutputDir(tmp_path, NAMES, "--output_dir", overwrite=True).check()
  with pytest.raises(KeyboardInterrupt):
    with out:
      out.stage_text("results.json", "new")
      raise KeyboardInterrupt
  assert _listing(tmp_path) == sorted(NAMES)
  assert all((tmp_path / name).read_text() == "old" for name in NAMES)


def test_a_staged_directory_replaces_the_old_one_and_stale_temporaries_go(tmp_path):
  (tmp_path / "model").mkdir()
  (tmp_path / "model" / "old.bin").write_text("old")
  (tmp_path / ".model.deadbeef.tmp").mkdir()  # left by a killed run
  out = run_dir.OutputDir(tmp_path, ("model", "summary.json"), "model_dir", overwrite=True)
  with out:
    staged = out.stage_dir("model")
    staged.mkdir()
    (staged / "new.bin").write_text("new")
    out.stage_text("summary.json", "{}")
    out.commit()
  assert _listing(tmp_path) == ["model", "summary.json"]
  assert _listing(tmp_path / "model") == ["new.bin"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp: tmp / "file", "is a file: give a directory"),
        (
            lambda tmp: tmp / "file" / "out",
            "is under {tmp}/file, which is a file: give a directory",
        ),
        (lambda tmp: pathlib.Path("/proc/speculative_t5x_out"), "cannot be written"),
        (lambda tmp: "", "--output_dir is empty: give a directory"),
    ],
    ids=["a file", "under a file", "under /proc", "empty"],
)
def test_a_location_that_cannot_be_written_is_refused_creating_nothing(tmp_path, make, message):
  (tmp_path / "file").write_text("x")
  path = make(tmp_path)
  with pytest.raises(gin_utils.ConfigError, match=message.format(tmp=tmp_path)):
    run_dir.check_writable(path, "--output_dir")
  assert _listing(tmp_path) == ["file"]


def test_a_read_only_directory_is_refused(tmp_path):
  if os.geteuid() == 0:
    pytest.skip("root writes in read-only directories")
  locked = tmp_path / "locked"
  locked.mkdir(mode=0o500)
  with pytest.raises(gin_utils.ConfigError, match="cannot be written"):
    run_dir.check_writable(locked / "out", "INFER_OUTPUT_DIR")


def test_only_a_run_output_can_be_staged(tmp_path):
  with pytest.raises(ValueError, match="'other.txt' is not one of this run's outputs"):
    run_dir.OutputDir(tmp_path, NAMES, "--output_dir").stage_text("other.txt", "")


_HOLDER = """
import sys, time
from speculative_t5x.running import run_dir
out = run_dir.OutputDir(sys.argv[1], ("a.txt", "b.txt"), "dir", overwrite=True)
with out:
  out.stage_text("a.txt", "new")
  out.stage_text("b.txt", "new")
  with run_dir.signals_held():
    print("holding", flush=True)
    sys.stdin.readline()  # the test sends SIGINT, then this line: the signal lands while held
    out.commit()
  print("not reached", flush=True)
"""


def test_sigint_during_a_commit_waits_for_it_and_then_ends_the_run(tmp_path):
  for name in ("a.txt", "b.txt"):
    (tmp_path / name).write_text("old")
  process = subprocess.Popen(
      [sys.executable, "-c", _HOLDER, str(tmp_path)],
      stdin=subprocess.PIPE,
      preexec_fn=default_sigint,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      cwd=REPO_ROOT,
  )
  try:
    assert process.stdout.readline() == "holding\n"
    process.send_signal(signal.SIGINT)
    start = time.monotonic()
    time.sleep(0.5)  # the child's handler records the signal (it is blocked reading stdin)
    stdout, stderr = process.communicate("commit now\n", timeout=60)
  finally:
    if process.poll() is None:
      process.kill()
  assert process.returncode != 0 and "KeyboardInterrupt" in stderr, stderr
  assert "not reached" not in stdout and time.monotonic() - start < 60
  assert _listing(tmp_path) == ["a.txt", "b.txt"]
  assert [(tmp_path / n).read_text() for n in ("a.txt", "b.txt")] == ["new", "new"]

"""Runs many short script invocations from one process that imported their heavy modules once.

`python tests/script_forks.py JOBS RESULTS`: JOBS is a JSON list of {"script", "argv", "stdout",
"stderr"}. This process imports what the scripts import (TensorFlow through the bootstrap,
seqio, JAX, flax, gin and the package's modules: about 5 CPU-seconds a process), then forks one
child per job. The child points its file descriptors 1 and 2 at the job's files and runs the
script as `python SCRIPT ARGV...` would (`runpy.run_path` as __main__, the script's directory
first on sys.path); its exit status is the script's. RESULTS receives {job index: exit status}.

tests/test_bad_inputs.py runs its refused-settings cases this way, each script's first case
excepted: those run as real processes, so the check that a script prints no TensorFlow start-up
line still sees what the script itself imports first.
"""

import json
import os
import runpy
import sys
import traceback

from speculative_t5x.running import bootstrap

bootstrap.start()  # first, as the scripts do: TensorFlow is imported quietly

# What the scripts import, loaded once here for every child.
import flax  # noqa: F401,E402
import gin  # noqa: F401,E402
import jax  # noqa: F401,E402
import seqio  # noqa: F401,E402
from speculative_t5x import feature_drafter  # noqa: F401,E402
from speculative_t5x.measuring import calibration  # noqa: F401,E402
from speculative_t5x.measuring import step_costs  # noqa: F401,E402
from speculative_t5x.measuring import sweep  # noqa: F401,E402
from speculative_t5x.running import inference  # noqa: F401,E402
from speculative_t5x.text import tasks  # noqa: F401,E402
from speculative_t5x.training import distillation  # noqa: F401,E402
from speculative_t5x.training import training  # noqa: F401,E402
from speculative_t5x.weights import pairs  # noqa: F401,E402


def _exit_status(error: SystemExit) -> int:
  """sys.exit's argument as the process's exit status (a message is printed, status 1)."""
  if error.code is None:
    return 0
  if isinstance(error.code, int):
    return error.code
  print(error.code, file=sys.stderr)
  return 1


def _run_child(job: dict) -> None:
  """In the forked child: runs the job's script with its output in the job's files; never
  returns."""
  status = 1
  try:
    for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
      os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.argv = [job["script"], *job["argv"]]
    sys.path[0] = os.path.dirname(os.path.abspath(job["script"]))
    try:
      runpy.run_path(job["script"], run_name="__main__")
      status = 0
    except SystemExit as e:
      status = _exit_status(e)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # pylint: disable=protected-access


def main(jobs_file: str, results_file: str) -> None:
  with open(jobs_file) as f:
    jobs = json.load(f)
  children = {}
  for index, job in enumerate(jobs):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _run_child(job)
    children[pid] = index
  results = {}
  while children:
    pid, status = os.wait()
    results[children.pop(pid)] = os.waitstatus_to_exitcode(status)
  with open(results_file, "w") as f:
    json.dump(results, f)


if __name__ == "__main__":
  main(*sys.argv[1:])

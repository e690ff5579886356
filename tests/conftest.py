"""Shared test set-up: one CPU device, float32 matmuls, a persistent compilation cache, and the
T5X fixtures beside the project."""

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu (the test extras) compiles for TPU in tests/test_tpu_compile.py: no metadata server to
# ask, and one libtpu per test worker (its lock file would refuse the second).
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "true")
# XLA:CPU at optimization level 0, with its older emitters in place of the fusion emitters. The
# suite's programs are tiny, and on a fresh clone (an empty compilation cache) compiling them took
# about a third of its time under XLA's defaults. Both sides of every comparison run under them, and so do the scripts the tests start
# (they inherit the variable). Flags already in XLA_FLAGS come later in the string, so they win.
FAST_COMPILE = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
    "--xla_cpu_use_fusion_emitters=false"
)
os.environ["XLA_FLAGS"] = f"{FAST_COMPILE} {os.environ.get('XLA_FLAGS', '')}".strip()
# JAX's persistent compilation cache, shared by the test workers and the scripts they start (which
# inherit the variable): a program that compiles in a second or more compiles once per clone.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    str(pathlib.Path(__file__).resolve().parents[1] / ".pytest_cache" / "jax_compilation_cache"),
)

import importlib.util  # noqa: E402

# Tests that compile with XLA:TPU (libtpu, installed by the test extras): skipped where it is not.
requires_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed (pip install -e '.[test]' installs it)",
)

from speculative_t5x.running import bootstrap  # noqa: E402

bootstrap.start()  # as the scripts do: TensorFlow, which seqio imports, imported quietly first
import jax  # noqa: E402
import seqio  # noqa: E402,F401
from flax import traverse_util  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

from speculative_t5x import network  # noqa: E402


def tiny_config(vocab_size: int, **overrides) -> network.T5Config:
  """A tiny T5 1.1 for tests: gated GELU, no dropout, emb_dim 16, 2 heads of 8, mlp_dim 32, one
  encoder layer and two decoder layers; `overrides` set any other T5Config field.

  Tests that compare against fixed seeds or files pass every dimension they depend on.
  """
  fields = dict(
      vocab_size=vocab_size,
      emb_dim=16,
      num_heads=2,
      head_dim=8,
      mlp_dim=32,
      num_encoder_layers=1,
      num_decoder_layers=2,
      mlp_activations=("gelu", "linear"),
      dropout_rate=0.0,
  )
  fields.update(overrides)
  return network.T5Config(**fields)


# The dimensions of T5X's test_t5_tiny.checkpoint_0 (fixtures/t5x/README.md).
FIXTURE_CONFIG = tiny_config(
    32128,
    emb_dim=8,
    num_heads=4,
    head_dim=3,
    mlp_dim=16,
    num_encoder_layers=2,
    num_decoder_layers=2,
)

# A seqio test vocabulary and eight tiny English-German pairs: the training tests' task data.
SEQIO_TEST_VOCABULARY = (
    pathlib.Path(seqio.__file__).parent / "test_data" / "sentencepiece" / "sentencepiece.model"
)
TRANSLATION_PAIRS = [
    ("open file", "datei offen"),
    ("save file", "datei sichern"),
    ("close", "schliessen"),
    ("open window", "fenster offen"),
    ("quit", "beenden"),
    ("help", "hilfe"),
    ("new window", "neues fenster"),
    ("save as", "sichern als"),
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT.parent / "shared" / "fixtures" / "t5x"


SCRIPT_ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")


def default_sigint() -> None:
  """A child process's `preexec_fn`: SIGINT at its default, so the child's Python raises
  KeyboardInterrupt on it. A suite started in the background by a non-interactive shell (`make
  test &`, `nohup`) ignores SIGINT, and children inherit that: a test that interrupts a child
  would otherwise test nothing, or wait forever."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def script_path(script: str) -> pathlib.Path:
  """scripts/`script`, a user's entry point, or else benchmarks/`script`, a lab bench."""
  path = REPO_ROOT / "scripts" / script
  return path if path.exists() else REPO_ROOT / "benchmarks" / script


def script_process(script: str, *flags: str, cwd=None, timeout: int = 600):
  """Runs `script_path(script)` with `flags` in a fresh interpreter on the CPU (in `cwd`, default
  the current directory) -> its subprocess.CompletedProcess (text stdout and stderr)."""
  return subprocess.run(
      [sys.executable, str(script_path(script)), *flags],
      cwd=cwd,
      env=SCRIPT_ENV,
      capture_output=True,
      text=True,
      timeout=timeout,
  )


class ScriptRuns:
  """Many runs of scripts that refuse their settings, started at once: each script's first run as
  its own process (`python scripts/SCRIPT FLAGS`), the others forked from one process that
  imported jax, TensorFlow and seqio once (tests/script_forks.py; importing them was most of
  each run's time). `runs[key].result() -> (exit status, stdout, stderr)`. Only a script's own process
  shows what it prints while importing (TensorFlow's start-up lines)."""

  def __init__(self, directory: pathlib.Path):
    self.directory = directory
    self.jobs, self.keys, self.processes, self.scripts = [], {}, {}, set()
    self.runner, self.results = None, None

  def add(self, key, script: str, *flags: str) -> None:
    command = [str(script_path(script)), *flags]
    if script in self.scripts:
      index = len(self.jobs)
      out, err = (str(self.directory / f"{index}.{name}") for name in ("stdout", "stderr"))
      self.jobs.append({"script": command[0], "argv": command[1:], "stdout": out, "stderr": err})
      self.keys[key] = index
    else:
      self.processes[key] = _popen([sys.executable, *command])
    self.scripts.add(script)

  def start(self) -> None:
    """Starts the forked runs (the others started when added)."""
    if self.jobs:
      jobs, results = self.directory / "jobs.json", self.directory / "results.json"
      jobs.write_text(json.dumps(self.jobs))
      forks = str(REPO_ROOT / "tests" / "script_forks.py")
      self.runner = _popen([sys.executable, forks, str(jobs), str(results)])

  def __getitem__(self, key) -> "_ScriptRun":
    return _ScriptRun(self, key)

  def result(self, key) -> tuple[int, str, str]:
    if key in self.processes:
      process = self.processes[key]
      stdout, stderr = process.communicate(timeout=300)
      return process.returncode, stdout, stderr
    if self.results is None:
      _, stderr = self.runner.communicate(timeout=600)
      assert self.runner.returncode == 0, stderr[-3000:]
      self.results = json.loads((self.directory / "results.json").read_text())
    job = self.jobs[self.keys[key]]
    output = (pathlib.Path(job[name]).read_text() for name in ("stdout", "stderr"))
    return self.results[str(self.keys[key])], *output

  def stop(self) -> None:
    for process in [*self.processes.values(), self.runner]:
      if process is not None and process.poll() is None:
        process.kill()
        process.wait()


@dataclasses.dataclass(frozen=True)
class _ScriptRun:
  runs: ScriptRuns
  key: Any

  def result(self) -> tuple[int, str, str]:
    """-> (exit status, stdout, stderr)."""
    return self.runs.result(self.key)


def _popen(command: list[str]) -> subprocess.Popen:
  pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  return subprocess.Popen(command, cwd=REPO_ROOT, env=SCRIPT_ENV, **pipes)


# The modules of the dependencies setup.py adds to requirements-decoding.txt's (its TASKS): `make
# demo` installs none of them.
NOT_FOR_DECODING = ("seqio", "tensorflow", "tensorflow_datasets", "sacrebleu", "rouge_score")

_WITHOUT_TASKS_DEPENDENCIES = f"""
import importlib.util, sys
class Block:
  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in {NOT_FOR_DECODING!r}:
      raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
find = importlib.util.find_spec
importlib.util.find_spec = lambda n, *a: None if n == 'tensorflow' else find(n, *a)
import os, runpy
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def make_demo_process(script: str, *flags: str, cwd=None, timeout: int = 600):
  """`script_process` as `make demo` runs a script: with the modules of NOT_FOR_DECODING
  unimportable, as where requirements-decoding.txt alone is installed (an import of one fails
  with 'blocked: <module>')."""
  return subprocess.run(
      [sys.executable, "-c", _WITHOUT_TASKS_DEPENDENCIES, str(script_path(script))] + list(flags),
      cwd=cwd or REPO_ROOT,
      env=SCRIPT_ENV,
      capture_output=True,
      text=True,
      timeout=timeout,
  )


def run_script(script: str, *flags: str, cwd=None, timeout: int = 600) -> str:
  """`script_process`, asserting that the script exits with status 0 (showing the end of its
  stderr if not) -> its stdout."""
  completed = script_process(script, *flags, cwd=cwd, timeout=timeout)
  assert completed.returncode == 0, completed.stderr[-4000:]
  return completed.stdout


def require_demo_pair() -> pathlib.Path:
  """demo_models/, which is part of the repository: its absence is a failure, not a skip."""
  pair = REPO_ROOT / "demo_models"
  if not (pair / "target").exists():
    pytest.fail("demo_models/ is missing: it is part of the repository.")
  return pair


def fixture_path(name: str) -> pathlib.Path:
  """Path of a T5X fixture; skips the calling test where ../shared/fixtures/t5x is absent."""
  path = FIXTURES / name
  if not path.exists():
    pytest.skip(
        f"T5X fixture {path} is absent (it ships only beside the project's own clone, "
        "in ../shared/fixtures/t5x); this test needs files written by T5X itself."
    )
  return path


# The checkpoint tests' model (test_checkpoints.py, test_t5x_checkpoints.py): every dimension is
# spelled out.
SMALL_CONFIG = tiny_config(
    40, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=12, num_encoder_layers=1, num_decoder_layers=2
)


@pytest.fixture(scope="module")
def small_params():
  """SMALL_CONFIG's parameters (seed 0) as numpy arrays."""
  params = network.init_params(SMALL_CONFIG, jax.random.PRNGKey(0))
  return jax.tree.map(np.asarray, params)


def flat(tree) -> dict:
  """A nested dict as {'a/b/c': leaf}."""
  return traverse_util.flatten_dict(tree, sep="/")


def assert_trees_equal(actual, expected):
  """Two nested dicts of arrays with the same paths, dtypes and values (exactly)."""
  actual, expected = flat(actual), flat(expected)
  assert actual.keys() == expected.keys()
  for key, value in expected.items():
    assert actual[key].dtype == np.asarray(value).dtype, key
    np.testing.assert_array_equal(actual[key], value, err_msg=key)


def bf16(tree):
  """Every leaf of `tree` cast to bfloat16."""
  return jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16), tree)


def chisquare_pvalue(observed, probabilities, min_expected: float = 5.0) -> float:
  """Pearson goodness-of-fit p-value of counts against exact probabilities.

  Cells whose expected count is below `min_expected` are pooled into one cell, so the chi-square
  approximation holds. Raises AssertionError if any count falls on a probability-0 cell.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  from scipy import stats  # pylint: disable=g-import-not-at-top

  observed = np.asarray(observed, np.float64)
  probabilities = np.asarray(probabilities, np.float64)
  assert observed[probabilities <= 0].sum() == 0, "an outcome of probability 0 was produced"
  expected = probabilities * observed.sum()
  small = expected < min_expected
  obs = np.append(observed[~small], observed[small].sum())
  exp = np.append(expected[~small], expected[small].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  exp *= obs.sum() / exp.sum()  # guard float drift in the probabilities' sum
  return float(stats.chisquare(obs, exp).pvalue)

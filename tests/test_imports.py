"""The package's form: the method imports in a fresh process without the data pipeline, training,
checkpoint or PyTorch libraries; importing the package changes nothing in the process; the code
cites no issue tracker and no journal section. (The import direction itself is checked by
import-linter's contracts in `make lint`, pyproject.toml.)"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

HEAVY = (
    "tensorflow",
    "seqio",
    "tensorflow_datasets",
    "optax",
    "orbax",
    "tensorstore",
    "torch",
    "transformers",
)
METHOD = ("models", "decoding", "drafters", "speculative", "network")


def _fresh(code: str, env: dict | None = None) -> str:
  """Runs `code` in a fresh interpreter -> its stdout (asserting exit status 0)."""
  run = subprocess.run(
      [sys.executable, "-c", code],
      capture_output=True,
      text=True,
      timeout=300,
      env=env if env is not None else os.environ,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  return run.stdout


@pytest.mark.parametrize("module", METHOD)
def test_the_method_imports_without_the_heavy_libraries(module):
  loaded = json.loads(
      _fresh(
          f"import json, sys; import speculative_t5x.{module}; "
          f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
      )
  )
  assert loaded == [], f"importing speculative_t5x.{module} loaded {loaded}"


def test_importing_the_package_changes_no_environment_variable_and_loads_no_tensorflow():
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ("JAX_PLATFORMS", "TPU_SKIP_MDS_QUERY", "TF_CPP_MIN_LOG_LEVEL")
  }
  out = json.loads(
      _fresh(
          "import json, os, sys; before = dict(os.environ); import speculative_t5x; "
          "print(json.dumps([dict(os.environ) == before, 'tensorflow' in sys.modules]))",
          env,
      )
  )
  assert out == [True, False]


def test_the_bootstrap_keeps_jax_off_an_absent_tpu_only_when_called(monkeypatch):
  from speculative_t5x.running import bootstrap  # pylint: disable=g-import-not-at-top

  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.delenv("TPU_SKIP_MDS_QUERY", raising=False)
  monkeypatch.setattr(bootstrap.importlib.util, "find_spec", lambda name: object())
  monkeypatch.setattr(bootstrap, "has_tpu_chip", lambda: False)
  monkeypatch.setattr(bootstrap.os.path, "exists", lambda path: False)  # no /dev/nvidia0
  assert "JAX_PLATFORMS" not in os.environ
  bootstrap.start(tensorflow=False)
  assert os.environ["JAX_PLATFORMS"] == "cpu" and os.environ["TPU_SKIP_MDS_QUERY"] == "1"


# Code states rules, not history: the issue tracker and the journal's section numbers are not
# the users'; figures live in docs/results.md. The guide's pages cite no journal section either.
_HISTORY = re.compile(
    r"\bissues? #?\d+"
    r"|(results_cpu|results_batched_cpu|results_gpu|demo_history|demo_runs)(\.md)?\)?[ ,;(]*(section|§)?\s*\d+",
    re.I,
)


@pytest.mark.parametrize("folder", ["speculative_t5x", "scripts", "benchmarks", "tests", "configs"])
def test_code_cites_no_issue_number_and_no_journal_section(folder):
  cited = [
      f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
      for path in sorted((REPO_ROOT / folder).rglob("*.*"))
      if path.suffix in (".py", ".gin") and path != pathlib.Path(__file__).resolve()
      for number, line in enumerate(path.read_text().splitlines(), 1)
      if _HISTORY.search(line)
  ]
  assert not cited, "\n".join(cited)


def test_the_history_pattern_finds_what_it_must():
  for line in (
      "# see issue 53",
      "(Issue 17's figures)",
      "docs/journal/results_cpu.md 16.6",
      "results_cpu 16.22",
  ):
    assert _HISTORY.search(line), line
  assert not _HISTORY.search("the issue of a slow machine; docs/results.md")


def test_every_module_of_the_package_sits_in_the_import_contract():
  """import-linter's layers contract is exhaustive; this names a module that is not in it."""
  text = (REPO_ROOT / "pyproject.toml").read_text()
  layers = text.split("layers = [", 1)[1].split("]", 1)[0]
  listed = set(re.findall(r"[a-z_]+", re.sub(r"#.*", "", layers)))
  package = pathlib.Path(REPO_ROOT / "speculative_t5x")
  children = {p.stem for p in package.glob("*.py") if p.stem != "__init__"} | {
      p.name for p in package.iterdir() if (p / "__init__.py").exists()
  }
  assert children == listed, (children - listed, listed - children)


def test_the_guide_cites_no_issue_number_and_no_journal_section():
  pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
  cited = [
      f"{page.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
      for page in pages
      for number, line in enumerate(page.read_text().splitlines(), 1)
      if _HISTORY.search(line)
  ]
  assert not cited, "\n".join(cited)

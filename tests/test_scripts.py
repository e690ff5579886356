"""The README's main command and the Table 3 script, end to end on the shipped demo pair."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")


def _run(script, *flags):
  completed = subprocess.run([sys.executable, str(REPO / "scripts" / script), *flags], env=ENV,
                             capture_output=True, text=True, timeout=600)
  assert completed.returncode == 0, completed.stderr[-4000:]
  return completed.stdout


@pytest.fixture(scope="module", autouse=True)
def _demo_pair():
  if not (REPO / "demo_models" / "target").exists():
    pytest.fail("demo_models/ is missing: it is part of the repository.")


def test_demo_translates_and_checks_greedy_equality():
  out = _run("demo.py", "--num_examples=2", "--show=2", "--repeats=1", "--decode_length=24")
  assert "trained demo pair" in out
  assert out.count("  EN  ") == 2 and out.count("  DE  ") == 2
  assert "| temp | gamma | alpha | tokens/call | c | verify | speedup | Thm 3.8 | hw-aware |" in out
  assert "identical to the baseline on all 2 examples: True" in out


def test_measure_alpha_writes_table_3(tmp_path):
  _run("measure_alpha.py", f"--output_dir={tmp_path}", "--num_tokens=100", "--batch_size=8",
       "--ngram_examples=500", "--temperatures=0")
  results = json.loads((tmp_path / "alpha.json").read_text())["t=0"]
  assert set(results) == {"T5 drafter (64d x 1)", "unigram", "bigram"}
  for value in results.values():
    assert 0.0 < value["alpha"] < 1.0 and value["tokens"] >= 100
  assert "| unigram |" in (tmp_path / "alpha.md").read_text()

"""The README's main command, the Table 3 script and the network benchmark, end to end."""
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


def test_bench_network_times_k_token_decodes(tmp_path):
  out = _run("bench_network.py", f"--output_dir={tmp_path}", "--sizes=tiny", "--ks=1,3",
             "--repeats=3", "--steps_per_call=4", "--decode_length=16", "--encoder_length=8")
  (row,) = json.loads((tmp_path / "bench_network.json").read_text())["rows"]
  assert row["size"] == "tiny" and set(row["ms"]) == {"1", "3"}
  assert row["ratio_to_k1"]["1"] == 1.0 and row["ms"]["3"]["median_ms"] > 0
  assert "| tiny |" in out

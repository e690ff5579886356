"""The README's main command, the Table 3 script, the network and batched benchmarks and the demo
pair's evaluation, end to end."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import pytest

from conftest import tiny_config
from speculative_t5x import checkpoints
from speculative_t5x import drafters

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")


def _run(script, *flags):
  completed = subprocess.run(
      [sys.executable, str(REPO / "scripts" / script), *flags],
      env=ENV,
      capture_output=True,
      text=True,
      timeout=600,
  )
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
  assert "| task | drafter | temp | gamma | alpha | tokens/call | c | verify cost |" in out
  for temperature in (0, 1):
    assert f"| demo_ende | demo drafter | {temperature} | 2 |" in out
  assert "identical to the baseline on all 2 examples: True" in out


def test_demo_refuses_a_missing_pair_and_bad_flags_before_loading(tmp_path):
  """No random pair in place of a missing one (that is --random_pair), and every bad flag an
  error with exit status 1 before anything loads; all cases run at once."""
  (tmp_path / "incomplete" / "target").mkdir(parents=True)
  cases = {
      f"--pair_dir={tmp_path / 'nowhere'}": f"--pair_dir={tmp_path / 'nowhere'} does not exist: "
      "give a directory written by checkpoints.save_pair with its sentencepiece.model (the "
      "shipped demo_models/ is the default), or --random_pair for a tiny random pair",
      f"--pair_dir={tmp_path / 'incomplete'}": f"--pair_dir={tmp_path / 'incomplete'} has no "
      "drafter, sentencepiece.model: give a directory",
      "--temperatures=0,-1": "--temperatures=0,-1 (0.0, -1.0): temperature must be >= 0 and finite",
  }
  runs = {
      flags: subprocess.Popen(
          [sys.executable, str(REPO / "scripts" / "demo.py"), *flags.split()],
          env=ENV,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for flags in cases
  }
  for flags, message in cases.items():
    stdout, stderr = runs[flags].communicate(timeout=300)
    assert runs[flags].returncode == 1, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith(f"demo.py: configuration error: {message}")
    assert "Traceback" not in stderr and "[demo]" not in stdout  # Nothing loaded or decoded.


def test_measure_alpha_writes_table_3(tmp_path):
  _run(
      "measure_alpha.py",
      f"--gin.ALPHA_OUTPUT_DIR='{tmp_path}'",
      "--gin.NUM_TOKENS=100",
      "--gin.BATCH_SIZE=8",
      "--gin.NGRAM_FIT_EXAMPLES=500",
      "--gin.TEMPERATURES=(0.0,)",
  )
  results = json.loads((tmp_path / "alpha.json").read_text())["t=0"]
  assert set(results) == {"T5 drafter (64d x 1)", "unigram", "bigram", "prompt lookup"}
  for name, value in results.items():
    assert value["tokens"] >= 100
    assert 0.0 <= value["alpha"] <= 1.0 if name == "prompt lookup" else 0.0 < value["alpha"] < 1.0
  assert "| unigram |" in (tmp_path / "alpha.md").read_text()


def test_calibrate_draft_length_writes_its_choice(tmp_path):
  out = _run(
      "calibrate_draft_length.py",
      f"--gin.CALIBRATION_OUTPUT_DIR='{tmp_path}'",
      "--gin.NUM_TOKENS=50",
      "--gin.TEMPERATURES=(1.0,)",
      "--gin.GAMMAS=(1, 3)",
      "--gin_bindings=calibrate_draft_length.CalibrationSetup.batch_size=4",
      "--gin_bindings=calibrate_draft_length.CalibrationSetup.cost_repeats=3",
  )
  result = json.loads((tmp_path / "calibration.json").read_text())["t=1"]
  assert result["positions"] >= 50 and result["c"] > 0
  assert set(result["verify_cost"]) == {"1", "3"}
  assert result["best"]["speedup"] == max(p["speedup"] for p in result["grid"])
  assert result["best_static"]["threshold"] == 0.0
  assert abs(sum(b["share"] for b in result["buckets"]) - 1.0) < 1e-9
  chosen = (tmp_path / "draft_length_t1.gin").read_text()
  assert f"draft_length.ConfidenceStop.threshold = {result['best']['threshold']:.4f}" in chosen
  assert "| adaptive (chosen) |" in out


def test_bench_network_times_k_token_decodes(tmp_path):
  out = _run(
      "bench_network.py",
      f"--output_dir={tmp_path}",
      "--sizes=tiny",
      "--ks=1,3",
      "--repeats=3",
      "--steps_per_call=4",
      "--decode_length=16",
      "--encoder_length=8",
  )
  (row,) = json.loads((tmp_path / "bench_network.json").read_text())["rows"]
  assert row["size"] == "tiny" and set(row["ms"]) == {"1", "3"}
  assert row["ratio_to_k1"]["1"] == 1.0 and row["ms"]["3"]["median_ms"] > 0
  assert "| tiny |" in out


def test_bench_batched_writes_a_row_per_batch_size(tmp_path):
  out = _run(
      "bench_batched.py",
      f"--output_dir={tmp_path}",
      "--batch_sizes=2",
      "--temperatures=0",
      "--repeats=1",
      "--cost_repeats=3",
      "--steps_per_call=8",
      "--gamma=2",
      "--vocab_size=64",
      "--emb_dim=32",
      "--num_heads=2",
      "--mlp_dim=64",
      "--num_encoder_layers=1",
      "--num_decoder_layers=2",
      "--input_length=8",
      "--decode_length=8",
  )
  results = json.loads((tmp_path / "results.json").read_text())
  (row,) = results["results"]
  assert (row["batch_size"], row["temperature"], row["gamma"]) == (2, 0.0, 2)
  assert row["outputs_match_baseline"] == 1.0  # greedy: identical to the baseline in every row
  assert 0.0 <= row["alpha"] <= 1.0 and row["c"] > 0 and row["verify_cost"] > 0
  base, spec = (
      row[key]["per_example"][0]["median_ms"] for key in ("baseline_ms", "speculative_ms")
  )
  (base_tokens,), (spec_tokens,) = row["baseline_tokens"], row["speculative_tokens"]
  assert row["speedup"] == (base / base_tokens) / (spec / spec_tokens)
  assert row["target_calls_per_row"]["max"] == row["loop_iterations"] >= 1
  assert 0 < row["ragged_efficiency"] <= 1
  assert set(results["costs"]) == {"batch=2"}
  table = (tmp_path / "results.md").read_text()
  assert "| batch | temp |" in table and "| 2 | 0 |" in table and "| yes |" in table
  assert table in out


def _demo_run(tmp_path, member):
  """A scripts/train.py model dir of the demo pair's `member`: model/ and train_summary.json."""
  run = tmp_path / f"{member}_run"
  shutil.copytree(REPO / "demo_models" / member, run / "model")
  shutil.copy(REPO / "demo_models" / member / "train_summary.json", run)
  return run


def test_evaluate_demo_exports_and_evaluates_a_pair(tmp_path):
  """Two 'training runs' made of the demo pair's members, exported into a new pair directory,
  then evaluated on 4 test sentences."""
  runs = {member: _demo_run(tmp_path, member) for member in ("target", "drafter")}
  pair_dir, output_dir = tmp_path / "pair", tmp_path / "out"
  out = _run(
      "evaluate_demo.py",
      f"--target_run={runs['target']}",
      f"--drafter_run={runs['drafter']}",
      f"--pair_dir={pair_dir}",
      f"--output_dir={output_dir}",
      "--max_examples=4",
      "--batch_size=4",
      "--check_examples=2",
      "--gammas=2",
      "--num_inputs=3",
  )
  assert {path.name for path in pair_dir.iterdir()} == {"target", "drafter", "sentencepiece.model"}
  assert (pair_dir / "target" / "train_summary.json").exists()
  report = json.loads((output_dir / "evaluation.json").read_text())
  for member in ("target", "drafter"):
    assert report[member]["examples"] == 4 and report[member]["bleu"] >= 0
  assert report["target"]["parameters"] > report["drafter"]["parameters"]
  assert report["stored_dtypes"] == {"target": ["float32"], "drafter": ["float32"]}
  check = report["greedy_check"]["2"]
  assert check["identical_rows"] == check["rows"] == 2
  assert 0.0 <= check["alpha"] <= 1.0 and check["tokens_per_target_call"] >= 1.0
  lines = (output_dir / "test_inputs.txt").read_text().splitlines()
  assert len(lines) == 3 and all(line.startswith("translate English to German: ") for line in lines)
  assert json.loads(out)["target"]["parameters"] == report["target"]["parameters"]


def test_evaluate_demo_exports_a_shared_encoder_drafter_in_bfloat16(tmp_path):
  """The demo target and a tiny random shared-encoder drafter run, exported with
  --storage_dtype=bfloat16 and restored as float32: the drafter gets a note instead of BLEU (it
  cannot translate alone), and greedy speculative decoding still reproduces the baseline."""
  target_run = _demo_run(tmp_path, "target")
  target_config = checkpoints.read_config(target_run / "model")
  drafter = drafters.SharedEncoderDrafter(
      tiny_config(target_config.vocab_size, num_decoder_layers=1), target_config.emb_dim
  )
  drafter_run = tmp_path / "drafter_run"
  drafter.save_params(drafter_run / "model", drafter.init_params(jax.random.PRNGKey(0), {}))
  (drafter_run / "train_summary.json").write_text(json.dumps({"steps": 0}))
  pair_dir, output_dir = tmp_path / "pair", tmp_path / "out"
  completed = subprocess.run(
      [
          sys.executable,
          str(REPO / "scripts" / "evaluate_demo.py"),
          f"--target_run={target_run}",
          f"--drafter_run={drafter_run}",
          f"--pair_dir={pair_dir}",
          f"--output_dir={output_dir}",
          "--storage_dtype=bfloat16",
          "--max_examples=2",
          "--batch_size=2",
          "--check_examples=2",
          "--gammas=1,3",
          "--num_inputs=1",
      ],
      env=ENV,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert completed.returncode == 0, completed.stderr[-4000:]
  fields = json.loads((pair_dir / "drafter" / "config.json").read_text())
  assert fields["drafter"] == {"kind": "shared_encoder", "encoder_emb_dim": target_config.emb_dim}
  for member in ("target", "drafter"):  # bfloat16 storage; the compute dtype is kept.
    assert checkpoints.stored_dtypes(pair_dir / member) == {"bfloat16"}
    assert json.loads((pair_dir / member / "config.json").read_text())["dtype"] == "float32"
    assert f"{member}: stored as bfloat16, restored as float32" in completed.stderr
  assert (pair_dir / "drafter" / "train_summary.json").exists()
  report = json.loads((output_dir / "evaluation.json").read_text())
  assert report["stored_dtypes"] == {"target": ["bfloat16"], "drafter": ["bfloat16"]}
  note = "reads the target's encoder output: not a standalone translation model"
  assert report["drafter"] == {
      "parameters": report["drafter"]["parameters"],
      "kind": "SharedEncoderDrafter",
      "bleu": None,
      "note": note,
  }
  assert report["drafter"]["parameters"] > 0 and note in completed.stderr
  assert report["target"]["examples"] == 2 and report["target"]["bleu"] >= 0
  assert set(report["greedy_check"]) == {"1", "3"}
  for check in report["greedy_check"].values():
    assert check["identical_rows"] == check["rows"] == 2
  printed = json.loads(completed.stdout)
  assert printed["drafter"] == {
      "parameters": report["drafter"]["parameters"],
      "bleu": None,
      "eval_loss": None,
  }

"""benchmarks/evaluate_demo.py: training runs exported into a pair directory (either drafter kind,
either storage dtype), then its report: BLEU, loss, the greedy check, the stored dtypes and the
benchmark's inputs. What the export writes and the greedy check itself are tests/test_pairs.py's
(`training.export_pair`, `pairs.greedy_check`)."""

import json
import shutil

import jax

from bench_conftest import load_bench
from conftest import require_demo_pair, run_script, script_process, tiny_config
from speculative_t5x import drafters
from speculative_t5x import feature_drafter
from speculative_t5x import table_drafters
from speculative_t5x.weights import checkpoints


def _demo_run(tmp_path, member):
  """A scripts/train.py model dir of the demo pair's `member`: model/ and train_summary.json."""
  run = tmp_path / f"{member}_run"
  pair = require_demo_pair()
  shutil.copytree(pair / member, run / "model")
  shutil.copy(pair / member / "train_summary.json", run)
  return run


def _random_drafter_run(tmp_path, drafter):
  """A scripts/train.py model dir of `drafter` with random weights."""
  run = tmp_path / "drafter_run"
  checkpoints.save_drafter_params(
      drafter, run / "model", drafter.init_params(jax.random.PRNGKey(0), {})
  )
  (run / "train_summary.json").write_text(json.dumps({"steps": 0}))
  return run


def test_evaluate_demo_exports_and_evaluates_a_pair(tmp_path):
  """Two 'training runs', the demo target and a tiny random T5 drafter (an encoder of its own,
  so it translates alone, badly), exported into a new pair directory in float32, then evaluated
  on 4 test sentences."""
  target_run = _demo_run(tmp_path, "target")
  vocab_size = checkpoints.read_config(target_run / "model").vocab_size
  drafter = drafters.T5Drafter(tiny_config(vocab_size, num_decoder_layers=1))
  runs = {"target": target_run, "drafter": _random_drafter_run(tmp_path, drafter)}
  pair_dir, output_dir = tmp_path / "pair", tmp_path / "out"
  out = run_script(
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
  """The demo pair's runs (its drafter reads the target's encoder output), exported with
  --storage_dtype=bfloat16 and restored as float32: the drafter gets a note instead of BLEU (it
  cannot translate alone), and greedy speculative decoding still reproduces the baseline."""
  target_run, drafter_run = (_demo_run(tmp_path, member) for member in ("target", "drafter"))
  pair_dir, output_dir = tmp_path / "pair", tmp_path / "out"
  completed = script_process(
      "evaluate_demo.py",
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
  )
  assert completed.returncode == 0, completed.stderr[-4000:]
  for member in ("target", "drafter"):  # bfloat16 storage; the compute dtype is kept.
    assert f"{member}: stored as bfloat16, restored as float32" in completed.stderr
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


def test_each_drafter_says_whether_it_is_a_model_of_its_own():
  standalone_config = load_bench("evaluate_demo").standalone_config
  config, v = tiny_config(16), 16
  assert standalone_config(drafters.T5Drafter(config)) == config
  others = [
      drafters.SharedEncoderDrafter(config, config.emb_dim),
      feature_drafter.FeatureDrafter(config, config.emb_dim),
      table_drafters.UnigramDrafter(v),
      table_drafters.BigramDrafter(v),
      table_drafters.PromptLookupDrafter(v),
  ]
  assert [standalone_config(d) for d in others] == [None] * len(others)

"""benchmarks/bench_batched.py: the batched benchmark, a row per batch size."""

import json

import numpy as np

from bench_conftest import load_bench
from conftest import run_script
from speculative_t5x import network
from speculative_t5x.measuring import workloads


def test_bench_batched_writes_a_row_per_batch_size(tmp_path):
  # 64 steps per timed call (the cache of a 64-token decode holds them) over 7 rounds: a tiny
  # network's extra steps must outweigh the machine's noise (8 steps over 3 rounds, then 32 over
  # 5, each once gave a negative median step time under load).
  out = run_script(
      "bench_batched.py",
      f"--output_dir={tmp_path}",
      "--batch_sizes=2",
      "--temperatures=0",
      "--repeats=1",
      "--cost_repeats=7",
      "--steps_per_call=64",
      "--gamma=2",
      "--vocab_size=64",
      "--emb_dim=32",
      "--num_heads=2",
      "--mlp_dim=64",
      "--num_encoder_layers=1",
      "--num_decoder_layers=2",
      "--input_length=8",
      "--decode_length=64",
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


def test_truncated_copy_pair_shares_the_first_decoder_layer():
  config = network.T5Config(
      vocab_size=16,
      emb_dim=8,
      num_heads=2,
      num_encoder_layers=1,
      num_decoder_layers=3,
      head_dim=4,
      mlp_dim=8,
      dropout_rate=0.0,
  )
  target, drafter_config, drafter = load_bench("bench_batched").truncated_copy_pair(
      config, 0.5, seed=0
  )
  original = workloads.random_params(config, 0)
  assert drafter_config == config.replace(num_decoder_layers=1)
  assert sorted(name for name in drafter["decoder"] if name.startswith("layers_")) == ["layers_0"]
  assert drafter["decoder"]["layers_0"] is target["decoder"]["layers_0"]
  assert drafter["encoder"] is target["encoder"]
  for layer in ("layers_1", "layers_2"):
    for block, kernel in (("self_attention", "out"), ("mlp", "wo")):
      scaled = target["decoder"][layer][block][kernel]["kernel"]
      np.testing.assert_allclose(scaled, 0.5 * original["decoder"][layer][block][kernel]["kernel"])
  np.testing.assert_array_equal(
      target["decoder"]["layers_0"]["mlp"]["wo"]["kernel"],
      original["decoder"]["layers_0"]["mlp"]["wo"]["kernel"],
  )

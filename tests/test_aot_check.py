"""scripts/aot_check.py end to end on a tiny pair: the speculative decode lowered and compiled for
a 2-device model-parallel mesh from abstract parameters, with a T5 drafter and, switched by one
gin file, a bigram drafter; its report, and exit status 1 when the memory does not fit.

Both runs go at once, in subprocesses (the script sets the simulated device count before JAX
starts, and defines absl flags of the same names as other scripts)."""

import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np

from conftest import SCRIPT_ENV
from conftest import requires_libtpu
from conftest import tiny_config
from speculative_t5x import network
from speculative_t5x import table_drafters

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB_SIZE = 64
TINY = tiny_config(
    VOCAB_SIZE,
    emb_dim=8,
    num_heads=4,
    head_dim=3,
    mlp_dim=16,
    num_encoder_layers=2,
    num_decoder_layers=2,
)  # t5_1_1_tiny.gin
MODEL_PARALLEL = {"vocab", "mlp", "heads", "joined_kv"}  # split over 'model' by the standard rules
BFLOAT16 = 2


def _start(output_dir, *flags):
  command = [
      sys.executable,
      str(REPO_ROOT / "scripts" / "aot_check.py"),
      "--gin_file=configs/runs/aot_xxl.gin",
      "--gin_file=configs/models/t5_1_1_tiny.gin",
      *flags,
      "--gin.TARGET_CONFIG=%T5_1_1_TINY",
      f"--gin.VOCAB_SIZE={VOCAB_SIZE}",
      "--gin.NUM_PARTITIONS=2",
      "--num_devices=2",
      "--gin.aot_script.AotSetup.gamma=3",
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 4}",
      f"--gin.AOT_OUTPUT_DIR='{output_dir}'",
  ]
  return subprocess.Popen(
      command,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      cwd=REPO_ROOT,
      env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3"),
  )


def _leaves(tree) -> list[tuple]:
  return jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, tuple))


def _t5_bytes_per_device(config, model_parallel: bool) -> int:
  """bfloat16 bytes of one device's shards of a T5's parameters: halved where a parameter has a
  model-parallel axis, if the model is split."""
  sizes = [
      math.prod(shape) // (2 if model_parallel and MODEL_PARALLEL & set(names) else 1)
      for shape, names in zip(
          _leaves(network.param_shapes(config)), _leaves(network.param_axes(config))
      )
  ]
  return BFLOAT16 * sum(sizes)


def test_aot_check_compiles_any_drafter_and_reports_memory(tmp_path):
  t5_dir, bigram_dir = tmp_path / "t5", tmp_path / "bigram"
  t5_run = _start(t5_dir, "--gin.DRAFTER_CONFIG=%T5_1_1_TINY")
  bigram_run = _start(
      bigram_dir, "--gin_file=configs/drafters/bigram.gin", "--gin.aot_script.AotSetup.hbm_gib=1e-6"
  )
  outputs = {"t5": t5_run.communicate(timeout=300), "bigram": bigram_run.communicate(timeout=300)}
  assert t5_run.returncode == 0, outputs["t5"][1][-3000:]
  assert bigram_run.returncode == 1, outputs["bigram"][1][-3000:]

  reports = {
      name: json.loads((directory / "aot_check.json").read_text())
      for name, directory in (("t5", t5_dir), ("bigram", bigram_dir))
  }
  target = _t5_bytes_per_device(TINY, model_parallel=True)
  assert target < _t5_bytes_per_device(TINY, model_parallel=False)
  bigram = table_drafters.BigramDrafter(vocab_size=VOCAB_SIZE).fit_params([])
  drafter_bytes = {  # replicated: whole on each device
      "t5": _t5_bytes_per_device(TINY, model_parallel=False),
      "bigram": sum(
          value.size
          * (BFLOAT16 if np.issubdtype(value.dtype, np.floating) else value.dtype.itemsize)
          for value in bigram.values()
      ),
  }
  for name, report in reports.items():
    assert report["mesh"] == {"data": 1, "model": 2}
    assert len(set(report["devices"])) == 2
    assert report["target_params_per_device_bytes"] == target
    assert report["drafter_params_per_device_bytes"] == drafter_bytes[name]
    assert report["module_problems"] == []
    sizes = report["memory_analysis_bytes"]
    assert report["peak_per_device_bytes"] == (
        sizes["argument"] + sizes["output"] + sizes["temp"] - sizes["alias"]
    )
    assert sizes["argument"] >= target + drafter_bytes[name]
  assert reports["t5"]["ok"] and reports["t5"]["fits"]
  assert not reports["bigram"]["fits"] and not reports["bigram"]["ok"]
  assert "DRAFTER = @drafters.BigramDrafter()" in reports["bigram"]["gin_config"]
  markdown = (bigram_dir / "aot_check.md").read_text()
  assert "drafter BigramDrafter" in markdown and "DOES NOT FIT" in markdown
  assert "fits (" in (t5_dir / "aot_check.md").read_text()


TPU_SHAPED = [  # tiny, but in XLA:TPU's (8, 128) tiles (tests/test_aot.py)
    "--gin.t5_1_1_tiny/network.T5Config.emb_dim=128",
    "--gin.t5_1_1_tiny/network.T5Config.num_heads=8",
    "--gin.t5_1_1_tiny/network.T5Config.head_dim=64",
    "--gin.t5_1_1_tiny/network.T5Config.mlp_dim=256",
    "--gin.t5_1_1_tiny/network.T5Config.dtype='bfloat16'",
]


@requires_libtpu
def test_aot_check_compiles_for_a_two_host_tpu_slice_from_one_process(tmp_path):
  run = subprocess.run(
      [
          sys.executable,
          str(REPO_ROOT / "scripts" / "aot_check.py"),
          "--topology=v4-16",
          "--gin_file=configs/runs/aot_xxl.gin",
          "--gin_file=configs/models/t5_1_1_tiny.gin",
          "--gin.TARGET_CONFIG=%T5_1_1_TINY",
          "--gin.DRAFTER_CONFIG=%T5_1_1_TINY",
          "--gin.VOCAB_SIZE=256",
          "--gin.NUM_PARTITIONS=8",
          "--gin.aot_script.AotSetup.gamma=3",
          "--gin.aot_script.AotSetup.temperature=0.0",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
          f"--gin.AOT_OUTPUT_DIR='{tmp_path}'",
          *TPU_SHAPED,
      ],
      capture_output=True,
      text=True,
      cwd=REPO_ROOT,
      env=SCRIPT_ENV,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  report = json.loads((tmp_path / "aot_check.json").read_text())
  assert report["compiler"] == "XLA:TPU (v4-16)"
  assert report["mesh"] == {"data": 1, "model": 8} and report["processes"] == 2
  assert report["hbm_bytes"] == 32 * 2**30 and report["fits"]
  assert report["hlo_report"]["problems"] == [] and report["hlo_report"]["loops"]
  assert (tmp_path / "optimized_hlo.txt").stat().st_size > 0
  markdown = (tmp_path / "aot_check.md").read_text()
  assert "temperature 0 (greedy program)" in markdown and "2 process(es)" in markdown


def test_aot_check_refuses_an_unknown_slice_or_paper_row_before_compiling(tmp_path):
  for flag, message in (
      ("--topology=v4-9", "unknown TPU slice 'v4-9'"),
      ("--paper_row=ende_tiny_t0", "is not a Table 2 row"),
  ):
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "aot_check.py"), flag],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=SCRIPT_ENV,
        timeout=120,
    )
    assert run.returncode != 0 and message in run.stderr, run.stderr[-2000:]

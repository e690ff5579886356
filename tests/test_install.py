"""The package installed with `pip install .` (not editable) works from any working directory: it
finds its gin configs and the demo task's data as package data, and a script that starts as the
scripts do (`bootstrap.start()`) prints nothing while importing it."""

import os
import pathlib
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

_USE_INSTALLED = """
import pathlib, sys
from speculative_t5x.running import bootstrap
bootstrap.start()
import speculative_t5x
from speculative_t5x import gin_utils
from speculative_t5x.running import inference
from speculative_t5x.text import demo_data
from speculative_t5x.text import tasks

package = pathlib.Path(speculative_t5x.__file__).parent
assert package.is_relative_to(sys.argv[1]), package  # the installed copy, not the clone
gin_utils.parse_gin_flags(
    ["configs/runs/infer.gin", "configs/drafters/bigram.gin", "configs/models/t5_1_1_tiny.gin",
     "configs/tasks/demo_ende.gin"],
    ["TARGET_CONFIG = %T5_1_1_TINY", "CHECKPOINT_PATH = None", "RANDOM_INIT_SEED = 0",
     "INFER_OUTPUT_DIR = '/tmp/unused'"])
config = inference.InferConfig()
example = next(tasks.get_task(config.mixture_or_task_name).get_dataset(
    {"inputs": 32, "targets": 32}, split="test", shuffle=False).as_numpy_iterator())
print(gin_utils.config_root(), demo_data.demo_data_dir(), len(example["inputs"]) > 0)
"""


def test_installed_package_finds_configs_and_demo_data(tmp_path):
  site = tmp_path / "site"
  subprocess.run(
      [
          sys.executable,
          "-m",
          "pip",
          "install",
          "--quiet",
          "--no-deps",
          "--no-build-isolation",
          "--target",
          str(site),
          str(REPO_ROOT),
      ],
      check=True,
      cwd=tmp_path,
      capture_output=True,
  )
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = dict(os.environ, PYTHONPATH=str(site))
  result = subprocess.run(
      [sys.executable, "-c", _USE_INSTALLED, str(site)],
      cwd=elsewhere,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert result.returncode == 0, result.stderr
  config_root, data_dir, has_inputs = result.stdout.split()
  assert pathlib.Path(config_root) == site / "speculative_t5x"
  assert pathlib.Path(data_dir) == site / "speculative_t5x" / "data" / "demo_ende"
  assert has_inputs == "True"
  # TensorFlow's start-up lines (CUDA, CPU features, oneDNN) are dropped on import.
  for chatter in ("cudart_stub", "cuInit", "cpu_feature_guard", "oneDNN"):
    assert chatter not in result.stderr, result.stderr

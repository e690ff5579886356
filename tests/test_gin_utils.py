"""Gin on the command line (speculative_t5x/gin_utils.py): the --gin.NAME=value shorthand, macros
left %gin.REQUIRED named, search paths that find configs/ from any working directory, and `run`
ending a configuration error with its message and exit status 1."""

import os
import pathlib
import subprocess
import sys
import textwrap

import gin
import pytest

from speculative_t5x import gin_utils
from speculative_t5x import network

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clear_gin(monkeypatch):
  """A clear gin config, and sys.path as a script has it: `python -m pytest` puts the repository
  root there, which makes configs/ a namespace package that gin's package-resource lookup of
  'configs/...' fails on (a script's sys.path starts with its own directory instead)."""
  monkeypatch.setattr(
      sys, "path", [p for p in sys.path if p and pathlib.Path(p).resolve() != REPO_ROOT]
  )
  gin.clear_config()
  yield
  gin.clear_config()


def test_rewrite_gin_args():
  assert gin_utils.rewrite_gin_args(
      ["infer.py", "--gin.GAMMA=3", "--gin_file=a.gin", "--gin.NAME='a=b'"]
  ) == ["infer.py", "--gin_bindings=GAMMA = 3", "--gin_file=a.gin", "--gin_bindings=NAME = 'a=b'"]
  with pytest.raises(gin_utils.ConfigError, match="--gin.GAMMA has no value"):
    gin_utils.rewrite_gin_args(["--gin.GAMMA"])


def test_config_root_is_the_repository_in_a_clone():
  assert gin_utils.config_root() == REPO_ROOT
  assert gin_utils.search_paths() == [os.getcwd(), str(REPO_ROOT)]


def test_required_macros_are_named_before_finalizing():
  files = ["configs/runs/infer.gin", "configs/tasks/wmt_ende.gin"]
  with pytest.raises(
      gin_utils.ConfigError,
      match=r"gin macro\(s\) CHECKPOINT_PATH, DRAFTER, "
      r"INFER_OUTPUT_DIR, TARGET_CONFIG are %gin.REQUIRED but not set: bind them, "
      r"e.g. --gin.CHECKPOINT_PATH=",
  ):
    gin_utils.parse_gin_flags(files)
  assert gin_utils.unset_required_macros() == [
      "CHECKPOINT_PATH",
      "DRAFTER",
      "INFER_OUTPUT_DIR",
      "TARGET_CONFIG",
  ]
  assert not gin.config_is_locked()
  gin.clear_config()
  gin_utils.parse_gin_flags(
      files,
      [
          "CHECKPOINT_PATH = None",
          "INFER_OUTPUT_DIR = '/tmp/o'",
          "TARGET_CONFIG = None",
          "DRAFTER = None",
      ],
  )
  assert gin.config_is_locked() and gin_utils.unset_required_macros() == []
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "wmt_t2t_ende_v003"


def test_default_files_and_bad_files_are_configuration_errors(tmp_path, monkeypatch):
  with pytest.raises(gin_utils.ConfigError, match="no gin file given"):
    gin_utils.parse_gin_flags(None)
  with pytest.raises(gin_utils.ConfigError, match="Unable to open file: configs/runs/nope.gin"):
    gin_utils.parse_gin_flags(["configs/runs/nope.gin"])
  with pytest.raises(gin_utils.ConfigError, match="No configurable matching 'nowhere.Nothing'"):
    gin_utils.parse_gin_flags(
        [], ["nowhere.Nothing.x = 1"], default_files=["configs/models/t5_1_1_tiny.gin"]
    )
  gin.clear_config()
  gin_utils.parse_gin_flags(
      None, ["VOCAB_SIZE = 64"], default_files=["configs/models/t5_1_1_tiny.gin"]
  )
  assert gin.query_parameter("%VOCAB_SIZE") == 64


def test_search_paths_find_configs_from_another_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "mine.gin").write_text(textwrap.dedent("""\
      include 'configs/models/t5_1_1_tiny.gin'
      VOCAB_SIZE = 40
      """))
  gin_utils.parse_gin_flags(["mine.gin"])
  with gin.config_scope("t5_1_1_tiny"):
    tiny = network.T5Config()
  assert (tiny.vocab_size, tiny.emb_dim, tiny.num_heads) == (40, 8, 4)


def test_the_working_directory_comes_before_the_shipped_configs(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  shadow = tmp_path / "configs" / "models"
  shadow.mkdir(parents=True)
  (shadow / "t5_1_1_tiny.gin").write_text("from speculative_t5x import network\nVOCAB_SIZE = 7\n")
  gin_utils.parse_gin_flags(["configs/models/t5_1_1_tiny.gin"])
  assert gin.query_parameter("%VOCAB_SIZE") == 7
  assert "T5_1_1_TINY" not in gin.config_str()  # the shipped file was not read


def test_resolve_path(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert gin_utils.resolve_path("demo_models/target") == str(REPO_ROOT / "demo_models" / "target")
  (tmp_path / "demo_models" / "target").mkdir(parents=True)
  assert gin_utils.resolve_path("demo_models/target") == str(tmp_path / "demo_models" / "target")
  for path in ("gs://bucket/checkpoint_1", "/abs/nowhere", "nowhere/relative"):
    assert gin_utils.resolve_path(path) == path


# gin_utils imports nothing else of the package: loaded from its file, it spares the subprocess
# the package's TensorFlow import.
_SCRIPT = """
import importlib.util
from absl import flags
spec = importlib.util.spec_from_file_location("gin_utils", {path!r})
gin_utils = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gin_utils)
flags.DEFINE_multi_string("gin_bindings", [], "")
def main(argv):
  print("bindings", flags.FLAGS.gin_bindings)
  if flags.FLAGS.gin_bindings == ["BAD = 1"]:
    raise gin_utils.ConfigError("BAD must not be set")
gin_utils.run(main)
"""


def test_run_ends_configuration_errors_with_their_message(tmp_path):
  script = tmp_path / "check.py"
  script.write_text(_SCRIPT.format(path=gin_utils.__file__))
  cases = {
      "--gin.GOOD='x'": (0, None),
      "--gin.BAD=1": (1, "check.py: configuration error: BAD must not be set"),
      "--gin.BAD": (1, "check.py: --gin.BAD has no value: write --gin.BAD=value"),
  }
  runs = {
      flag: subprocess.Popen(
          [sys.executable, str(script), flag],
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
          env=dict(os.environ, JAX_PLATFORMS="cpu"),
      )
      for flag in cases
  }
  for flag, (code, last_line) in cases.items():
    stdout, stderr = runs[flag].communicate(timeout=120)
    assert runs[flag].returncode == code, stderr
    if last_line is None:
      assert "bindings [\"GOOD = 'x'\"]" in stdout
    else:
      assert stderr.strip().splitlines()[-1] == last_line
      assert "Traceback" not in stderr

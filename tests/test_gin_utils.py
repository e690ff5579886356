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


# ----------------------------------------------------------------------------------------------
# Unknown macros and unused bindings: errors that list close matches, never silently ignored.
# ----------------------------------------------------------------------------------------------
TINY_GIN = "configs/models/t5_1_1_tiny.gin"


@pytest.mark.parametrize(
    "files, bindings, message",
    [
        (
            # infer.gin leaves macros %gin.REQUIRED: the misspelling is named before them.
            ["configs/runs/infer.gin"],
            ["TEMPRATURE = 1.0"],
            r"TEMPRATURE is bound on the command line but nothing in this run reads it \(did "
            r"you mean TEMPERATURE\?\)",
        ),
        (
            # A macro the shipped configs know, which this run does not read.
            [TINY_GIN],
            ["GAMMA = 3"],
            r"GAMMA is bound on the command line but nothing in this run reads it\n",
        ),
        (
            [TINY_GIN],
            ["t5_1_1_tiny/network.T5Config.emb_dim = %EMB_DIMM", "EMB_DIM = 4"],
            r"EMB_DIM is bound on the command line but nothing in this run reads it "
            r"\(did you mean EMB_DIMM\?\)\n  %EMB_DIMM is read but never bound \(did you mean "
            r"EMB_DIM\?\)",
        ),
    ],
    ids=["misspelt", "unread_here", "read_but_unbound"],
)
def test_unknown_macros_are_named_with_close_matches(files, bindings, message):
  with pytest.raises(gin_utils.ConfigError, match=rf"^unknown gin macro\(s\):\n  {message}"):
    gin_utils.parse_gin_flags(files, bindings)
  assert not gin.config_is_locked()


def test_a_misspelt_macro_in_a_gin_file_is_named(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "mine.gin").write_text(f"include '{TINY_GIN}'\nVOCAB_SIZ = 40\n")
  with pytest.raises(
      gin_utils.ConfigError,
      match=r"VOCAB_SIZ is bound in a gin file but no config knows it \(did you mean VOCAB_SIZE or",
  ):
    gin_utils.parse_gin_flags(["mine.gin"])


# Shipped files alone, as overlays and with the command lines their comments and the scripts'
# docstrings document: no macro is reported. (Command lines that bind macros only the scripts'
# configurables read run in the scripts' own tests, e.g. tests/test_measure_alpha.py.)
DOCUMENTED = [
    ([path], [])
    for path in sorted(str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.glob("configs/**/*.gin"))
] + [
    (
        ["configs/paper/ende_small_t0.gin"],
        ["CHECKPOINT_PATH = 'gs://b/t'", "DRAFTER_CHECKPOINT_PATH = 'gs://b/d'"],
    ),
    (["configs/paper/ende_small_t0.gin", "configs/drafters/bigram.gin"], ["CHECKPOINT_PATH = 'a'"]),
    (["configs/paper/cnndm_base_t0.gin", "configs/runs/baseline.gin"], ["CHECKPOINT_PATH = 'a'"]),
    (
        ["configs/runs/benchmark.gin", "configs/paper/cnndm_base_t0.gin"],
        ["CHECKPOINT_PATH = 'a'", "DRAFTER_CHECKPOINT_PATH = 'b'", "INFER_OUTPUT_DIR = None"],
    ),
    (["configs/demo/benchmark.gin", "configs/runs/benchmark_verifiers.gin"], []),
    (["configs/runs/aot_xxl.gin", "configs/drafters/bigram.gin"], ["NUM_PARTITIONS = 8"]),
    (
        [
            "configs/runs/infer.gin",
            "configs/drafters/t5.gin",
            TINY_GIN,
            "configs/tasks/demo_ende.gin",
        ],
        [
            "TARGET_CONFIG = %T5_1_1_TINY",
            "DRAFTER_CONFIG = %T5_1_1_TINY",
            "CHECKPOINT_PATH = None",
            "DRAFTER_CHECKPOINT_PATH = None",
            "RANDOM_INIT_SEED = 0",
        ],
    ),
]


def test_shipped_configs_and_documented_commands_have_no_unknown_macro():
  for search_path in gin_utils.search_paths():
    gin.add_config_file_search_path(search_path)
  for files, bindings in DOCUMENTED:
    gin.clear_config()
    # The scripts' own configurables (benchmark_script, ...) are not imported here: skipping
    # their bindings leaves only macros the shipped configs know unread, which is allowed.
    gin.parse_config_files_and_bindings(files, bindings, finalize_config=False, skip_unknown=True)
    gin_utils.check_macros(command_line=[b.split(" =")[0] for b in bindings])


def _tiny_run(bindings, call=lambda: network.T5Config(), files=(TINY_GIN,)):
  """Parses `files` and command-line `bindings`, calls `call` in the tiny model's scope."""
  gin_utils.parse_gin_flags(list(files), bindings)
  with gin.config_scope("t5_1_1_tiny"):
    call()


@pytest.mark.parametrize(
    "bindings, call, message",
    [
        (
            ["t5_1_1_tny/network.T5Config.emb_dim = 4"],  # A scope no call enters.
            lambda: network.T5Config(),
            r"t5_1_1_tny/T5Config.emb_dim \(given on the command line\) \(did you mean "
            r"t5_1_1_tiny/T5Config.emb_dim or",
        ),
        (
            ["network.T5Config.dropout_rate = 0.5"],  # t5_1_1_tiny/ binds it more specifically.
            lambda: network.T5Config(),
            r"T5Config.dropout_rate \(given on the command line\) \(did you mean "
            r"t5_1_1_tiny/T5Config.dropout_rate\?\)",
        ),
        (
            ["t5_1_1_tiny/network.T5Config.head_dim = 2"],  # The caller always sets it.
            lambda: network.T5Config(head_dim=3),
            r"t5_1_1_tiny/T5Config.head_dim \(given on the command line\)",
        ),
    ],
    ids=["scope_typo", "overridden_by_a_scope", "overridden_by_the_caller"],
)
def test_unused_command_line_bindings_are_named_with_close_matches(bindings, call, message):
  _tiny_run(bindings, call)
  with pytest.raises(
      gin_utils.ConfigError, match=rf"^gin binding\(s\) this run never used:\n  {message}"
  ):
    gin_utils.check_unused_bindings()


def test_gin_file_bindings_must_be_used_only_where_their_configurable_is_called(
    tmp_path, monkeypatch
):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "mine.gin").write_text(
      f"include '{TINY_GIN}'\n"
      "other/network.T5Config.emb_dim = 4  # never called in scope other/: allowed\n"
      "network.T5Config.mlp_dim = 7  # t5_1_1_tiny/ binds it for the one call: unused\n"
  )
  _tiny_run([], files=["mine.gin"])
  with pytest.raises(
      gin_utils.ConfigError,
      match=r"never used:\n  T5Config.mlp_dim \(bound in a gin file\) \(did you mean "
      r"t5_1_1_tiny/T5Config.mlp_dim or [^\n]*\)\nBind a parameter",
  ):
    gin_utils.check_unused_bindings()
  gin.clear_config()
  _tiny_run(["t5_1_1_tiny/network.T5Config.emb_dim = 12"])  # Used: no error.
  gin_utils.check_unused_bindings()


_GIN_SCRIPT = """
import importlib.util
import gin
from absl import flags
spec = importlib.util.spec_from_file_location("gin_utils", {path!r})
gin_utils = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gin_utils)
flags.DEFINE_multi_string("gin_bindings", [], "")

@gin.configurable
def step(size=1):
  print("size", size)

def main(argv):
  gin_utils.parse_gin_flags([{gin_file!r}], flags.FLAGS.gin_bindings)
  step()
gin_utils.run(main)
"""


def test_run_exits_1_on_an_unknown_macro_or_an_unused_binding(tmp_path):
  (tmp_path / "run.gin").write_text("SIZE = 2\nstep.size = %SIZE\n")
  script = tmp_path / "run.py"
  script.write_text(_GIN_SCRIPT.format(path=gin_utils.__file__, gin_file=str(tmp_path / "run.gin")))
  cases = {
      "--gin.SIZE=3": (0, "size 3"),
      "--gin.SIZ=3": (
          1,
          "  SIZ is bound on the command line but nothing in this run reads it (did "
          "you mean SIZE?)",
      ),
      "--gin.big/step.size=3": (
          1,
          "  big/step.size (given on the command line) (did you mean " "step.size?)",
      ),
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
  for flag, (code, line) in cases.items():
    stdout, stderr = runs[flag].communicate(timeout=120)
    assert runs[flag].returncode == code, stderr
    assert line in (stdout if code == 0 else stderr).splitlines(), stderr
    if code:
      assert "run.py: configuration error: " in stderr and "Traceback" not in stderr


@gin.configurable(module="gin_utils_test")
def later_step(size=1):
  return size


def test_the_early_check_leaves_the_configurables_still_to_call_to_the_final_one():
  """A script checks its bindings before any work with `later`, the configurables its work may
  still call: their bindings wait for the check after `main`; every other one is judged now."""
  _tiny_run(["gin_utils_test.later_step.size = 2", "t5_1_1_tny/network.T5Config.emb_dim = 4"])
  with pytest.raises(gin_utils.ConfigError, match=r"never used:\n  t5_1_1_tny/T5Config.emb_dim"):
    gin_utils.check_unused_bindings(later=[later_step])  # judged now: not a later configurable
  gin.clear_config()
  _tiny_run(["gin_utils_test.later_step.size = 2"])
  gin_utils.check_unused_bindings(later=[later_step])  # not called yet: left to the final check
  with pytest.raises(gin_utils.ConfigError, match=r"never used:\n  later_step.size \(given"):
    gin_utils.check_unused_bindings()  # the final check: it was never called
  assert later_step() == 2
  gin_utils.check_unused_bindings()
  with pytest.raises(ValueError, match="'no_such_thing' is not a gin configurable"):
    gin_utils.check_unused_bindings(later=["no_such_thing"])


@gin.configurable(module="gin_utils_test")
def referred_size(size=1):
  return size


def test_what_the_bindings_of_a_later_configurable_refer_to_waits_for_the_final_check():
  """A configurable that a later one's binding refers to, here through a macro, is called when
  the later one is: its bindings wait for the final check too."""
  _tiny_run(
      [
          "SIZE = @gin_utils_test.referred_size()",
          "gin_utils_test.later_step.size = %SIZE",
          "gin_utils_test.referred_size.size = 3",
      ]
  )
  gin_utils.check_unused_bindings(later=[later_step])
  with pytest.raises(
      gin_utils.ConfigError,
      match=r"never used:\n  later_step.size \(given.*\n  referred_size.size \(given",
  ):
    gin_utils.check_unused_bindings(later=[])  # nothing later: both judged now, neither called
  assert later_step() == 3
  gin_utils.check_unused_bindings()


@gin.configurable(module="gin_utils_test")
def needs_settings(size=gin.REQUIRED, name=gin.REQUIRED):
  return size, name


def test_settings_left_unbound_name_the_missing_run_file(tmp_path, monkeypatch):
  """An overlay given alone (a model, drafter or task file without its run file) leaves a run's
  gin.REQUIRED settings unbound: gin's RuntimeError becomes a ConfigError naming them, the files
  given and the fix; `run` ends with it (tests/test_bad_inputs.py runs the scripts)."""
  monkeypatch.chdir(tmp_path)
  gin_utils.parse_gin_flags([TINY_GIN])
  with pytest.raises(RuntimeError) as raised:
    needs_settings()
  error = gin_utils.unbound_required_settings(raised.value)
  assert isinstance(error, gin_utils.ConfigError)
  assert str(error).startswith(
      f"needs_settings needs ['size', 'name'], which no gin file of this run binds (files: "
      f"{TINY_GIN}): give the run file that binds them first"
  )
  assert gin_utils.unbound_required_settings(RuntimeError("another failure")) is None


def test_a_command_line_macro_no_file_reads_points_at_a_missing_run_file():
  with pytest.raises(
      gin_utils.ConfigError,
      match=r"ALPHA_OUTPUT_DIR is bound on the command line but nothing in this run reads it"
      rf"(.|\n)*The gin files parsed \({TINY_GIN}\) read none of ALPHA_OUTPUT_DIR: if a run file "
      r"that reads them is missing, give it first",
  ):
    gin_utils.parse_gin_flags([TINY_GIN], ["ALPHA_OUTPUT_DIR = '/tmp/x'"])

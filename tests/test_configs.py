"""Every gin file under configs/ parses and binds; the paper's files match its Table 2; one file of
configs/drafters/ per drafter kind switches a run's drafter.

"Binds" means: with test values for the macros a file leaves %gin.REQUIRED, the config finalizes,
every macro evaluates (model macros build their T5Configs, DRAFTER its drafter) and every
dataclass the file configures without a scope (inference.InferConfig, pairs.PairConfig, the
drafters, the scripts' setups) constructs and validates.

Files whose configurables live in a script (scripts/measure_alpha.py's `measure_alpha`, ...) are
checked in a subprocess that imports the scripts one at a time, removing each one's absl flags
before the next: scripts define flags of the same names, which must not meet in the pytest process.
"""

import dataclasses
import inspect
import json
import pathlib
import re
import subprocess
import sys

import gin
import pytest

from speculative_t5x import drafters
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x import table_drafters
from speculative_t5x.projections import paper
from speculative_t5x.running import inference
from speculative_t5x.text import tasks
from speculative_t5x.weights import checkpoints

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
GIN_FILES = sorted(
    str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "configs").rglob("*.gin")
)
# What a command line would give for the macros run files leave %gin.REQUIRED.
REQUIRED_VALUES = {
    "MIXTURE_OR_TASK_NAME": "'wmt_t2t_ende_v003'",
    "TASK_FEATURE_LENGTHS": "{'inputs': 8, 'targets': 8}",
    "CHECKPOINT_PATH": "'/checkpoints/target'",
    "DRAFTER_CHECKPOINT_PATH": "'/checkpoints/drafter'",
    "INFER_OUTPUT_DIR": "'/tmp/infer'",
    "TARGET_CONFIG": "@network.T5Config()",
    "DRAFTER_CONFIG": "@network.T5Config()",
    "DRAFTER": "@drafters.BigramDrafter()",
    "MODEL_CONFIG": "@network.T5Config()",
    "REFERENCES_DRAFTER": "'/checkpoints/references_drafter'",
    "DISTILLED_DRAFTER": "'/checkpoints/distilled_drafter'",
    "DISTILLSPEC_DRAFTER": "'/checkpoints/distillspec_drafter'",
    "SHARED_ENCODER_DRAFTER": "'/checkpoints/shared_encoder_drafter'",
}
T5_CONFIG_DEFAULTS = ["network.T5Config.vocab_size = 32"]
# (paper file, task, drafter emb_dim, temperature, gamma): Table 2 of the paper, row by row.
# Each Table 2 row's gin file: (name, seqio task, drafter emb_dim, temperature, gamma).
_TASKS = {"EnDe": "wmt_t2t_ende_v003", "CNNDM": "cnn_dailymail_v002"}
_DRAFTER_EMB_DIM = {"small": 512, "base": 768, "large": 1024}
TABLE_2 = [
    (row.config_name, _TASKS[row.task], _DRAFTER_EMB_DIM[row.drafter], row.temperature, row.gamma)
    for row in paper.TABLE_2
]
_BINDING = re.compile(r"^([A-Za-z_][\w./]*)\.\w+ = ", re.MULTILINE)
_MACRO = re.compile(r"^(\w+) = ", re.MULTILINE)
_INCLUDE = re.compile(r"^include '([^']+)'", re.MULTILINE)


@gin.configurable("config_probe")
def _probe(value):
  """Returns what gin passes it: `scope/config_probe.value = %MACRO` evaluates MACRO."""
  return value


def check_gin_files(files) -> dict:
  """Parses `files` with test values for the unset required macros, finalizes, evaluates every
  macro and constructs every unscoped dataclass configurable; returns {macro or class name:
  repr(value)}."""
  gin.clear_config()
  try:
    for path in gin_utils.search_paths():
      gin.add_config_file_search_path(path)
    gin.parse_config_files_and_bindings(list(files), [], finalize_config=False)
    missing = gin_utils.unset_required_macros()
    unknown = sorted(set(missing) - set(REQUIRED_VALUES))
    assert not unknown, f"{files} leave {unknown} %gin.REQUIRED: add test values to REQUIRED_VALUES"
    macros = sorted(set(_MACRO.findall(gin.config_str())))
    gin.parse_config(
        [f"{name} = {REQUIRED_VALUES[name]}" for name in missing]
        + [f"macro_{name}/config_probe.value = %{name}" for name in macros]
        + T5_CONFIG_DEFAULTS
    )
    gin.finalize()
    values = {}
    for name in macros:
      with gin.config_scope(f"macro_{name}"):
        values[name] = _probe()
    for selector in sorted(set(_BINDING.findall(gin.config_str()))):
      configurable = gin.get_configurable(selector) if "/" not in selector else None
      if dataclasses.is_dataclass(configurable) and configurable is not network.T5Config:
        values[configurable.__name__] = configurable()
    if "MIXTURE_OR_TASK_NAME" in values:
      tasks.get_task(values["MIXTURE_OR_TASK_NAME"])
    return {name: repr(value) for name, value in values.items()}
  finally:
    gin.clear_config()


def _script_modules() -> dict[str, str]:
  """{gin module name: script path} of the configurables defined in scripts/*.py."""
  modules = {}
  for script in sorted((REPO_ROOT / "scripts").glob("*.py")):
    for module in re.findall(r"@gin\.configurable\(module=\"(\w+)\"\)", script.read_text()):
      modules[module] = str(script)
  return modules


def _text_with_includes(path: str) -> str:
  """The bindings of `path` and of the files it includes, comments left out."""
  text = re.sub(r"#.*", "", (REPO_ROOT / path).read_text())
  return text + "".join(_text_with_includes(include) for include in _INCLUDE.findall(text))


def _needed_script(path: str) -> str | None:
  text = _text_with_includes(path)
  scripts = {
      script for module, script in _script_modules().items() if re.search(rf"\b{module}\.", text)
  }
  assert len(scripts) <= 1, f"{path} configures several scripts: {sorted(scripts)}"
  return scripts.pop() if scripts else None


IN_PROCESS = [path for path in GIN_FILES if _needed_script(path) is None]
BY_SCRIPT = {}
for _path in GIN_FILES:
  if _path not in IN_PROCESS:
    BY_SCRIPT.setdefault(_needed_script(_path), []).append(_path)
BENCHMARK_GIN = "configs/runs/benchmark.gin"
# The paper's files, each after benchmark.gin: scripts/benchmark.py times a Table 2 row this way.
PAPER_WITH_BENCHMARK = [[BENCHMARK_GIN, f"configs/paper/{row[0]}.gin"] for row in TABLE_2]
# Files that add to a run file rather than stand alone: each is checked after its run file.
OVERLAYS = {
    "configs/runs/benchmark_verifiers.gin": BENCHMARK_GIN,
    "configs/runs/benchmark_draft_length.gin": BENCHMARK_GIN,
    "configs/runs/benchmark_trees.gin": BENCHMARK_GIN,
    "configs/runs/benchmark_auto.gin": BENCHMARK_GIN,
}


def _files(path: str) -> list[str]:
  """The files a script parses to use `path`: its run file first for an overlay."""
  return [OVERLAYS[path], path] if path in OVERLAYS else [path]


_SUBPROCESS = """
import importlib.util, json, sys
from absl import flags
sys.path.insert(0, {tests!r})
import test_configs
results = {{}}
for index, (script, combos) in enumerate({runs!r}):
  spec = importlib.util.spec_from_file_location(f"script_under_test_{{index}}", script)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  for files in combos:
    try:
      results[" + ".join(files)] = test_configs.check_gin_files(files)
    except Exception as e:
      results[" + ".join(files)] = f"{{type(e).__name__}}: {{e}}"
  for flag in flags.FLAGS.get_flags_for_module(spec.name):
    delattr(flags.FLAGS, flag.name)
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def script_results() -> dict:
  """{' + '.join(files): {name: repr} or an error string} for the files that need a script."""
  runs = []
  for script, paths in BY_SCRIPT.items():
    combos = [_files(path) for path in paths]
    runs.append((script, combos))
  code = _SUBPROCESS.format(tests=str(REPO_ROOT / "tests"), runs=runs)
  run = subprocess.run(
      [sys.executable, "-c", code],
      cwd=REPO_ROOT,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  lines = [line for line in run.stdout.splitlines() if line.startswith("RESULTS ")]
  assert run.returncode == 0 and lines, run.stderr
  return json.loads(lines[-1][len("RESULTS ") :])


def test_infer_drafter_and_paper_files_need_no_script():
  assert {"configs/runs/infer.gin", "configs/runs/pair.gin", "configs/runs/baseline.gin"} | {
      f"configs/paper/{row[0]}.gin" for row in TABLE_2
  } | set(DRAFTER_FILES) <= set(IN_PROCESS)


@pytest.mark.parametrize("path", IN_PROCESS)
def test_gin_file_parses_and_binds(path):
  check_gin_files(_files(path))


@pytest.mark.parametrize("files", PAPER_WITH_BENCHMARK, ids=lambda files: files[-1])
def test_a_paper_file_after_the_benchmark_file_binds(files):
  """scripts/benchmark.py times a Table 2 row this way."""
  check_gin_files(files)


@pytest.mark.parametrize("path", [path for paths in BY_SCRIPT.values() for path in paths])
def test_script_gin_file_parses_and_binds(path, script_results):
  result = script_results[" + ".join(_files(path))]
  assert isinstance(result, dict), result


def _infer_config(files, bindings) -> inference.InferConfig:
  gin.clear_config()
  try:
    gin_utils.parse_gin_flags(files, bindings)
    return inference.InferConfig()
  finally:
    gin.clear_config()


@pytest.mark.parametrize("name, task, drafter_emb_dim, temperature, gamma", TABLE_2)
def test_paper_file_is_its_table_2_row(name, task, drafter_emb_dim, temperature, gamma):
  bindings = [
      "CHECKPOINT_PATH = 'gs://b/xxl'",
      "DRAFTER_CHECKPOINT_PATH = 'gs://b/drafter'",
      "INFER_OUTPUT_DIR = '/tmp/out'",
  ]
  config = _infer_config([f"configs/paper/{name}.gin"], bindings)
  target = config.pair.target_config
  assert (
      target.emb_dim,
      target.num_heads,
      target.num_encoder_layers,
      target.mlp_dim,
      target.dtype,
  ) == (4096, 64, 24, 10240, "bfloat16")
  assert isinstance(config.pair.drafter, drafters.T5Drafter)
  assert config.pair.drafter.config.emb_dim == drafter_emb_dim
  assert config.pair.drafter.vocab_size == target.vocab_size == 32128
  assert (config.mixture_or_task_name, config.temperature, config.gamma) == (
      task,
      temperature,
      gamma,
  )
  assert (config.decoder, config.pair.restore_dtype, config.split) == (
      "speculative",
      "bfloat16",
      "test",
  )
  assert (config.pair.checkpoint_path, config.pair.drafter_checkpoint_path) == (
      "gs://b/xxl",
      "gs://b/drafter",
  )
  assert config.pair.random_init_seed is None


def test_paper_files_leave_the_checkpoints_required():
  gin.clear_config()
  try:
    with pytest.raises(
        gin_utils.ConfigError,
        match="CHECKPOINT_PATH, DRAFTER_CHECKPOINT_PATH, " "INFER_OUTPUT_DIR are %gin.REQUIRED",
    ):
      gin_utils.parse_gin_flags(["configs/paper/ende_small_t0.gin"])
  finally:
    gin.clear_config()


DRAFTER_FILES = sorted(
    str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "configs" / "drafters").glob("*.gin")
)


def _kind(cls: type) -> str:
  """A drafter class's gin file stem: T5Drafter -> t5, PromptLookupDrafter -> prompt_lookup."""
  return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", cls.__name__.removesuffix("Drafter")).lower()


def _concrete_drafters(cls=drafters.Drafter) -> set[type]:
  subclasses = set(cls.__subclasses__())
  for subclass in cls.__subclasses__():
    subclasses |= _concrete_drafters(subclass)
  return {sub for sub in subclasses if not inspect.isabstract(sub)}


def test_every_drafter_kind_has_its_gin_file():
  """Adding a drafter kind is a class in drafters.py (or table_drafters.py) and
  configs/drafters/<kind>.gin."""
  modules = {drafters.__name__, table_drafters.__name__}
  kinds = {_kind(cls) for cls in _concrete_drafters() if cls.__module__ in modules}
  assert {"t5", "unigram", "bigram", "prompt_lookup"} <= kinds
  assert kinds == {pathlib.Path(path).stem for path in DRAFTER_FILES}


@pytest.mark.parametrize("path", DRAFTER_FILES)
def test_a_drafter_file_switches_the_drafter_of_a_paper_row(path):
  """One more --gin_file after a run file changes its drafter and nothing else; the file leaves
  DRAFTER_CHECKPOINT_PATH required exactly when its drafter needs a checkpoint."""
  gin.clear_config()
  try:
    for search_path in gin_utils.search_paths():
      gin.add_config_file_search_path(search_path)
    gin.parse_config_files_and_bindings(
        ["configs/paper/ende_small_t0.gin", path],
        ["CHECKPOINT_PATH = 'gs://b/xxl'", "INFER_OUTPUT_DIR = '/tmp/out'"],
        finalize_config=False,
    )
    required = gin_utils.unset_required_macros()
    values = {**REQUIRED_VALUES, "DRAFTER_CONFIG": "%T5_1_1_SMALL"}  # the row's drafter model
    gin.parse_config([f"{name} = {values[name]}" for name in required])
    gin.finalize()
    config = inference.InferConfig()
  finally:
    gin.clear_config()
  drafter = config.pair.drafter
  assert _kind(type(drafter)) == pathlib.Path(path).stem
  assert ("DRAFTER_CHECKPOINT_PATH" in required) == checkpoints.needs_checkpoint(drafter)
  assert config.pair.drafter_checkpoint_path == (
      "/checkpoints/drafter" if checkpoints.needs_checkpoint(drafter) else None
  )
  assert drafter.vocab_size in (0, 32128)
  assert config.pair.target_config.emb_dim == 4096
  assert (config.gamma, config.temperature, config.mixture_or_task_name) == (
      7,
      0.0,
      "wmt_t2t_ende_v003",
  )

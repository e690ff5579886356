"""The scripts' output directories and early checks (and the gin type checks):
every output location is checked before any model loads, another run's outputs are refused unless
--overwrite, flags a mode does not use and wrong types are configuration errors, and an
interrupted run leaves the old complete run untouched.

The refusals run the scripts' `main` in this process (each script loaded fresh, its absl flags
removed again afterwards), so each case takes milliseconds; one test interrupts a real
scripts/infer.py run of a tiny random pair with SIGINT.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags
import gin
import pytest

from conftest import SCRIPT_ENV, SEQIO_TEST_VOCABULARY, SMALL_CONFIG, default_sigint, tiny_config
from speculative_t5x import drafters
from speculative_t5x import gin_utils
from speculative_t5x.measuring import benchmark_config
from speculative_t5x.running import inference
from speculative_t5x.running import multihost
from speculative_t5x.text import demo_data
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import pairs

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_ERROR = gin_utils.ConfigError


_LOADED = (
    {}
)  # script name -> (its module, its absl flags): a script's gin configurables register once


@pytest.fixture
def script():
  """load(name) -> scripts/<name>.py as a module (executed once a session); its flags are defined
  for the test and removed at the end, and gin's configuration is cleared."""
  defined = set(flags.FLAGS)
  gin.clear_config()

  def load(name):
    if name not in _LOADED:
      spec = importlib.util.spec_from_file_location(
          f"{name}_under_test", REPO_ROOT / "scripts" / f"{name}.py"
      )
      module = importlib.util.module_from_spec(spec)
      sys.modules[spec.name] = module  # dataclasses read their module's annotations there
      before = set(flags.FLAGS)
      spec.loader.exec_module(module)
      _LOADED[name] = module, {n: flags.FLAGS[n] for n in set(flags.FLAGS) - before}
    else:
      for flag_name, flag in _LOADED[name][1].items():
        flags.FLAGS[flag_name] = flag
    return _LOADED[name][0]

  yield load
  flags.FLAGS.unparse_flags()
  for name in set(flags.FLAGS) - defined:
    delattr(flags.FLAGS, name)
  gin.clear_config()


def _main(module, name, *argv):
  """module.main after absl parsed `argv` (with the --gin.X shorthand), from the repository root."""
  flags.FLAGS(gin_utils.rewrite_gin_args([f"{name}.py", *argv]))
  cwd = os.getcwd()
  os.chdir(REPO_ROOT)
  try:
    return module.main([f"{name}.py"])
  finally:
    os.chdir(cwd)


def _never(*_, **__):
  pytest.fail("the script began its work")


# ----------------------------------------------------------------------------- infer.py

_INFER_TINY = [
    "--gin_file=configs/runs/infer.gin",
    "--gin_file=configs/drafters/unigram.gin",
    "--gin_file=configs/models/t5_1_1_tiny.gin",
    "--gin_file=configs/tasks/demo_ende.gin",
    "--gin.TARGET_CONFIG=%T5_1_1_TINY",
    "--gin.CHECKPOINT_PATH=None",
    "--gin.RANDOM_INIT_SEED=0",
]


def _old_run(directory: pathlib.Path, names) -> dict:
  directory.mkdir(parents=True, exist_ok=True)
  for name in names:
    (directory / name).write_text(f"old {name}\n")
  return {name: f"old {name}\n" for name in names}


def _contents(directory: pathlib.Path) -> dict:
  return {p.name: p.read_text() for p in directory.iterdir()}


@pytest.mark.parametrize(
    "binding, message",
    [
        (
            "--gin.TASK_FEATURE_LENGTHS=16",
            "TASK_FEATURE_LENGTHS 16 must give positive integer lengths for exactly 'inputs' and "
            "'targets'",
        ),
        ("--gin.DECODER=['baseline']", "DECODER ['baseline'] is not one of"),
        ("--gin.BATCH_SIZE='2'", "BATCH_SIZE must be an integer >= 1, got '2'"),
        ("--gin.SPLIT=3", "SPLIT must be a non-empty string, got 3"),
    ],
)
def test_infer_refuses_a_wrong_type_as_a_configuration_error(
    script, tmp_path, monkeypatch, binding, message
):
  monkeypatch.setattr(inference, "infer", _never)
  infer = script("infer")
  with pytest.raises(CONFIG_ERROR, match=message.replace("[", r"\[").replace("]", r"\]")):
    _main(infer, "infer", *_INFER_TINY, f"--gin.INFER_OUTPUT_DIR='{tmp_path}/out'", binding)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(num_partitions=3), "num_partitions=3 does not divide"),
        (dict(logical_axis_rules=5), "'int' object is not iterable"),
    ],
)
def test_a_partitioner_setting_it_refuses_is_a_configuration_error(settings, message):
  with pytest.raises(
      CONFIG_ERROR, match=r"partitioning.Partitioner \(NUM_PARTITIONS, .*" + message
  ):
    inference.configured_partitioner(**settings)


def test_infer_refuses_another_runs_outputs_before_any_model_loads(script, tmp_path, monkeypatch):
  monkeypatch.setattr(inference, "infer", _never)
  old = _old_run(tmp_path, ["metrics.json", "predictions.jsonl"])
  infer = script("infer")
  with pytest.raises(
      CONFIG_ERROR,
      match=f"INFER_OUTPUT_DIR {tmp_path} holds another run's outputs "
      r"\(predictions.jsonl, metrics.json\): give a new directory, or pass --overwrite",
  ):
    _main(infer, "infer", *_INFER_TINY, f"--gin.INFER_OUTPUT_DIR='{tmp_path}'")
  assert _contents(tmp_path) == old


@pytest.mark.parametrize("where", ["file/out", "/proc/infer_out"])
def test_infer_refuses_an_output_dir_it_cannot_write_before_any_model_loads(
    script, tmp_path, monkeypatch, where
):
  monkeypatch.setattr(inference, "infer", _never)
  (tmp_path / "file").write_text("")
  infer = script("infer")
  path = where if where.startswith("/") else tmp_path / where
  with pytest.raises(CONFIG_ERROR, match="INFER_OUTPUT_DIR .*(which is a file|cannot be written)"):
    _main(infer, "infer", *_INFER_TINY, f"--gin.INFER_OUTPUT_DIR='{path}'")


def _read_until(process: subprocess.Popen, marker: str, timeout: float) -> str:
  """The process's stderr up to `marker` (tqdm's bar ends its lines with carriage returns)."""
  seen, done = [], threading.Event()

  def read():
    while not done.is_set():
      chunk = os.read(process.stderr.fileno(), 4096)
      if not chunk:
        break
      seen.append(chunk.decode("utf-8", "replace"))
      if marker in "".join(seen):
        done.set()

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  reader.join(timeout)
  done.set()
  return "".join(seen)


def test_an_interrupted_infer_rerun_leaves_the_old_run_untouched(tmp_path):
  """A rerun with --overwrite into a complete run's directory, interrupted (SIGINT) once it
  decodes: the directory holds the old run, or (had the run ended first) the new one whole."""
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  sentences = [("Open file", "Datei öffnen"), ("Close", "Schließen"), ("Save", "Speichern")]
  for split in demo_data.DEMO_SPLITS:
    (corpus / f"{split}.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in sentences))
  shutil.copy(SEQIO_TEST_VOCABULARY, corpus / demo_data.DEMO_VOCABULARY_FILE)
  out = tmp_path / "out"
  old = _old_run(out, inference.OUTPUT_FILES)
  process = subprocess.Popen(
      [
          sys.executable,
          str(REPO_ROOT / "scripts" / "infer.py"),
          *_INFER_TINY,
          "--gin.VOCAB_SIZE=32",
          "--gin.RESTORE_DTYPE='float32'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
          "--gin.BATCH_SIZE=1",
          f"--gin.INFER_OUTPUT_DIR='{out}'",
          "--overwrite",
      ],
      cwd=REPO_ROOT,
      env=dict(SCRIPT_ENV, **{demo_data.DEMO_DATA_ENV: str(corpus)}),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      preexec_fn=default_sigint,
  )
  try:
    seen = _read_until(process, "speculative demo_ende", timeout=240)
    assert "speculative demo_ende" in seen, seen[-3000:]
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  contents = _contents(out)
  if contents != old:  # the run finished before the signal: the new run, whole
    assert sorted(contents) == sorted(inference.OUTPUT_FILES), sorted(contents)
    metrics = json.loads(contents["metrics.json"])
    assert metrics["examples"] == len(contents["predictions.jsonl"].splitlines()) == 3
    assert str(out) in contents["config.gin"]
  else:
    assert process.returncode != 0


# ----------------------------------------------------------------------------- convert_checkpoint.py


@pytest.fixture
def formats(tmp_path, small_params):
  """{format: a directory of it}: an orbax model (save_model), an HF directory, a T5X dir."""
  orbax = tmp_path / "orbax"
  checkpoints.save_model(orbax, small_params, SMALL_CONFIG)
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "config.json").write_text(json.dumps({"d_model": 8, "model_type": "t5"}))
  (hf / "model.safetensors").write_text("")
  t5x = tmp_path / "t5x" / "checkpoint_1"
  t5x.mkdir(parents=True)
  (t5x / "checkpoint").write_text("")
  return {"orbax": orbax, "hf": hf, "t5x": t5x.parent}


@pytest.mark.parametrize(
    "mode, source, extra, message",
    [
        (
            "orbax_to_hf",
            "orbax",
            ["--output={hf}"],
            r"--output {hf} holds another run's outputs \(model.safetensors, config.json\)",
        ),
        (
            "hf_to_orbax",
            "hf",
            ["--output={orbax}"],
            r"--output {orbax} holds another run's outputs \(params, config.json\)",
        ),
        (
            "hf_to_orbax",
            "hf",
            ["--output={new}", "--mlp_activations=gelu,linear"],
            r"--mode=hf_to_orbax does not use --mlp_activations \(--mlp_activations is for "
            r"t5x_to_orbax\): drop it",
        ),
        (
            "hf_to_orbax",
            "hf",
            ["--output={new}", "--step=3"],
            "--mode=hf_to_orbax does not use --step",
        ),
        (
            "orbax_to_hf",
            "orbax",
            ["--output={new}", "--dtype=float32"],
            r"--mode=orbax_to_hf does not use --dtype \(--dtype is for t5x_to_orbax and "
            r"hf_to_orbax\)",
        ),
        (
            "hf_to_orbax",
            "orbax",
            ["--output={new}"],
            r"is this project's orbax directory .*, not a Hugging Face T5 directory .* that "
            "--mode=hf_to_orbax reads: convert it with --mode=orbax_to_hf",
        ),
        (
            "orbax_to_hf",
            "hf",
            ["--output={new}"],
            "is a Hugging Face T5 directory .*: convert it with --mode=hf_to_orbax",
        ),
        (
            "orbax_to_hf",
            "t5x",
            ["--output={new}"],
            "is a T5X checkpoint .*: convert it with --mode=t5x_to_orbax",
        ),
        (
            "t5x_to_orbax",
            "hf",
            ["--output={new}"],
            "convert it with --mode=hf_to_orbax",
        ),
        ("orbax_to_hf", "orbax", ["--output={file}/out"], "--output .* which is a file"),
        ("orbax_to_hf", "orbax", ["--output={orbax}"], "--output=.* is --input"),
    ],
)
def test_convert_refuses_before_reading_anything(
    script, tmp_path, formats, monkeypatch, mode, source, extra, message
):
  monkeypatch.setattr(checkpoints, "restore_model", _never)
  monkeypatch.setattr(checkpoints, "save_model", _never)
  (tmp_path / "file").write_text("")
  places = {**formats, "new": tmp_path / "new", "file": tmp_path / "file"}
  convert = script("convert_checkpoint")
  argv = [f"--mode={mode}", f"--input={formats[source]}", *(a.format(**places) for a in extra)]
  with pytest.raises(CONFIG_ERROR, match=message.format(**places)):
    _main(convert, "convert_checkpoint", *argv)
  assert not (tmp_path / "new").exists()


def test_convert_refuses_positional_arguments(script, formats, tmp_path):
  convert = script("convert_checkpoint")
  flags.FLAGS(
      [
          "convert_checkpoint.py",
          "--mode=orbax_to_hf",
          f"--input={formats['orbax']}",
          f"--output={tmp_path}/x",
      ]
  )
  with pytest.raises(app.UsageError, match=r"unexpected arguments \['stray'\]"):
    convert.main(["convert_checkpoint.py", "stray"])


def test_convert_with_overwrite_replaces_the_earlier_output_whole(script, formats, small_params):
  hf = formats["hf"]
  (hf / "pytorch_model.bin").write_text("an older conversion's weights")
  (hf / "README.md").write_text("not an output")
  convert = script("convert_checkpoint")
  _main(
      convert,
      "convert_checkpoint",
      "--mode=orbax_to_hf",
      f"--input={formats['orbax']}",
      f"--output={hf}",
      "--overwrite",
  )
  assert sorted(p.name for p in hf.iterdir()) == ["README.md", "config.json", "model.safetensors"]
  assert json.loads((hf / "config.json").read_text())["d_model"] == SMALL_CONFIG.emb_dim


# ----------------------------------------------------------------------------- benchmark.py


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--repeats=0"], r"--repeats=0: give an integer >= 1 \(timed decodes"),
        (["--steps_per_call=0"], r"--steps_per_call=0: give an integer >= 1"),
        (["--cost_repeats=0"], r"--cost_repeats=0: give an integer >= 1"),
        (["--warmup=-1"], r"--warmup=-1: give an integer >= 0"),
        (
            ["--input_file={empty}", "--sentencepiece_model={spm}"],
            "the inputs .*: .*empty.txt has no non-empty lines",
        ),
        (["--output_dir={file}/out"], "--output_dir .* which is a file"),
        (["--output_dir={old}"], r"--output_dir {old} holds another run's outputs \(costs.md\)"),
    ],
)
def test_benchmark_refuses_bad_inputs_before_any_model_loads(
    script, tmp_path, monkeypatch, argv, message
):
  monkeypatch.setattr(benchmark_config, "load_models", _never)
  (tmp_path / "file").write_text("")
  (tmp_path / "empty.txt").write_text("\n  \n")
  _old_run(tmp_path / "old", ["costs.md"])
  places = dict(
      empty=tmp_path / "empty.txt",
      spm=SEQIO_TEST_VOCABULARY,
      file=tmp_path / "file",
      old=tmp_path / "old",
  )
  benchmark = script("benchmark")
  argv = [a.format(**places) for a in argv]
  if not any(a.startswith("--output_dir") for a in argv):
    argv.append(f"--output_dir={tmp_path}/out")
  with pytest.raises(CONFIG_ERROR, match=message.format(**places)):
    _main(benchmark, "benchmark", *argv)
  assert not (tmp_path / "out").exists()


def _setup(**changes):
  fields = dict(
      pair=pairs.PairConfig(
          target_config=tiny_config(32),
          drafter=drafters.T5Drafter(tiny_config(32)),
          random_init_seed=0,
      ),
      task_feature_lengths={"inputs": 8, "targets": 8},
      gammas=(2,),
      temperatures=(0.0,),
  )
  return benchmark_config.BenchmarkSetup(**{**fields, **changes}).checked()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(task_feature_lengths=16), "TASK_FEATURE_LENGTHS must be a non-empty mapping"),
        (dict(gammas=4), r"BenchmarkSetup.gammas must be a sequence, e.g. \(2, 4\), got 4"),
        (dict(verifiers=3), "BenchmarkSetup.verifiers must be a mapping label -> setting"),
        (dict(random_drafters=("copy", "twin")), r"holds \['twin'\]: use kinds of"),
        (dict(seed="0"), "BenchmarkSetup.seed must be an integer >= 0"),
        (dict(pair=None), "BenchmarkSetup.pair must be a pairs.PairConfig"),
    ],
)
def test_benchmark_setup_refuses_wrong_types(changes, message):
  with pytest.raises(CONFIG_ERROR, match=message):
    _setup(**changes)


# ----------------------------------------------------------------------------- aot_check.py


def test_aot_check_refuses_a_device_count_below_one_before_jax_sees_it(script, monkeypatch):
  before = os.environ.get("XLA_FLAGS")
  aot_check = script("aot_check")
  with pytest.raises(CONFIG_ERROR, match="--num_devices=0: give a device count of at least 1"):
    _main(aot_check, "aot_check", "--num_devices=0")
  assert os.environ.get("XLA_FLAGS") == before


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(param_dtype="int8"), "param_dtype 'int8' is not a floating type"),
        (dict(param_dtype=None), "param_dtype None is not a dtype"),
        (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
        (dict(batch_size="1"), r"batch_size must be an integer >= 1, got '1' \(str\)"),
        (dict(gamma=0), "gamma must be an integer >= 1, got 0"),
        (dict(task_feature_lengths=64), "TASK_FEATURE_LENGTHS must be a non-empty mapping"),
        (dict(hbm_gib=0.0), "hbm_gib must be > 0"),
        (dict(temperature=1.0), "AotSetup.temperature=1.0: give None"),
        (dict(target_config="xxl"), "target_config must be a network.T5Config"),
    ],
)
def test_aot_setup_refuses_bad_fields(script, changes, message):
  aot_check = script("aot_check")
  fields = dict(
      target_config=tiny_config(32),
      drafter=drafters.T5Drafter(tiny_config(32)),
      task_feature_lengths={"inputs": 8, "targets": 8},
      output_dir="/tmp/unused",
  )
  with pytest.raises(CONFIG_ERROR, match=message):
    aot_check.AotSetup(**{**fields, **changes})


# ----------------------------------------------------------------------------- measure_alpha.py


@pytest.mark.parametrize("kind", ["under a file", "another run"])
def test_measure_alpha_checks_its_output_dir_before_measuring(script, tmp_path, kind):
  (tmp_path / "file").write_text("")
  _old_run(tmp_path / "old", ["alpha.md"])
  path, message = {
      "under a file": (tmp_path / "file" / "out", "ALPHA_OUTPUT_DIR .* which is a file"),
      "another run": (tmp_path / "old", r"holds another run's outputs \(alpha.md\)"),
  }[kind]
  measure_alpha = script("measure_alpha")
  measure_alpha.measure = _never
  with pytest.raises(CONFIG_ERROR, match=message):
    _main(measure_alpha, "measure_alpha", f"--gin.ALPHA_OUTPUT_DIR='{path}'")


def test_alpha_setup_refuses_checkpoint_paths_of_another_type(script):
  measure_alpha = script("measure_alpha")
  with pytest.raises(CONFIG_ERROR, match="drafter_checkpoint_paths must be a mapping row name"):
    measure_alpha.AlphaSetup(
        pair=pairs.PairConfig(target_config=tiny_config(32), random_init_seed=0),
        drafters={"t5": drafters.T5Drafter(tiny_config(32))},
        mixture_or_task_name="demo_ende",
        task_feature_lengths={"inputs": 8, "targets": 8},
        output_dir="/tmp/unused",
        drafter_checkpoint_paths=3,
    )


# ----------------------------------------------------------------------------- multi-process flags


def test_multiprocess_gpu_alone_without_a_cluster_is_named(monkeypatch):
  monkeypatch.setattr(multihost, "detected_cluster", lambda: None)
  with pytest.raises(
      CONFIG_ERROR, match="--multiprocess_gpu alone asks JAX to detect the processes"
  ):
    multihost.initialize(multihost.ProcessFlags(multiprocess_gpu=True))


def test_a_coordinator_port_in_use_is_named_before_jax_starts():
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
    holder.bind(("", 0))
    holder.listen()
    port = holder.getsockname()[1]
    process_flags = multihost.ProcessFlags(
        multiprocess_gpu=True,
        coordinator_address=f"localhost:{port}",
        process_count=2,
        process_index=0,
    )
    with pytest.raises(CONFIG_ERROR, match=f"port {port} is in use on this host"):
      multihost.initialize(process_flags)
  # Another process's index does not start the coordinator, and a free port passes.
  multihost.check_can_start(
      multihost.ProcessFlags(True, f"localhost:{port}", process_count=2, process_index=1)
  )
  multihost.check_can_start(
      multihost.ProcessFlags(True, f"localhost:{port}", process_count=2, process_index=0)
  )


# ----------------------------------------------------------------------------- train.py


def test_an_interrupted_training_leaves_a_checkpoint_and_the_summary_that_describes_it(tmp_path):
  """SIGINT once the first checkpoint is in: the latest checkpoint, train_summary.json and
  config.gin describe the same step of the same run, and no temporary is left."""
  model_dir = tmp_path / "run"
  process = subprocess.Popen(
      [
          sys.executable,
          str(REPO_ROOT / "scripts" / "train.py"),
          "--gin_file=configs/runs/train.gin",
          "--gin_file=configs/models/t5_1_1_tiny.gin",
          "--gin.MODEL_CONFIG=%T5_1_1_TINY",
          "--gin.NUM_STEPS=100000",
          "--gin.training.train.eval_period=0",
          "--gin.training.train.checkpoint_period=2",
          "--gin.training.train.progress=False",
          f"--model_dir={model_dir}",
      ],
      cwd=REPO_ROOT,
      env=SCRIPT_ENV,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      preexec_fn=default_sigint,
  )
  try:
    deadline = time.monotonic() + 240
    while not (model_dir / "train_summary.json").exists() and time.monotonic() < deadline:
      assert process.poll() is None, process.stderr.read().decode()[-3000:]
      time.sleep(0.2)
    assert (model_dir / "train_summary.json").exists()
    process.send_signal(signal.SIGINT)
    # Within the deadline too: on a loaded machine (the suite's other worker compiling) the
    # held checkpoint write and orbax's shutdown after the interrupt took over 60 s once.
    process.wait(timeout=max(60.0, deadline - time.monotonic()))
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  assert process.returncode != 0
  summary = json.loads((model_dir / "train_summary.json").read_text())
  steps = sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit())
  assert summary["steps"] == steps[-1] and steps[-1] % 2 == 0
  assert "NUM_STEPS = 100000" in (model_dir / "config.gin").read_text()
  assert sorted(p.name for p in model_dir.iterdir()) == [
      "checkpoints",
      "config.gin",
      "train_summary.json",
  ]


def test_the_demo_names_a_translation_caught_in_a_loop(script):
  repeats_itself = script("demo").repeats_itself
  assert repeats_itself("Die gewählte gewählte gewählte gewählte Datei")  # one word, 4 times
  assert repeats_itself("a b c a b c a b c a b c")  # three words, 4 times
  assert not repeats_itself("Die gewählte gewählte gewählte Datei")  # 3 times: a sentence may
  assert not repeats_itself("Liste der widerrufenen Serverzertifikate")
  assert not repeats_itself("")

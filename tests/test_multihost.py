"""Multi-process inference on localhost (speculative_t5x/running/multihost.py, scripts/infer.py's flags).

Every scenario runs in fresh CPU processes joined by JAX's distributed runtime (gloo collectives),
all started at once by the module's fixture, since most of each is importing JAX, TensorFlow and
seqio (on two cores the module takes about half its processes' CPU time: one launch per scenario
and side, each compiling with XLA:CPU's cheapest settings, conftest.FAST_COMPILE):
  - the same inference (tests/multihost_check.py: a tiny random target and T5 drafter, 9 examples,
    global batches of 4 rows) by 2 processes of 2 devices and by 1 process of 4 devices, each at
    T = 0 and T = 1, with a chain and a draft tree: the outputs must be identical, and process 1
    must write nothing; then with the 'model' axis over all 4 devices (across the 2
    processes), at T = 1, against 1 process with the same mesh;
  - scripts/infer.py with a process killed once it has joined: the other must end with a non-zero
    status, within 60 s, saying which process died, and leave no outputs;
  - scripts/infer.py with mismatched --process_count: both refuse before any model loads;
  - scripts/infer.py with a duplicated --process_index: the join never completes; both end with a
    non-zero status, one with our message naming the process that did not join.
Flags one process can judge alone are checked here, in this process: by multihost.ProcessFlags,
and by scripts/infer.py's main before it joins.
"""

import importlib.util
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import flags
import jax
import numpy as np
import pytest

from conftest import FAST_COMPILE, REPO_ROOT, SEQIO_TEST_VOCABULARY, TRANSLATION_PAIRS, flat
from speculative_t5x import decoding
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x.running import inference
from speculative_t5x.running import multihost
from speculative_t5x.text import demo_data
import multihost_check

HERE = pathlib.Path(__file__).resolve().parent
PAIRS = TRANSLATION_PAIRS + [("close window", "fenster schliessen")]  # 9: shards of 5 and 4
RUNS = ("chain_t0", "chain_t1", "tree_t0", "tree_t1")  # tests/multihost_check.py's RUNS
FAULT_TIMEOUT = 10  # --multiprocess_timeout_seconds of the fault scenarios
FAULT_LIMIT = 60  # the bound on the time from a fault to every process's end
INFER_FLAGS = (
    "--gin_file=configs/runs/infer.gin",
    "--gin_file=configs/models/t5_1_1_tiny.gin",
    "--gin_file=configs/tasks/demo_ende.gin",
    "--gin_file=configs/drafters/t5.gin",
    "--gin.TARGET_CONFIG=%T5_1_1_TINY",
    "--gin.DRAFTER_CONFIG=%T5_1_1_TINY",
    "--gin.VOCAB_SIZE=32",
    "--gin.CHECKPOINT_PATH=None",
    "--gin.DRAFTER_CHECKPOINT_PATH=None",
    "--gin.RANDOM_INIT_SEED=0",
    "--gin.RESTORE_DTYPE='float32'",
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 12, 'targets': 6}",
    "--gin.BATCH_SIZE=4",
    "--multiprocess_gpu",
    f"--multiprocess_timeout_seconds={FAULT_TIMEOUT}",
)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(args, corpus, devices: int, log: pathlib.Path | None) -> subprocess.Popen:
  """A process with `devices` CPU devices; its stderr goes to `log`, or to a pipe if None."""
  env = dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      TF_CPP_MIN_LOG_LEVEL="3",
      XLA_FLAGS=f"{FAST_COMPILE} --xla_force_host_platform_device_count={devices}",
      **{demo_data.DEMO_DATA_ENV: str(corpus)},
  )
  process = subprocess.Popen(
      [sys.executable, *map(str, args)],
      cwd=REPO_ROOT,
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE if log is None else log.open("w"),
      text=True,
  )
  process.log = log
  return process


def _infer(corpus, out, count: int, index: int, port: int, log) -> subprocess.Popen:
  return _start(
      [
          REPO_ROOT / "scripts" / "infer.py",
          *INFER_FLAGS,
          f"--gin.INFER_OUTPUT_DIR='{out}'",
          f"--coordinator_address=localhost:{port}",
          f"--process_count={count}",
          f"--process_index={index}",
      ],
      corpus,
      devices=2,
      log=log,
  )


def _finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
  """Waits for `process` -> (its exit status, its stderr)."""
  _, stderr = process.communicate(timeout=timeout)
  return process.returncode, stderr if process.log is None else process.log.read_text()


class _Killer(threading.Thread):
  """Kills `victim` (SIGKILL) as soon as its stderr says it has joined the runtime, then waits for
  `survivor` to end; records both times (`killed_at`, `survivor_ended_at`, time.monotonic()) and
  what the victim wrote (`stderr`)."""

  def __init__(self, victim: subprocess.Popen, survivor: subprocess.Popen):
    super().__init__(daemon=True)
    self.victim, self.survivor, self.stderr = victim, survivor, []
    self.killed_at = self.survivor_ended_at = None

  def run(self):
    for line in self.victim.stderr:
      self.stderr.append(line)
      if self.killed_at is None and "process 1 of 2 joined" in line:
        self.victim.send_signal(signal.SIGKILL)
        self.killed_at = time.monotonic()
    self.victim.wait()
    self.survivor.wait()
    self.survivor_ended_at = time.monotonic()


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
  """Every scenario's processes, started at once -> ({name: (Popen, ...), 'killer': _Killer},
  {name: output directory})."""
  root = tmp_path_factory.mktemp("multihost")
  corpus = root / "corpus"
  corpus.mkdir()
  for split in demo_data.DEMO_SPLITS:
    (corpus / f"{split}.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in PAIRS))
  (corpus / demo_data.DEMO_VOCABULARY_FILE).write_bytes(SEQIO_TEST_VOCABULARY.read_bytes())
  check = HERE / "multihost_check.py"
  saved = root / "pair"
  multihost_check.save_pair(str(saved))
  dirs = {name: root / name for name in ("one", "two", "two_p1", "killed", "count", "index")}
  port, kill_port, count_port, index_port = (_free_port() for _ in range(4))
  logs = root / "logs"
  logs.mkdir()
  started = {
      "one": (_start([check, dirs["one"], 4, saved], corpus, 4, logs / "one"),),
      "two": tuple(
          _start([check, dirs[out], 2, saved, f"localhost:{port}", 2, i], corpus, 2, logs / out)
          for i, out in enumerate(("two", "two_p1"))
      ),
      "killed": (
          _infer(corpus, dirs["killed"], 2, 0, kill_port, logs / "killed_0"),
          _infer(corpus, dirs["killed"], 2, 1, kill_port, None),  # read as it goes
      ),
      "count": (
          _infer(corpus, dirs["count"], 2, 0, count_port, logs / "count_0"),
          _infer(corpus, dirs["count"], 3, 1, count_port, logs / "count_1"),
      ),
      "index": tuple(
          _infer(corpus, dirs["index"], 2, 0, index_port, logs / f"index_{i}") for i in (0, 1)
      ),
  }
  killer = _Killer(started["killed"][1], started["killed"][0])
  killer.start()
  started["killer"] = killer
  yield started, dirs
  for name, processes in started.items():
    for process in () if name == "killer" else processes:
      if process.poll() is None:
        process.kill()
        process.communicate()


@pytest.fixture(scope="module")
def decoded(launched):
  """The inference runs' output directories, once every process has ended with status 0."""
  started, dirs = launched
  for name in ("one", "two"):
    for i, process in enumerate(started[name]):
      code, stderr = _finish(process)
      assert code == 0, f"{name}, process {i}:\n{stderr[-4000:]}"
  return dirs


def _lines(directory: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (directory / inference.PREDICTIONS_FILE).open()]


@pytest.mark.parametrize("run", RUNS)
def test_two_processes_decode_what_one_process_does(decoded, run):
  one, two = decoded["one"] / run, decoded["two"] / run
  lines = _lines(two)
  assert lines == _lines(one)  # predictions and per-example statistics, bit for bit
  assert [line["targets"] for line in lines] == [de for _, de in PAIRS]  # the split's order
  metrics = {d: json.loads((d / inference.METRICS_FILE).read_text()) for d in (one, two)}
  for d in (one, two):
    del metrics[d]["seconds"]
  assert metrics[two]["settings"].pop("processes") == 2
  assert metrics[one]["settings"].pop("processes") == 1
  assert metrics[one] == metrics[two]
  # Pooled over all examples, whichever process decoded them: summed counts, then ratios.
  totals = {name: np.array([line["stats"][name] for line in lines]) for name in lines[0]["stats"]}
  assert metrics[two]["decoding"] == decoding.SpeculativeStats.from_dict(totals).summary()
  assert not decoded["two_p1"].exists()  # process 1 writes nothing


@pytest.mark.parametrize("run", multihost_check.MODEL_PARALLEL_RUNS)
def test_a_model_axis_across_processes_decodes_what_one_process_does(decoded, run):
  # The 'model' axis over all 4 devices: 2 processes x 2 devices against 1 process x 4, the
  # same (1, 4) mesh; both processes feed every row, and only process 0's results count.
  one, two = (decoded[side] / multihost_check.MODEL_PARALLEL_DIR / run for side in ("one", "two"))
  lines, expected = _lines(two), _lines(one)
  # The same tokens and counts; beta_sum, a sum of probabilities, to float32 rounding: the
  # model axis's reductions run in another order over gloo than within one process.
  for line in expected:
    line["stats"]["beta_sum"] = pytest.approx(line["stats"]["beta_sum"], rel=1e-5)
  assert lines == expected
  assert [line["targets"] for line in lines] == [de for _, de in PAIRS]  # each example once
  assert [line["prediction"] for line in lines] == [
      line["prediction"] for line in _lines(decoded["one"] / run)  # the data-parallel mesh's
  ]
  metrics = {d: json.loads((d / inference.METRICS_FILE).read_text()) for d in (one, two)}
  for d in (one, two):
    del metrics[d]["seconds"]
  # Pooled over the examples once each, though both processes decoded every one.
  totals = {name: np.array([line["stats"][name] for line in lines]) for name in lines[0]["stats"]}
  assert metrics[two]["decoding"] == decoding.SpeculativeStats.from_dict(totals).summary()
  metrics[one]["decoding"] = pytest.approx(metrics[one]["decoding"], rel=1e-5)
  assert metrics[two]["settings"].pop("processes") == 2
  assert metrics[one]["settings"].pop("processes") == 1
  assert metrics[two]["settings"]["mesh"] == {"data": 1, "model": 4}
  assert metrics[two] == metrics[one]
  assert not decoded["two_p1"].exists()


def _reads(log: pathlib.Path) -> dict:
  """{run: {parameter: (shape, [the slices it read, each ((start, stop) per dimension)])}} from
  a multihost_check.py process's stderr."""
  [line] = [line for line in log.read_text().splitlines() if multihost_check.READS in line]
  out = {}
  for run, reads in json.loads(line.partition(multihost_check.READS)[2]).items():
    for name, shape, bounds in reads:
      out.setdefault(run, {}).setdefault(name, (tuple(shape), []))[1].append(
          tuple(map(tuple, bounds))
      )
  return out


def test_each_process_reads_only_its_devices_slices_of_the_target(decoded):
  logs = decoded["one"].parent / "logs"
  one, mine, theirs = (_reads(logs / name) for name in ("one", "two", "two_p1"))
  assert one == {}  # one process reads the checkpoint whole, as it always has
  names = {f"target/{name}" for name in flat(network.param_shapes(multihost_check.TINY))}
  model_parallel = [
      f"{multihost_check.MODEL_PARALLEL_DIR}/{run}" for run in multihost_check.MODEL_PARALLEL_RUNS
  ]
  assert mine.keys() == theirs.keys() == set(RUNS) | set(model_parallel)
  # wi_0 [8, 16], its 'mlp' axis over 'model' (4 devices, 2 a process): each process its half.
  kernel = "target/decoder/layers_0/mlp/wi_0/kernel"
  assert mine[model_parallel[0]][kernel] == ((8, 16), [((0, 8), (0, 4)), ((0, 8), (4, 8))])
  assert theirs[model_parallel[0]][kernel] == ((8, 16), [((0, 8), (8, 12)), ((0, 8), (12, 16))])
  for run in mine:
    assert mine[run].keys() == theirs[run].keys() == names
    for name in names:
      (shape, a), (_, b) = mine[run][name], theirs[run][name]
      whole = [tuple((0, n) for n in shape)]
      assert len(set(a)) == len(a) and len(set(b)) == len(b), (run, name)  # each slice once
      if run in RUNS or a == whole:  # replicated: each process reads it whole, once
        assert a == b == whole, (run, name)
      else:  # split over 'model': the two processes' halves, neither reading the other's
        assert not set(a) & set(b), (run, name)
        sizes = [sum(np.prod([stop - start for start, stop in s]) for s in x) for x in (a, b)]
        assert sizes == [np.prod(shape) // 2] * 2, (run, name)


def test_sampling_differs_from_greedy(decoded):
  # Guards the comparison above: T = 1 must sample (not fall back to greedy) in these runs.
  for shape in ("chain", "tree"):
    greedy, sampled = (
        [line["prediction"] for line in _lines(decoded["two"] / f"{shape}_t{t}")] for t in (0, 1)
    )
    assert greedy != sampled


def test_a_killed_process_ends_the_other_with_a_message_naming_it(launched):
  started, dirs = launched
  killer = started["killer"]
  killer.join(timeout=FAULT_LIMIT + 300)
  assert killer.killed_at is not None, "process 1 ended before joining:\n" + "".join(
      killer.stderr[-40:]
  )
  code, stderr = _finish(started["killed"][0])
  assert code != 0, stderr[-3000:]
  assert killer.survivor_ended_at - killer.killed_at < FAULT_LIMIT, stderr[-3000:]
  assert re.search(r"Task 1 heartbeat timeout|stopped sending heartbeats\):\s*1\b", stderr), stderr[
      -3000:
  ]
  outputs = {inference.PREDICTIONS_FILE, inference.METRICS_FILE}
  assert not dirs["killed"].exists() or not outputs & {p.name for p in dirs["killed"].iterdir()}


def test_a_mismatched_process_count_is_refused_before_any_model_loads(launched):
  started, dirs = launched
  for process in started["count"]:
    code, stderr = _finish(process)
    assert code == 1, stderr[-3000:]
    assert (
        "configuration error: process(es) [1] differ from process 0 in ['--process_count'] "
        "(process 0 vs process 1: {'--process_count': ('2', '3')})" in stderr
    ), stderr[-3000:]
    assert "Random weights" not in stderr  # no model was built
  assert not dirs["count"].exists()


def test_a_duplicated_process_index_never_completes_the_join(launched):
  started, dirs = launched
  results = [_finish(process, timeout=FAULT_LIMIT + 60) for process in started["index"]]
  assert all(code != 0 for code, _ in results), [stderr[-2000:] for _, stderr in results]
  assert any(
      re.search(
          "multihost: process 0 of 2: process 1 did not join the JAX distributed runtime at "
          rf"localhost:\d+ within {FAULT_TIMEOUT} s",
          stderr,
      )
      for _, stderr in results
  ), [stderr[-2000:] for _, stderr in results]
  assert not dirs["index"].exists()


@pytest.fixture
def infer_script():
  """scripts/infer.py, loaded in this process (one process alone can judge the flags below); its
  flags leave absl's FLAGS again at the end."""
  spec = importlib.util.spec_from_file_location("infer_script", REPO_ROOT / "scripts" / "infer.py")
  script = importlib.util.module_from_spec(spec)
  defined = set(flags.FLAGS)
  spec.loader.exec_module(script)
  yield script
  flags.FLAGS.unparse_flags()
  for name in set(flags.FLAGS) - defined:
    delattr(flags.FLAGS, name)


def test_a_flag_one_process_can_judge_ends_the_script_before_it_joins(infer_script, monkeypatch):
  monkeypatch.setattr(multihost, "initialize", lambda _: pytest.fail("infer.py began to join"))
  flags.FLAGS(
      [
          "infer.py",
          "--multiprocess_gpu",
          "--coordinator_address=localhost:1234",
          "--process_count=2",
          "--process_index=2",
      ]
  )
  with pytest.raises(
      gin_utils.ConfigError,
      match=re.escape(
          "--process_index=2 is not one of 0 .. 1 (--process_count=2): number the processes 0, "
          "1, ..., process_count - 1, each index on one process"
      ),
  ):
    infer_script.main(["infer.py"])


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(process_count=2), "--process_count given without --multiprocess_gpu"),
        (
            dict(multiprocess_gpu=True, process_count=2, process_index=0),
            "but not --coordinator_address: give all three",
        ),
        (
            dict(
                multiprocess_gpu=True, coordinator_address="h:1", process_count=2, process_index=2
            ),
            "--process_index=2 is not one of 0 .. 1",
        ),
        (
            dict(
                multiprocess_gpu=True, coordinator_address="h:1", process_count=2, process_index=-1
            ),
            "--process_index=-1 is not one of 0 .. 1",
        ),
        (
            dict(
                multiprocess_gpu=True, coordinator_address="h:1", process_count=0, process_index=0
            ),
            "--process_count=0: give the number of processes, >= 1",
        ),
        (
            dict(multiprocess_gpu=True, coordinator_address="h", process_count=2, process_index=0),
            "--coordinator_address='h' is not 'host:port'",
        ),
        (
            dict(
                multiprocess_gpu=True, coordinator_address="h:0", process_count=2, process_index=0
            ),
            "--coordinator_address='h:0' is not 'host:port' with a port in 1..65535",
        ),
        (dict(multiprocess_gpu=True, timeout_seconds=0), "--multiprocess_timeout_seconds=0"),
    ],
)
def test_flags_one_process_can_judge_are_refused_before_anything_starts(fields, message):
  with pytest.raises(gin_utils.ConfigError, match=re.escape(message)):
    multihost.ProcessFlags(**fields)


def test_good_flags_pass():
  assert multihost.ProcessFlags(
      multiprocess_gpu=True, coordinator_address="10.0.0.1:1234", process_count=2, process_index=1
  ).explicit
  assert not multihost.ProcessFlags(multiprocess_gpu=True).explicit  # JAX detects them
  multihost.ProcessFlags()  # one process


def test_one_process_gathers_its_own():
  assert multihost.gather_texts(["a", "é"]) == ["a", "é"]
  multihost.check_same_everywhere({"anything": 1})
  multihost.all_succeeded(True, "nothing")


def test_a_one_process_script_refuses_several(monkeypatch):
  monkeypatch.setattr(jax, "process_count", lambda: 4)
  monkeypatch.setattr(jax, "process_index", lambda: 2)
  with pytest.raises(
      gin_utils.ConfigError,
      match=re.escape(
          "scripts/benchmark.py runs in one process, and JAX runs 4 (this is process 2)"
      ),
  ):
    multihost.refuse_multiprocess("scripts/benchmark.py")
  monkeypatch.setattr(jax, "process_count", lambda: 1)
  multihost.refuse_multiprocess("scripts/benchmark.py")

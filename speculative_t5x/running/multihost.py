"""Several processes, one program: JAX's multi-controller runtime, as T5X runs on a TPU pod slice.

Every host runs the same command; `jax.distributed` joins the processes, a mesh spans every
process's devices (`partitioning.Partitioner`), each process reads its shard of the data and
feeds its rows of each global batch (`partitioning.Partitioner.get_data_layout`,
`place_process_batch`). This module holds what is about processes
rather than arrays:

  ProcessFlags      T5X's flags --multiprocess_gpu, --coordinator_address, --process_count and
                    --process_index, with its meaning, checked before anything starts;
  initialize        `jax.distributed.initialize` with bounded waits, and a clear message naming
                    the missing process when the join does not complete;
  check_same_everywhere  values every process must agree on (the flags, the configuration, the
                    number of examples), compared across processes before any model loads;
  gather_texts      lists of strings from every process, in process order (JAX's collectives);
  all_succeeded     a collective end: a process that failed makes every process fail.

Faults. JAX's distributed runtime does the health checking: each process sends heartbeats to the
coordination service (in process 0), and a process that stops (killed, crashed, its host gone) is
declared dead after `timeout_seconds`, when the runtime ends every other process with a non-zero
status (SIGABRT) and the message "Terminating process because the JAX distributed service
detected fatal errors ... Task <i> heartbeat timeout" (or "The following tasks are unhealthy
(stopped sending heartbeats): <i>"), which names the dead process by its index. If process 0 dies,
the others lose the coordination service at once ("Socket closed"). A join that does not complete
(a process that never starts, a second process with the same --process_index, one with another
--process_count) ends here after `timeout_seconds`, with a message naming the processes this one
waited for. Outputs are written by process 0 only after every process's results have been
gathered, so a run that stops early leaves no output that could pass for complete.

Single process: every function works unchanged, so the same code runs
on one CPU and on a pod slice.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import re
import socket
import sys
import threading
from typing import Any, Mapping, Sequence

from absl import logging
import jax
import numpy as np

from speculative_t5x import gin_utils

DEFAULT_TIMEOUT_SECONDS = 30
# The runtime's own join deadline is this much later than ours, so ours (which names the missing
# processes) speaks first.
_RUNTIME_JOIN_MARGIN_SECONDS = 10
JOIN_FAILED_EXIT_STATUS = 1
_ADDRESS = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})$")


@dataclasses.dataclass(frozen=True)
class ProcessFlags:
  """T5X's multi-process flags (t5x/train.py, t5x/infer.py), with its meaning.

  multiprocess_gpu: initialize JAX's distributed runtime (`jax.distributed.initialize`) with
    coordinator_address, process_count and process_index. T5X names it for GPUs; it joins CPU
    processes too. Given without the other three, JAX detects them (Cloud TPU pod slices, Slurm,
    Open MPI): on a TPU pod slice `--multiprocess_gpu` alone is enough.
  coordinator_address: 'host:port' of process 0, where the coordination service listens; the
    same on every process.
  process_count: the number of processes, the same on every process.
  process_index: this process's index, 0 .. process_count - 1, each index on one process.
  timeout_seconds: how long to wait for every process to join, the heartbeat timeout after which
    a silent process is declared dead, and the wait at shutdown (ours; T5X leaves JAX's 300 s,
    100 s and 300 s).
  """

  multiprocess_gpu: bool = False
  coordinator_address: str | None = None
  process_count: int | None = None
  process_index: int | None = None
  timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS

  def __post_init__(self):
    """Checks what one process can check alone, before anything starts: raises
    `gin_utils.ConfigError` naming the flag and the fix."""
    explicit = {
        "--coordinator_address": self.coordinator_address,
        "--process_count": self.process_count,
        "--process_index": self.process_index,
    }
    given = [name for name, value in explicit.items() if value is not None]
    if not self.multiprocess_gpu:
      if given:
        raise gin_utils.ConfigError(
            f"{', '.join(given)} given without --multiprocess_gpu: T5X's flags join processes "
            "only with --multiprocess_gpu; add it (with all three of --coordinator_address, "
            "--process_count and --process_index), or drop them for one process"
        )
      return
    if given and len(given) != len(explicit):
      missing = [name for name in explicit if name not in given]
      raise gin_utils.ConfigError(
          f"--multiprocess_gpu with {', '.join(given)} but not {', '.join(missing)}: give all "
          "three of --coordinator_address, --process_count and --process_index, or none of them "
          "(JAX then detects them on a TPU pod slice, Slurm or Open MPI)"
      )
    if _bad_int(self.timeout_seconds, 1):
      raise gin_utils.ConfigError(
          f"--multiprocess_timeout_seconds={self.timeout_seconds!r}: give a whole number of "
          "seconds >= 1"
      )
    if not given:
      return
    if _bad_int(self.process_count, 1):
      raise gin_utils.ConfigError(
          f"--process_count={self.process_count!r}: give the number of processes, >= 1"
      )
    if _bad_int(self.process_index, 0) or self.process_index >= self.process_count:
      raise gin_utils.ConfigError(
          f"--process_index={self.process_index!r} is not one of 0 .. {self.process_count - 1} "
          f"(--process_count={self.process_count}): number the processes 0, 1, ..., "
          "process_count - 1, each index on one process"
      )
    match = _ADDRESS.match(str(self.coordinator_address))
    if not match or not 1 <= int(match.group("port")) <= 65535:
      raise gin_utils.ConfigError(
          f"--coordinator_address={self.coordinator_address!r} is not 'host:port' with a port "
          "in 1..65535: give process 0's address and a free port, the same on every process, "
          "e.g. --coordinator_address=10.0.0.1:1234"
      )

  @property
  def explicit(self) -> bool:
    """Whether the address, count and index are given (not detected by JAX)."""
    return self.coordinator_address is not None


def _bad_int(value: Any, low: int) -> bool:
  return not isinstance(value, int) or isinstance(value, bool) or value < low


def _join_failed(flags: ProcessFlags) -> None:
  """Called when the join has not completed in time: says which processes this one waited for,
  and what to check, and ends this process (the runtime would end it later with a bare
  DEADLINE_EXCEEDED)."""
  if flags.explicit:
    others = [i for i in range(flags.process_count) if i != flags.process_index]
    waited = (
        f"process {others[0]} did not join"
        if len(others) == 1
        else f"not all of processes {others} joined"
    )
    message = (
        f"process {flags.process_index} of {flags.process_count}: {waited} the JAX distributed "
        f"runtime at {flags.coordinator_address} within {flags.timeout_seconds} s. Start every "
        f"process with --process_count={flags.process_count}, a distinct --process_index in "
        f"0..{flags.process_count - 1} and --coordinator_address={flags.coordinator_address} "
        "(a process that never starts, one given another --process_count, or two given the "
        "same --process_index leave the join incomplete), or raise "
        "--multiprocess_timeout_seconds if hosts start slowly."
    )
  else:
    message = (
        "the JAX distributed runtime (processes detected by JAX) was not joined by every "
        f"process within {flags.timeout_seconds} s: start the same command on every host, "
        "e.g. with gcloud's --worker=all."
    )
  sys.stderr.write(f"multihost: {message}\n")
  sys.stderr.flush()
  os._exit(JOIN_FAILED_EXIT_STATUS)  # the runtime holds threads that would block a normal exit.


def detected_cluster() -> str | None:
  """The name of the cluster environment `jax.distributed.initialize` would detect the processes
  from (a Cloud TPU pod slice, Slurm, Open MPI, Kubernetes), or None where there is none; where
  JAX's detection cannot be asked, 'unknown'."""
  try:
    from jax._src import clusters  # pylint: disable=g-import-not-at-top

    environments = clusters.ClusterEnv._cluster_types  # pylint: disable=protected-access
  except (ImportError, AttributeError):
    return "unknown"
  for environment in environments:
    if getattr(environment, "opt_in_only_method", False):
      continue
    try:
      if environment.is_env_present():
        return environment.__name__
    except Exception:  # pylint: disable=broad-except  (a probe that fails detects nothing)
      continue
  return None


def check_can_start(flags: ProcessFlags) -> None:
  """What the machine decides, checked before `jax.distributed.initialize`: --multiprocess_gpu
  alone needs an environment JAX detects the processes from (`detected_cluster`), and process 0
  needs the --coordinator_address port free (it binds a socket to it, and closes it). Raises
  `gin_utils.ConfigError` naming the flag or the port and the fix."""
  if not flags.multiprocess_gpu:
    return
  if not flags.explicit:
    if detected_cluster() is None:
      raise gin_utils.ConfigError(
          "--multiprocess_gpu alone asks JAX to detect the processes, and this machine is none "
          "of the environments it detects them from (a Cloud TPU pod slice, Slurm, Open MPI, "
          "Kubernetes): give --coordinator_address, --process_count and --process_index, or "
          "drop --multiprocess_gpu for one process"
      )
    return
  if flags.process_index != 0:
    return
  port = int(_ADDRESS.match(flags.coordinator_address).group("port"))
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the coordinator binds
    try:
      probe.bind(("", port))
    except OSError as e:
      if e.errno != errno.EADDRINUSE:
        return  # not ours to judge (e.g. a port the system reserves): the runtime says
      raise gin_utils.ConfigError(
          f"--coordinator_address={flags.coordinator_address}: port {port} is in use on this "
          "host, where process 0 starts the coordinator: give a free port (the same on every "
          "process), or end what holds it"
      ) from e


def initialize(flags: ProcessFlags) -> None:
  """Joins this process to the others (`jax.distributed.initialize`) if `flags.multiprocess_gpu`;
  nothing otherwise. Must run before anything else uses JAX.

  CPU processes exchange data through gloo (`jax_cpu_collectives_implementation`). A join that
  has not completed after `flags.timeout_seconds` ends this process with a message naming the
  processes it waited for (exit status `JOIN_FAILED_EXIT_STATUS`). Then every process checks
  that the runtime's count and index are the flags' (`check_same_everywhere`). First
  `check_can_start`: --multiprocess_gpu alone where JAX detects no processes, and a coordinator
  port in use, are errors naming the flag and the port.
  """
  if not flags.multiprocess_gpu:
    return
  check_can_start(flags)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if flags.explicit:
    logging.info(
        "process %d of %d: joining the JAX distributed runtime at %s (if the runtime ends this "
        "process with ALREADY_EXISTS, another process was given --process_index=%d too)",
        flags.process_index,
        flags.process_count,
        flags.coordinator_address,
        flags.process_index,
    )
  watchdog = threading.Timer(flags.timeout_seconds, _join_failed, args=(flags,))
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(
        flags.coordinator_address,
        flags.process_count,
        flags.process_index,
        initialization_timeout=flags.timeout_seconds + _RUNTIME_JOIN_MARGIN_SECONDS,
        heartbeat_timeout_seconds=flags.timeout_seconds,
        shutdown_timeout_seconds=flags.timeout_seconds,
    )
  finally:
    watchdog.cancel()
  logging.info(
      "process %d of %d joined: %d local device(s), %d in all",
      jax.process_index(),
      jax.process_count(),
      jax.local_device_count(),
      jax.device_count(),
  )
  # A process given another --process_count than process 0 can still join (the coordination
  # service counts process 0's); the other mismatches leave the join incomplete (above).
  count = flags.process_count if flags.explicit else jax.process_count()
  check_same_everywhere({"--process_count": count})
  if count != jax.process_count():
    raise gin_utils.ConfigError(
        f"--process_count={count} on every process, but {jax.process_count()} processes joined "
        f"the runtime at {flags.coordinator_address}: give the number of processes you start"
    )


def is_writer() -> bool:
  """Whether this process writes the run's files (process 0)."""
  return jax.process_index() == 0


def gather_texts(texts: Sequence[str]) -> list[str]:
  """Every process's `texts`, concatenated in process order (each process may give a different
  number) -> the same list on every process. A collective: every process must call it."""
  if jax.process_count() == 1:
    return list(texts)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  payload = json.dumps(list(texts), ensure_ascii=False).encode("utf-8")
  lengths = multihost_utils.process_allgather(np.array([len(payload)], np.int64))
  longest = int(np.max(lengths))
  padded = np.zeros((longest,), np.uint8)
  padded[: len(payload)] = np.frombuffer(payload, np.uint8)
  gathered = np.asarray(multihost_utils.process_allgather(padded))
  out = []
  for row, length in zip(gathered.reshape(len(lengths), longest), np.ravel(lengths)):
    out.extend(json.loads(row[: int(length)].tobytes().decode("utf-8")))
  return out


def check_same_everywhere(values: Mapping[str, Any]) -> None:
  """Raises `gin_utils.ConfigError` on every process if some process has other `values` than
  process 0 (compared by their JSON text), naming the processes and the values; nothing with one
  process. A collective: every process must call it."""
  if jax.process_count() == 1:
    return
  mine = json.dumps(values, sort_keys=True, default=str)
  everyone = gather_texts([mine])
  differing = [i for i, text in enumerate(everyone) if text != everyone[0]]
  if differing:
    ours, theirs = json.loads(everyone[0]), json.loads(everyone[differing[0]])
    keys = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
    shown = {k: (_short(ours.get(k)), _short(theirs.get(k))) for k in keys}
    raise gin_utils.ConfigError(
        f"process(es) {differing} differ from process 0 in {keys} (process 0 vs process "
        f"{differing[0]}: {shown}): start every process with the same flags, gin files and "
        "data"
    )


def _short(value: Any, limit: int = 200) -> str:
  text = str(value)
  if len(text) <= limit:
    return text
  return f"{text[:limit]}... (sha256 {hashlib.sha256(text.encode()).hexdigest()[:12]})"


def all_succeeded(ok: bool, what: str) -> None:
  """A collective end of a phase: raises RuntimeError on every process if any process passes
  ok=False, naming those processes and `what` they failed at."""
  if jax.process_count() == 1:
    return
  failed = [i for i, text in enumerate(gather_texts([str(bool(ok))])) if text != "True"]
  if failed:
    raise RuntimeError(f"process(es) {failed} failed at {what}; see their logs")


def refuse_multiprocess(script: str) -> None:
  """Raises `gin_utils.ConfigError` if JAX runs more than one process (a TPU pod slice's hosts,
  or a joined distributed runtime): for scripts that time or write from one process only."""
  if jax.process_count() > 1:
    raise gin_utils.ConfigError(
        f"{script} runs in one process, and JAX runs {jax.process_count()} (this is process "
        f"{jax.process_index()}): it times batch-1 decodes on one host's devices and has no "
        "way to pool timings across hosts. Run it on a single-host machine (e.g. a v4-8 TPU "
        "VM, or one GPU host), or decode a split on every host with scripts/infer.py and "
        "--multiprocess_gpu (docs/multihost.md)."
    )

"""Wall time of jitted calls, and whether the machine was quiet before they were timed.

The first call (compilation) and `warmup` more are untimed; calls that are compared are timed in
the same `repeats` rounds, each ended by `jax.block_until_ready`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from typing import Any, Callable, Hashable, Mapping, Sequence

import jax
import numpy as np

DEFAULT_REPEATS = 20
DEFAULT_WARMUP = 1


# A busy machine's timings are not a quiet one's. The load average lags by minutes, so the
# verdict rests on the processes runnable now (/proc/loadavg, sampled).
_RUNNABLE_SAMPLES = 5
_SAMPLE_SECONDS = 0.1


def _runnable_others() -> int | None:
  """The fewest runnable tasks besides this one over a few samples; None without /proc."""
  try:
    counts = []
    for _ in range(_RUNNABLE_SAMPLES):
      with open("/proc/loadavg", encoding="ascii") as f:
        counts.append(int(f.read().split()[3].split("/")[0]) - 1)
      time.sleep(_SAMPLE_SECONDS)
  except (OSError, ValueError, IndexError):
    return None
  return max(0, min(counts))


def machine_load() -> dict:
  """The load averages, the core count and the other processes runnable now."""
  one, five, fifteen = os.getloadavg()
  return {
      "load_1m": one,
      "load_5m": five,
      "load_15m": fifteen,
      "cpus": os.cpu_count(),
      "runnable_others": _runnable_others(),
  }


def busy_warning(load: dict) -> str | None:
  """A loud warning where `machine_load()` shows other work running (without /proc, a
  1-minute load above 0.5), else None."""
  others = load["runnable_others"]
  if others is None:
    if load["load_1m"] <= 0.5:
      return None
    seen = f"1-minute load average {load['load_1m']:.2f} > 0.5"
  elif others == 0:
    return None
  else:
    seen = f"{others} other process(es) running"
  return (
      f"WARNING: the machine was busy before this timing ({seen}): other work shares the "
      "cores, so these times and speedups are not a quiet machine's. Rerun with nothing else "
      "running before using them."
  )


@dataclasses.dataclass(frozen=True)
class Timing:
  """Statistics of `repeats` wall-clock times, in milliseconds (IQR = 75th - 25th percentile)."""

  median_ms: float
  min_ms: float
  max_ms: float
  iqr_ms: float
  repeats: int

  @classmethod
  def from_seconds(cls, seconds: Sequence[float]) -> "Timing":
    """Times in seconds [repeats] -> Timing in milliseconds."""
    ms = np.asarray(seconds, np.float64) * 1e3
    if ms.ndim != 1 or ms.size == 0:
      raise ValueError(f"need a non-empty 1-D sequence of times, got shape {ms.shape}.")
    q25, q50, q75 = np.percentile(ms, [25, 50, 75])
    return cls(
        median_ms=float(q50),
        min_ms=float(ms.min()),
        max_ms=float(ms.max()),
        iqr_ms=float(q75 - q25),
        repeats=int(ms.size),
    )

  def per_step(self, steps: int) -> "Timing":
    """The same statistics divided by `steps` (a call that ran `steps` identical steps)."""
    return Timing(
        self.median_ms / steps,
        self.min_ms / steps,
        self.max_ms / steps,
        self.iqr_ms / steps,
        self.repeats,
    )

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


def time_calls(
    calls: Mapping[Hashable, tuple[Callable[..., Any], Sequence[Any]]],
    *,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    compiled: bool = False,
    outputs: dict[Hashable, Any] | None = None,
) -> dict[Hashable, Timing]:
  """name -> Timing of calls (name -> (jitted fn, args)) timed side by side: each round times
  every call once, in an order rotated from round to round, so a slow spell lands on all alike.
  compiled: every call ran before (else `first_calls` first). outputs: filled with name -> the
  last timed run's result."""
  return {
      name: Timing.from_seconds(seconds)
      for name, seconds in time_rounds(
          calls, repeats=repeats, warmup=warmup, compiled=compiled, outputs=outputs
      ).items()
  }


def time_rounds(
    calls: Mapping[Hashable, tuple[Callable[..., Any], Sequence[Any]]],
    *,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    compiled: bool = False,
    outputs: dict[Hashable, Any] | None = None,
) -> dict[Hashable, np.ndarray]:
  """`time_calls` without the statistics: name -> seconds [repeats], entry r from round r."""
  if int(repeats) < 1 or int(warmup) < 0:
    raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}.")
  if not calls:
    raise ValueError("no calls to time.")
  names = list(calls)
  if not compiled:
    first_calls(calls)
  for name in names:
    fn, args = calls[name]
    for _ in range(int(warmup)):
      jax.block_until_ready(fn(*args))
  seconds = {name: np.zeros(int(repeats)) for name in names}
  for r in range(int(repeats)):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      fn, args = calls[name]
      start = time.perf_counter()
      result = jax.block_until_ready(fn(*args))
      seconds[name][r] = time.perf_counter() - start
      if outputs is not None:
        outputs[name] = result
  return seconds


def until_resolved(
    calls: Mapping[Hashable, tuple[Callable[..., Any], Sequence[Any]]],
    seconds: Mapping[Hashable, np.ndarray],
    resolve: Callable[[dict[Hashable, np.ndarray]], Any],
    *,
    more: int,
    limit: int,
) -> tuple[Any, int]:
  """(resolve(seconds), rounds added): while resolve raises ValueError (within the noise), time
  `more` rounds of `calls` more, up to `limit` in all, then raise it."""
  seconds, added = dict(seconds), 0
  while True:
    try:
      return resolve(seconds), added
    except ValueError:
      if added >= limit:
        raise
      new = time_rounds(calls, repeats=more, warmup=0, compiled=True)
      seconds = {name: np.concatenate([seconds[name], new[name]]) for name in seconds}
      added += more


def first_calls(calls: Mapping[Hashable, tuple[Callable[..., Any], Sequence[Any]]]) -> dict:
  """name -> the output of each call run once, compiling it: on CPU a thread per core (XLA
  compiles without Python's lock), on an accelerator one at a time so buffers are not held
  together. Each function's first call goes first: a second would idle waiting for it."""
  workers = (os.cpu_count() or 1) if jax.default_backend() == "cpu" else 1
  firsts = {}  # id(fn) -> the name of its first call
  for name, (fn, _) in calls.items():
    firsts.setdefault(id(fn), name)
  order = list(firsts.values()) + [name for name in calls if name not in firsts.values()]
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    futures = {
        name: pool.submit(lambda call: jax.block_until_ready(call[0](*call[1])), calls[name])
        for name in order
    }
    return {name: futures[name].result() for name in calls}

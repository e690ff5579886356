"""A pair's measured acceptance, recorded in a file so that a later run need not measure it again.

Acceptance belongs to the pair and its inputs, not to the machine: beta_t = sum_x min(p_t(x),
q_t(x)) at each position t the target generated itself (`calibration.measure_positions`), the
same numbers on any device up to float rounding. Measuring it compiles and runs the target's
sampler and a teacher-forced scorer; the machine's costs, which do depend on the machine, are
timed afresh by `auto_shape.Auto` in every run.

A record holds the positions (`calibration.Positions`: confidence and beta per sequence, float64,
which JSON keeps exactly) and what they were measured on, under a `Key`: the pair's fingerprint
(`pair_fingerprint`: configs and weights), the temperature, the decode length and a digest of
the encoder inputs [N, Le]. A record made for other weights, inputs, temperature or decode
length has another key and is never read for these, so a file left behind by older weights
cannot stand in for a measurement.

The file (JSON):
  {"format": FORMAT, "records": [{"key": {"pair", "temperature", "decode_length", "inputs"},
   "measured_on": "<what the positions are, in words>", "confidence": [[...], ...],
   "beta": [[...], ...]}, ...]}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any

import jax
import numpy as np

from speculative_t5x.measuring import calibration

FORMAT = "speculative_t5x acceptance records 1"


def pair_fingerprint(target_config, target_params, drafter, drafter_params) -> str:
  """The pair's identity: a sha256 of the configs (the drafter's repr) and every parameter's
  path, shape, dtype and a few of its values (the first and last rows' ends, sliced where the
  leaf lives: a T5-XXL's 22 GB never cross to the host). The same in every process."""
  digest = hashlib.sha256(repr((target_config, drafter)).encode())
  for params in (target_params, drafter_params):
    paths_leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    # Sliced in one program: leaf by leaf, eager slicing compiles a program per shape.
    ends = jax.device_get(_leaf_ends([leaf for _, leaf in paths_leaves]))
    for (path, leaf), values in zip(paths_leaves, ends):
      shape, dtype = np.shape(leaf), getattr(leaf, "dtype", type(leaf))
      digest.update(f"{jax.tree_util.keystr(path)}{shape}{dtype}".encode())
      for value in values:
        digest.update(np.asarray(value).tobytes())
  return digest.hexdigest()


@jax.jit
def _leaf_ends(leaves: list) -> list[tuple]:
  """Each leaf -> (its first row's first 16 values, its last row's last 16), a scalar -> (it,)."""
  ends = []
  for leaf in leaves:
    ndim = np.ndim(leaf)
    if ndim:
      ends.append((leaf[(0,) * (ndim - 1)][:16], leaf[(-1,) * (ndim - 1)][-16:]))
    else:
      ends.append((leaf,))
  return ends


def inputs_digest(encoder_tokens: np.ndarray) -> str:
  """A sha256 of encoder token ids [N, Le] (as int32) and their shape."""
  tokens = np.ascontiguousarray(np.asarray(encoder_tokens), dtype=np.int32)
  return hashlib.sha256(f"{tokens.shape}".encode() + tokens.tobytes()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Key:
  """What a record's positions depend on: the pair (`pair_fingerprint`), the temperature, the
  decode length and the inputs (`inputs_digest`)."""

  pair: str
  temperature: float
  decode_length: int
  inputs: str

  @classmethod
  def of(
      cls,
      target_config,
      target_params,
      drafter,
      drafter_params,
      temperature: float,
      decode_length: int,
      encoder_tokens: np.ndarray,
  ) -> "Key":
    return cls(
        pair_fingerprint(target_config, target_params, drafter, drafter_params),
        float(temperature),
        int(decode_length),
        inputs_digest(encoder_tokens),
    )


@dataclasses.dataclass(frozen=True)
class Record:
  """Positions measured under a key, and what they were measured on (in words)."""

  key: Key
  positions: calibration.Positions
  measured_on: str

  def as_dict(self) -> dict:
    return {
        "key": dataclasses.asdict(self.key),
        "measured_on": self.measured_on,
        "confidence": [np.asarray(c, np.float64).tolist() for c in self.positions.confidence],
        "beta": [np.asarray(b, np.float64).tolist() for b in self.positions.beta],
    }

  @classmethod
  def from_dict(cls, record: dict) -> "Record":
    return cls(
        Key(**record["key"]),
        calibration.Positions(
            [np.asarray(c, np.float64) for c in record["confidence"]],
            [np.asarray(b, np.float64) for b in record["beta"]],
        ),
        str(record["measured_on"]),
    )


def read_all(path: str | os.PathLike) -> list[Record]:
  """Every record of the file at `path`; [] where there is none. A file that is not one (other
  JSON, a record with a missing field or a value that is not a probability) raises a ValueError
  that names it and the fix."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  try:
    content = json.loads(path.read_text())
    if not isinstance(content, dict) or content.get("format") != FORMAT:
      raise ValueError(f"its 'format' is not {FORMAT!r}")
    return [Record.from_dict(record) for record in content["records"]]
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(
        f"{path} is not a file of acceptance records ({type(e).__name__}: {e}): delete it, or "
        "measure again and record (the demo's --record_acceptance)."
    ) from e


def find(path: str | os.PathLike, key: Key) -> Record | None:
  """The record of `key` in the file at `path`, or None where it has none (or there is none)."""
  return next((record for record in read_all(path) if record.key == key), None)


def write(path: str | os.PathLike, record: Record) -> None:
  """Adds `record` to the file at `path` (created with its folder where absent), in place of
  any record of the same key; written under a temporary name and renamed, so a failed write
  leaves the file as it was."""
  path = pathlib.Path(path)
  records = [kept for kept in read_all(path) if kept.key != record.key] + [record]
  path.parent.mkdir(parents=True, exist_ok=True)
  temporary = path.with_name(path.name + ".tmp")
  content: dict[str, Any] = {"format": FORMAT, "records": [r.as_dict() for r in records]}
  temporary.write_text(json.dumps(content, indent=1) + "\n")
  temporary.replace(path)

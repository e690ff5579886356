"""acceptance_record: the pair's fingerprint, the record's key, and the file: exact round trips,
a record found only under its own key, replacement, and a malformed file refused."""

import json

import numpy as np
import pytest

from conftest import tiny_config
from speculative_t5x import drafters
from speculative_t5x.measuring import acceptance_record
from speculative_t5x.measuring import calibration

CONFIG = tiny_config(16)
DRAFTER = drafters.T5Drafter(CONFIG)
PARAMS = {"a": np.arange(40, dtype=np.float32).reshape(2, 20), "b": np.float32(3.0)}
TOKENS = np.array([[5, 6, 1, 0], [7, 1, 0, 0]], np.int32)


def test_fingerprint_reads_every_leaf_and_its_ends():
  """The pair's fingerprint changes with a config, a leaf's path, shape or dtype, or a value at
  either end of a leaf; it ignores a value in between (only the ends are read)."""
  key = acceptance_record.pair_fingerprint(CONFIG, PARAMS, DRAFTER, {})
  assert acceptance_record.pair_fingerprint(CONFIG, dict(PARAMS), DRAFTER, {}) == key

  def changed(**leaves):
    return acceptance_record.pair_fingerprint(CONFIG, {**PARAMS, **leaves}, DRAFTER, {})

  first, last, middle = (PARAMS["a"].copy() for _ in range(3))
  first[0, 0], last[-1, -1], middle[0, 18] = -1, -1, -1
  assert changed(a=first) != key and changed(a=last) != key and changed(b=np.float32(4)) != key
  assert changed(a=PARAMS["a"].astype(np.float16)) != key and changed(c=np.float32(3.0)) != key
  assert changed(a=middle) == key  # position 18 of row 0: neither end
  assert acceptance_record.pair_fingerprint(CONFIG.replace(emb_dim=32), PARAMS, DRAFTER, {}) != key


def key(temperature=0.0, decode_length=8, tokens=TOKENS, params=PARAMS):
  return acceptance_record.Key.of(CONFIG, params, DRAFTER, {}, temperature, decode_length, tokens)


def positions(seed):
  """Two sequences of float32 probabilities widened to float64, as `measure_positions` gives."""
  rng = np.random.default_rng(seed)
  draws = [rng.random(n).astype(np.float32).astype(np.float64) for n in (3, 5, 3, 5)]
  return calibration.Positions(draws[:2], draws[2:])


def test_a_record_round_trips_exactly_and_is_found_under_its_own_key_only(tmp_path):
  path = tmp_path / "measurements" / "acceptance.json"
  assert acceptance_record.find(path, key()) is None  # no file: nothing recorded
  measured = positions(0)
  acceptance_record.write(path, acceptance_record.Record(key(), measured, "3 + 5 tokens"))
  found = acceptance_record.find(path, key())
  assert found.measured_on == "3 + 5 tokens"
  for got, want in zip(
      found.positions.beta + found.positions.confidence, measured.beta + measured.confidence
  ):
    np.testing.assert_array_equal(got, want)  # bit for bit: the decision sees the same alpha
  other_tokens = TOKENS.copy()
  other_tokens[0, 0] = 9
  other_params = {**PARAMS, "b": np.float32(4.0)}
  for other in (
      key(temperature=1.0),
      key(decode_length=16),
      key(tokens=other_tokens),
      key(tokens=TOKENS[:1]),
      key(params=other_params),
  ):
    assert other != key() and acceptance_record.find(path, other) is None
  assert not list(path.parent.glob("*.tmp"))


def test_writing_a_key_again_replaces_its_record_and_keeps_the_others(tmp_path):
  path = tmp_path / "acceptance.json"
  acceptance_record.write(path, acceptance_record.Record(key(0.0), positions(0), "first"))
  acceptance_record.write(path, acceptance_record.Record(key(1.0), positions(1), "at T = 1"))
  acceptance_record.write(path, acceptance_record.Record(key(0.0), positions(2), "again"))
  records = acceptance_record.read_all(path)
  assert [(r.key.temperature, r.measured_on) for r in records] == [
      (1.0, "at T = 1"),
      (0.0, "again"),
  ]
  np.testing.assert_array_equal(
      acceptance_record.find(path, key(0.0)).positions.beta[0], positions(2).beta[0]
  )


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"records": []}),  # no format
        json.dumps({"format": acceptance_record.FORMAT, "records": [{"key": {}}]}),
        json.dumps(
            {
                "format": acceptance_record.FORMAT,
                "records": [
                    {
                        "key": {"pair": "p", "temperature": 0.0, "decode_length": 8, "inputs": "i"},
                        "measured_on": "x",
                        "confidence": [[0.5]],
                        "beta": [[1.5]],  # not a probability
                    }
                ],
            }
        ),
    ],
)
def test_a_file_that_is_not_one_of_records_is_refused_with_the_fix(tmp_path, content):
  path = tmp_path / "acceptance.json"
  path.write_text(content)
  with pytest.raises(
      ValueError, match=r"is not a file of acceptance records .*: delete it, or measure again"
  ):
    acceptance_record.find(path, key())
  with pytest.raises(ValueError, match="is not a file of acceptance records"):
    acceptance_record.write(path, acceptance_record.Record(key(), positions(0), "x"))
  assert path.read_text() == content  # a refused write leaves the file as it was

"""The confidence rule of adaptive draft length, on values worked out by hand.

Its exactness inside the loop is tested in test_speculative.py (enumeration of blocks with empty
slots) and test_decoding.py (whole sequences, greedy equality, drafter-step counts).
"""

import gin
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5x import draft_length

# Two rows over V = 4: softmax(log p) = p.
PROBS = np.array([[0.7, 0.1, 0.1, 0.1], [0.3, 0.3, 0.25, 0.15]], np.float32)
LOGITS = jnp.log(jnp.asarray(PROBS))


def test_confidence_is_the_top_probability_or_the_drafts():
  drafts = jnp.array([1, 2])
  np.testing.assert_allclose(
      draft_length.ConfidenceStop(0.5).confidence(LOGITS, drafts), [0.7, 0.3], rtol=1e-6
  )
  np.testing.assert_allclose(
      draft_length.ConfidenceStop(0.5, "draft").confidence(LOGITS, drafts), [0.1, 0.25], rtol=1e-6
  )


@pytest.mark.parametrize(
    "threshold, measure, expected",
    [
        (0.5, "max", [False, True]),
        (0.29, "max", [False, False]),
        (0.31, "max", [False, True]),
        (0.2, "draft", [True, False]),
        (0.0, "draft", [False, False]),  # threshold 0 never stops: static gamma
        (1.0, "max", [True, True]),
    ],
)
def test_stops_below_the_threshold(threshold, measure, expected):
  stop = draft_length.ConfidenceStop(threshold, measure)(LOGITS, jnp.array([1, 2]))
  np.testing.assert_array_equal(stop, expected)


def test_the_rule_reads_temperature_one_logits_whatever_their_scale():
  """Confidence is softmax at temperature 1 of the logits given: scaling them changes it."""
  rule = draft_length.ConfidenceStop(0.5)
  np.testing.assert_array_equal(rule(LOGITS * 0.1, jnp.array([0, 0])), [True, True])
  np.testing.assert_array_equal(rule(LOGITS, jnp.array([0, 0])), [False, True])


def test_non_finite_logits_stop_the_row():
  logits = LOGITS.at[0, 2].set(jnp.nan)
  np.testing.assert_array_equal(
      draft_length.ConfidenceStop(0.0)(logits, jnp.array([0, 0])), [True, False]
  )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"threshold": 1.5}, r"in \[0, 1\]"),
        ({"threshold": -0.1}, r"in \[0, 1\]"),
        ({"threshold": float("nan")}, r"in \[0, 1\]"),
        ({"threshold": "0.4"}, "must be a number"),
        ({"threshold": True}, "must be a number"),
        ({"threshold": 0.4, "measure": "mean"}, "measure must be one of"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    draft_length.ConfidenceStop(**kwargs)


def test_gin_binds_the_rule():
  gin.clear_config()
  try:
    gin.parse_config(
        "import speculative_t5x.draft_length\n"
        "draft_length.ConfidenceStop.threshold = 0.4\n"
        "draft_length.ConfidenceStop.measure = 'draft'\n"
    )
    rule = gin.get_configurable("draft_length.ConfidenceStop")()
  finally:
    gin.clear_config()
  assert rule == draft_length.ConfidenceStop(0.4, "draft")
  assert hash(rule) == hash(draft_length.ConfidenceStop(0.4, "draft"))

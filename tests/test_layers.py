"""Tests of the T5 1.1 building blocks (`layers.py`): T5's relative-position buckets."""

import numpy as np

from speculative_t5x import layers


def test_relative_position_buckets_match_t5_definition():
  # Hand-derived from T5's definition: causal, 32 buckets, max_exact 16, max_distance 128.
  rel = -np.array([0, 1, 15, 16, 20, 127, 128, 1000])
  np.testing.assert_array_equal(
      layers.relative_position_bucket(rel, False, 32, 128), [0, 1, 15, 16, 17, 31, 31, 31]
  )
  # Bidirectional: 16 buckets per sign, future keys offset by 16.
  np.testing.assert_array_equal(
      layers.relative_position_bucket(np.array([0, 1, -1, 7, 8]), True, 32, 128),
      [0, 17, 1, 23, 24],
  )

"""roofline.py: T5 1.1 decoder sizes and the TPU-v4 projection, against arithmetic done by hand."""

import numpy as np
import pytest

from speculative_t5x.projections import roofline

XXL = roofline.T5_1_1["xxl"]
SMALL = roofline.T5_1_1["small"]
# T5-XXL: 24 layers x (6 x 4096 x 4096 + 3 x 4096 x 10240) + 32128 x 4096
#   = 24 x (100,663,296 + 125,829,120) + 131,596,288 = 5,567,414,272 weights.
XXL_PARAMS = 5_567_414_272
# T5-small: 8 x (6 x 512 x 384 + 3 x 512 x 1024) + 32128 x 512 = 8 x 2,752,512 + 16,449,536.
SMALL_PARAMS = 38_469_632


def test_streamed_weights_by_hand():
  assert XXL.streamed_params == XXL_PARAMS
  assert SMALL.streamed_params == SMALL_PARAMS
  # The "T5-XXL decoder streams about 11 GB per step": 2 bytes per weight.
  assert roofline.call_bytes(XXL, 0, 0) == pytest.approx(11.13e9, rel=1e-3)
  # The cache: 2 (keys, values) x 24 layers x 4096 x (128 + 512) positions x 2 bytes = 251.7 MB.
  assert roofline.call_bytes(XXL, 128, 512) - roofline.call_bytes(XXL, 0, 0) == 251_658_240


def test_call_time_and_verify_cost_on_tpu_v4():
  # One XXL step streams 11,134,828,544 bytes at 1.2 TB/s: 9.279 ms.
  assert roofline.call_time(XXL, 1, roofline.TPU_V4, 0, 0) == pytest.approx(9.2790e-3, rel=1e-4)
  # Flat while the arithmetic is under the streaming: k = 128 is 2 x 5.567e9 x 128 + 4 x 24 x
  # 4096 x 128 x 128 = 1.432e12 flops, 5.21 ms.
  ks = np.array([1, 2, 8, 64, 128])
  np.testing.assert_array_equal(roofline.verify_cost(XXL, ks, roofline.TPU_V4, 0, 0), 1.0)
  # k = 512: (2 x 5.567e9 x 512 + 4 x 24 x 4096 x 512 x 512) flops = 5.8033e12 at 275 TFLOP/s
  # = 21.103 ms, over 9.279 ms: 2.274.
  assert roofline.verify_cost(XXL, 512, roofline.TPU_V4, 0, 0) == pytest.approx(2.274, abs=1e-3)


def test_cost_coefficient_by_hand():
  # With no cache both are pure weight streaming: 38,469,632 / 5,567,414,272 = 0.006910.
  c = roofline.cost_coefficient(SMALL, XXL, roofline.TPU_V4, 0, 0)
  assert c == pytest.approx(0.006910, abs=1e-6)
  # Adding the caches of 640 positions: (76.94 + 7.86) MB over (11,134.8 + 251.7) MB = 0.00745.
  c = roofline.cost_coefficient(SMALL, XXL, roofline.TPU_V4, 128, 512)
  assert c == pytest.approx(0.00745, abs=1e-5)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: roofline.call_flops(XXL, 0, 0, 0), "integers >= 1"),
        (lambda: roofline.call_flops(XXL, 1.5, 0, 0), "integers >= 1"),
        (lambda: roofline.call_bytes(XXL, -1, 0), "context_length must be an integer >= 0"),
        (lambda: roofline.call_bytes(XXL, 0, 2.5), "encoder_length must be an integer >= 0"),
        (lambda: roofline.Chip("x", 0.0, 1e12), "bandwidth_bytes_per_s must be a positive"),
        (lambda: roofline.Chip("x", 1e12, float("inf")), "peak_flops_per_s must be a positive"),
    ],
)
def test_invalid_inputs_raise(call, message):
  with pytest.raises(ValueError, match=message):
    call()

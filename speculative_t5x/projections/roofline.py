"""A roofline PROJECTION of one batch-1 T5 1.1 decoder call: time(k) = max(bytes / bandwidth,
flops(k) / peak), nothing else.

Nothing here is measured. A decode call scoring k tokens (k = 1 for a plain step, gamma + 1 for a
chain's verification, M + 1 for a tree of M drafts) must stream the decoder's weights and read
its cache once, whatever k is, and do arithmetic in proportion to k:

  bytes     = (decoder weights that act on decoder tokens + the KV cache) x 2 (bfloat16),
  flops(k)  = 2 x those weights x k + attention: 2 x 2 x k x (context + k + encoder) x H D
              per layer (scores and weighted values over the cached and new self-attention
              positions and the encoder's positions),
  time(k)   = max(bytes / bandwidth, flops(k) / peak flops), with zero fixed overhead.

Weights counted: per decoder layer self-attention q, k, v, o (4 E HD), cross-attention q and o
(2 E HD: its keys and values are projected once per sequence and cached, as network.py does),
the gated-GELU MLP (3 E F); and the output projection (V E). Left out: RMSNorm scales and
relative-position tables (tiny), the embedding lookup (a gather of k rows; T5X's one-hot matmul
would stream the table too, +2% for T5-XXL) and the encoder (run once per sequence). The cache
read is the self-attention keys and values of `context_length` positions and the cross-attention
keys and values of `encoder_length` positions, every layer.

So verify_cost(k) = time(k) / time(1) stays 1 until the arithmetic catches up with the streaming,
near k = peak / bandwidth tokens (2 bytes and 2 flops per weight; 229 for TPU-v4), and the
cost coefficient c of a drafter is its time(1) over the target's. Real calls add fixed overheads
(kernel launches, collectives, the sampling) that weigh most on small drafters, so measured c is
larger (Table 4: 0.02 for T5-small against T5-XXL on TPU-v4).

Shapes: E emb_dim, H heads, D head_dim, F mlp_dim, V vocab; dimensions of T5 1.1 from T5X's
gin files (small ... xxl).
"""

from __future__ import annotations

import dataclasses

import numpy as np

# T5 1.1's SentencePiece vocabulary, padded to a multiple of 128 in T5X.
T5_VOCAB_SIZE = 32128
BFLOAT16_BYTES = 2


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip's HBM bandwidth (bytes/s) and peak dense bfloat16 arithmetic (flop/s)."""

  name: str
  bandwidth_bytes_per_s: float
  peak_flops_per_s: float

  def __post_init__(self):
    for field in ("bandwidth_bytes_per_s", "peak_flops_per_s"):
      value = getattr(self, field)
      if not np.isfinite(value) or value <= 0:
        raise ValueError(f"Chip.{field} must be a positive finite rate, got {value!r}")


# One TPU-v4 chip (the paper's hardware), at its published figures: 1.2 TB/s and 275 TFLOP/s.
TPU_V4 = Chip("TPU-v4", bandwidth_bytes_per_s=1.2e12, peak_flops_per_s=275e12)


@dataclasses.dataclass(frozen=True)
class DecoderShape:
  """The dimensions of a T5 1.1 decoder that set its cost per call."""

  emb_dim: int
  num_heads: int
  head_dim: int
  mlp_dim: int
  num_layers: int
  vocab_size: int = T5_VOCAB_SIZE

  @property
  def attention_dim(self) -> int:
    """H D, the width of the attention's queries, keys and values."""
    return self.num_heads * self.head_dim

  @property
  def streamed_params(self) -> int:
    """Weights one decode call reads: per layer 4 E HD + 2 E HD + 3 E F, plus V E (see above)."""
    per_layer = 6 * self.emb_dim * self.attention_dim + 3 * self.emb_dim * self.mlp_dim
    return self.num_layers * per_layer + self.vocab_size * self.emb_dim

  def cache_values(self, context_length: int, encoder_length: int) -> int:
    """Cached keys and values one call reads: 2 L H D (context_length + encoder_length)."""
    return 2 * self.num_layers * self.attention_dim * (context_length + encoder_length)


# T5 1.1 decoders (T5X's t5_1_1 gin files: emb_dim, num_heads, head_dim, mlp_dim, layers).
T5_1_1 = {
    "small": DecoderShape(512, 6, 64, 1024, 8),
    "base": DecoderShape(768, 12, 64, 2048, 12),
    "large": DecoderShape(1024, 16, 64, 2816, 24),
    "xl": DecoderShape(2048, 32, 64, 5120, 24),
    "xxl": DecoderShape(4096, 64, 64, 10240, 24),
}


def _check_lengths(context_length, encoder_length):
  for name, value in (("context_length", context_length), ("encoder_length", encoder_length)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
      raise ValueError(f"{name} must be an integer >= 0 (cached positions), got {value!r}")


def _check_tokens(k):
  tokens = np.asarray(k)
  if not np.issubdtype(tokens.dtype, np.integer) or np.any(tokens < 1):
    raise ValueError(f"k must hold integers >= 1 (tokens scored by one call), got {k!r}")
  return tokens.astype(np.float64)


def call_bytes(shape: DecoderShape, context_length: int, encoder_length: int) -> float:
  """Bytes one decode call streams: its bfloat16 weights and cache, read once whatever k is."""
  _check_lengths(context_length, encoder_length)
  values = shape.streamed_params + shape.cache_values(context_length, encoder_length)
  return float(values * BFLOAT16_BYTES)


def call_flops(shape: DecoderShape, k, context_length: int, encoder_length: int):
  """Arithmetic of one decode call on k tokens: 2 x weights x k plus attention (see above).

  k: tokens scored, an integer >= 1 or an integer array; returns a float or an array like k.
  """
  tokens = _check_tokens(k)
  _check_lengths(context_length, encoder_length)
  attended = context_length + tokens + encoder_length
  attention = 4 * shape.num_layers * shape.attention_dim * tokens * attended
  flops = 2 * shape.streamed_params * tokens + attention
  return float(flops) if flops.ndim == 0 else flops


def call_time(shape: DecoderShape, k, chip: Chip, context_length: int, encoder_length: int):
  """Projected seconds of one batch-1 decode call on k tokens: max(streaming, arithmetic)."""
  streaming = call_bytes(shape, context_length, encoder_length)
  arithmetic = call_flops(shape, k, context_length, encoder_length) / chip.peak_flops_per_s
  time = np.maximum(streaming / chip.bandwidth_bytes_per_s, arithmetic)
  return float(time) if np.ndim(time) == 0 else time


def verify_cost(shape: DecoderShape, k, chip: Chip, context_length: int, encoder_length: int):
  """time(k) / time(1): what scoring k tokens in one call costs in single-token calls."""
  one = call_time(shape, 1, chip, context_length, encoder_length)
  return call_time(shape, k, chip, context_length, encoder_length) / one


def cost_coefficient(
    drafter: DecoderShape,
    target: DecoderShape,
    chip: Chip,
    context_length: int,
    encoder_length: int,
) -> float:
  """c (Definition 3.7): the drafter's single-token call time over the target's."""
  return call_time(drafter, 1, chip, context_length, encoder_length) / call_time(
      target, 1, chip, context_length, encoder_length
  )

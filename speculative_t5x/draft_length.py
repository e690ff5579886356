"""Adaptive draft length: when a row stops drafting before gamma drafts.

The loop verifies a static gamma + 1 tokens per target call; what adapts is how many of the gamma
slots a row fills. After each draft x_i ~ q_i, a `DraftStop` rule reads the drafter's own logits at
that position (and x_i) and says, per row, whether to stop; the slots after the last draft are left
empty (`drafters.EMPTY`) and the verifier rejects them, drawing the token at the first empty slot
from the target's p itself. The drafting loop runs only while some row is still drafting, so what a
stop saves is drafter steps (Hugging Face's `assistant_confidence_threshold`; DISCO and SpecDec++
learn the rule instead).

Exactness: the rule reads only what the drafter computed, never the target, so whether slot i is
filled is decided before, and independently of, the verification's uniforms. Conditioned on the
drafted prefix, verification is Algorithm 1 (or block verification) on a shorter block, and an
empty slot behaves as a draft of zero probability: its residual norm(max(0, p_i - 0)) is p_i.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import gin
import jax
import jax.numpy as jnp

MEASURES = ("max", "draft")

# (the drafter's logits at the drafted position [B, V], the drafts [B]) -> stop after it [B] bool.
DraftStop = Callable[[jax.Array, jax.Array], jax.Array]


@gin.configurable(module="draft_length")
@dataclasses.dataclass(frozen=True)
class ConfidenceStop:
  """Stops a row after a draft the drafter is unsure of: its confidence c_i < threshold.

  c_i is computed from softmax(logits_i) at temperature 1, before any top-k/top-p cutoff (so the
  same rule applies to greedy and sampled decoding): its maximum (`measure='max'`, Hugging Face's
  rule) or its value at the draft x_i (`measure='draft'`; the two agree at temperature 0). A
  threshold of 0 never stops (static gamma); the draft with low confidence is kept, as its drafter
  step is already paid for. `scripts/calibrate_draft_length.py` chooses the threshold.
  """

  threshold: float = gin.REQUIRED
  measure: str = "max"

  def __post_init__(self):
    threshold = self.threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
      raise ValueError(
          f"ConfidenceStop.threshold must be a number in [0, 1], got {threshold!r} (run "
          "scripts/calibrate_draft_length.py to choose one)."
      )
    if not 0.0 <= threshold <= 1.0:
      raise ValueError(
          f"ConfidenceStop.threshold must be in [0, 1] (a probability), got {threshold} "
          "(run scripts/calibrate_draft_length.py to choose one)."
      )
    if self.measure not in MEASURES:
      raise ValueError(f"ConfidenceStop.measure must be one of {MEASURES}, got {self.measure!r}.")

  def confidence(self, logits: jax.Array, drafts: jax.Array) -> jax.Array:
    """c_i: logits [B, V] (the drafter's, at the drafted position), drafts [B] -> [B] float32."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    if self.measure == "max":
      return jnp.max(probs, axis=-1)
    index = jnp.clip(drafts, 0, probs.shape[-1] - 1)[:, None]
    return jnp.take_along_axis(probs, index, axis=-1)[:, 0]

  def __call__(self, logits: jax.Array, drafts: jax.Array) -> jax.Array:
    """Whether each row stops after this draft: logits [B, V], drafts [B] -> [B] bool. A row
    whose logits are not finite (a broken drafter) stops: its drafts are rejected anyway."""
    confidence = self.confidence(logits, drafts)
    return ~(confidence >= self.threshold)

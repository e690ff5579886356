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

A rule is any function of that signature (`DraftStop`); `check_rule` traces it once on abstract
arguments before the loop is traced (`draft_shapes.Chain.check`), so a rule that returns another
dtype or shape is refused with the fix instead of failing, or broadcasting, inside the loop.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import gin
import jax
import jax.numpy as jnp

from speculative_t5x import validation

MEASURES = ("max", "draft")

# (the drafter's logits at the drafted position [B, V], the drafts [B]) -> stop after it [B] bool.
DraftStop = Callable[[jax.Array, jax.Array], jax.Array]


def check_rule(rule: DraftStop, vocab_size: int) -> None:
  """Raises `validation.InvalidInputError` unless `rule` maps logits [rows, V] float32 and drafts
  [rows] int32 to bool [rows]. The rule is traced once on abstract arguments (`jax.eval_shape`:
  nothing is computed or compiled), at a row count other than 1 and V, so that a [1] or [V]
  result cannot pass for one flag per row."""
  rows = 3 if vocab_size == 2 else 2
  logits = jax.ShapeDtypeStruct((rows, vocab_size), jnp.float32)
  drafts = jax.ShapeDtypeStruct((rows,), jnp.int32)
  name = getattr(rule, "__qualname__", None) or repr(rule)
  given = f"logits [rows, V] = [{rows}, {vocab_size}] float32 and drafts [rows] = [{rows}] int32"
  needed = (
      "a draft_length rule must return bool [rows], one stop flag per row, e.g. "
      "`jnp.max(jax.nn.softmax(logits), axis=-1) < 0.4` (draft_length.ConfidenceStop(0.4))"
  )
  try:
    out = jax.eval_shape(rule, logits, drafts)
  except Exception as e:  # the rule's own error, named with the arguments it will be called on
    raise validation.InvalidInputError(
        f"draft_stop {name} fails when called on {given} ({type(e).__name__}: {e}): {needed}, "
        "and it is called inside jax.jit, on traced arrays."
    ) from e
  if isinstance(out, jax.ShapeDtypeStruct):
    if out.dtype == jnp.bool_ and out.shape == (rows,):
      return
    returned = f"{out.dtype} {list(out.shape)}"
  else:
    returned = repr(out)
  raise validation.InvalidInputError(
      f"draft_stop {name} returns {returned} for {given}: {needed}. Compare a score with a "
      "threshold rather than return the score, reduce over the vocabulary axis (axis=-1), and "
      "keep the row axis (no [rows, 1] column, no single flag for every row)."
  )


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

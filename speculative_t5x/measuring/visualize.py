"""The paper's Figure 1 from a decode's trace: which drafts the target accepted, rejected, corrected.

`speculative_sample(return_trace=True)` (through `predict_batch_with_aux(..., decoder_params=
{'return_trace': True})`) records, per iteration, the drafts (a chain's gamma, a draft tree's M
nodes), the path the verifier walked through them, how many it accepted, the target's own token
and how many tokens were kept. `trace_steps` turns one row of it into one `Step` per target call; `steps_html` draws them like Figure 1: one line per target call, the text
so far in the default colour, then the accepted drafts in green, the first rejected draft in red
(struck through) and the target's token in blue.
"""

from __future__ import annotations

import dataclasses
import html
from typing import Callable, Sequence

import numpy as np

from speculative_t5x import decoding
from speculative_t5x import drafters

ACCEPTED, REJECTED, CORRECTION = "accepted", "rejected", "correction"
COLORS = {ACCEPTED: "#1a7f37", REJECTED: "#cf222e", CORRECTION: "#0969da"}
_LEGEND = {
    ACCEPTED: "accepted draft",
    REJECTED: "rejected draft",
    CORRECTION: "target's token (correction, or bonus after gamma acceptances)",
}
_SENTENCEPIECE_SPACE = "\u2581"


@dataclasses.dataclass(frozen=True)
class Step:
  """One target call for one row.

  accepted: the drafts kept, in order (for a draft tree, along the accepted path).
  rejected: the first draft the verifier rejected (for a draft tree, the first child of the
    path's last node; its later siblings were rejected too); None when every draft was accepted,
    or when the row ended (EOS, length limit) before the target's token was kept.
  correction: the target's token after the accepted drafts: resampled after a rejection, or the
    bonus token after every draft was accepted; None when the row ended before it.
  stopped: whether some draft slots were empty (`drafters.EMPTY`): the drafter stopped before
    gamma drafts (adaptive draft length, `draft_length`), or a tree node had no token left to
    draw under a top-k or top-p cutoff. Empty slots are neither drafts nor rejections, so after
    all its drafts were accepted `rejected` is None and `correction` is the target's token in the
    first empty slot.
  """

  accepted: tuple[int, ...]
  rejected: int | None
  correction: int | None
  stopped: bool = False

  @property
  def tokens(self) -> tuple[int, ...]:
    """The tokens this call appended to the output."""
    return self.accepted + (() if self.correction is None else (self.correction,))


def trace_steps(trace: decoding.SpeculativeTrace, row: int) -> list[Step]:
  """One row of aux['speculative_trace'] (a `decoding.SpeculativeTrace`, fields [B, L],
  [B, L, M] for drafts and [B, L, D] for the path) -> its target calls, in order, each read along
  the path the verifier walked (a chain's drafts in order). Concatenating their `tokens` gives
  the row's decode."""
  if not isinstance(trace, decoding.SpeculativeTrace):
    raise ValueError(
        f"trace is a {type(trace).__name__}, not a decoding.SpeculativeTrace: pass "
        "aux['speculative_trace'] from a decode with "
        "decoder_params={'return_trace': True}."
    )
  drafts, accepted, token, emitted = (
      np.asarray(x) for x in (trace.drafts, trace.accepted, trace.token, trace.emitted)
  )
  if trace.path is None:  # a chain built by hand: its drafts in order.
    path = np.broadcast_to(np.arange(1, drafts.shape[-1] + 1), drafts.shape)
  else:
    path = np.asarray(trace.path)
  if drafts.ndim != 3 or accepted.shape != drafts.shape[:2] or path.shape[:2] != accepted.shape:
    raise ValueError(
        f"trace shapes drafts {drafts.shape}, accepted {accepted.shape}, path {path.shape}: "
        "expected [B, L, M], [B, L] and [B, L, D] (one decode per row, not return_all_decodes)."
    )
  if not 0 <= row < drafts.shape[0]:
    raise ValueError(f"row {row} is outside the trace's batch of {drafts.shape[0]}.")
  depth = path.shape[2]
  steps = []
  for drafted, walk, n, target_token, kept in zip(
      drafts[row], path[row], accepted[row], token[row], emitted[row]
  ):
    n, kept = int(n), int(kept)
    if kept == 0:  # the row had ended: every later iteration is empty too.
      break
    walked = np.where(walk > 0, drafted[np.maximum(walk - 1, 0)], drafters.EMPTY)
    corrected = kept == n + 1
    rejected = int(walked[n]) if corrected and n < depth else None
    steps.append(
        Step(
            accepted=tuple(int(t) for t in walked[: min(n, kept)]),
            rejected=None if rejected == drafters.EMPTY else rejected,
            correction=int(target_token) if corrected else None,
            stopped=bool(np.any(drafted == drafters.EMPTY)),
        )
    )
  return steps


def piece_text(vocabulary) -> Callable[[int], str]:
  """A seqio.SentencePieceVocabulary -> token id -> its piece, with SentencePiece's word marker
  shown as a space (ids past the SentencePiece model, like T5's extra ids, as '<id N>')."""
  processor = vocabulary.tokenizer
  size = processor.get_piece_size()

  def text(token_id: int) -> str:
    if not 0 <= token_id < size:
      return f"<id {token_id}>"
    return processor.id_to_piece(token_id).replace(_SENTENCEPIECE_SPACE, " ")

  return text


def _span(text: str, kind: str | None = None) -> str:
  if kind is None:
    return html.escape(text)
  strike = "text-decoration: line-through; " if kind == REJECTED else ""
  return (
      f'<span class="spec-{kind}" style="color: {COLORS[kind]}; font-weight: bold; '
      f'{strike}">{html.escape(text)}</span>'
  )


def legend_html() -> str:
  """The colour key, as an HTML fragment."""
  items = " &nbsp; ".join(_span(label, kind) for kind, label in _LEGEND.items())
  return f'<div class="spec-legend">{items}</div>'


def _id_text(token_id: int) -> str:
  return f" {token_id}"


def steps_html(
    steps: Sequence[Step], token_text: Callable[[int], str] = _id_text, title: str | None = None
) -> str:
  """Figure 1 as an HTML fragment: one line per target call (see the module docstring).

  token_text: token id -> its text, e.g. `piece_text(vocabulary)`; by default the id after a space.
  """
  lines, prefix = [], ""
  for step in steps:
    new = [_span(token_text(t), ACCEPTED) for t in step.accepted]
    if step.rejected is not None:
      new.append(_span(token_text(step.rejected), REJECTED))
    if step.correction is not None:
      new.append(_span(token_text(step.correction), CORRECTION))
    lines.append(f"<div>{prefix}{''.join(new)}</div>")
    prefix += "".join(html.escape(token_text(t)) for t in step.tokens)
  heading = "" if title is None else f"<div><b>{html.escape(title)}</b></div>"
  return (
      f'<div class="spec-figure1" style="font-family: monospace; white-space: pre-wrap; '
      f'line-height: 1.5; margin-bottom: 1em">{heading}{"".join(lines)}</div>'
  )

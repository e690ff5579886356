"""The paper's published measurements that this repository compares against: Table 2 and, for the
same rows, Table 4 (Leviathan, Kalman, Matias, ICML 2023, section 4.1 and Appendix A.3).

Table 2 is the walltime speedup of speculative decoding over T5X's implementation, for a T5-XXL
(11B) target and a T5 1.1 small, base or large drafter, at batch 1 on one TPU-v4, with the alpha
measured in the same runs. Table 4 adds, per row, the cost coefficient c the authors estimated
from profiler traces and Theorem 3.8's expected speedup (EXP) from the unrounded alpha and c.
Nothing here depends on JAX or on a model.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Table2Row:
  """task: 'EnDe' (WMT En-De) or 'CNNDM' (CNN/DailyMail); drafter: the T5 1.1 size ('small',
  'base', 'large'); temperature: 0 (argmax) or 1; gamma, alpha and speedup (walltime, 'Speed')
  as printed in Table 2; c and expected_speedup as printed in Table 4."""

  task: str
  drafter: str
  temperature: float
  gamma: int
  alpha: float
  speedup: float
  c: float
  expected_speedup: float

  @property
  def config_name(self) -> str:
    """The row's gin file under configs/paper/, without '.gin', e.g. 'ende_small_t0'."""
    return f"{self.task.lower()}_{self.drafter}_t{self.temperature:g}"


TABLE_2 = (
    Table2Row("EnDe", "small", 0.0, 7, 0.75, 3.4, 0.02, 3.2),
    Table2Row("EnDe", "base", 0.0, 7, 0.80, 2.8, 0.04, 3.3),
    Table2Row("EnDe", "large", 0.0, 7, 0.82, 1.7, 0.11, 2.5),
    Table2Row("EnDe", "small", 1.0, 7, 0.62, 2.6, 0.02, 2.3),
    Table2Row("EnDe", "base", 1.0, 5, 0.68, 2.4, 0.04, 2.4),
    Table2Row("EnDe", "large", 1.0, 3, 0.71, 1.4, 0.11, 2.0),
    Table2Row("CNNDM", "small", 0.0, 5, 0.65, 3.1, 0.02, 2.4),
    Table2Row("CNNDM", "base", 0.0, 5, 0.73, 3.0, 0.04, 2.6),
    Table2Row("CNNDM", "large", 0.0, 3, 0.74, 2.2, 0.11, 2.0),
    Table2Row("CNNDM", "small", 1.0, 5, 0.53, 2.3, 0.02, 1.9),
    Table2Row("CNNDM", "base", 1.0, 3, 0.55, 2.2, 0.04, 1.8),
    Table2Row("CNNDM", "large", 1.0, 3, 0.56, 1.7, 0.11, 1.6),
)

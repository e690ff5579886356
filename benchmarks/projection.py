r"""A PROJECTION of draft trees against chains for the paper's Table 2 rows on a TPU (nothing runs).

Every number here is a projection: a T5-XXL target and T5 1.1 small/base/large drafters timed by
the roofline of `roofline` (batch 1, bfloat16, zero overhead; `roofline.TPU_V4` is one TPU-v4
chip, 1.2 TB/s and 275 TFLOP/s), and tokens per target call from
`theory.branching_acceptance` at each row's alpha (`paper.TABLE_2`).

For each row (`project_row`):
  - the chain at the paper's gamma: Eq. (1) tokens over gamma c + verify_cost(gamma + 1);
  - the best chain over gamma (at most max_nodes drafts);
  - for each tree family of `FAMILIES` (k chains sharing the root, (2, 2, 1, ...),
    (3, 2, 1, ...), ...), the depth that projects fastest, and the best of every non-increasing
    branching (k_1 >= k_2 >= ...) with at most max_nodes nodes (`branchings`).
A tree of branching (k_1, ..., k_D) has N_d = k_1 ... k_d nodes at depth d (N_0 = 1, the root) and
M = N_1 + ... + N_D nodes. It drafts in D drafter calls, the call at depth d on the N_{d-1} nodes
above it, each costing c times the drafter's roofline time(N_{d-1}) / time(1); the target verifies
its M nodes in one call on M + 1 tokens, costing verify_cost(M + 1) = time(M + 1) / time(1)
(`Projector`). c is the roofline's time_drafter(1) / time_target(1) or Table 4's, as the caller
chooses.

Acceptance per depth, a_1..a_D [D]: alpha_j = alpha for every sibling (the default model, an
upper bound for children drawn i.i.d. from the drafter; see `theory.branching_acceptance`), and
with sibling ratios (r_2, r_3, ...) a second model alpha_j = r_j alpha (the last ratio repeating).
A per-depth acceptance measured for one tree (`theory.acceptance_by_depth`) is projected with
each drafter's c. `project_table` gathers it all into one JSON-ready dict and `markdown` renders
that dict's tables.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from speculative_t5x import theory
from speculative_t5x import trees
from speculative_t5x.projections import paper
from speculative_t5x.projections import roofline

TARGET = "xxl"
DRAFTERS = ("small", "base", "large")
# Family prefixes, each followed by 1s (k chains sharing the root, or a wider top).
FAMILIES = ((), (2,), (3,), (4,), (8,), (16,), (2, 2), (3, 2), (4, 2), (3, 3), (2, 2, 2))
# The fewest nodes every family has a member within: the smallest member of (16,) has 16.
MIN_NODES = max(trees.DraftTree.from_branching(prefix or (1,)).num_nodes for prefix in FAMILIES)
# Tokens per call shown for the target's verification cost.
VERIFY_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def branchings(max_nodes: int) -> list[tuple[int, ...]]:
  """Every non-increasing branching (k_1 >= k_2 >= ... >= 1) of at most max_nodes nodes M.

  Depth first: each branching comes right before the deeper ones that start with it.
  """
  found = []

  def grow(branching: tuple[int, ...], leaves: int, nodes: int):
    widest = branching[-1] if branching else max_nodes
    for k in range(1, widest + 1):
      if nodes + leaves * k > max_nodes:
        return
      found.append(branching + (k,))
      grow(branching + (k,), leaves * k, nodes + leaves * k)

  grow((), 1, 0)
  return found


def family_members(prefix: tuple[int, ...], max_nodes: int) -> list[tuple[int, ...]]:
  """prefix + (1,) * n for every n >= 0 (n >= 1 for the chain, prefix ()) within max_nodes nodes."""
  members = []
  branching = prefix or (1,)
  while trees.DraftTree.from_branching(branching).num_nodes <= max_nodes:
    members.append(branching)
    branching += (1,)
  return members


def family_name(prefix: tuple[int, ...]) -> str:
  """The family's label: "chain (1, ...)" for (), "(k_1, ..., k_n, 1, ...)" otherwise."""
  if not prefix:
    return "chain (1, ...)"
  return "(" + ", ".join(map(str, prefix + (1,))) + ", ...)"


class Projector:
  """Tree costs on the roofline for one chip and cache geometry, each tree's computed once."""

  def __init__(self, chip: roofline.Chip, context_length: int, encoder_length: int):
    self.chip = chip
    self.lengths = (context_length, encoder_length)
    self._costs = {}

  def verify_cost(self, size: str, k):
    """time(k) / time(1) of the T5 1.1 `size` decoder; k an int or an int array [...] (same shape)."""
    return roofline.verify_cost(roofline.T5_1_1[size], k, self.chip, *self.lengths)

  def c(self, drafter: str) -> float:
    """The drafter's time(1) over the target's (T5-XXL) on the roofline."""
    shapes = roofline.T5_1_1
    return roofline.cost_coefficient(shapes[drafter], shapes[TARGET], self.chip, *self.lengths)

  def costs(self, branching: tuple[int, ...], drafter: str) -> dict:
    """The tree's size and costs, in single-token steps of their model.

    Returns:
      {"branching": [D], "nodes": M, "depth": D, "drafter_calls": sum over d of the drafter's
      verify_cost(N_{d-1}) (its D calls), "verify_cost": the target's verify_cost(M + 1)}.
    """
    key = (branching, drafter)
    if key not in self._costs:
      tree = trees.DraftTree.from_branching(branching)
      above = np.concatenate([[1], tree.path_nodes_per_depth()[:-1]])  # [D] N_0..N_{D-1}
      self._costs[key] = {
          "branching": list(branching),
          "nodes": tree.num_nodes,
          "depth": tree.depth,
          "drafter_calls": float(np.sum(self.verify_cost(drafter, above))),
          "verify_cost": self.verify_cost(TARGET, tree.width),
      }
    return self._costs[key]

  def project(self, branching: tuple[int, ...], acceptance, c: float, drafter: str) -> dict:
    """`costs` with the tokens per call and the speedup for a_1..a_D `acceptance` [D]."""
    costs = self.costs(branching, drafter)
    speedup = theory.tree_speedup_hardware_aware(
        acceptance, c, costs["drafter_calls"], costs["verify_cost"]
    )
    return dict(costs, tokens=theory.tree_expected_tokens(acceptance), speedup=speedup)


def best(
    projector: Projector,
    candidates: Sequence[tuple[int, ...]],
    alpha: float,
    c: float,
    drafter: str,
    ratios: Sequence[float] = (),
) -> dict:
  """The `Projector.project` of the fastest candidate under the branching model with `ratios`."""
  projections = [
      projector.project(b, theory.branching_acceptance(alpha, b, ratios), c, drafter)
      for b in candidates
  ]
  return max(projections, key=lambda p: p["speedup"])


def project_row(
    projector: Projector,
    row: paper.Table2Row,
    c: float,
    searched: Sequence[tuple[int, ...]],
    ratios: Sequence[float],
    max_nodes: int,
) -> dict:
  """One Table 2 row: the paper's chain, the best chain, each family's best and the best searched.

  Args:
    projector: the chip and cache geometry.
    row: the paper's row (task, drafter, temperature, alpha, gamma, measured speedup).
    c: the drafter's cost coefficient.
    searched: the branchings searched for the best tree (`branchings(max_nodes)`).
    ratios: (r_2, r_3, ...) for a second model alpha_j = r_j alpha; () for none.
    max_nodes: the most nodes M of a family member (and drafts of a chain).

  Returns:
    The row's settings, "chain", "best_chain" and "models": {model: {family name: projection}}.
  """
  args = (row.alpha, c, row.drafter)
  projected = {
      "task": row.task,
      "drafter": row.drafter,
      "temperature": row.temperature,
      "alpha": row.alpha,
      "gamma": row.gamma,
      "c": c,
      "paper_speedup": row.speedup,
      "chain": projector.project((1,) * row.gamma, np.full(row.gamma, row.alpha), c, row.drafter),
      "best_chain": best(projector, family_members((), max_nodes), *args),
      "models": {},
  }
  models = {"alpha_j = alpha": ()}
  if ratios:
    models["alpha_j = r_j alpha"] = ratios
  for model, model_ratios in models.items():
    families = {
        family_name(prefix): best(projector, family_members(prefix, max_nodes), *args, model_ratios)
        for prefix in FAMILIES
    }
    families[f"best of {len(searched)} searched"] = best(projector, searched, *args, model_ratios)
    projected["models"][model] = families
  return projected


def project_table(
    projector: Projector,
    max_nodes: int,
    c_source: str,
    ratios: Sequence[float] = (),
    measured: tuple[tuple[int, ...], Sequence[float]] | None = None,
) -> dict:
  """Every Table 2 row projected on the projector's chip, as one JSON-ready dict.

  Args:
    projector: the chip and cache geometry.
    max_nodes: the most nodes M of a tree (and drafts of a chain).
    c_source: "roofline" (the projector's c) or "paper" (Table 4's c), the c of every row.
    ratios: (r_2, r_3, ...) for the second acceptance model; () for the default one only.
    measured: (k_1..k_D, a_1..a_D [D]) a tree and the per-depth acceptance measured for it, or
      None.

  Returns:
    The settings, the target's verify_cost at `VERIFY_KS`, each drafter's c (roofline and
    Table 4), a `project_row` per row and, with `measured`, that tree projected per drafter.
  """
  if max_nodes < MIN_NODES:
    raise ValueError(
        f"max_nodes={max_nodes}: every tree family needs room for its smallest member, so give "
        f"at least {MIN_NODES} nodes."
    )
  chip = projector.chip
  context_length, encoder_length = projector.lengths
  paper_c = {row.drafter: row.c for row in paper.TABLE_2}
  drafter_c = {size: {"roofline": projector.c(size), "paper": paper_c[size]} for size in DRAFTERS}
  searched = branchings(max_nodes)
  table = {
      "projection": True,
      "chip": {
          "name": chip.name,
          "bandwidth_tb_s": chip.bandwidth_bytes_per_s / 1e12,
          "peak_tflops": chip.peak_flops_per_s / 1e12,
      },
      "encoder_length": encoder_length,
      "context_length": context_length,
      "max_nodes": max_nodes,
      "c_source": c_source,
      "sibling_ratios": list(ratios),
      "target_gb": roofline.call_bytes(roofline.T5_1_1[TARGET], *projector.lengths) / 1e9,
      "target_verify_cost": {k: projector.verify_cost(TARGET, k) for k in VERIFY_KS},
      "drafter_c": drafter_c,
      "rows": [
          project_row(projector, row, drafter_c[row.drafter][c_source], searched, ratios, max_nodes)
          for row in paper.TABLE_2
      ],
  }
  if measured:
    branching, acceptance = measured
    table["measured_depth_acceptance"] = list(acceptance)
    table["measured"] = [
        dict(
            projector.project(branching, acceptance, cs[c_source], size),
            drafter=size,
            c=cs[c_source],
        )
        for size, cs in drafter_c.items()
    ]
  return table


def _tree_cell(projection: dict) -> str:
  return f"({', '.join(map(str, projection['branching']))})"


def markdown(table: dict) -> str:
  """The Markdown of a `project_table`: the row summary, each row's families, the measured tree."""
  chip = table["chip"]
  lines = [
      f"PROJECTION, not a measurement: T5-XXL target on one {chip['name']} (roofline: "
      f"{chip['bandwidth_tb_s']:g} TB/s HBM, {chip['peak_tflops']:g} TFLOP/s bfloat16, zero "
      f"overhead), batch 1, encoder length {table['encoder_length']}, "
      f"{table['context_length']} decoded positions cached. alpha and gamma: the paper's "
      f"Table 2; c: {table['c_source']}; tokens per call: the branching model "
      "with alpha_j = alpha for every sibling (an upper bound for children drawn i.i.d. from the "
      "drafter; exact only when the target is deterministic and the children are sampled).",
      "",
      f"T5-XXL decoder streams {table['target_gb']:.2f} GB per call; verify_cost(k) = "
      "time(k) / time(1): "
      + ", ".join(f"k={k}: {v:.2f}" for k, v in table["target_verify_cost"].items())
      + ".",
      "Drafter c (roofline / Table 4): "
      + ", ".join(
          f"T5-{size} {cs['roofline']:.4f} / {cs['paper']:g}"
          for size, cs in table["drafter_c"].items()
      )
      + ".",
      "",
  ]
  models = list(table["rows"][0]["models"])
  header = ["task", "drafter", "temp", "alpha", "c", "chain gamma", "tokens", "speedup"]
  header += ["best chain gamma", "speedup"]
  for model in models:
    header += [f"best tree ({model})", "M", "tokens", "speedup"]
  lines += ["| " + " | ".join(header) + " | paper measured |", "|" + "---|" * (len(header) + 1)]
  for row in table["rows"]:
    chain, best_chain = row["chain"], row["best_chain"]
    cells = [
        row["task"],
        f"T5-{row['drafter']}",
        f"{row['temperature']:g}",
        f"{row['alpha']}",
        f"{row['c']:.4f}",
        f"{row['gamma']}",
        f"{chain['tokens']:.2f}",
        f"{chain['speedup']:.2f}x",
        f"{best_chain['depth']}",
        f"{best_chain['speedup']:.2f}x",
    ]
    for model in models:
      top = max(row["models"][model].values(), key=lambda p: p["speedup"])
      cells += [
          _tree_cell(top),
          f"{top['nodes']}",
          f"{top['tokens']:.2f}",
          f"{top['speedup']:.2f}x",
      ]
    lines.append("| " + " | ".join(cells) + f" | {row['paper_speedup']}x |")
  for row in table["rows"]:
    lines += [
        "",
        f"{row['task']}, T5-{row['drafter']}, t={row['temperature']:g}, alpha={row['alpha']}, "
        f"c={row['c']:.4f}: the fastest depth of each family (* = fastest tree).",
        "",
    ]
    header = ["family"]
    for model in models:
      header += [f"tree ({model})", "M", "tokens", "verify", "speedup"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    fastest = {m: max(p["speedup"] for p in row["models"][m].values()) for m in models}
    for name in row["models"][models[0]]:
      cells = [name]
      for model in models:
        p = row["models"][model][name]
        star = " *" if p["speedup"] == fastest[model] else ""
        cells += [
            _tree_cell(p),
            f"{p['nodes']}",
            f"{p['tokens']:.2f}",
            f"{p['verify_cost']:.2f}",
            f"{p['speedup']:.2f}x{star}",
        ]
      lines.append("| " + " | ".join(cells) + " |")
  measured = table.get("measured")
  if measured:
    lines += [
        "",
        f"Measured per-depth acceptance for tree {_tree_cell(measured[0])}: "
        + ", ".join(f"a_{d + 1}={a:g}" for d, a in enumerate(table["measured_depth_acceptance"]))
        + ", projected with each drafter's c.",
        "",
        "| drafter | c | M | tokens | drafter calls | verify | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in measured:
      lines.append(
          f"| T5-{p['drafter']} | {p['c']:.4f} | {p['nodes']} | {p['tokens']:.2f} | "
          f"{p['drafter_calls']:.2f} | {p['verify_cost']:.2f} | {p['speedup']:.2f}x |"
      )
  return "\n".join(lines) + "\n"

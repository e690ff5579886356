r"""PROJECTS draft trees against chains for the paper's Table 2 rows on a TPU-v4 (nothing is run).

Every number here is a projection: a T5-XXL target and T5 1.1 small/base/large drafters timed by
the roofline of `speculative_t5x.roofline` (batch 1, bfloat16, zero overhead; by default the
chip of issue 17, "about 1.2 TB/s and 275 TFLOP/s"), and tokens per target call from
`theory.branching_acceptance` at each row's alpha (`paper.TABLE_2`).

For each row:
  - the chain at the paper's gamma: Eq. (1) tokens over gamma c + verify_cost(gamma + 1);
  - the best chain over gamma (at most --max_nodes drafts);
  - for each tree family (k chains sharing the root, (2, 2, 1, ...), (3, 2, 1, ...), ...), the
    depth that projects fastest, and the best of every non-increasing branching (k_1 >= k_2 >= ...)
    with at most --max_nodes nodes; the fastest is marked with a star.
A tree of depth D drafts in D drafter calls, the call at depth d on the N_{d-1} nodes above it
(N_0 = 1), each costing c times the drafter's roofline time(N_{d-1}) / time(1); the target verifies
its M nodes in one call on M + 1 tokens, costing verify_cost(M + 1). c is the roofline's (default)
or Table 4's (--c_source=paper).

Acceptance per depth: alpha_j = alpha for every sibling (the default model, an upper bound for
children drawn i.i.d. from the drafter; see `theory.branching_acceptance`), and with
--sibling_ratios=r_2,r_3,... a second projection with alpha_j = r_j alpha (the last ratio
repeating). --measured_depth_acceptance=a_1,...,a_D with --measured_tree=k_1,...,k_D plugs in the
per-depth acceptance measured for that tree (e.g. on the demo pair; `theory.acceptance_by_depth`)
and projects it with each drafter's c.

Writes project_trees.json and project_trees.md into --output_dir and prints the Markdown.

  python scripts/project_trees.py --output_dir=/tmp/project_trees --sibling_ratios=0.6,0.4
"""

from __future__ import annotations

import json
import pathlib

from absl import app
from absl import flags
import numpy as np

from speculative_t5x import gin_utils
from speculative_t5x import paper
from speculative_t5x import roofline
from speculative_t5x import theory
from speculative_t5x import trees

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Directory for project_trees.json and project_trees.md.")
flags.DEFINE_integer("max_nodes", 64, "The most draft nodes M of a tree (and drafts of a chain).")
flags.DEFINE_enum(
    "c_source",
    "roofline",
    ("roofline", "paper"),
    "The drafter's c: the roofline's, or the one Table 4 estimated from TPU-v4 profiles.",
)
flags.DEFINE_float("bandwidth_tb_s", 1.2, "The chip's HBM bandwidth, TB/s (TPU-v4: about 1.2).")
flags.DEFINE_float("peak_tflops", 275.0, "The chip's peak bfloat16 TFLOP/s (TPU-v4: 275).")
flags.DEFINE_integer("encoder_length", 512, "Encoder positions whose cross-attention K/V are read.")
flags.DEFINE_integer(
    "context_length", 128, "Decoded positions in the self-attention cache at the projected step."
)
flags.DEFINE_list(
    "sibling_ratios",
    [],
    "r_2,r_3,...: alpha_j / alpha of later siblings (the last repeats), for a second projection.",
)
flags.DEFINE_list(
    "measured_depth_acceptance", [], "a_1,...,a_D measured for --measured_tree, each in [0, 1]."
)
flags.DEFINE_list(
    "measured_tree", [], "k_1,...,k_D: the branching --measured_depth_acceptance is for."
)
flags.mark_flag_as_required("output_dir")

TARGET = "xxl"
DRAFTERS = ("small", "base", "large")
# Family prefixes, each followed by 1s (k chains sharing the root, or a wider top).
FAMILIES = ((), (2,), (3,), (4,), (8,), (16,), (2, 2), (3, 2), (4, 2), (3, 3), (2, 2, 2))
# Tokens per call shown for the target's verification cost.
VERIFY_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _floats(name: str, values: list[str]) -> tuple[float, ...]:
  try:
    return tuple(float(v) for v in values)
  except ValueError as error:
    raise app.UsageError(f"--{name}={','.join(values)}: {error}") from None


def _ints(name: str, values: list[str]) -> tuple[int, ...]:
  try:
    return tuple(int(v) for v in values)
  except ValueError as error:
    raise app.UsageError(f"--{name}={','.join(values)}: {error}") from None


def branchings(max_nodes: int) -> list[tuple[int, ...]]:
  """Every non-increasing (k_1 >= k_2 >= ...) branching with at most max_nodes nodes."""
  found = []

  def extend(prefix, level_nodes, total):
    for k in range(1, (prefix[-1] if prefix else max_nodes) + 1):
      nodes = total + level_nodes * k
      if nodes > max_nodes:
        break
      found.append(prefix + (k,))
      extend(prefix + (k,), level_nodes * k, nodes)

  extend((), 1, 0)
  return found


def family_members(prefix: tuple[int, ...], max_nodes: int) -> list[tuple[int, ...]]:
  """prefix + (1,) * n for every n >= 0 (n >= 1 for the chain) within max_nodes nodes."""
  members = []
  branching = prefix or (1,)
  while trees.DraftTree.from_branching(branching).num_nodes <= max_nodes:
    members.append(branching)
    branching += (1,)
  return members


def family_name(prefix: tuple[int, ...]) -> str:
  return "chain (1, ...)" if not prefix else "(" + ", ".join(map(str, prefix + (1,))) + ", ...)"


class Projector:
  """Tree costs on the roofline for one chip and cache geometry."""

  def __init__(self, chip: roofline.Chip, context_length: int, encoder_length: int):
    self.chip = chip
    self.lengths = (context_length, encoder_length)
    self._costs = {}

  def verify_cost(self, size: str, k) -> float:
    return roofline.verify_cost(roofline.T5_1_1[size], k, self.chip, *self.lengths)

  def c(self, drafter: str) -> float:
    shapes = roofline.T5_1_1
    return roofline.cost_coefficient(shapes[drafter], shapes[TARGET], self.chip, *self.lengths)

  def costs(self, branching: tuple[int, ...], drafter: str) -> dict:
    """The tree's size, its drafter calls (D calls, the one at depth d on N_{d-1} tokens, in
    single-token drafter steps) and the target's verify_cost(M + 1)."""
    key = (branching, drafter)
    if key not in self._costs:
      tree = trees.DraftTree.from_branching(branching)
      above = np.concatenate([[1], tree.path_nodes_per_depth()[:-1]])
      self._costs[key] = {
          "branching": list(branching),
          "nodes": tree.num_nodes,
          "depth": tree.depth,
          "drafter_calls": float(np.sum(self.verify_cost(drafter, above))),
          "verify_cost": self.verify_cost(TARGET, tree.width),
      }
    return self._costs[key]

  def project(self, branching, acceptance, c: float, drafter: str) -> dict:
    """Tokens per call and speedup of a tree with per-depth acceptance [D]."""
    costs = self.costs(branching, drafter)
    speedup = theory.tree_speedup_hardware_aware(
        acceptance, c, costs["drafter_calls"], costs["verify_cost"]
    )
    return dict(costs, tokens=theory.tree_expected_tokens(acceptance), speedup=speedup)


def best(projector, candidates, alpha, c, drafter, ratios=()) -> dict:
  """The fastest of `candidates` under the branching model with sibling ratios."""
  projections = [
      projector.project(b, theory.branching_acceptance(alpha, b, ratios), c, drafter)
      for b in candidates
  ]
  return max(projections, key=lambda p: p["speedup"])


def project_row(projector, row, c, searched, ratios) -> dict:
  """One Table 2 row: the paper's chain, the best chain, family bests and the best tree."""
  args = (row.alpha, c, row.drafter)
  chain = (1,) * row.gamma
  projected = {
      "task": row.task,
      "drafter": row.drafter,
      "temperature": row.temperature,
      "alpha": row.alpha,
      "gamma": row.gamma,
      "c": c,
      "paper_speedup": row.speedup,
      "chain": projector.project(chain, np.full(row.gamma, row.alpha), c, row.drafter),
      "best_chain": best(projector, family_members((), FLAGS.max_nodes), *args),
      "models": {},
  }
  models = {"alpha_j = alpha": ()}
  if ratios:
    models["alpha_j = r_j alpha"] = ratios
  for model, model_ratios in models.items():
    families = {
        family_name(prefix): best(
            projector, family_members(prefix, FLAGS.max_nodes), *args, model_ratios
        )
        for prefix in FAMILIES
    }
    families[f"best of {len(searched)} searched"] = best(projector, searched, *args, model_ratios)
    projected["models"][model] = families
  return projected


def _tree_cell(projection: dict) -> str:
  return f"({', '.join(map(str, projection['branching']))})"


def markdown(result: dict) -> str:
  chip = result["chip"]
  lines = [
      f"PROJECTION, not a measurement: T5-XXL target on one {chip['name']} (roofline: "
      f"{chip['bandwidth_tb_s']:g} TB/s HBM, {chip['peak_tflops']:g} TFLOP/s bfloat16, zero "
      f"overhead), batch 1, encoder length {result['encoder_length']}, "
      f"{result['context_length']} decoded positions cached. alpha and gamma: the paper's "
      f"Table 2; c: {result['c_source']}; tokens per call: the branching model "
      "with alpha_j = alpha for every sibling (an upper bound for children drawn i.i.d. from the "
      "drafter; exact only when the target is deterministic and the children are sampled).",
      "",
      f"T5-XXL decoder streams {result['target_gb']:.2f} GB per call; verify_cost(k) = "
      "time(k) / time(1): "
      + ", ".join(f"k={k}: {v:.2f}" for k, v in result["target_verify_cost"].items())
      + ".",
      "Drafter c (roofline / Table 4): "
      + ", ".join(
          f"T5-{size} {cs['roofline']:.4f} / {cs['paper']:g}"
          for size, cs in result["drafter_c"].items()
      )
      + ".",
      "",
  ]
  models = list(result["rows"][0]["models"])
  header = [
      "task",
      "drafter",
      "temp",
      "alpha",
      "c",
      "chain gamma",
      "tokens",
      "speedup",
      "best chain gamma",
      "speedup",
  ]
  for model in models:
    header += [f"best tree ({model})", "M", "tokens", "speedup"]
  lines += ["| " + " | ".join(header) + " | paper measured |", "|" + "---|" * (len(header) + 1)]
  for row in result["rows"]:
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
  for row in result["rows"]:
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
  measured = result.get("measured")
  if measured:
    lines += [
        "",
        f"Measured per-depth acceptance for tree {_tree_cell(measured[0])}: "
        + ", ".join(f"a_{d + 1}={a:g}" for d, a in enumerate(result["measured_depth_acceptance"]))
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


def _check_flags():
  """-> (chip, sibling ratios, measured (tree, acceptance) or None); UsageError on bad flags."""
  if FLAGS.max_nodes < 1:
    raise app.UsageError(f"--max_nodes={FLAGS.max_nodes} must be >= 1 (draft nodes per tree).")
  if FLAGS.encoder_length < 0 or FLAGS.context_length < 0:
    raise app.UsageError("--encoder_length and --context_length must be >= 0 (cached positions).")
  try:
    chip = roofline.Chip(
        "TPU-v4" if (FLAGS.bandwidth_tb_s, FLAGS.peak_tflops) == (1.2, 275.0) else "custom chip",
        FLAGS.bandwidth_tb_s * 1e12,
        FLAGS.peak_tflops * 1e12,
    )
  except ValueError as error:
    raise app.UsageError(f"--bandwidth_tb_s, --peak_tflops: {error}") from None
  ratios = _floats("sibling_ratios", FLAGS.sibling_ratios)
  try:
    theory.branching_acceptance(max(row.alpha for row in paper.TABLE_2), (2,), ratios)
  except ValueError as error:
    raise app.UsageError(f"--sibling_ratios: {error}") from None
  acceptance = _floats("measured_depth_acceptance", FLAGS.measured_depth_acceptance)
  branching = _ints("measured_tree", FLAGS.measured_tree)
  if bool(acceptance) != bool(branching):
    raise app.UsageError(
        "--measured_depth_acceptance and --measured_tree go together: the acceptance a_1..a_D "
        "measured for the tree k_1..k_D."
    )
  if not acceptance:
    return chip, ratios, None
  try:
    tree = trees.DraftTree.from_branching(branching)
    theory.tree_expected_tokens(acceptance)
  except ValueError as error:
    raise app.UsageError(f"--measured_tree, --measured_depth_acceptance: {error}") from None
  if tree.depth != len(acceptance):
    raise app.UsageError(
        f"--measured_depth_acceptance has {len(acceptance)} values but --measured_tree="
        f"{','.join(FLAGS.measured_tree)} has depth {tree.depth}: give one a_d per depth."
    )
  return chip, ratios, (branching, acceptance)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  chip, ratios, measured = _check_flags()
  projector = Projector(chip, FLAGS.context_length, FLAGS.encoder_length)
  paper_c = {row.drafter: row.c for row in paper.TABLE_2}
  drafter_c = {size: {"roofline": projector.c(size), "paper": paper_c[size]} for size in DRAFTERS}
  searched = branchings(FLAGS.max_nodes)
  result = {
      "projection": True,
      "chip": {
          "name": chip.name,
          "bandwidth_tb_s": FLAGS.bandwidth_tb_s,
          "peak_tflops": FLAGS.peak_tflops,
      },
      "encoder_length": FLAGS.encoder_length,
      "context_length": FLAGS.context_length,
      "max_nodes": FLAGS.max_nodes,
      "c_source": FLAGS.c_source,
      "sibling_ratios": list(ratios),
      "target_gb": roofline.call_bytes(roofline.T5_1_1[TARGET], *projector.lengths) / 1e9,
      "target_verify_cost": {k: projector.verify_cost(TARGET, k) for k in VERIFY_KS},
      "drafter_c": drafter_c,
      "rows": [
          project_row(projector, row, drafter_c[row.drafter][FLAGS.c_source], searched, ratios)
          for row in paper.TABLE_2
      ],
  }
  if measured:
    branching, acceptance = measured
    result["measured_depth_acceptance"] = list(acceptance)
    result["measured"] = [
        dict(
            projector.project(branching, acceptance, cs[FLAGS.c_source], size),
            drafter=size,
            c=cs[FLAGS.c_source],
        )
        for size, cs in drafter_c.items()
    ]
  table = markdown(result)
  output_dir = pathlib.Path(FLAGS.output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  (output_dir / "project_trees.json").write_text(json.dumps(result, indent=2))
  (output_dir / "project_trees.md").write_text(table)
  print(table, end="")


if __name__ == "__main__":
  gin_utils.run(main)

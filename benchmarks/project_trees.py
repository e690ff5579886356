r"""PROJECTS draft trees against chains for the paper's Table 2 rows on a TPU-v4 (nothing is run).

The projection is `projection` (benchmarks/projection.py) (its docstring has the model): a T5-XXL target and
T5 1.1 small/base/large drafters on the roofline of `speculative_t5x.projections.roofline` (by default one
TPU-v4 chip, 1.2 TB/s and 275 TFLOP/s; --bandwidth_tb_s and --peak_tflops for
another), and tokens per target call from `theory.branching_acceptance` at each row's alpha. This
script checks its flags, runs `projection.project_table` and writes what it returns.

For each row: the chain at the paper's gamma, the best chain over gamma, the fastest depth of each
tree family and the best of every non-increasing branching with at most --max_nodes nodes (the
fastest starred). c is the roofline's (default) or Table 4's (--c_source=paper).

Acceptance per depth: alpha_j = alpha for every sibling, and with --sibling_ratios=r_2,r_3,... a
second projection with alpha_j = r_j alpha (the last ratio repeating).
--measured_depth_acceptance=a_1,...,a_D with --measured_tree=k_1,...,k_D plugs in the per-depth
acceptance measured for that tree (e.g. on the demo pair; `theory.acceptance_by_depth`) and
projects it with each drafter's c.

Writes project_trees.json and project_trees.md into --output_dir and prints the Markdown.

  python benchmarks/project_trees.py --output_dir=/tmp/project_trees --sibling_ratios=0.6,0.4
"""

from __future__ import annotations

import json

from absl import app
from absl import flags

from speculative_t5x.running import bootstrap

bootstrap.start(tensorflow=False)  # first: keeps JAX off an absent TPU (no seqio task read)

from speculative_t5x import gin_utils
from speculative_t5x.projections import paper
import projection
from speculative_t5x import theory
from speculative_t5x import trees
from speculative_t5x.projections import roofline
from speculative_t5x.running import run_dir

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

run_dir.define_overwrite_flag()
OUTPUTS = ("project_trees.json", "project_trees.md")


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


def _check_flags():
  """-> (chip, sibling ratios, measured (tree, acceptance) or None); UsageError on bad flags."""
  if FLAGS.max_nodes < projection.MIN_NODES:
    raise app.UsageError(
        f"--max_nodes={FLAGS.max_nodes} must be >= {projection.MIN_NODES}: every tree family "
        "needs room for its smallest member (the (16,) family has 16 nodes)."
    )
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
  output = run_dir.OutputDir(FLAGS.output_dir, OUTPUTS, "--output_dir", FLAGS.overwrite)
  output.check()  # before any work
  chip, ratios, measured = _check_flags()
  projector = projection.Projector(chip, FLAGS.context_length, FLAGS.encoder_length)
  result = projection.project_table(projector, FLAGS.max_nodes, FLAGS.c_source, ratios, measured)
  table = projection.markdown(result)
  output.write({"project_trees.json": json.dumps(result, indent=2), "project_trees.md": table})
  print(table, end="")


if __name__ == "__main__":
  gin_utils.run(main)

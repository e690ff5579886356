"""scripts/project_trees.py: the TPU-v4 projection of draft trees for Table 2's rows (numpy only)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from speculative_t5x import paper

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "scripts" / "project_trees.py")
ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")


def _run(*flags):
  completed = subprocess.run(
      [sys.executable, SCRIPT, *flags], env=ENV, capture_output=True, text=True, timeout=300
  )
  assert completed.returncode == 0, completed.stderr[-4000:]
  return completed.stdout


def test_projects_every_row_and_marks_the_best_tree(tmp_path):
  out = _run(
      f"--output_dir={tmp_path}",
      "--max_nodes=24",  # 107 trees searched instead of 438 at the default 64.
      "--c_source=paper",
      "--sibling_ratios=0",
      "--measured_tree=2,1",
      "--measured_depth_acceptance=0.75,0.5",
  )
  assert out.startswith("PROJECTION, not a measurement")
  assert (tmp_path / "project_trees.md").read_text() == out
  result = json.loads((tmp_path / "project_trees.json").read_text())
  assert result["projection"] and len(result["rows"]) == len(paper.TABLE_2) == 12
  # Verification is flat on the roofline up to 229 tokens: every chain is Theorem 3.8 with
  # Table 4's c. EnDe, T5-small, t=0: 3.157 (derived by hand in test_theory.py).
  assert "| EnDe | T5-small | 0 | 0.75 | 0.0200 | 7 | 3.60 | 3.16x |" in out
  assert result["target_verify_cost"]["64"] == 1.0
  for row in result["rows"]:
    trees = row["models"]["alpha_j = alpha"]
    fastest = max(p["speedup"] for p in trees.values())
    # The search covers every family, and no tree is slower than the paper's chain of its size.
    assert fastest == trees[next(name for name in trees if name.startswith("best of"))]["speedup"]
    assert fastest >= row["best_chain"]["speedup"] >= row["chain"]["speedup"]
    assert all(p["nodes"] <= 24 for p in trees.values())
    # Ratio 0: later siblings are never accepted, so no tree beats the best chain.
    ratio_zero = row["models"]["alpha_j = r_j alpha"]
    assert max(p["speedup"] for p in ratio_zero.values()) == pytest.approx(
        row["best_chain"]["speedup"]
    )
  # One family table per row, each with its fastest tree starred (once per model).
  assert out.count("(* = fastest tree)") == 12
  assert out.count("x * |") >= 24
  # Measured (2, 1) with a = (.75, .5): 2.125 tokens; T5-small, c = 0.02: 2.125 / 1.04 = 2.04x.
  assert "| T5-small | 0.0200 | 4 | 2.12 | 2.00 | 1.00 | 2.04x |" in out


def test_refuses_bad_flags(tmp_path):
  """Each bad flag exits non-zero with its reason, before anything is written; run at once."""
  # Three of the script's checks, one per kind (a range, a parse, flags that go together): each
  # case is a process importing TensorFlow, so the suite keeps them few.
  cases = {
      "--max_nodes=0": "--max_nodes=0 must be >= 1",
      "--sibling_ratios=x": "--sibling_ratios=x",
      "--measured_tree=2,1 --measured_depth_acceptance=0.5": "has depth 2",
  }
  runs = {
      flags: subprocess.Popen(
          [sys.executable, SCRIPT, f"--output_dir={tmp_path / 'out'}", *flags.split()],
          env=ENV,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for flags in cases
  }
  for flags, process in runs.items():
    _, stderr = process.communicate(timeout=300)
    assert process.returncode != 0, flags
    assert cases[flags] in stderr, (flags, stderr[-2000:])
  assert not (tmp_path / "out").exists()

"""scripts/demo.py, the README's main command: the shipped demo pair end to end, and every bad
flag refused before anything loads."""

import re

from conftest import ScriptRuns, make_demo_process, require_demo_pair

MAX_GAMMA = 2


def test_demo_translates_and_checks_greedy_equality():
  """As `make demo` runs it: where seqio, TensorFlow and the other dependencies
  requirements-decoding.txt leaves out cannot be imported; the draft shape chosen on this machine
  (--gamma=auto, the default) and decoded with both verifiers; with --gamma=auto no decode step is
  timed beside the examples (--cost_repeats=0, the default)."""
  require_demo_pair()
  completed = make_demo_process(
      "demo.py",
      "--num_examples=2",
      "--show=2",
      "--repeats=1",
      "--decode_length=24",
      f"--max_gamma={MAX_GAMMA}",
      "--alpha_examples=2",
      "--auto_budget_s=0",
      "--verifier=token,block",  # both exact: the greedy check covers both
  )
  assert completed.returncode == 0, completed.stderr[-4000:]
  out = completed.stdout
  assert "trained demo pair" in out
  assert (
      f"draft shape chosen here (chains of 1-{MAX_GAMMA} drafts), token and block verification, "
      "2 examples" in out
  )
  assert out.count("  EN  ") == 2 and out.count("  DE  ") == 2
  assert "before the run: 1-minute load average" in out
  chose_a_shape = False
  for temperature in (0, 1):
    decision = re.search(
        rf"auto draft shape at temperature {temperature}: (gamma \d|baseline), .*\n"
        r"  measured on cpu: target step [\d.]+ ms; verifying k tokens, in target steps: "
        r"3: [\d.]+; alpha [\d.]+ \(measured on the \d+ tokens the target generated for 2 "
        r"sentences\)\n"
        r"  the decoding loops on 2 inputs, in target steps: the baseline [\d.]+ per token; per "
        r"target call gamma 1 [\d.]+, gamma 2 [\d.]+; per decode, fixed: baseline [\d.]+, "
        r"gamma 1 [\d.]+, gamma 2 [\d.]+\n"
        r"  predicted: gamma 1 [\d.]+x \(low [\d.]+x\), gamma 2 [\d.]+x \(low [\d.]+x\)\n"
        r"  measuring took [\d.]+ s compiling, [\d.]+ s timing \(3 rounds\)",
        out,
    )
    assert decision, out
    chose_baseline = decision.group(1) == "baseline"
    chose_a_shape = chose_a_shape or not chose_baseline
    assert re.search(
        rf"What you get on this machine: .*temperature {temperature}, "
        + (r"the baseline, 1\.00x" if chose_baseline else r"gamma \d, [\d.]+x"),
        out,
    )
    for verifier in ("token", "block"):
      row = f"  feature_drafter_128x1+source, {verifier} verification, gamma "
      outcome = (
          r"the baseline is chosen here \(1\.00x by definition\)\. Timed beside it, this shape "
          r"runs at [\d.]+x per token here: verifying 3 tokens costs [\d.]+ target steps on this "
          r"machine, against about one on TPUs and GPUs"
          if chose_baseline
          else r"chosen here, speedup [\d.]+x per token, measured"
      )
      assert re.search(rf"{re.escape(row)}\d, temperature {temperature}: {outcome}", out), out
      assert re.search(
          rf"  auto, temperature {temperature}, gamma \d \((the auto choice|not chosen: the baseline "
          rf"is)\): predicted [\d.]+x, measured [\d.]+x in the loop",
          out,
      )
  # --cost_repeats=0, the default: auto's timed loops cost the shape, no decode step is timed.
  # (A baseline decision's reason names the verification's cost too, so the rows' line is matched.)
  assert out.count("tokens per target call\n") == 4 and "in target steps: a verification" not in out
  # A chosen shape's row says "speedup"; where the baseline won at both temperatures (a busy
  # machine), the rows give the timed shape's figure per token without that word.
  assert ("speedup" in out or not chose_a_shape) and "x per token" in out
  assert "--verbose" in out and "| task |" not in out  # the full table only when asked
  assert "identical to the baseline on all 2 examples: True" in out


def test_demo_refuses_a_missing_pair_and_bad_flags_before_loading(tmp_path):
  """No random pair in place of a missing one (that is --random_pair), and every bad flag an
  error with exit status 1 before anything loads; all cases run at once."""
  (tmp_path / "forks").mkdir()
  (tmp_path / "incomplete" / "target").mkdir(parents=True)
  (tmp_path / "no_tab.tsv").write_text("Open\tÖffnen\nonly English\n")
  (tmp_path / "three.tsv").write_text("Open\tÖffnen\tOuvrir\n")
  cases = {
      f"--pair_dir={tmp_path / 'nowhere'}": f"--pair_dir={tmp_path / 'nowhere'} does not exist: "
      "give a directory written by pairs.save_pair with its sentencepiece.model (the "
      "shipped demo_models/ is the default) and --drafter one of its drafter subdirectories, or "
      "--random_pair for a tiny random pair",
      f"--pair_dir={tmp_path / 'incomplete'}": f"--pair_dir={tmp_path / 'incomplete'} has no "
      "feature_drafter_128x1, sentencepiece.model: give a directory",
      "--temperatures=0,-1": "--temperatures=0,-1 (0.0, -1.0): temperature must be >= 0 and finite",
      f"--test_file={tmp_path / 'no_tab.tsv'}": f"--test_file={tmp_path / 'no_tab.tsv'}: "
      "non-empty line 2 is not English<TAB>German ('only English', 1 tab-separated field(s)): "
      "give one pair per line",
      f"--test_file={tmp_path / 'three.tsv'}": f"--test_file={tmp_path / 'three.tsv'}: "
      "non-empty line 1 is not English<TAB>German ('Open\\tÖffnen\\tOuvrir', 3 tab-separated "
      "field(s))",
      "--gamma=two": "--gamma=two: give a number of drafts per target call (an integer >= 1) or "
      "auto",
      "--gamma=0": "--gamma=0: give a number of drafts per target call",
      "--gamma=3 --draft_tree=2,1": "--gamma=3 with --draft_tree=2,1: a tree sets its own drafts "
      "per call; give one of the two flags",
      "--gamma=3 --max_gamma=5": "--max_gamma applies to --gamma=auto only, and the draft shape "
      "is fixed here (--gamma=3): drop it",
      "--draft_tree=2,1 --alpha_examples=4": "--alpha_examples applies to --gamma=auto only",
      "--auto_tree=2,0": "--auto_tree=2,0: a draft tree's branching must hold integers >= 1",
      "--record_acceptance --acceptance_file=none": "--record_acceptance writes the measured "
      "alpha into --acceptance_file, and there is none here",
      "--gamma=2 --record_acceptance": "--record_acceptance applies to --gamma=auto only",
      f"--random_pair --test_file={tmp_path / 'three.tsv'}": "--random_pair decodes random inputs "
      "with random weights, and --test_file belongs to the trained pair's run: give one of the two",
      f"--test_file={tmp_path / 'absent.tsv'}": f"--test_file={tmp_path / 'absent.tsv'}: ",
      "--draft_tree=2,0": "--draft_tree=2,0: ",
      "--drafter=drafter,drafter": "--drafter=drafter,drafter: give one or more distinct drafter "
      "subdirectories of --pair_dir",
      "--drafter=drafter+source": "--drafter=drafter+source: +source adds each sentence's source "
      "ids to a feature drafter's draft vocabulary, and drafter is a SharedEncoderDrafter that has "
      "none (feature_drafter.can_copy_source): drop "
      "+source",
      "--verifier=token,tree": "--verifier=token,tree: give one or both of token, block, each once",
      "--draft_tree=2,1 --verifier=block": "--verifier=block with --draft_tree=2,1: a tree is "
      "verified by recursive rejection sampling",
  }
  runs = ScriptRuns(tmp_path / "forks")
  for flags in cases:
    runs.add(flags, "demo.py", *flags.split())
  runs.start()
  try:
    for flags, message in cases.items():
      returncode, stdout, stderr = runs[flags].result()
      assert returncode == 1, stderr[-3000:]
      last = stderr.strip().splitlines()[-1]
      assert last.startswith(f"demo.py: configuration error: {message}")
      assert "Traceback" not in stderr and "[demo]" not in stdout  # Nothing loaded or decoded.
  finally:
    runs.stop()

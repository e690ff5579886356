"""The README's main command: speculative vs baseline decoding on the shipped demo pair.

It translates held-out English sentences into German with the trained demo target and drafter in
`demo_models/` (see its MODEL_CARD.md), prints a few of them, then the Table-2 row of each
temperature (`sweep.sweep`: batch 1, baseline and speculative decodes timed side by side on
identical inputs and rng, medians, compilation excluded; alpha and tokens per target call from
the run's own statistics; c and the verification cost from compiled decode steps timed between
the examples; the speedups beside Theorem 3.8's prediction; see speculative_t5x/measuring/report.py). It
checks that the greedy output is identical to the baseline's, and exits with status 1 if not.

The draft shape is chosen on the machine it runs on (--gamma=auto, the default;
`auto_shape.Auto`): per temperature, alpha is read from its record in --acceptance_file where one
matches the pair, temperature and sentences (demo_models/measurements/acceptance.json holds the
default run's; --record_acceptance rewrites it), else measured on the first --alpha_examples (by default all 48)
sentences; the decoding loops (the baseline's, and chains of 1 and --max_gamma drafts) are timed
on four of them spanning their outputs' lengths, beside the target's 1- and k-token steps, then the chain with the highest
predicted speedup is decoded, before the next temperature is measured. Where none is predicted faster than the
baseline the demo says so, with the figures, and still decodes the fastest one whose loop it
timed, to show it and check it.

A --pair_dir that is missing or incomplete is an error (exit status 1), never replaced: a tiny
pair of random weights, for the mechanics only (its alpha says nothing about real drafters), is
the explicit --random_pair. Every flag is checked before anything loads.

  python scripts/demo.py [--pair_dir=demo_models] [--drafter=feature_drafter_128x1+source]
    [--num_examples=48] [--gamma=auto [--max_gamma=4] | --gamma=3 [--verifier=token,block] |
     --draft_tree=2,2,1]
    [--input_bucket=0] [--verbose]
  python scripts/demo.py --random_pair
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

from speculative_t5x.running import bootstrap

bootstrap.start(
    tensorflow=False
)  # first: keeps JAX off an absent TPU (decoding needs no TensorFlow)

from absl import flags
from absl import logging
import jax
import numpy as np

from speculative_t5x import draft_shapes
from speculative_t5x import drafters
from speculative_t5x import feature_drafter
from speculative_t5x import gin_utils
from speculative_t5x import network
from speculative_t5x import sampling
from speculative_t5x import speculative
from speculative_t5x import trees
from speculative_t5x import validation
from speculative_t5x.measuring import auto_shape
from speculative_t5x.measuring import report
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.measuring import sweep
from speculative_t5x.text import demo_data
from speculative_t5x.text import input_data
from speculative_t5x.text import vocabularies
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import pairs

REPO = pathlib.Path(__file__).resolve().parents[1]
RANDOM_DRAFTER = "random drafter"
# A --drafter entry ending in it: that feature drafter with `FeatureDrafter.copy_source`.
COPY_SOURCE = "+source"
EOS_ID = 1
RANDOM_INPUT_LENGTH = 16
# --cost_repeats=0 with a fixed draft shape: 5 rounds, a few seconds per temperature on a CPU.
FIXED_SHAPE_COST_REPEATS = 5
# --acceptance_file's default, under --pair_dir.
ACCEPTANCE_FILE = "measurements/acceptance.json"
VERIFIERS = {"token": speculative.TokenVerifier(), "block": speculative.BlockVerifier()}

_PAIR_DIR = flags.DEFINE_string(
    "pair_dir",
    str(REPO / "demo_models"),
    "Directory written by pairs.save_pair (+ sentencepiece.model).",
)
_DRAFTERS = flags.DEFINE_list(
    "drafter",
    ["feature_drafter_128x1+source"],
    "The drafter's subdirectory of --pair_dir, or several separated by commas, all timed side by "
    "side in one run: demo_models/ holds feature_drafter_128x1/ (the fastest here), "
    "feature_drafter_128/ and feature_drafter/ (feature-level drafters) and drafter/ (the "
    f"shared-encoder drafter); see demo_models/MODEL_CARD.md. A feature drafter's name with "
    f"{COPY_SOURCE} appended (feature_drafter_128x1{COPY_SOURCE}) also drafts each sentence's "
    "own source ids (feature_drafter.copying_source).",
)
_RANDOM_PAIR = flags.DEFINE_bool(
    "random_pair",
    False,
    "Decode with a tiny pair of RANDOM weights instead of --pair_dir: the mechanics only (its "
    "alpha means nothing).",
)
_TEST_FILE = flags.DEFINE_string(
    "test_file", str(REPO / "data" / "demo_ende" / "test.tsv"), "Held-out English<TAB>German pairs."
)
_NUM_EXAMPLES = flags.DEFINE_integer(
    "num_examples",
    48,
    "Sentences to decode and time (the first of --test_file). Tokens per target call move from "
    "one block of the test split to the next, less over more sentences (docs/demo.md).",
    lower_bound=1,
)
_SHOW = flags.DEFINE_integer("show", 5, "Translations to print.", lower_bound=0)
_GAMMA = flags.DEFINE_string(
    "gamma",
    "auto",
    "Drafted tokens per target call, or 'auto': chosen per temperature from alpha and the costs "
    "measured on this machine (auto_shape.Auto; the chain of 1..--max_gamma drafts with the "
    "highest predicted speedup). Machines of one kind differ: a verification of 4 tokens costs "
    "1.2 target steps on one 2-core machine and 2.4 on another, so no fixed gamma serves both.",
)
_MAX_GAMMA = flags.DEFINE_integer(
    "max_gamma", 4, "With --gamma=auto: the longest chain tried.", lower_bound=1
)
_AUTO_TREES = flags.DEFINE_multi_string(
    "auto_tree",
    [],
    "With --gamma=auto: a draft tree that is a candidate too, as children per depth (e.g. "
    "2,2,1); repeat the flag for several.",
)
_EVERY_CANDIDATE = flags.DEFINE_bool(
    "every_candidate",
    False,
    "With --gamma=auto: decode and time every candidate, not only the chosen one, to set each "
    "prediction beside its measurement (the auto choice marked).",
)
_AUTO_BUDGET = flags.DEFINE_float(
    "auto_budget_s",
    3.0,
    "With --gamma=auto: seconds of timing rounds per temperature (compilation apart).",
    lower_bound=0.0,
)
_ALPHA_EXAMPLES = flags.DEFINE_integer(
    "alpha_examples",
    48,
    "With --gamma=auto: alpha is measured on the target's own outputs for this many of the "
    "first sentences (about 12 tokens each), at each temperature (auto_shape.measure_acceptance); "
    "by default the --num_examples decoded: the first 16 of the test split have an alpha of "
    "0.567 / 0.621 at T = 0 / 1, the 48 0.662 / 0.682.",
    lower_bound=1,
)
_ACCEPTANCE_FILE = flags.DEFINE_string(
    "acceptance_file",
    "",
    "With --gamma=auto: a file of acceptance records (speculative_t5x/measuring/acceptance_record.py); "
    f"empty: --pair_dir's {ACCEPTANCE_FILE} (the shipped demo_models/ holds the demo's, at "
    "temperatures 0 and 1), none with --random_pair. Where it holds the record of this pair, "
    "temperature, decode length and these sentences, alpha is read from it, not measured; "
    "'none': always measure.",
)
_RECORD_ACCEPTANCE = flags.DEFINE_bool(
    "record_acceptance",
    False,
    "With --gamma=auto: measure alpha whatever --acceptance_file holds, and record it there.",
)
_DRAFT_TREE = flags.DEFINE_list(
    "draft_tree",
    [],
    "A static draft tree instead of the chain of --gamma: children per depth, e.g. 2,2,1 "
    "(trees.DraftTree.from_branching).",
)
_VERIFIER = flags.DEFINE_list(
    "verifier",
    ["token"],
    "How the chain of --gamma is verified: 'token' (Algorithm 1) or 'block' (block verification, "
    "Sun et al. 2025: as exact, never fewer tokens per call in expectation, and Algorithm 1 "
    "itself at T = 0), or both, e.g. --verifier=token,block, timed side by side.",
)
_VERBOSE = flags.DEFINE_bool(
    "verbose", False, "Print every figure of the rows (report.markdown_table) too."
)
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Temperatures to run.")
_REPEATS = flags.DEFINE_integer(
    "repeats",
    0,
    "Timed repeats per example (median is used); 0: with --gamma=auto, as many (1 to 3) as fit "
    "--timing_budget_s by the measured step time, else 3.",
    lower_bound=0,
)
_TIMING_BUDGET = flags.DEFINE_float(
    "timing_budget_s",
    8.0,
    "With --repeats=0 and --gamma=auto: seconds of timed decodes per temperature, estimated "
    "from auto's measured loops.",
    lower_bound=0.0,
)
_COST_REPEATS = flags.DEFINE_integer(
    "cost_repeats",
    0,
    "Timed rounds of the decode steps behind c and the verification cost, spread over the "
    "examples, after the steps compile; 0: with --gamma=auto none, since auto's timed loops, "
    "printed with its decision, "
    f"already cost the shape; else {FIXED_SHAPE_COST_REPEATS}.",
    lower_bound=0,
)
_INPUT_BUCKET = flags.DEFINE_integer(
    "input_bucket",
    0,
    "Pad each sentence's input to its own multiple of this many tokens (sweep.pad_to_buckets), so "
    "a short sentence does not pay the longest one's encoder; 0 (the default) pads every "
    "sentence to the longest: one length, one set of compiled decodes. Each length compiles its "
    "own decodes, which costs more than the demo's sentences, nearly all of one length, gain.",
    lower_bound=0,
)
_DECODE_LENGTH = flags.DEFINE_integer(
    "decode_length", 64, "Decoder length (max output tokens).", lower_bound=1
)


def check_flags() -> tuple[float, ...]:
  """What absl's bounds leave, before anything loads: --temperatures finite and >= 0, and either
  --random_pair or a --pair_dir holding a pair and its vocabulary -> the temperatures."""
  given = f"--temperatures={','.join(_TEMPERATURES.value)}"
  try:
    values = [float(t) for t in _TEMPERATURES.value]
  except ValueError as e:
    raise gin_utils.ConfigError(f"{given}: {e}: give numbers, e.g. --temperatures=0,1") from e
  try:
    temperatures = validation.check_temperatures(values, given)
  except validation.InvalidInputError as e:
    raise gin_utils.ConfigError(str(e)) from e
  if _RANDOM_PAIR.value:
    for name in ("pair_dir", "drafter", "test_file"):
      if flags.FLAGS[name].present:
        raise gin_utils.ConfigError(
            f"--random_pair decodes random inputs with random weights, and --{name} belongs "
            "to the trained pair's run: give one of the two"
        )
    return temperatures
  pair_dir = pathlib.Path(gin_utils.resolve_path(_PAIR_DIR.value))
  if not _DRAFTERS.value or len(set(_DRAFTERS.value)) != len(_DRAFTERS.value):
    raise gin_utils.ConfigError(
        f"--drafter={','.join(_DRAFTERS.value)}: give one or more distinct drafter "
        "subdirectories of --pair_dir, e.g. --drafter=drafter,feature_drafter"
    )
  members = [_member(entry)[0] for entry in _DRAFTERS.value]
  needed = ("target", *members, demo_data.DEMO_VOCABULARY_FILE)
  missing = [name for name in needed if not (pair_dir / name).exists()]
  if missing:
    problem = "does not exist" if not pair_dir.is_dir() else f"has no {', '.join(missing)}"
    raise gin_utils.ConfigError(
        f"--pair_dir={_PAIR_DIR.value} {problem}: give a directory written by "
        f"pairs.save_pair with its {demo_data.DEMO_VOCABULARY_FILE} (the shipped demo_models/ "
        "is the default) and --drafter one of its drafter subdirectories, or --random_pair for "
        "a tiny random pair (mechanics only)"
    )
  for entry in _DRAFTERS.value:
    member, copy_source = _member(entry)
    if not copy_source:
      continue
    drafter = checkpoints.read_drafter(pair_dir / member)
    if not feature_drafter.can_copy_source(drafter):
      raise gin_utils.ConfigError(
          f"--drafter={entry}: {COPY_SOURCE} adds each sentence's source ids to a feature "
          f"drafter's draft vocabulary, and {member} is a {type(drafter).__name__} that has "
          f"none (feature_drafter.can_copy_source): drop {COPY_SOURCE}"
      )
  return temperatures


def _member(entry: str) -> tuple[str, bool]:
  """A --drafter entry -> (its subdirectory of --pair_dir, whether it copies the source)."""
  if entry.endswith(COPY_SOURCE):
    return entry[: -len(COPY_SOURCE)], True
  return entry, False


def _demo_pairs() -> tuple[dict[str, pairs.Pair], vocabularies.Vocabulary | None, str]:
  """-> (drafter label -> its pair with the target, the sentencepiece vocabulary or None for the
  random pair, a label of where the weights come from)."""
  if _RANDOM_PAIR.value:
    return _random_pair()
  pair_dir = pathlib.Path(gin_utils.resolve_path(_PAIR_DIR.value))
  vocabulary = vocabularies.SentencePieceVocabulary(str(pair_dir / demo_data.DEMO_VOCABULARY_FILE))
  # Parameters may be stored in bfloat16 (demo_models/ is, to halve its size); from_pair_dir
  # restores them in the compute dtype the target's config.json records (float32 for the demo).
  loaded = {}
  for entry in _DRAFTERS.value:
    member, copy_source = _member(entry)
    config = pairs.PairConfig.from_pair_dir(pair_dir, drafter_member=member)
    pair = pairs.load_pair(config, vocabulary.eos_id)
    if copy_source:
      drafter, params = feature_drafter.copying_source(
          pair.drafter, pair.drafter_params, pair.target_params
      )
      pair = dataclasses.replace(pair, drafter=drafter, drafter_params=params)
    loaded[entry] = pair
  members = {_member(entry)[0] for entry in _DRAFTERS.value}
  stored = sorted(
      set().union(*(checkpoints.stored_dtypes(pair_dir / m) for m in ("target", *members)))
  )
  restored = loaded[_DRAFTERS.value[0]].config.restore_dtype
  return (
      loaded,
      vocabulary,
      f"trained demo pair from {pair_dir} (stored as {', '.join(stored)}, restored as "
      f"{restored})",
  )


def _random_pair() -> tuple[dict[str, pairs.Pair], None, str]:
  """--random_pair: a tiny target and drafter of random weights, and no vocabulary."""
  print("[demo] --random_pair: a tiny RANDOM pair (mechanics only; its alpha is not meaningful).")
  target = network.T5Config(
      vocab_size=512,
      emb_dim=64,
      num_heads=4,
      num_encoder_layers=2,
      num_decoder_layers=2,
      head_dim=16,
      mlp_dim=128,
      mlp_activations=("gelu", "linear"),
      dropout_rate=0.0,
  )
  drafter = target.replace(
      emb_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, mlp_dim=64
  )
  config = pairs.PairConfig(
      target_config=target,
      drafter=drafters.T5Drafter(drafter),
      restore_dtype=None,
      random_init_seed=0,
  )
  return {RANDOM_DRAFTER: pairs.load_pair(config, EOS_ID)}, None, "random tiny pair"


def read_test_pairs() -> list[tuple[str, str]]:
  """The first --num_examples (English, German) pairs of --test_file, before anything loads;
  a missing file or a line that is not English<TAB>German is a configuration error."""
  given = f"--test_file={_TEST_FILE.value}"
  try:
    lines = input_data.read_lines(_TEST_FILE.value, _NUM_EXAMPLES.value)
  except (OSError, ValueError) as e:
    raise gin_utils.ConfigError(f"{given}: {e}") from e
  pairs_read = []
  for number, line in enumerate(lines, 1):
    fields = line.split("\t")
    if len(fields) != 2 or not fields[0].strip():
      raise gin_utils.ConfigError(
          f"{given}: non-empty line {number} is not English<TAB>German ({line[:60]!r}, "
          f"{len(fields)} tab-separated field(s)): give one pair per line, e.g. "
          "data/demo_ende/test.tsv"
      )
    pairs_read.append((fields[0], fields[1]))
  return pairs_read


def _draft_trees() -> dict[str, trees.DraftTree] | None:
  """--draft_tree -> {label: tree}, or None for the chain of --gamma."""
  if not _DRAFT_TREE.value:
    return None
  given = f"--draft_tree={','.join(_DRAFT_TREE.value)}"
  try:
    tree = trees.DraftTree.from_branching([int(k) for k in _DRAFT_TREE.value])
  except ValueError as e:
    raise gin_utils.ConfigError(
        f"{given}: {e}: give children per depth, integers >= 1, e.g. --draft_tree=2,2,1"
    ) from e
  return {",".join(_DRAFT_TREE.value): tree}


def _verifiers() -> dict[str, speculative.Verifier]:
  """--verifier -> {label: verifier} for the chain (a tree has its own verifier)."""
  given = f"--verifier={','.join(_VERIFIER.value)}"
  unknown = [name for name in _VERIFIER.value if name not in VERIFIERS]
  if not _VERIFIER.value or unknown or len(set(_VERIFIER.value)) != len(_VERIFIER.value):
    raise gin_utils.ConfigError(
        f"{given}: give one or both of {', '.join(VERIFIERS)}, each once, e.g. "
        "--verifier=token,block"
    )
  if _DRAFT_TREE.value and flags.FLAGS["verifier"].present:
    raise gin_utils.ConfigError(
        f"{given} with --draft_tree={','.join(_DRAFT_TREE.value)}: a tree is verified by "
        "recursive rejection sampling (speculative.TreeVerifier); give one of the two flags"
    )
  return {name: VERIFIERS[name] for name in _VERIFIER.value}


# Steps per timed call of auto's costs and the sweep's: shorter rounds, more of them in the budget
# (a median of several rounds holds against a slow spell better than a few long ones).
AUTO_STEPS_PER_CALL = 4
AUTO_FLAGS = (
    "max_gamma",
    "auto_tree",
    "auto_budget_s",
    "alpha_examples",
    "every_candidate",
    "acceptance_file",
    "record_acceptance",
)


def _gamma() -> int | None:
  """--gamma -> the fixed gamma, or None for 'auto' (a chain chosen per temperature); a tree
  (--draft_tree) takes neither. Flags only auto reads are refused beside a fixed shape."""
  if flags.FLAGS["gamma"].present and _DRAFT_TREE.value:
    raise gin_utils.ConfigError(
        f"--gamma={_GAMMA.value} with --draft_tree={','.join(_DRAFT_TREE.value)}: a tree sets "
        "its own drafts per call; give one of the two flags"
    )
  gamma = None
  if _GAMMA.value != "auto":
    try:
      gamma = validation.check_integer(int(_GAMMA.value), "--gamma", 1)
    except (ValueError, validation.InvalidInputError) as e:
      raise gin_utils.ConfigError(
          f"--gamma={_GAMMA.value}: give a number of drafts per target call (an integer >= 1) "
          "or auto"
      ) from e
  if gamma is not None or _DRAFT_TREE.value:
    given = [name for name in AUTO_FLAGS if flags.FLAGS[name].present]
    if given:
      raise gin_utils.ConfigError(
          f"--{given[0]} applies to --gamma=auto only, and the draft shape is fixed here "
          f"({'--draft_tree' if _DRAFT_TREE.value else f'--gamma={gamma}'}): drop it"
      )
  elif _RECORD_ACCEPTANCE.value and _acceptance_file() is None:
    raise gin_utils.ConfigError(
        "--record_acceptance writes the measured alpha into --acceptance_file, and there is "
        "none here (--acceptance_file=none, or --random_pair without one): give a file"
    )
  return gamma


def _auto() -> auto_shape.Auto:
  """--gamma=auto's candidates and budget (--max_gamma, --auto_tree, --auto_budget_s), each tree
  checked first (`trees.DraftTree.from_branching`)."""
  branchings = []
  for tree in _AUTO_TREES.value:
    try:
      branching = [int(k) for k in tree.split(",")]
      trees.DraftTree.from_branching(branching)
    except ValueError as e:
      raise gin_utils.ConfigError(
          f"--auto_tree={tree}: {e}: give children per depth, integers >= 1, e.g. "
          "--auto_tree=2,2,1"
      ) from e
    branchings.append(branching)
  return auto_shape.Auto(max_gamma=_MAX_GAMMA.value, trees=branchings, budget_s=_AUTO_BUDGET.value)


def _acceptance_file() -> pathlib.Path | None:
  """--acceptance_file: the file, or None (always measure)."""
  if _ACCEPTANCE_FILE.value == "none":
    return None
  if _ACCEPTANCE_FILE.value:
    return pathlib.Path(gin_utils.resolve_path(_ACCEPTANCE_FILE.value))
  if _RANDOM_PAIR.value:
    return None
  return pathlib.Path(gin_utils.resolve_path(_PAIR_DIR.value)) / ACCEPTANCE_FILE


def _auto_settings(
    auto: auto_shape.Auto,
    loaded: dict[str, pairs.Pair],
    temperature: float,
    encoder_tokens: np.ndarray,
    decode_length: int,
    vocabulary: vocabularies.Vocabulary,
    verifiers: dict[str, speculative.Verifier],
    geometry: step_costs.DecodeGeometry,
) -> tuple[list[sweep.SweepSetting], dict[str, auto_shape.Choice], float]:
  """--gamma=auto at one temperature: for each drafter, the acceptance per position along the
  target's own outputs for the first --alpha_examples of encoder_tokens [examples, Le] (one
  batch), then `auto_shape.Auto.choose` on this machine (`Auto.choose_for_pair`) -> (the sweep's
  settings: the chosen chain, or the best one when the baseline is chosen, so that speculative
  decoding is still shown and checked; drafter -> its Choice; tokens per sentence the target
  generated)."""
  first = encoder_tokens[: _ALPHA_EXAMPLES.value]
  settings, choices, tokens = [], {}, []
  for name, pair in loaded.items():
    choice = auto.choose_for_pair(
        pair,
        first,
        decode_length,
        geometry,
        temperature,
        vocabulary,
        "sentences",
        acceptance_file=_acceptance_file(),
        record=_RECORD_ACCEPTANCE.value,
    )
    tokens.append(choice.acceptance_tokens / len(first))
    print(f"[demo] {name}: {choice.summary()}")
    choices[name] = choice
    shown = choice.predictions if _EVERY_CANDIDATE.value else [choice.speculative]
    chains = [p.shape.gamma for p in shown if isinstance(p.shape, draft_shapes.Chain)]
    trees = {
        p.label.removeprefix("tree "): p.shape.tree
        for p in shown
        if isinstance(p.shape, draft_shapes.Tree)
    }
    settings += sweep.grid_settings([name], chains, verifiers, None, trees)
  return settings, choices, float(np.mean(tokens))


def _timing_repeats(choices: dict[str, auto_shape.Choice], tokens: float, examples: int) -> int:
  """--repeats, or with --repeats=0 as many (1 to 3) as fit --timing_budget_s at one
  temperature: each example's baseline and speculative decodes are estimated from the baseline's
  measured loop, its fixed part and per token (the target's step where no loop was timed), and
  the predicted speedup."""
  if _REPEATS.value:
    return _REPEATS.value
  per_repeat = 0.0
  for choice in choices.values():
    costs = choice.costs
    steps = costs.fixed(auto_shape.BASELINE) + tokens * costs.baseline_step
    example_s = steps * costs.target_step.median_ms / 1e3
    per_repeat += examples * example_s * (1 + 1 / max(choice.speculative.speedup, 0.1))
  return int(np.clip(_TIMING_BUDGET.value // max(per_repeat, 1e-9), 1, 3))


def _predicted(row, choices: dict[float, dict[str, auto_shape.Choice]]):
  """(the auto Choice behind `row`, the Prediction for the row's shape)."""
  choice = choices[row.temperature][row.drafter.split(", ")[0]]
  return choice, next(p for p in choice.predictions if p.shape == row.shape)


def _outcome(row, choices: dict[float, dict[str, auto_shape.Choice]]) -> str:
  """A row's first line under --gamma=auto: what the decision gives on this machine. Where the
  baseline is chosen, the shape timed beside it is what it would cost here, and why."""
  choice, predicted = _predicted(row, choices)
  head = f"  {row.drafter}, {row.shape.label}, temperature {row.temperature:g}: "
  if predicted == choice.chosen:
    return head + f"chosen here, speedup {row.speedup:.2f}x per token, measured"
  if choice.shape is None:
    tokens, steps = choice.costs.gamma + 1, choice.costs.verify_cost(choice.costs.gamma)
    return head + (
        f"the baseline is chosen here (1.00x by definition). Timed beside it, this shape runs at "
        f"{row.speedup:.2f}x per token here: verifying {tokens} tokens costs {steps:.2f} target "
        "steps on this machine, against about one on TPUs and GPUs"
    )
  return head + f"not chosen ({choice.chosen.label} is): {row.speedup:.2f}x per token here"


def _summary(rows, choices: dict[float, dict[str, auto_shape.Choice]]) -> str:
  """--gamma=auto: each row with its outcome, then each row's predicted speedup beside the
  measured one in the loop (prefill taken off, what the prediction models)."""
  outcomes = {}  # (temperature, drafter) -> what the decision gives here
  for row in rows:
    choice, predicted = _predicted(row, choices)
    key = row.temperature, row.drafter.split(", ")[0]
    if choice.shape is None:
      outcomes[key] = f"temperature {row.temperature:g}, the baseline, 1.00x"
    elif predicted == choice.chosen and key not in outcomes:
      outcomes[key] = f"temperature {row.temperature:g}, {row.shape.label}, {row.speedup:.2f}x"
  lines = ["  What you get on this machine: " + "; ".join(outcomes.values()) + " per token."]
  for row in rows:
    detail = report.plain_summary([row]).splitlines()[1:]
    lines += [_outcome(row, choices), *detail]
  for row in rows:
    choice, predicted = _predicted(row, choices)
    if predicted == choice.chosen:
      taken = "the auto choice"
    else:
      taken = "not chosen" + (": the baseline is" if choice.shape is None else "")
    lines.append(
        f"  auto, temperature {row.temperature:g}, {predicted.label} ({taken}): predicted "
        f"{predicted.speedup:.2f}x, measured {row.loop_speedup:.2f}x in the loop "
        f"({row.loop_speedup / predicted.speedup:.2f} of the prediction"
        + ("" if choice.costs.loop else "; the loop's own work is not in the costs")
        + ")"
    )
  lines.append(
      "  Where verifying k tokens costs about one target step, as on the paper's TPUs "
      "(docs/tpu.md: XLA:TPU's cost model puts 2 and 8 tokens of T5-XXL on a v4 chip at 1.34 and "
      "1.33 steps), longer drafts pay."
  )
  return "\n".join(lines) + "\n"


def repeats_itself(text: str, min_repeats: int = 4, max_words: int = 3) -> bool:
  """Whether `text` holds a run of 1 to `max_words` words repeated `min_repeats` times in a row
  (a greedy decode caught in a loop)."""
  words = text.split()
  for n in range(1, max_words + 1):
    for start in range(len(words) - n * min_repeats + 1):
      unit = words[start : start + n]
      if all(words[start + k * n : start + (k + 1) * n] == unit for k in range(min_repeats)):
        return True
  return False


def main(argv):
  if len(argv) > 1:
    raise gin_utils.ConfigError(f"unexpected arguments {argv[1:]}: all options are --flags")
  temperatures = check_flags()
  draft_trees = _draft_trees()
  verifiers = _verifiers()
  gamma = _gamma()
  auto = _auto() if gamma is None and draft_trees is None else None
  test_pairs = None if _RANDOM_PAIR.value else read_test_pairs()
  load = stopwatch.machine_load()
  logging.set_verbosity(logging.WARNING)
  loaded, vocabulary, label = _demo_pairs()
  pair = next(iter(loaded.values()))
  target = pair.target_config
  if vocabulary is None:
    sources = references = None
    encoder_tokens = input_data.random_inputs(
        target.vocab_size, _NUM_EXAMPLES.value, RANDOM_INPUT_LENGTH, eos_id=EOS_ID
    )
  else:
    sources, references = zip(*test_pairs)
    encoder_tokens = input_data.encode_texts(
        [demo_data.TRANSLATE_EN_DE_PREFIX + source for source in sources], vocabulary
    )
  examples = encoder_tokens[:, None]
  if _INPUT_BUCKET.value:
    examples = sweep.pad_to_buckets(examples, _INPUT_BUCKET.value)
  lengths = sweep.encoder_lengths(examples)
  if draft_trees is not None:
    shape = f"draft tree {_DRAFT_TREE.value}"
  elif gamma is None:
    shape = f"draft shape chosen here (chains of 1-{_MAX_GAMMA.value} drafts)"
  else:
    shape = f"gamma {gamma}"
  if draft_trees is None:
    shape += f", {' and '.join(verifiers)} verification"
  print(
      f"[demo] {label}: target {target.emb_dim}d x {target.num_decoder_layers} decoder layers, "
      f"drafters {', '.join(f'{name} ({type(p.drafter).__name__})' for name, p in loaded.items())}"
      f", {shape}, {len(encoder_tokens)} examples at batch 1 (input tokens padded to "
      f"{', '.join(f'{n}: {count}' for n, count in lengths.items())}), backend "
      f"{jax.default_backend()}"
  )
  vocabulary = vocabulary or vocabularies.PassThroughVocabulary(target.vocab_size, eos_id=EOS_ID)
  choices, repeats = {}, _REPEATS.value or 3
  geometry = None  # the sweep's own
  if auto is not None:
    # Auto's steps and the sweep's costs timed in one geometry: their programs compile once.
    geometry = step_costs.DecodeGeometry.for_decoding(
        sweep.most_common_length(examples),
        _DECODE_LENGTH.value,
        auto.max_block,
        AUTO_STEPS_PER_CALL,
    )
  rows, results = [], {}
  # With --gamma=auto, a sweep per temperature, each decided just before it runs: a machine's
  # speed drifts over minutes.
  plan = [(t, [t]) for t in temperatures] if auto is not None else [(None, list(temperatures))]
  for temperature, run_temperatures in plan:
    if auto is None:
      settings = sweep.grid_settings(
          loaded, [gamma] if draft_trees is None else [], verifiers, None, draft_trees
      )
    else:
      settings, choices[temperature], tokens = _auto_settings(
          auto,
          loaded,
          temperature,
          encoder_tokens,
          _DECODE_LENGTH.value,
          vocabulary,
          verifiers,
          geometry,
      )
      repeats = _timing_repeats(choices[temperature], tokens, len(examples))
    result = sweep.sweep(
        target,
        pair.target_params,
        {name: (p.drafter, p.drafter_params) for name, p in loaded.items()},
        settings,
        run_temperatures,
        examples,
        _DECODE_LENGTH.value,
        vocabulary=vocabulary,
        task="demo_ende" if sources else input_data.RANDOM_TASK,
        repeats=repeats,
        cost_repeats=_COST_REPEATS.value or (0 if auto else FIXED_SHAPE_COST_REPEATS),
        cost_geometry=geometry,
    )
    rows += result.rows
    results.update(result.results)
  greedy = [row for row in rows if sampling.is_greedy(row.temperature)]
  if greedy and sources and _SHOW.value:
    print("\nTranslations (temperature 0, speculative decoding):")
    key = greedy[0].drafter, greedy[0].gamma
    outputs = results[greedy[0].temperature][key]
    for source, reference, output in list(zip(sources, references, outputs))[: _SHOW.value]:
      german = vocabulary.decode(output.decodes[0].tolist())
      print(f"  EN  {source}\n  DE  {german}\n  ref {reference}")
      if repeats_itself(german):
        print(
            "  (it repeats itself: the small target's own greedy output, which speculative "
            "decoding reproduces exactly)"
        )
      print()
  print(
      f"Speculative against baseline decoding, {len(encoder_tokens)} examples at batch 1 "
      f"(median of {repeats} run(s) each; before the run: 1-minute load average "
      f"{load['load_1m']:.2f}, other processes running {load['runnable_others']}):"
  )
  print(_summary(rows, choices) if choices else report.plain_summary(rows), end="")
  warning = stopwatch.busy_warning(load)
  if warning:
    print(f"\n{warning}")
  if _VERBOSE.value:
    print("\n" + report.markdown_table(rows) + "\n" + report.NOTES)
  else:
    print(
        "Every figure of these rows (Table 2's, predictions, efficiencies): --verbose, or "
        "scripts/benchmark.py, which writes them to results.json."
    )
  if greedy:
    identical = all(row.outputs_match_baseline == 1.0 for row in greedy)
    print(
        f"\nGreedy speculative output identical to the baseline on all {len(encoder_tokens)} "
        f"examples: {identical}"
    )
    if not identical:
      sys.exit(1)


if __name__ == "__main__":
  gin_utils.run(main)

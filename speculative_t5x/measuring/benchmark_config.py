"""A benchmark run's configuration, beside `inference.InferConfig`: the gin-configured
`BenchmarkSetup` that scripts/benchmark.py runs, its checks (before anything loads) and the models
it names.

configs/runs/benchmark.gin binds `benchmark_config.BenchmarkSetup` to the T5X-style macros
(TASK_FEATURE_LENGTHS) and its `pair` to `pairs.PairConfig` (configs/runs/pair.gin, with a drafter
from configs/drafters/); configs/runs/benchmark_{tiny,small,verifiers,draft_length,trees}.gin set
its other fields. `BenchmarkSetup().checked(...)` applies the command line's gammas and
temperatures and refuses a bad setting with `gin_utils.ConfigError`; `load_models` loads the pair
and names the drafters `sweep.sweep` times.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping, Sequence

import gin

from speculative_t5x import draft_length
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import gin_utils
from speculative_t5x import speculative
from speculative_t5x import trees
from speculative_t5x import validation
from speculative_t5x.measuring import auto_shape
from speculative_t5x.measuring import workloads
from speculative_t5x.weights import pairs

# The rows' drafter labels of `workloads.RANDOM_DRAFTER_KINDS`.
RANDOM_DRAFTER_LABELS = {"independent": "random, independent", "copy": "random, copy of target"}


@gin.configurable(module="benchmark_config")
@dataclasses.dataclass(frozen=True)
class BenchmarkSetup:
  """What configs/runs/benchmark*.gin choose.

  pair: the target, a drafter and their weights (configs/runs/pair.gin); a drafter without a
    checkpoint gets random weights and one row per kind in `random_drafters`.
  task_feature_lengths: {'inputs': Le, 'targets': decode length}.
  gammas, temperatures: the settings swept.
  random_drafters: kinds from `workloads.RANDOM_DRAFTER_KINDS`.
  seed: random inputs and decode rngs (random weights: the pair's RANDOM_INIT_SEED).
  verifiers: label -> speculative.Verifier, each measured with every drafter, side by side
    (None: Algorithm 1 alone), e.g. configs/runs/benchmark_verifiers.gin.
  draft_stops: label -> a `draft_length` rule or None (static gamma), each measured with every
    drafter and verifier, side by side, at every gamma as its most drafts (None: static gamma
    alone), e.g. configs/runs/benchmark_draft_length.gin.
  draft_trees: label -> a draft tree's branching (k_1, ..., k_D) or `trees.DraftTree`, each
    measured with every drafter at its depth, beside the chains (None: chains alone), e.g.
    configs/runs/benchmark_trees.gin.
  auto: an `auto_shape.Auto`, or None: per temperature and drafter, the draft shape chosen from
    the acceptance per position and the costs measured on this machine before the sweep, its
    decision recorded (results.json 'auto_shape') and its shape swept beside the gammas, e.g.
    configs/runs/benchmark_auto.gin.
  """

  pair: pairs.PairConfig
  task_feature_lengths: Mapping[str, int]
  gammas: Sequence[int]
  temperatures: Sequence[float]
  random_drafters: Sequence[str] = workloads.RANDOM_DRAFTER_KINDS
  seed: int = 0
  verifiers: Mapping[str, speculative.Verifier] | None = None
  draft_stops: Mapping[str, draft_length.DraftStop | None] | None = None
  draft_trees: Mapping[str, trees.DraftTree | tuple[int, ...]] | None = None
  auto: auto_shape.Auto | None = None

  def checked(
      self, gammas: Sequence[int] | None = None, temperatures: Sequence[float] | None = None
  ) -> BenchmarkSetup:
    """This setup with `gammas` and `temperatures` in place of its own where given (a command
    line's), its draft trees as `trees.DraftTree`s, every setting checked -> the setup to run.
    Raises gin_utils.ConfigError, naming the setting and the fix, before anything loads."""
    setup = self
    if not isinstance(setup.pair, pairs.PairConfig):
      raise gin_utils.ConfigError(
          "benchmark_config.BenchmarkSetup.pair must be a pairs.PairConfig (configs/runs/"
          f"benchmark.gin binds it to @pairs.PairConfig()), got {setup.pair!r}."
      )
    try:
      validation.check_feature_lengths(
          setup.task_feature_lengths, "TASK_FEATURE_LENGTHS", ("inputs", "targets")
      )
      validation.check_integer(setup.seed, "benchmark_config.BenchmarkSetup.seed", 0)
      for name in ("gammas", "random_drafters"):
        value = getattr(setup, name)
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
          raise validation.InvalidInputError(
              f"benchmark_config.BenchmarkSetup.{name} must be a sequence, e.g. "
              f"{'(2, 4)' if name == 'gammas' else repr(workloads.RANDOM_DRAFTER_KINDS)}, got "
              f"{value!r}."
          )
      unknown = [k for k in setup.random_drafters if k not in workloads.RANDOM_DRAFTER_KINDS]
      if unknown:
        raise validation.InvalidInputError(
            f"benchmark_config.BenchmarkSetup.random_drafters {tuple(setup.random_drafters)!r} "
            f"holds {unknown!r}: use kinds of {workloads.RANDOM_DRAFTER_KINDS!r}."
        )
      for name in ("verifiers", "draft_stops", "draft_trees"):
        value = getattr(setup, name)
        if value is not None and not isinstance(value, Mapping):
          raise validation.InvalidInputError(
              f"benchmark_config.BenchmarkSetup.{name} must be a mapping label -> setting, or "
              f"None, got {value!r}."
          )
      if setup.auto is not None and not isinstance(setup.auto, auto_shape.Auto):
        raise validation.InvalidInputError(
            f"benchmark_config.BenchmarkSetup.auto must be an @auto_shape.Auto() or None, got "
            f"{setup.auto!r}."
        )
    except validation.InvalidInputError as e:
      raise gin_utils.ConfigError(str(e)) from e
    try:
      if gammas is not None:
        setup = dataclasses.replace(setup, gammas=tuple(gammas))
      if temperatures is not None:
        setup = dataclasses.replace(setup, temperatures=tuple(temperatures))
      if not setup.gammas:
        raise validation.InvalidInputError("gammas is empty: give at least one, e.g. --gammas=2,4.")
      for gamma in setup.gammas:
        validation.check_integer(gamma, "gammas", 1)
      validation.check_temperatures(setup.temperatures, "temperatures")
      if setup.draft_trees:
        setup = dataclasses.replace(
            setup,
            draft_trees={label: trees.as_tree(tree) for label, tree in setup.draft_trees.items()},
        )
    except ValueError as e:  # InvalidInputError, and a bad tree (trees.DraftTree)
      raise gin_utils.ConfigError(str(e)) from e
    drafter = setup.pair.drafter
    if drafter is None:
      raise gin_utils.ConfigError(
          "DRAFTER is None: scripts/benchmark.py times a drafter against the target; include one "
          "file of configs/drafters/ (e.g. configs/drafters/t5.gin and DRAFTER_CONFIG)."
      )
    if not setup.pair.drafter_checkpoint_path and drafters_lib.stepped_network(drafter) is None:
      raise gin_utils.ConfigError(
          f"DRAFTER {type(drafter).__name__} has no DRAFTER_CHECKPOINT_PATH, and the random "
          f"drafters {tuple(setup.random_drafters)} are built from a T5 drafter's network, which "
          "it has none of: give its checkpoint (a drafter without one is timed by "
          "scripts/demo.py or sweep.sweep)."
      )
    if not (setup.pair.drafter_checkpoint_path or setup.random_drafters):
      raise gin_utils.ConfigError(
          "no DRAFTER_CHECKPOINT_PATH and no BenchmarkSetup.random_drafters: nothing to benchmark."
      )
    return setup


def load_models(
    setup: BenchmarkSetup, eos_id: int
) -> tuple[pairs.Pair, dict[str, tuple[drafters_lib.Drafter, dict]]]:
  """-> the pair (`pairs.load_pair`), {drafter label: (drafter, params)}: the checkpointed
  drafter under its directory's name, else one per kind in `setup.random_drafters`
  (`workloads.random_drafter`, labelled by RANDOM_DRAFTER_LABELS)."""
  pair = pairs.load_pair(setup.pair, eos_id)
  if setup.pair.drafter_checkpoint_path:
    name = pathlib.PurePath(str(setup.pair.drafter_checkpoint_path).rstrip("/")).name
    return pair, {name: (pair.drafter, pair.drafter_params)}
  return pair, {
      RANDOM_DRAFTER_LABELS.get(kind, kind): workloads.random_drafter(
          kind, pair.target_config, pair.target_params, pair.drafter, pair.drafter_params
      )
      for kind in setup.random_drafters
  }

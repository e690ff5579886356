"""A target and its drafter with their weights: one configuration and one loader shared by every
script (infer, benchmark, aot_check, demo, measure_alpha).

`PairConfig` is what gin binds (configs/runs/pair.gin binds it to T5X-style macros: TARGET_CONFIG,
DRAFTER, CHECKPOINT_PATH, DRAFTER_CHECKPOINT_PATH, RESTORE_DTYPE, RANDOM_INIT_SEED); `load_pair`
turns it into parameters:
  - the target from CHECKPOINT_PATH (a T5X checkpoint or a `checkpoints.save_model` directory);
  - the drafter, whatever its kind, through the `drafters.Drafter` protocol: from
    DRAFTER_CHECKPOINT_PATH (`checkpoints.restore_drafter_params`), else fitted on target sequences
    (`fit_params`, for the n-gram tables), else its untrained parameters (`init_params`: none for
    prompt lookup);
  - random weights where a model needs a checkpoint and its path is None, allowed only with
    RANDOM_INIT_SEED set (tests and demos), and labelled as such in `Pair.sources`.
Relative checkpoint paths resolve like gin files (`gin_utils.resolve_path`): the working
directory, then the repository. `PairConfig.from_pair_dir` reads a directory written by
`save_pair` (demo_models/).

`save_pair` writes such a directory (`training.export_pair` one from two scripts/train.py runs), and
`greedy_check` checks a loaded pair: its greedy speculative decodes must be the target's own,
token for token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import typing
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Protocol

from absl import logging
import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import decoding
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import feature_drafter  # noqa: F401  (reads saved feature drafters)
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import table_drafters  # noqa: F401  (gin: @drafters.BigramDrafter() ...)
from speculative_t5x import validation
from speculative_t5x.weights import checkpoints

if TYPE_CHECKING:  # seqio imports TensorFlow: decoding a pair needs neither
  import seqio

RANDOM_WEIGHTS = "RANDOM weights (seed {seed}), not a trained model"
MEMBERS = ("target", "drafter")  # the subdirectories `save_pair` writes

FitTargets = Callable[[], Iterable[np.ndarray]]


@typing.runtime_checkable
class FittedFromTargets(Protocol):
  """A drafter kind whose parameters are fitted on target sequences (the n-gram tables)."""

  def fit_params(self, targets: Iterable[np.ndarray]) -> Any:
    """Parameters fitted on target token sequences (1-D int arrays, 0 = padding)."""


def learns_from_targets(drafter: drafters_lib.Drafter) -> bool:
  """Whether `drafter`'s parameters are fitted on target sequences (`FittedFromTargets`)."""
  return isinstance(drafter, FittedFromTargets)


def fit_drafter_params(drafter: drafters_lib.Drafter, targets: Iterable[np.ndarray]) -> Any:
  """`drafter`'s parameters fitted on target sequences; a drafter of another kind is refused."""
  if not learns_from_targets(drafter):
    raise ValueError(f"{type(drafter).__name__} is not fitted from data.")
  return drafter.fit_params(targets)


@gin.configurable(module="pairs")
@dataclasses.dataclass(frozen=True)
class PairConfig:
  """A target, an optional drafter, and where their weights come from.

  target_config: the target's `network.T5Config`.
  drafter: a `drafters.Drafter` (e.g. `@drafters.T5Drafter()` in gin), or None for the target
    alone (the baseline). Its vocab_size must be the target's (or 0: take the target's).
  checkpoint_path, drafter_checkpoint_path: checkpoints, as strings (a path-like becomes one);
    None means random weights for a model that needs a checkpoint (then random_init_seed must be
    set), and no checkpoint for a drafter that does not (n-gram tables are fitted, prompt lookup
    has no weights).
  restore_dtype: floating-point parameters are cast to it ('bfloat16' for the real sizes, as
    T5X's RestoreCheckpointConfig; 'float32' for tiny models; None keeps them as stored). A name
    that is not a floating-point dtype ('int8' would truncate every weight) is refused.
  random_init_seed: seed of random weights, an integer >= 0 (the target's; the drafter's is
    seed + 1).

  Raises `gin_utils.ConfigError`, naming the macro, at construction: before any model is built.
  """

  target_config: network.T5Config = gin.REQUIRED
  drafter: drafters_lib.Drafter | None = None
  checkpoint_path: str | None = None
  drafter_checkpoint_path: str | None = None
  restore_dtype: str | None = "bfloat16"
  random_init_seed: int | None = None

  def __post_init__(self):
    if not isinstance(self.target_config, network.T5Config):
      raise gin_utils.ConfigError(
          f"TARGET_CONFIG must be a network.T5Config (include a "
          f"configs/models/ file), got {self.target_config!r}"
      )
    _check_restore_dtype(self.restore_dtype, "RESTORE_DTYPE")
    for field, macro in (
        ("checkpoint_path", "CHECKPOINT_PATH"),
        ("drafter_checkpoint_path", "DRAFTER_CHECKPOINT_PATH"),
    ):
      path = getattr(self, field)
      if isinstance(path, os.PathLike):
        object.__setattr__(self, field, os.fspath(path))
      elif path is not None and not isinstance(path, str):
        raise gin_utils.ConfigError(
            f"{macro} must be a checkpoint's path as a string (e.g. "
            f"--gin.{macro}=\"'gs://your-bucket/model/checkpoint_N'\"), or None, got {path!r}"
        )
    if self.random_init_seed is not None:
      try:
        validation.check_integer(
            self.random_init_seed, "RANDOM_INIT_SEED", 0, meaning="None: weights from checkpoints"
        )
      except validation.InvalidInputError as e:
        raise gin_utils.ConfigError(str(e)) from e
    if self.drafter is not None:
      check_drafter(self.drafter)
    vocab_size = self.target_config.vocab_size
    if self.drafter is not None and self.drafter.vocab_size not in (0, vocab_size):
      raise gin_utils.ConfigError(
          f"DRAFTER ({type(self.drafter).__name__}) vocab_size {self.drafter.vocab_size} != "
          f"TARGET_CONFIG vocab_size {vocab_size}: speculative decoding needs one vocabulary; "
          "give the drafter the target's (e.g. a DRAFTER_CONFIG of the same VOCAB_SIZE)"
      )
    if self.drafter is not None:
      try:
        self.drafter.check_target(self.target_config)
      except ValueError as e:
        raise gin_utils.ConfigError(
            f"DRAFTER ({type(self.drafter).__name__}) does not fit TARGET_CONFIG: {e}"
        ) from e
    if self.random_init_seed is None:
      missing = [
          macro
          for macro, path, needed in (
              ("CHECKPOINT_PATH", self.checkpoint_path, True),
              (
                  "DRAFTER_CHECKPOINT_PATH",
                  self.drafter_checkpoint_path,
                  self.drafter is not None and checkpoints.needs_checkpoint(self.drafter),
              ),
          )
          if needed and not path
      ]
      if missing:
        raise gin_utils.ConfigError(
            f"{' and '.join(missing)} not set: give the checkpoint(s) (e.g. "
            f"--gin.{missing[0]}=\"'gs://your-bucket/model/checkpoint_N'\"), or set "
            "RANDOM_INIT_SEED for random weights (tests and demos only)"
        )

  @classmethod
  def from_pair_dir(
      cls,
      directory: str | os.PathLike,
      restore_dtype: str | None = None,
      drafter_member: str = "drafter",
  ) -> "PairConfig":
    """The pair written by `save_pair` into `directory` (target/ and drafter/, each
    with its config.json): a T5 target and the drafter drafter/config.json records
    (`checkpoints.read_drafter`: any registered kind, e.g. a `SharedEncoderDrafter` or a
    `feature_drafter.FeatureDrafter`).

    drafter_member: the drafter's subdirectory; a directory may hold several drafters of one
    target, each written by `checkpoints.save_drafter_params` (demo_models/ holds drafter/ and
    feature_drafter/).

    restore_dtype: None restores the parameters in the compute dtype target/config.json records,
    whatever dtype they are stored in (the demo pair is stored in bfloat16 and computes in
    float32); a dtype name restores them in that one (a floating-point one, checked before
    anything is read).
    """
    _check_restore_dtype(restore_dtype, "from_pair_dir's restore_dtype")
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
      raise gin_utils.ConfigError(
          f"from_pair_dir needs the directory pairs.save_pair wrote (holding target/ and "
          f"drafter/, e.g. 'demo_models'), got {directory!r}."
      )
    directory = gin_utils.resolve_path(directory)
    target, drafter = (os.path.join(directory, member) for member in ("target", drafter_member))
    for member in (target, drafter):
      if not os.path.isdir(member):
        raise FileNotFoundError(
            f"{member} does not exist: {directory} is not a pair written by "
            f"pairs.save_pair (it needs target/ and {drafter_member}/)."
        )
    target_config = checkpoints.read_config(target)
    return cls(
        target_config=target_config,
        drafter=checkpoints.read_drafter(drafter),
        checkpoint_path=target,
        drafter_checkpoint_path=drafter,
        restore_dtype=restore_dtype or target_config.dtype,
    )


def _check_restore_dtype(dtype: Any, name: str) -> None:
  """A ConfigError naming the setting `name` unless `dtype` is None or a floating-point dtype."""
  try:
    validation.check_restore_dtype(dtype, name)
  except validation.InvalidInputError as e:
    raise gin_utils.ConfigError(str(e)) from e


def check_drafter(drafter: Any, name: str = "DRAFTER") -> None:
  """Raises a ConfigError unless `drafter` (the setting `name`) is a `drafters.Drafter`."""
  if not isinstance(drafter, drafters_lib.Drafter):
    raise gin_utils.ConfigError(
        f"{name} must be a drafters.Drafter, e.g. @drafters.T5Drafter() "
        f"(include a configs/drafters/ file), got {drafter!r}"
    )


@dataclasses.dataclass(frozen=True)
class Pair:
  """Loaded weights. drafter: the config's drafter for the target's vocabulary (None for the
  target alone); target_params: on the device, or `t5x_checkpoints.LazyArray`s
  (`load_pair(..., lazy_target=True)`); sources: 'target' (and 'drafter') -> where the weights
  came from."""

  config: PairConfig
  drafter: drafters_lib.Drafter | None
  target_params: Any
  drafter_params: Any
  sources: dict[str, str]

  @property
  def target_config(self) -> network.T5Config:
    return self.config.target_config

  @property
  def params(self) -> Any:
    """The target's params alone, or {'target': ..., 'drafter': ...} with a drafter (the tree a
    `SpeculativeEncoderDecoderModel` takes)."""
    if self.drafter is None:
      return self.target_params
    return {"target": self.target_params, "drafter": self.drafter_params}

  @property
  def random_weights(self) -> bool:
    return any(source.startswith("RANDOM") for source in self.sources.values())


def cast(params: Any, dtype: str | None) -> Any:
  """Floating-point leaves cast to `dtype`, a floating-point dtype (None: unchanged; another
  dtype, which would truncate the weights, is refused: `validation.check_restore_dtype`)."""
  if validation.check_restore_dtype(dtype) is None:
    return params
  return jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
  )


def load_pair(
    config: PairConfig,
    eos_id: int,
    fit_targets: FitTargets | None = None,
    lazy_target: bool = False,
) -> Pair:
  """Loads the target's and the drafter's weights (see the module docstring).

  Args:
    config: the pair.
    eos_id: the output vocabulary's EOS id (the drafter's must agree).
    fit_targets: () -> target token sequences (1-D int arrays, 0 = padding) to fit a drafter that
      `learns_from_targets` on; called only for such a drafter without a checkpoint.
    lazy_target: leave the target's checkpoint unread (`load_target(config, lazy=True)`), for
      `partitioning.Partitioner.place_params_per_process` to read each process's slices of it.
      The drafter is read whole whatever its kind: a drafter restores itself
      (`checkpoints.restore_drafter_params`), and is small.

  Raises:
    gin_utils.ConfigError: before anything is loaded, for a `config` that is not a PairConfig, an
      `eos_id` outside the target's vocabulary, a drafter that cannot serve the target with it,
      or a drafter fitted on targets with no `fit_targets` to fit it on.
  """
  _check_load(config, eos_id, fit_targets)
  target_params, target_source = load_target(config, lazy=lazy_target)
  sources = {"target": target_source}
  drafter, drafter_params = None, None
  if config.drafter is not None:
    drafter, drafter_params, sources["drafter"] = load_drafter(
        config, eos_id, fit_targets, target_params
    )
  return Pair(config, drafter, target_params, drafter_params, sources)


def _check_load(config: Any, eos_id: Any, fit_targets: FitTargets | None) -> None:
  """`load_pair`'s arguments, checked before anything is loaded or traced."""
  if not isinstance(config, PairConfig):
    raise gin_utils.ConfigError(
        f"load_pair needs a pairs.PairConfig (e.g. PairConfig.from_pair_dir('demo_models')), got "
        f"{type(config).__name__}."
    )
  try:
    validation.check_eos_id(eos_id, config.target_config.vocab_size)
  except validation.InvalidInputError as e:
    raise gin_utils.ConfigError(f"load_pair: {e}") from e
  drafter = config.drafter
  if drafter is None:
    return
  try:
    drafter = drafter.for_target(config.target_config.vocab_size, eos_id)
  except ValueError as e:
    raise gin_utils.ConfigError(f"DRAFTER: {e}") from e
  needs_fit = learns_from_targets(drafter) and not config.drafter_checkpoint_path
  if needs_fit and fit_targets is None:
    raise gin_utils.ConfigError(
        f"the {type(drafter).__name__} is fitted on target sequences, and this run has none to "
        "give it: use a drafter with weights (DRAFTER_CHECKPOINT_PATH), or pass fit_targets."
    )
  if fit_targets is not None and not callable(fit_targets):
    raise gin_utils.ConfigError(
        f"fit_targets must be a function () -> target token sequences, got {fit_targets!r}."
    )


def load_target(config: PairConfig, lazy: bool = False) -> tuple[Any, str]:
  """(the target's parameters on the device, where they came from): restored from
  CHECKPOINT_PATH, else random. lazy=True: a checkpoint's parameters are
  `t5x_checkpoints.LazyArray`s, none read yet (`checkpoints.restore_params(..., lazy=True)`:
  a slice is refused where not finite when it is read, and a damaged chunk named then); random
  ones are made on the device as without it."""
  source = _source(config.checkpoint_path, config.random_init_seed)
  if config.checkpoint_path:
    with _restoring("CHECKPOINT_PATH", config.checkpoint_path):
      return (
          checkpoints.restore_params(  # on the device, or LazyArrays
              config.target_config,
              gin_utils.resolve_path(config.checkpoint_path),
              dtype=config.restore_dtype,
              lazy=lazy,
          ),
          source,
      )
  params = _random_params(
      lambda rng: network.init_params(config.target_config, rng),
      config.random_init_seed,
      config.restore_dtype,
  )
  return jax.device_put(params), source


def load_drafter(
    config: PairConfig,
    eos_id: int,
    fit_targets: FitTargets | None = None,
    target_params: Any = None,
) -> tuple[drafters_lib.Drafter, Any, str]:
  """(config.drafter for the target, its parameters on the device, where they came from): see
  the module docstring for the order of sources, and `load_pair` for `fit_targets`. A checkpoint
  is restored with the target's parameters at hand (`Drafter.restore_with_target`: a
  FeatureDrafter with copy_source takes the target's logits kernel where its checkpoint was saved
  without it)."""
  try:
    drafter = config.drafter.for_target(config.target_config.vocab_size, eos_id)
  except ValueError as e:
    raise gin_utils.ConfigError(f"DRAFTER: {e}") from e
  name = type(drafter).__name__
  if config.drafter_checkpoint_path:
    with _restoring("DRAFTER_CHECKPOINT_PATH", config.drafter_checkpoint_path):
      params = checkpoints.restore_drafter_with_target(
          drafter,
          gin_utils.resolve_path(config.drafter_checkpoint_path),
          target_params,
          config.restore_dtype,
      )
    source = _source(config.drafter_checkpoint_path, None)
  elif learns_from_targets(drafter):
    if fit_targets is None:
      raise gin_utils.ConfigError(
          f"the {name} is fitted on target sequences, and this run has "
          "none to give it: use a drafter with weights."
      )
    targets = list(fit_targets())
    if not targets:
      raise gin_utils.ConfigError(f"no target sequences to fit the {name} on.")
    params, source = (
        fit_drafter_params(drafter, targets),
        f"{name} fitted on {len(targets)} targets",
    )
  elif checkpoints.needs_checkpoint(drafter):
    seed = config.random_init_seed + 1
    params = _random_params(
        lambda rng: drafter.init_params(rng, drafters_lib.INIT_FEATURE_SHAPES),
        seed,
        config.restore_dtype,
    )
    source = _source(None, seed)
  else:
    params = drafter.init_params(jax.random.PRNGKey(0), drafters_lib.INIT_FEATURE_SHAPES)
    source = f"{name} (nothing to restore or fit)"
  return drafter, jax.device_put(params), source


@contextlib.contextmanager
def _restoring(macro: str, path: str) -> Iterator[None]:
  """A checkpoint that is missing, damaged (weights holding NaN or inf included: restoring checks
  them, `t5x_checkpoints.NonFiniteWeightsError`) or does not fit the configured model is a
  ConfigError naming the macro."""
  try:
    yield
  except (FileNotFoundError, ValueError) as e:
    raise gin_utils.ConfigError(f"{macro} {path!r}: {e}") from e


def _source(checkpoint_path: str | None, seed: int | None) -> str:
  if checkpoint_path:
    return f"checkpoint {checkpoint_path}"
  return RANDOM_WEIGHTS.format(seed=seed)


def _random_params(init: Callable[[jax.Array], Any], seed: int, dtype: str | None) -> Any:
  logging.warning("Random weights (seed %d): predictions mean nothing.", seed)
  return cast(init(jax.random.PRNGKey(seed)), dtype)


def save_pair(
    directory: str | os.PathLike,
    target_params: Mapping[str, Any],
    target_config: network.T5Config,
    drafter_params: Any,
    drafter: Any,
    overwrite: bool = False,
) -> None:
  """Writes a (target, drafter) pair, which `pairs.PairConfig.from_pair_dir` and `pairs.load_pair`
  read back: `checkpoints.save_model` into `directory/target`, and `checkpoints.save_drafter_params` into
  `directory/drafter` (`drafter`: a `drafters.Drafter`, whose kind its config.json records).

  The drafter is refused before anything is written unless it serves the target
  (`drafter.check_target(target_config)`) and `drafter_params` are its parameters
  (`drafter.check_params`)."""
  if isinstance(drafter, network.T5Config):
    raise ValueError(
        "save_pair's drafter must be a drafters.Drafter, got a network.T5Config: pass "
        "drafters.T5Drafter(config) for a T5 drafter of that config."
    )
  if not all(callable(getattr(drafter, name, None)) for name in ("check_target", "check_params")):
    raise ValueError(
        f"save_pair's drafter must be a drafters.Drafter (e.g. drafters.T5Drafter(config)), got "
        f"{drafter!r}."
    )
  drafter.check_target(target_config)
  drafter.check_params(drafter_params, "save_pair's drafter_params")
  target_dir, drafter_dir = (os.path.join(os.fspath(directory), member) for member in MEMBERS)
  checkpoints.save_model(target_dir, target_params, target_config, overwrite)
  checkpoints.save_drafter_params(drafter, drafter_dir, drafter_params, overwrite=overwrite)


def greedy_check(
    pair: Pair,
    batch: Mapping[str, np.ndarray],
    vocabulary: seqio.Vocabulary,
    gammas: Iterable[int],
    rows: int | None = None,
) -> dict[int, dict[str, Any]]:
  """Greedy speculative decodes of `batch` with `pair`, at each of `gammas`, against the target's
  own greedy decodes (the baseline), with a drafter of any kind (a shared-encoder drafter reads
  the target's encoder output).

  Args:
    pair: a target and its drafter (`load_pair`).
    batch: 'encoder_input_tokens' [batch, input_length] and 'decoder_input_tokens' [batch,
      decode_length] (its length: the most tokens decoded), as `training.eval_set` batches them.
    vocabulary: the pair's vocabulary, of its inputs and outputs.
    gammas: drafted tokens per target call, each an integer >= 1.
    rows: how many of the batch's first rows to compare (the rest padding); None: all of them.

  Returns:
    gamma -> {'identical_rows': compared rows whose decodes are the baseline's token for token,
    'rows': the rows compared, 'alpha' and 'tokens_per_target_call': of those rows' statistics}.
  """
  target = network.Transformer(pair.target_config)
  baseline = models.EncoderDecoderModel(target, vocabulary, vocabulary).jit_predict()
  expected = np.asarray(baseline(pair.target_params, batch, jax.random.PRNGKey(0), 0.0)[0])[:rows]
  n = expected.shape[0]
  results = {}
  for gamma in gammas:
    model = models.SpeculativeEncoderDecoderModel(
        target, pair.drafter, vocabulary, vocabulary, gamma=gamma
    )
    decodes, aux = model.jit_predict()(pair.params, batch, jax.random.PRNGKey(0), 0.0)
    stats = decoding.SpeculativeStats.from_dict(
        {k: np.asarray(v)[:n] for k, v in aux["speculative_stats"].items()}
    )
    results[gamma] = {
        "identical_rows": int(np.all(np.asarray(decodes)[:n] == expected, axis=1).sum()),
        "rows": n,
        "alpha": stats.alpha,
        "tokens_per_target_call": stats.tokens_per_call,
    }
  return results

"""A target and its drafter with their weights: one configuration and one loader shared by every
script (infer, benchmark, aot_check, demo, measure_alpha).

`PairConfig` is what gin binds (configs/runs/*.gin bind it to T5X-style macros: TARGET_CONFIG,
DRAFTER, CHECKPOINT_PATH, DRAFTER_CHECKPOINT_PATH, RESTORE_DTYPE, RANDOM_INIT_SEED); `load_pair`
turns it into parameters:
  - the target from CHECKPOINT_PATH (a T5X checkpoint or a `checkpoints.save_model` directory);
  - the drafter, whatever its kind, through the `drafters.Drafter` protocol: from
    DRAFTER_CHECKPOINT_PATH (`restore_params`), else fitted on target sequences
    (`fit_params`, for the n-gram tables), else its untrained parameters (`init_params`: none for
    prompt lookup);
  - random weights where a model needs a checkpoint and its path is None, allowed only with
    RANDOM_INIT_SEED set (tests and demos), and labelled as such in `Pair.sources`.
`PairConfig.from_pair_dir` reads a directory written by `checkpoints.save_pair` (demo_models/).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterable

from absl import logging
import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import checkpoints
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import gin_utils
from speculative_t5x import network

RANDOM_WEIGHTS = "RANDOM weights (seed {seed}), not a trained model"
_FEATURE_SHAPES = {"encoder_input_tokens": (1, 1), "decoder_input_tokens": (1, 1)}


@gin.configurable(module="pairs")
@dataclasses.dataclass(frozen=True)
class PairConfig:
  """A target, an optional drafter, and where their weights come from.

  target_config: the target's `network.T5Config`.
  drafter: a `drafters.Drafter` (e.g. `@drafters.T5Drafter()` in gin), or None for the target
    alone (the baseline).
  checkpoint_path, drafter_checkpoint_path: checkpoints; None means random weights for a model
    that needs a checkpoint (then random_init_seed must be set), and no checkpoint for a drafter
    that does not (n-gram tables are fitted, prompt lookup has no weights).
  restore_dtype: floating-point parameters are cast to it ('bfloat16' for the real sizes, as
    T5X's RestoreCheckpointConfig; 'float32' for tiny models; None keeps them as stored).
  random_init_seed: seed of random weights (the target's; the drafter's is seed + 1).
  """
  target_config: network.T5Config = gin.REQUIRED
  drafter: drafters_lib.Drafter | None = None
  checkpoint_path: str | None = None
  drafter_checkpoint_path: str | None = None
  restore_dtype: str | None = "bfloat16"
  random_init_seed: int | None = None

  def __post_init__(self):
    if not isinstance(self.target_config, network.T5Config):
      raise gin_utils.ConfigError(f"TARGET_CONFIG must be a network.T5Config (include a "
                                  f"configs/models/ file), got {self.target_config!r}")
    if self.drafter is not None and not isinstance(self.drafter, drafters_lib.Drafter):
      raise gin_utils.ConfigError(f"DRAFTER must be a drafters.Drafter, e.g. "
                                  f"@drafters.T5Drafter() (include a configs/drafters/ file), "
                                  f"got {self.drafter!r}")
    if self.random_init_seed is None:
      missing = [macro for macro, path, needed in (
          ("CHECKPOINT_PATH", self.checkpoint_path, True),
          ("DRAFTER_CHECKPOINT_PATH", self.drafter_checkpoint_path,
           self.drafter is not None and self.drafter.needs_checkpoint)) if needed and not path]
      if missing:
        raise gin_utils.ConfigError(
            f"{' and '.join(missing)} not set: give the checkpoint(s) (e.g. "
            f"--gin.{missing[0]}=\"'gs://your-bucket/model/checkpoint_N'\"), or set "
            "RANDOM_INIT_SEED for random weights (tests and demos only)")

  @classmethod
  def from_pair_dir(cls, directory: str | os.PathLike,
                    restore_dtype: str | None = None) -> "PairConfig":
    """The pair written by `checkpoints.save_pair` into `directory` (target/ and drafter/, each
    with its config.json): a T5 target and a `drafters.T5Drafter`."""
    directory = os.fspath(directory)
    target, drafter = (os.path.join(directory, member) for member in ("target", "drafter"))
    for member in (target, drafter):
      if not os.path.isdir(member):
        raise FileNotFoundError(f"{member} does not exist: {directory} is not a pair written by "
                                "checkpoints.save_pair (it needs target/ and drafter/).")
    return cls(target_config=checkpoints.read_config(target),
               drafter=drafters_lib.T5Drafter(checkpoints.read_config(drafter)),
               checkpoint_path=target, drafter_checkpoint_path=drafter,
               restore_dtype=restore_dtype)


@dataclasses.dataclass(frozen=True)
class Pair:
  """Loaded weights. drafter: the config's drafter for the target's vocabulary (None for the
  target alone); sources: 'target' (and 'drafter') -> where the weights came from."""
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
  """Floating-point leaves cast to `dtype` (None: unchanged)."""
  if dtype is None:
    return params
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      params)


def load_pair(config: PairConfig, eos_id: int,
              fit_targets: Callable[[], Iterable[np.ndarray]] | None = None) -> Pair:
  """Loads the target's and the drafter's weights (see the module docstring).

  Args:
    config: the pair.
    eos_id: the output vocabulary's EOS id (the drafter's must agree).
    fit_targets: () -> target token sequences (1-D int arrays) to fit a drafter that
      `learns_from_targets` on; called only for such a drafter without a checkpoint.
  """
  if config.checkpoint_path:
    target_params = checkpoints.restore_params(config.target_config, config.checkpoint_path,
                                               dtype=config.restore_dtype)
    sources = {"target": f"checkpoint {config.checkpoint_path}"}
  else:
    seed = config.random_init_seed
    target_params = _random_params(lambda rng: network.init_params(config.target_config, rng),
                                   seed, config.restore_dtype)
    sources = {"target": RANDOM_WEIGHTS.format(seed=seed)}
  drafter, drafter_params = None, None
  if config.drafter is not None:
    drafter = config.drafter.for_target(config.target_config.vocab_size, eos_id)
    drafter_params, sources["drafter"] = _drafter_params(drafter, config, fit_targets)
  return Pair(config, drafter, jax.device_put(target_params),
              None if drafter_params is None else jax.device_put(drafter_params), sources)


def _random_params(init: Callable[[jax.Array], Any], seed: int, dtype: str | None) -> Any:
  logging.warning("Random weights (seed %d): predictions mean nothing.", seed)
  return cast(init(jax.random.PRNGKey(seed)), dtype)


def _drafter_params(drafter: drafters_lib.Drafter, config: PairConfig,
                    fit_targets: Callable[[], Iterable[np.ndarray]] | None) -> tuple[Any, str]:
  """(params, where they came from) of the drafter."""
  name = type(drafter).__name__
  if config.drafter_checkpoint_path:
    return (drafter.restore_params(config.drafter_checkpoint_path, config.restore_dtype),
            f"checkpoint {config.drafter_checkpoint_path}")
  if drafter.learns_from_targets:
    if fit_targets is None:
      raise gin_utils.ConfigError(f"the {name} is fitted on target sequences, and this run "
                                  "has none to give it: use a drafter with weights.")
    targets = list(fit_targets())
    if not targets:
      raise gin_utils.ConfigError(f"no target sequences to fit the {name} on.")
    return drafter.fit_params(targets), f"{name} fitted on {len(targets)} target sequences"
  if drafter.needs_checkpoint:
    seed = config.random_init_seed + 1
    return (_random_params(lambda rng: drafter.init_params(rng, _FEATURE_SHAPES), seed,
                           config.restore_dtype), RANDOM_WEIGHTS.format(seed=seed))
  return drafter.init_params(jax.random.PRNGKey(0), _FEATURE_SHAPES), f"{name} (no weights)"

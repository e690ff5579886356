"""`T5Config`, the hyperparameters of a T5 encoder-decoder, and the names its fields may take.

It sits below both `layers` (whose blocks are built from a config) and `network` (the models), so
neither imports the other for it; `network.T5Config` is this class, kept for the many call sites
and for gin, whose files bind it as `network.T5Config` (its gin module is `speculative_t5x.network`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import flax.linen as nn
import gin
import jax.numpy as jnp
import numpy as np

# The activations `T5Config.mlp_activations` may name.
ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": nn.gelu,  # tanh approximation, as flax's default and T5X's T5 1.1.
    "gelu_exact": functools.partial(nn.gelu, approximate=False),
    "silu": nn.silu,
    "swish": nn.silu,
    "linear": lambda x: x,
}

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# T5Config's integer fields and their least values; T5 1.1 small's values, for the messages.
_MINIMUM_INTS = {
    "vocab_size": 1,
    "emb_dim": 1,
    "num_heads": 1,
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "head_dim": 1,
    "mlp_dim": 1,
    "relative_attention_num_buckets": 4,
    "relative_attention_max_distance": 1,
}
_WHY_MINIMUM = {
    "relative_attention_num_buckets": (
        "the encoder splits the buckets between the two directions, and each direction "
        "needs at least one bucket for exact and one for log-spaced distances. "
    ),
}
_T5_1_1_SMALL = {
    "vocab_size": 32128,
    "emb_dim": 512,
    "num_heads": 6,
    "num_encoder_layers": 8,
    "num_decoder_layers": 8,
    "head_dim": 64,
    "mlp_dim": 1024,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
}


@gin.configurable(module="speculative_t5x.network")  # gin files bind network.T5Config
@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters of a T5 encoder-decoder, with T5X's field names and defaults.

  `dtype` is the activation dtype ('float32' or 'bfloat16'); parameters are always stored in
  float32 and logits are always float32.
  """

  vocab_size: int
  dtype: str = "float32"
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ("relu",)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  float32_attention_logits: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128

  def __post_init__(self):
    """Checks the type and range of every field, before any model is built: one ValueError
    naming the field, its value and the fix. Normalizes numpy integers, floats and bools to
    Python ones, `mlp_activations` to a tuple and `dtype` to its name."""
    for name, minimum in _MINIMUM_INTS.items():
      value = getattr(self, name)
      if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(
            f"T5Config.{name} must be an int, got {value!r} ({type(value).__name__}): give a "
            f"whole number >= {minimum} (T5 1.1 small: {name}={_T5_1_1_SMALL[name]})."
        )
      object.__setattr__(self, name, int(value))
      if value < minimum:
        raise ValueError(
            f"T5Config.{name} must be >= {minimum}, got {value}: {_WHY_MINIMUM.get(name, '')}"
            f"T5 1.1 small has {name}={_T5_1_1_SMALL[name]}."
        )
    max_exact = self.relative_attention_num_buckets // 2  # The decoder's exact buckets.
    if self.relative_attention_max_distance <= max_exact:
      raise ValueError(
          f"T5Config.relative_attention_max_distance must be > relative_attention_num_buckets "
          f"// 2 = {max_exact}, got {self.relative_attention_max_distance}: distances below "
          f"{max_exact} have a bucket each and the rest share log-spaced buckets up to "
          "max_distance (T5 uses 32 buckets and max_distance 128)."
      )
    for name in ("logits_via_embedding", "float32_attention_logits"):
      value = getattr(self, name)
      if not isinstance(value, (bool, np.bool_)):
        raise ValueError(
            f"T5Config.{name} must be True or False, got {value!r} ({type(value).__name__})."
        )
      object.__setattr__(self, name, bool(value))
    rate = self.dropout_rate
    if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, (int, float, np.number)):
      raise ValueError(
          f"T5Config.dropout_rate must be a number in [0, 1), got {rate!r} "
          f"({type(rate).__name__}): 0.0 for inference, 0.1 is T5's training default."
      )
    object.__setattr__(self, "dropout_rate", float(rate))
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(
          f"T5Config.dropout_rate must be in [0, 1), got {rate!r}: 0.0 for inference, 0.1 is "
          "T5's training default."
      )
    try:
      dtype = self.dtype if isinstance(self.dtype, str) else jnp.dtype(self.dtype).name
    except TypeError as e:
      raise ValueError(
          f"T5Config.dtype {self.dtype!r} is not a dtype: use one of {sorted(_DTYPES)}."
      ) from e
    object.__setattr__(self, "dtype", dtype)
    if dtype not in _DTYPES:
      raise ValueError(
          f"T5Config.dtype {self.dtype!r} is not supported: use one of {sorted(_DTYPES)}."
      )
    activations = self.mlp_activations
    if isinstance(activations, str) or not isinstance(activations, Sequence) or not activations:
      raise ValueError(
          f"T5Config.mlp_activations must be a non-empty tuple of activation names, got "
          f"{activations!r}: "
          "e.g. ('gelu', 'linear') (T5 1.1) or ('relu',) (T5 1.0)."
      )
    object.__setattr__(self, "mlp_activations", tuple(activations))
    unknown = [a for a in self.mlp_activations if not isinstance(a, str) or a not in ACTIVATIONS]
    if unknown:
      raise ValueError(
          f"T5Config.mlp_activations {self.mlp_activations} has unknown activation(s) "
          f"{unknown}: use names from {sorted(ACTIVATIONS)} "
          "(T5 1.1 uses ('gelu', 'linear'))."
      )

  @property
  def activation_dtype(self):
    return _DTYPES[self.dtype]

  def replace(self, **changes) -> "T5Config":
    return dataclasses.replace(self, **changes)

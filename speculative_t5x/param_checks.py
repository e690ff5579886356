"""Parameter trees checked against what a model expects, before anything is traced.

One comparison (`tree_problems`, `raise_problems`) serves every model: the target of both model
classes (`check_target_params`, against `network.param_shapes` of its config) and every drafter
(`drafters.Drafter.check_params`, against its `param_shapes`). Paths, shapes and dtypes are
compared, no value is read and nothing moves between devices, so arrays, tracers (inside
`jax.jit` or `jax.grad`) and `jax.ShapeDtypeStruct`s are checked alike, at the cost of one
flattening of the tree.

Boxed leaves (flax's `nn.LogicallyPartitioned` / `nn.Partitioned`, what
`network.Transformer(cfg).init(...)['params']` holds) are accepted: the models unbox them once at
their entry points (`unbox`), so every other check and the network see plain arrays.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Collection, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import network
from speculative_t5x import validation

# Problems a message lists by path, after its count.
LISTED_PROBLEMS = 3
# The kinds of problem `tree_problems` reports, in the order it reports them.
MISSING, MISSHAPED, EXTRA, NOT_FLOATING = "missing", "mis-shaped", "extra", "not floating"
# How to cast a tree of parameters to a floating type.
CAST_FIX = (
    "cast them with jax.tree.map(lambda x: x.astype(jnp.float32), params) (or 'bfloat16'), or "
    "restore them with a floating restore dtype"
)


def unbox(params: Any) -> Any:
  """`params` with every boxed leaf (`nn.LogicallyPartitioned`, `nn.Partitioned`) replaced by its
  array; a tree without boxes comes back as it is."""
  boxed = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
  if not any(boxed(leaf) for leaf in jax.tree.leaves(params, is_leaf=boxed)):
    return params
  return nn.meta.unbox(params)


def is_shape(node: Any) -> bool:
  """Whether `node` is a shape in a tree of shapes (a tuple of sizes, a size None being free)."""
  return isinstance(node, tuple) and all(
      d is None or isinstance(d, (int, np.integer)) for d in node
  )


def _leaves(tree: Any, leaves_are_shapes: bool = False) -> dict[str, Any]:
  flat, _ = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=is_shape if leaves_are_shapes else None
  )
  return {jax.tree_util.keystr(path, simple=True, separator="/"): leaf for path, leaf in flat}


def shapes_by_path(tree: Any, leaves_are_shapes: bool = False) -> dict[str, tuple]:
  """'a/b/c' path -> shape of every leaf of `tree`: an array's (or a tracer's) shape, or where
  `leaves_are_shapes` the leaf itself, a shape tuple. Reads no values."""
  return {
      path: tuple(leaf) if leaves_are_shapes else tuple(np.shape(leaf))
      for path, leaf in _leaves(tree, leaves_are_shapes).items()
  }


def floating_paths(tree: Any) -> frozenset[str]:
  """The paths of `tree` whose leaves have a floating dtype (a tree of arrays or of
  `jax.ShapeDtypeStruct`s, e.g. `jax.eval_shape` of an init)."""
  return frozenset(
      path
      for path, leaf in _leaves(tree).items()
      if jnp.issubdtype(getattr(leaf, "dtype", np.int32), jnp.floating)
  )


def _where(path: str) -> str:
  return path or "the tree itself"


def tree_problems(
    params: Any, expected: Mapping[str, tuple], owner: str, floating: Collection[str] = ()
) -> list[tuple[str, str]]:
  """What keeps `params` from being the tree of `expected` ('a/b' path -> shape, a size None
  free) -> [(kind, description)], kinds MISSING, MISSHAPED, EXTRA and NOT_FLOATING (a path of
  `floating` whose leaf has another dtype); `owner` names the model in the descriptions."""
  leaves = _leaves(params)
  got = {path: tuple(np.shape(leaf)) for path, leaf in leaves.items()}
  problems = []
  for path, shape in expected.items():
    if path not in got:
      problems.append((MISSING, f"{_where(path)} {shape} is missing"))
    elif len(got[path]) != len(shape) or any(
        e is not None and e != g for e, g in zip(shape, got[path])
    ):
      problems.append((MISSHAPED, f"{_where(path)} is {got[path]}, the {owner} needs {shape}"))
  problems += [
      (EXTRA, f"{_where(path)} {shape} is not a parameter of the {owner}")
      for path, shape in got.items()
      if path not in expected
  ]
  for path in sorted(set(floating) & set(got)):
    dtype = getattr(leaves[path], "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
      shown = f"dtype {dtype}" if dtype is not None else f"a {type(leaves[path]).__name__}"
      problems.append((NOT_FLOATING, f"{_where(path)} is {shown}, not a floating type"))
  return problems


def raise_problems(problems: list[tuple[str, str]], name: str, owner: str, cause: str) -> None:
  """Raises `validation.InvalidInputError` for `problems` (`tree_problems`), if any: '<name> are
  not this <owner>'s parameters (<n> problem(s); the first: ...): <cause>', the next few listed
  after the cause."""
  if not problems:
    return
  texts = [text for _, text in problems]
  more = texts[1:LISTED_PROBLEMS]
  raise validation.InvalidInputError(
      f"{name} are not this {owner}'s parameters ({len(texts)} problem(s); the first: "
      f"{texts[0]}): {cause}" + (f" The next: {'; '.join(more)}." if more else "")
  )


# ----------------------------------------------------------------------------- the target


@functools.cache
def target_param_shapes(config: network.T5Config) -> dict[str, tuple]:
  """'a/b' path -> shape of every parameter of `network.Transformer(config)`, traced once per
  config (`network.param_shapes`)."""
  return shapes_by_path(network.param_shapes(config), leaves_are_shapes=True)


def config_from_params(params: Mapping, **overrides) -> network.T5Config:
  """The `T5Config` whose parameter tree has the shapes of `params` (T5X layout).

  Sizes come from the shapes. `mlp_activations` is ('gelu', 'linear') for a gated MLP (`wi_0`,
  `wi_1`: T5 1.1, mT5, Flan-T5) and ('relu',) for a single `wi` (T5 1.0); `logits_via_embedding`
  is whether `decoder/logits_dense` is absent. `overrides` (e.g. dtype='bfloat16') win.
  """
  try:
    vocab_size, emb_dim = np.shape(params["token_embedder"]["embedding"])
    num_heads = np.shape(params["encoder"]["relpos_bias"]["rel_embedding"])[0]
    layer = params["encoder"]["layers_0"]
    mlp = layer["mlp"]
    fields = dict(
        vocab_size=vocab_size,
        emb_dim=emb_dim,
        num_heads=num_heads,
        head_dim=np.shape(layer["attention"]["query"]["kernel"])[1] // num_heads,
        mlp_dim=np.shape(mlp["wo"]["kernel"])[0],
        num_encoder_layers=sum(k.startswith("layers_") for k in params["encoder"]),
        num_decoder_layers=sum(k.startswith("layers_") for k in params["decoder"]),
        mlp_activations=("relu",) if "wi" in mlp else ("gelu", "linear"),
        logits_via_embedding="logits_dense" not in params["decoder"],
        dropout_rate=0.0,
    )
  except KeyError as e:
    raise ValueError(f"not a T5X T5 parameter tree: it has no {e} where T5X puts it") from e
  return network.T5Config(**{**fields, **overrides})


def _other_config(params: Any, config: network.T5Config) -> str:
  """The T5Config fields whose values `params`' shapes imply and `config` does not have, as
  'emb_dim=16 (this model: 8), ...'; '' where the shapes imply none (or no T5 at all)."""
  try:
    implied = config_from_params(params, dtype=config.dtype)
  except (ValueError, TypeError, KeyError, IndexError, AttributeError):
    return ""
  fields = (
      "vocab_size",
      "emb_dim",
      "num_heads",
      "head_dim",
      "mlp_dim",
      "num_encoder_layers",
      "num_decoder_layers",
      "logits_via_embedding",
  )
  other = [
      f"{field}={getattr(implied, field)!r} (this model: {getattr(config, field)!r})"
      for field in fields
      if getattr(implied, field) != getattr(config, field)
  ]
  if len(implied.mlp_activations) != len(config.mlp_activations):
    other.append(
        f"mlp_activations of {len(implied.mlp_activations)} (this model: "
        f"{config.mlp_activations!r})"
    )
  return ", ".join(other)


def _target_cause(params: Any, problems: list[tuple[str, str]], config, expected) -> str:
  """The likely reason `params` are not the target's, and the fix."""
  kinds = {kind for kind, _ in problems}
  keys = set(params) if isinstance(params, Mapping) else set()
  if keys == {"params"}:
    return (
        "they are flax variables {'params': ...}, the tree one level up: pass "
        "variables['params']."
    )
  if {"target", "drafter"} <= keys:
    return (
        "they are a speculative pair's {'target': ..., 'drafter': ...}: give this model "
        "params['target'] (or decode the pair with SpeculativeEncoderDecoderModel)."
    )
  found = {path for path in shapes_by_path(params) if path in expected}
  if not found:
    return (
        "none of their paths is one of T5 1.1's (the T5X tree: token_embedder, encoder, "
        "decoder), so they are another model's: convert them (scripts/convert_checkpoint.py for "
        "Hugging Face weights) or restore this model's T5X checkpoint."
    )
  other = _other_config(params, config)
  if other:
    return (
        f"they are another size of T5: their shapes fit a T5Config with {other}. Build the model "
        "with the config they were saved with (its gin file or config.json), or restore this "
        "model's own checkpoint."
    )
  if kinds == {MISSING}:
    return (
        f"{len(problems)} of {len(expected)} parameters are missing and the rest fit: a "
        "half-restored tree (an interrupted restore, or a filter that dropped entries). Restore "
        "the whole checkpoint."
    )
  if kinds == {NOT_FLOATING}:
    return f"the weights must be floating-point: {CAST_FIX}."
  cast = f" Then {CAST_FIX}." if NOT_FLOATING in kinds else ""
  return (
      "they are another model's, or of another config (sizes, mlp_activations, "
      "logits_via_embedding): restore them with the config they were saved with, or restore "
      f"this model's own checkpoint.{cast}"
  )


def check_target_params(params: Any, config: network.T5Config, name: str = "params") -> None:
  """Raises `validation.InvalidInputError` unless `params` (unboxed) are the parameters of
  `network.Transformer(config)`: a floating leaf of the right shape at every path, and no other
  leaf. The message lists the first problems by path and the likely cause: flax variables for
  their 'params', a pair's {'target', 'drafter'}, another model's tree, another size (the config
  fields their shapes imply), a half-restored tree, an integer cast."""
  if not isinstance(params, Mapping):
    raise validation.InvalidInputError(
        f"{name} must be the T5X parameter tree, a mapping (model.get_initial_variables(rng, "
        "shapes)['params'], or a restored checkpoint's), got "
        f"{type(params).__name__}."
    )
  expected = target_param_shapes(config)
  problems = tree_problems(params, expected, "T5 model", floating=expected)
  if problems:
    raise_problems(problems, name, "T5 model", _target_cause(params, problems, config, expected))


def check_pair_params(params: Any, target_config: network.T5Config, check_drafter: Callable):
  """A speculative model's `params`: a mapping {'target': ..., 'drafter': ...}, the target's
  checked by `check_target_params`, the drafter's by `check_drafter(params['drafter'])`."""
  if not isinstance(params, Mapping) or not {"target", "drafter"} <= set(params):
    got = (
        f"one with the keys {list(params)}"
        if isinstance(params, Mapping)
        else f"a {type(params).__name__}"
    )
    alone = (
        " (the target's tree alone? add the drafter's: {'target': params, 'drafter': "
        "drafter_params})"
        if isinstance(params, Mapping) and "decoder" in params
        else ""
    )
    raise validation.InvalidInputError(
        "params of a SpeculativeEncoderDecoderModel must be a mapping {'target': ..., "
        f"'drafter': ...}} (get_initial_variables, or pairs.load_pair(...).params), got {got}"
        f"{alone}."
    )
  extra = sorted(set(params) - {"target", "drafter"})
  if extra:
    raise validation.InvalidInputError(
        f"params {{'target', 'drafter'}} also hold {extra}, which no part of the model reads: "
        "give the two entries only."
    )
  check_target_params(params["target"], target_config, "params['target']")
  check_drafter(params["drafter"])

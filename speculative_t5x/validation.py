"""Checks of user-supplied values at the entry points, before anything is traced or compiled.

Every public entry point calls these on its arguments, in one place at its top: the models'
`predict_batch_with_aux`, `score_batch`, `loss_fn` and constructor, the function `jit_predict`
returns, the decoding functions, the input pipeline (`inference`, `tasks`) and the scripts.
Nothing inside a decoding loop checks anything. Each check raises `InvalidInputError` (a
ValueError) whose message names the offending value and the fix.

Under `jax.jit` the arguments are tracers: their shapes and dtypes are known and checked, their
values are not. Value checks (token ids in range, a temperature's sign, a step count) run where a
value is concrete (`is_concrete`): the models check token ids eagerly and in `jit_predict`'s
wrapper, before the compiled function is called. That costs one host copy of the token arrays per
call, never one per loop step.
"""

from __future__ import annotations

import difflib
import numbers
from typing import Any, Collection, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# The features of seqio's EncDecFeatureConverter that hold token ids, [B, L] each.
TOKEN_FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")
# The other features it writes: each has the shape of the encoder's or the decoder's tokens.
ENCODER_SHAPED = ("encoder_segment_ids", "encoder_positions")
DECODER_SHAPED = ("decoder_segment_ids", "decoder_positions", "decoder_loss_weights")
# Decoder params that are switches.
BOOLEAN_PARAMS = ("rescale_log_probs", "return_trace")


class InvalidInputError(ValueError):
  """A user-supplied value that has no meaning; the message names it and says what to pass."""


def is_concrete(x: Any) -> bool:
  """Whether `x`'s values are known now (not a tracer inside `jax.jit`)."""
  return not isinstance(x, jax.core.Tracer)


def is_tensorflow(value: Any) -> bool:
  """Whether `value` is a TensorFlow tensor (what a `tf.data` iterator yields), which jax does
  not take."""
  return type(value).__module__.startswith("tensorflow")


def _refuse_tensorflow(value: Any, name: str) -> None:
  if is_tensorflow(value):
    raise InvalidInputError(
        f"{name} is a TensorFlow tensor ({type(value).__name__}), which jax does not take: "
        "convert it with .numpy(), or iterate the dataset with .as_numpy_iterator()."
    )


def scalar(value: Any, name: str = "the value") -> Any:
  """A concrete 0-d NumPy or jax array (`np.float32(0.9)`, `jnp.asarray(0.9)`) -> its Python
  value; any other value as it is. A TensorFlow tensor is refused with the conversion."""
  _refuse_tensorflow(value, name)
  concrete = isinstance(value, (np.ndarray, np.generic)) or (
      isinstance(value, jax.Array) and is_concrete(value)
  )
  if concrete and np.ndim(value) == 0:
    value = np.asarray(value)[()]
    if jnp.issubdtype(value.dtype, jnp.floating) and value.dtype.itemsize < 8:
      return float(str(value))  # the number written: float32 0.9 -> 0.9, not 0.8999999761...
    return value.item()
  return value


def _static(value: Any, name: str, wanted: str) -> Any:
  """`scalar(value)`, refused where `value` is traced: a setting that shapes the computation
  must be known before tracing."""
  if isinstance(value, jax.core.Tracer):
    raise InvalidInputError(
        f"{wanted}, known before tracing (it shapes the compiled computation), but {name} is "
        "traced: pass it as a Python number from outside the jitted function (a static "
        "argument)."
    )
  return scalar(value, name)


def _is_integer(value: Any) -> bool:
  """A Python or NumPy integer, not a bool."""
  return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
      value, (bool, np.bool_)
  )


def _requirement(wanted: str, minimum: Any, maximum: Any, meaning: str) -> str:
  """'<name> must be <kind>' with its bounds and its meaning: the start of an error message."""
  bounds = [
      f"{op} {bound}" for op, bound in ((">=", minimum), ("<=", maximum)) if bound is not None
  ]
  if bounds:
    wanted += " " + " and ".join(bounds)
  return wanted + (f" ({meaning})" if meaning else "")


def check_integer(
    value: Any,
    name: str,
    minimum: int | None = None,
    maximum: int | None = None,
    meaning: str = "",
) -> int:
  """`value`, a Python or NumPy integer (not a bool) in [minimum, maximum] -> a Python int.
  `meaning` (what the number counts) goes into the message. A concrete 0-d NumPy or jax integer
  array is taken for its value."""
  wanted = _requirement(f"{name} must be an integer", minimum, maximum, meaning)
  value = _static(value, name, wanted)
  if not _is_integer(value):
    raise InvalidInputError(f"{wanted}, got {value!r} ({type(value).__name__}).")
  if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
    raise InvalidInputError(f"{wanted}, got {int(value)}.")
  return int(value)


def check_number(
    value: Any,
    name: str,
    minimum: float | None = None,
    maximum: float | None = None,
    meaning: str = "",
) -> float:
  """`value`, a finite Python or NumPy real number (not a bool) in [minimum, maximum] -> a Python
  float. `meaning` (what the number is) goes into the message. A concrete 0-d NumPy or jax
  array is taken for its value."""
  wanted = _requirement(f"{name} must be a finite number", minimum, maximum, meaning)
  value = _static(value, name, wanted)
  real = isinstance(value, (numbers.Real, np.floating, np.integer))
  if isinstance(value, (bool, np.bool_)) or not real:
    raise InvalidInputError(f"{wanted}, got {value!r} ({type(value).__name__}).")
  if (
      not np.isfinite(value)
      or (minimum is not None and value < minimum)
      or (maximum is not None and value > maximum)
  ):
    raise InvalidInputError(f"{wanted}, got {float(value)}.")
  return float(value)


def check_restore_dtype(dtype: Any, name: str = "restore dtype") -> np.dtype | None:
  """None (parameters keep the dtypes they are stored in), or a floating-point dtype or its name
  ('float32', 'bfloat16', 'float16') -> its np.dtype. Restoring casts the floating-point
  parameters to it, so an integer or bool dtype would truncate every weight: refused, as is a
  name that is no dtype."""
  if dtype is None:
    return None
  fix = "use 'float32' or 'bfloat16' (or None to keep the stored dtypes)"
  try:
    resolved = np.dtype(dtype)
  except (TypeError, ValueError) as e:
    raise InvalidInputError(f"{name} {dtype!r} is not a dtype: {fix}.") from e
  if not jnp.issubdtype(resolved, jnp.floating):  # numpy's issubdtype misses bfloat16
    raise InvalidInputError(f"{name} {dtype!r} is not a floating type: {fix}.")
  return resolved


def check_boolean(value: Any, name: str) -> bool:
  """`value`, which must be True or False (a Python or NumPy bool, or a concrete 0-d bool
  array) -> a Python bool."""
  value = _static(value, name, f"{name} must be True or False")
  if not isinstance(value, (bool, np.bool_)):
    raise InvalidInputError(f"{name} must be True or False, got {value!r}.")
  return bool(value)


def check_text(value: Any, name: str) -> str:
  """`value`, which must be a non-empty string."""
  if not isinstance(value, str) or not value:
    raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}.")
  return value


# ----------------------------------------------------------------------------- token arrays


def _host_values(x: Any) -> list[np.ndarray]:
  """The values of a concrete array on this host: each addressable shard of a jax.Array spread
  over several hosts, else the whole array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return [np.asarray(shard.data) for shard in x.addressable_shards]
  return [np.asarray(x)]


def check_tokens(x: Any, name: str, vocab_size: int | None = None) -> tuple[int, int]:
  """Checks a token array [B, L]: integer dtype, rank 2, B >= 1 and L >= 1, and, where its values
  are concrete and `vocab_size` is given, 0 <= id < vocab_size -> (B, L). A TensorFlow tensor is
  refused with the conversion to make."""
  _refuse_tensorflow(x, name)
  if getattr(x, "dtype", None) is None:
    try:
      x = np.asarray(x)
    except ValueError as e:
      raise InvalidInputError(f"{name} must be a [batch, length] array of token ids: {e}") from e
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise InvalidInputError(
        f"{name} must hold integer token ids, got dtype {x.dtype}: cast with .astype(np.int32)."
    )
  shape = tuple(np.shape(x))
  if len(shape) != 2:
    raise InvalidInputError(
        f"{name} must be a rank-2 [batch, length] array of token ids, got shape {shape}: add a "
        "batch dimension (tokens[None]) or flatten extra axes."
    )
  if 0 in shape:
    raise InvalidInputError(
        f"{name} is empty (shape {shape}): give at least one row and one position (batch >= 1, "
        "length >= 1)."
    )
  if vocab_size is not None and is_concrete(x):
    for values in _host_values(x):
      outside = (values < 0) | (values >= vocab_size)
      if np.any(outside):
        where = tuple(int(i) for i in np.argwhere(outside)[0])
        raise InvalidInputError(
            f"{name} holds id {int(values[where])} at {list(where)}, outside [0, {vocab_size}) "
            f"(the model's vocab_size is {vocab_size}): encode the inputs with the model's "
            "vocabulary, or give the model a vocab_size that covers it."
        )
  return shape


def _holds_text(value: Any) -> bool:
  """Whether a feature's value holds strings or bytes (a NumPy or nested-list value)."""
  if isinstance(value, jax.Array):
    return False
  dtype = getattr(value, "dtype", None)
  if dtype is None:
    try:
      dtype = np.asarray(value).dtype
    except ValueError:
      return False
  return np.dtype(dtype).kind in "USO"


def check_batch(batch: Any, vocab_size: int, required: Sequence[str] = TOKEN_FEATURES[:2]) -> None:
  """Checks a model batch in seqio's EncDecFeatureConverter layout.

  The `required` features must be present. Every token feature present (encoder_input_tokens
  [B, Le], decoder_input_tokens and decoder_target_tokens [B, Ld]) is checked by `check_tokens`
  against `vocab_size`, with one batch size B between them; segment ids, positions and loss
  weights must have their tokens' shapes. Other keys are left alone, except features that hold
  text (seqio's `inputs_pretokenized`): a jitted model cannot take them, so they are refused with
  the fix (keep the model's features only), and so are token features given as nested Python
  lists (the models read their `.shape` and `.dtype`).
  """
  if not isinstance(batch, Mapping):
    raise InvalidInputError(
        "batch must be a mapping of feature name -> [batch, length] array (seqio's "
        f"EncDecFeatureConverter layout: {', '.join(required)}), got {type(batch).__name__}."
    )
  missing = [name for name in required if name not in batch]
  if missing:
    raise InvalidInputError(
        f"batch lacks {missing} (it has {sorted(batch)}): give each of {list(required)}, a "
        "[batch, length] int32 array."
    )
  for name, value in batch.items():  # what a tf.data iterator yields, unconverted
    _refuse_tensorflow(value, str(name))
  text = [name for name, value in batch.items() if _holds_text(value)]
  if text and not set(text) & set(TOKEN_FEATURES):
    raise InvalidInputError(
        f"batch feature(s) {sorted(text)} hold text, which the model does not read (and a jitted "
        "call cannot take): give the model's features only, e.g. {k: v for k, v in "
        f"batch.items() if k in {list(TOKEN_FEATURES + ENCODER_SHAPED + DECODER_SHAPED)}}}."
    )
  shapes = {
      name: check_tokens(batch[name], name, vocab_size) for name in TOKEN_FEATURES if name in batch
  }
  for name in shapes:  # the models read their .shape and .dtype
    if getattr(batch[name], "dtype", None) is None:
      raise InvalidInputError(
          f"batch feature {name} is a {type(batch[name]).__name__}, not an array: give a "
          f"[batch, length] array of token ids, e.g. np.asarray(tokens, np.int32)."
      )
  sizes = {name: shape[0] for name, shape in shapes.items()}
  if len(set(sizes.values())) > 1:
    raise InvalidInputError(
        f"the token arrays disagree on the batch size: {sizes}; give every feature one row per "
        "example."
    )
  decoder = [name for name in TOKEN_FEATURES[1:] if name in shapes]
  if len({shapes[name] for name in decoder}) > 1:
    raise InvalidInputError(
        f"decoder_input_tokens has shape {shapes['decoder_input_tokens']} and "
        f"decoder_target_tokens {shapes['decoder_target_tokens']}: give them one shape (the "
        "inputs are the targets shifted right by one)."
    )
  for features, tokens in ((ENCODER_SHAPED, TOKEN_FEATURES[:1]), (DECODER_SHAPED, decoder)):
    for name in features:
      if name in batch and tokens and tuple(np.shape(batch[name])) != shapes[tokens[0]]:
        raise InvalidInputError(
            f"{name} has shape {tuple(np.shape(batch[name]))} but {tokens[0]} has "
            f"{shapes[tokens[0]]}: give {name} the shape of {tokens[0]}."
        )


# ----------------------------------------------------------------------------- decode settings


def check_temperature(temperature: Any, rows: int | None = None) -> None:
  """A temperature: a number, or one per batch row ([rows]); finite and >= 0 (0 is greedy). A
  traced temperature is checked for its dtype and shape only."""
  wanted = "temperature must be >= 0 and finite (0 means greedy), one number or one per row" + (
      f" of the batch ([{rows}])" if rows is not None else ""
  )
  _refuse_tensorflow(temperature, "temperature")
  values = np.asarray(temperature) if is_concrete(temperature) else temperature
  if not (jnp.issubdtype(values.dtype, jnp.integer) or jnp.issubdtype(values.dtype, jnp.floating)):
    raise InvalidInputError(f"{wanted}; got {temperature!r} (dtype {values.dtype}).")
  if values.ndim > 1 or (values.ndim == 1 and rows is not None and values.shape[0] != rows):
    raise InvalidInputError(f"{wanted}; got shape {values.shape}.")
  if is_concrete(values) and (not np.all(np.isfinite(values)) or np.any(values < 0)):
    raise InvalidInputError(f"{wanted}; got {values.tolist()}.")


def check_sampling(
    temperature: Any = None,
    topk: Any = 0,
    topp: Any = 0.0,
    rows: int | None = None,
    vocab_size: int | None = None,
) -> tuple[int, float]:
  """The sampling distribution's settings: the temperature (None: not checked; see
  `check_temperature`), topk an integer in [0, vocab_size] (0: no cutoff), topp a number in
  [0, 1] (0: no cutoff), and not both topk and topp -> (topk, topp) as Python numbers. They
  shape the computation, so they are known before tracing: Python and NumPy numbers and concrete
  0-d jax arrays are taken for their values (as a temperature is), a traced one is refused."""
  limit = f", at most the vocab_size {vocab_size}" if vocab_size is not None else ""
  wanted_topk = f"topk must be a non-negative integer (0 = no cutoff){limit}"
  topk = _static(topk, "topk", wanted_topk)
  if not _is_integer(topk) or topk < 0 or (vocab_size is not None and topk > vocab_size):
    raise InvalidInputError(f"{wanted_topk}, got {topk!r}.")
  topp = _static(topp, "topp", "topp must be in [0, 1] (0 = no cutoff)")
  real = isinstance(topp, (numbers.Real, np.floating, np.integer))
  if isinstance(topp, (bool, np.bool_)) or not real or not 0.0 <= topp <= 1.0:
    raise InvalidInputError(f"topp must be in [0, 1] (0 = no cutoff), got {topp!r}.")
  if topk and topp:
    raise InvalidInputError(
        f"topk={topk} and topp={topp} were both set: at most one of top-k and top-p may be "
        "non-zero (set the other to 0)."
    )
  if temperature is not None:
    check_temperature(temperature, rows)
  return int(topk), float(topp)


def check_num_decodes(num_decodes: Any) -> int:
  """Decodes per batch item: an integer >= 1."""
  return check_integer(num_decodes, "num_decodes", 1, meaning="samples per batch item")


def check_gamma(gamma: Any) -> int:
  """Drafts per target call: an integer >= 1."""
  return check_integer(gamma, "gamma", 1, meaning="the number of drafted tokens per target call")


def check_max_decode_steps(max_decode_steps: Any, length: int | None = None) -> Any:
  """None (decode up to the length), or an integer in [1, length] -> it, a Python int where it
  is concrete. NumPy and concrete jax integers are checked like Python ints; a traced one for
  its dtype and rank only (and returned as it is)."""
  if max_decode_steps is None:
    return None
  _refuse_tensorflow(max_decode_steps, "max_decode_steps")
  wanted = "max_decode_steps must be None (decode up to the decode length) or an integer >= 1"
  wanted += f" and <= the decode length {length}" if length is not None else ""
  dtype = getattr(max_decode_steps, "dtype", None)
  if not _is_integer(max_decode_steps) and not (
      dtype is not None and jnp.issubdtype(dtype, jnp.integer) and np.ndim(max_decode_steps) == 0
  ):
    raise InvalidInputError(f"{wanted}, got {max_decode_steps!r}.")
  if is_concrete(max_decode_steps):
    steps = int(np.asarray(max_decode_steps))
    if steps < 1 or (length is not None and steps > length):
      raise InvalidInputError(f"{wanted}, got {steps}.")
    return steps
  return max_decode_steps


def check_eos_id(eos_id: Any, vocab_size: int | None = None) -> int:
  """The end-of-sequence id: an integer in [1, vocab_size), as 0 is padding (finished rows emit
  0) -> a Python int."""
  fix = (
      "give the output vocabulary an EOS id >= 1, e.g. seqio.PassThroughVocabulary(size, eos_id=1)"
  )
  if eos_id is None:
    raise InvalidInputError(
        f"the output vocabulary has no EOS id (eos_id None): decoding needs one to end a row; {fix}."
    )
  if not _is_integer(eos_id) or eos_id < 1:
    raise InvalidInputError(
        f"eos_id is {eos_id!r}, but it must be an integer >= 1 (0 is the padding id that finished "
        f"rows emit; T5's EOS is 1): {fix}."
    )
  if vocab_size is not None and eos_id >= vocab_size:
    raise InvalidInputError(
        f"eos_id {eos_id} is not an id of the model (vocab_size {vocab_size}), so no decode "
        "could end: use the EOS id of the model's vocabulary."
    )
  return int(eos_id)


def check_vocabulary(vocabulary: Any, vocab_size: int, name: str) -> None:
  """A seqio vocabulary whose ids the model's `vocab_size` covers."""
  size = getattr(vocabulary, "vocab_size", None)
  if not _is_integer(size):
    raise InvalidInputError(
        f"{name} must be a seqio.Vocabulary (with an integer vocab_size), got {vocabulary!r}."
    )
  if size > vocab_size:
    raise InvalidInputError(
        f"{name} has {size} ids but the model's vocab_size is {vocab_size}: the model can "
        f"neither read nor emit ids >= {vocab_size}; give the model a vocab_size >= {size}, or "
        "use the vocabulary the model was trained with."
    )


def check_prng_key(key: Any, name: str, batch: int | None = None) -> None:
  """None, or one PRNG key: `jax.random.key(seed)` (a typed key, shape []) or
  `jax.random.PRNGKey(seed)` (raw uint32 key data, shape [2] for the default threefry); with
  `batch`, also one key per example: typed [batch] or raw [batch, 2] (`sampling.uniforms`)."""
  if key is None:
    return
  dtype = getattr(key, "dtype", None)
  typed = dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)
  raw = not typed and dtype is not None and np.dtype(dtype) == np.uint32
  rank = np.ndim(key) - (0 if typed else 1)  # 0: one key, 1: one per example
  valid = (typed or raw) and (rank == 0 or (rank == 1 and batch is not None))
  if valid and rank == 1 and np.shape(key)[0] != batch:
    raise InvalidInputError(
        f"{name} holds {np.shape(key)[0]} keys, one per example, but the batch has {batch} "
        "examples: give one key, or one per example."
    )
  if not valid:
    per_example = (
        " or one per example (jax.vmap(jax.random.fold_in, (None, 0))(key, indices))"
        if batch is not None
        else ""
    )
    raise InvalidInputError(
        f"{name} must be one PRNG key, jax.random.PRNGKey(seed) or jax.random.key(seed)"
        f"{per_example}, got {key!r}."
    )


def check_decoder_params(decoder_params: Any, known: Collection[str] | None) -> None:
  """None or a mapping whose keys are among `known` (None: any key), with True or False for the
  switches in BOOLEAN_PARAMS."""
  if decoder_params is None:
    return
  if not isinstance(decoder_params, Mapping):
    raise InvalidInputError(
        f"decoder_params must be a mapping (e.g. {{'temperature': 1.0}}), got {decoder_params!r}."
    )
  unknown = sorted(set(decoder_params) - set(known)) if known is not None else []
  if unknown:
    close = [match for key in unknown for match in difflib.get_close_matches(key, known, 1)]
    hint = f"did you mean {close}? " if close else ""
    raise InvalidInputError(
        f"unknown decoder_params {unknown}: {hint}the decode function takes {sorted(known)}."
    )
  for name in BOOLEAN_PARAMS:
    if name in decoder_params:
      check_boolean(decoder_params[name], f"decoder_params[{name!r}]")


def check_decode_call(
    inputs: Any,
    eos_id: Any,
    num_decodes: Any,
    temperature: Any,
    topk: Any,
    topp: Any,
    max_decode_steps: Any = None,
    decode_rng: Any = None,
    vocab_size: int | None = None,
    name: str = "inputs",
) -> None:
  """Everything a decoding loop takes from its caller: `inputs` [B, L] (the decoder's, called
  `name` in messages), eos_id, num_decodes, the sampling settings (the temperature one number or
  [B]), max_decode_steps against L, and the decode rng. `vocab_size` (where known) bounds the ids,
  eos_id and topk."""
  rows, length = check_tokens(inputs, name, vocab_size)
  check_eos_id(eos_id, vocab_size)
  check_num_decodes(num_decodes)
  check_sampling(None, topk, topp, vocab_size=vocab_size)
  check_temperature(temperature, rows)
  check_max_decode_steps(max_decode_steps, length)
  check_prng_key(decode_rng, "decode_rng", rows)


# ----------------------------------------------------------------------------- configuration


def check_feature_lengths(lengths: Any, name: str, required: Sequence[str] = ()) -> dict[str, int]:
  """{feature: length}, non-empty, every length an integer >= 1, with the `required` features
  -> a dict of Python ints."""
  if not isinstance(lengths, Mapping) or not lengths:
    raise InvalidInputError(
        f"{name} must be a non-empty mapping feature -> length, e.g. {{'inputs': 64, "
        f"'targets': 64}}, got {lengths!r}."
    )
  missing = [feature for feature in required if feature not in lengths]
  bad = {feature: n for feature, n in lengths.items() if not _is_integer(n) or n < 1}
  if missing or bad:
    raise InvalidInputError(
        f"{name} {dict(lengths)!r} must give an integer length >= 1 for "
        f"{list(required) or 'each feature'} (missing: {missing}, not an integer >= 1: {bad})."
    )
  return {feature: int(n) for feature, n in lengths.items()}


def check_temperatures(temperatures: Any, name: str) -> tuple[float, ...]:
  """A non-empty sequence of temperatures, each finite and >= 0 -> a tuple of floats."""
  if isinstance(temperatures, (str, bytes)) or not isinstance(temperatures, Sequence):
    raise InvalidInputError(
        f"{name} must be a sequence of temperatures, e.g. (0.0, 1.0), got {temperatures!r}."
    )
  if not temperatures:
    raise InvalidInputError(f"{name} is empty: give at least one temperature, e.g. (0.0,).")
  for temperature in temperatures:
    try:
      check_temperature(temperature)
    except InvalidInputError as e:
      raise InvalidInputError(f"{name} {tuple(temperatures)!r}: {e}") from e
  return tuple(float(t) for t in temperatures)

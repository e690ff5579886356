"""speculative_t5x/validation.py: each check accepts the values that have a meaning, rejects the
others with a message naming them, and checks a traced value for its shape and dtype only."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from speculative_t5x import validation
from speculative_t5x.validation import InvalidInputError

TOKENS = np.array([[3, 4, 1], [5, 1, 0]], np.int32)


def test_invalid_input_error_is_a_value_error():
  assert issubclass(InvalidInputError, ValueError)


@pytest.mark.parametrize(
    "value, minimum, maximum, expected", [(3, 1, None, 3), (np.int64(2), 1, 2, 2), (0, 0, 0, 0)]
)
def test_check_integer_accepts_python_and_numpy_integers(value, minimum, maximum, expected):
  result = validation.check_integer(value, "n", minimum, maximum)
  assert result == expected and type(result) is int


@pytest.mark.parametrize(
    "value, maximum, message",
    [
        (True, None, r"n must be an integer >= 1 \(things\), got True \(bool\)"),
        (2.0, None, r"got 2.0 \(float\)"),
        ("2", None, r"got '2' \(str\)"),
        (0, None, r"n must be an integer >= 1 \(things\), got 0\."),
        (np.int32(9), 8, r"n must be an integer >= 1 and <= 8 \(things\), got 9"),
    ],
)
def test_check_integer_rejects(value, maximum, message):
  with pytest.raises(InvalidInputError, match=message):
    validation.check_integer(value, "n", 1, maximum, meaning="things")


def test_check_boolean_and_text():
  assert validation.check_boolean(np.bool_(True), "flag") is True
  assert validation.check_text("test", "SPLIT") == "test"
  with pytest.raises(InvalidInputError, match="flag must be True or False, got 1"):
    validation.check_boolean(1, "flag")
  with pytest.raises(InvalidInputError, match="SPLIT must be a non-empty string, got ''"):
    validation.check_text("", "SPLIT")


def test_check_tokens_accepts_lists_numpy_and_jax_arrays():
  assert validation.check_tokens([[1, 2]], "x", 3) == (1, 2)
  assert validation.check_tokens(TOKENS, "x", 6) == (2, 3)
  assert validation.check_tokens(jnp.asarray(TOKENS, jnp.uint8), "x", 6) == (2, 3)


@pytest.mark.parametrize(
    "tokens, message",
    [
        (TOKENS.astype(np.float32), "x must hold integer token ids, got dtype float32"),
        ([[1, 2], [3]], r"x must be a \[batch, length\] array of token ids"),
        (TOKENS[0], r"x must be a rank-2 \[batch, length\] array of token ids, got shape \(3,\)"),
        (TOKENS[:0], r"x is empty \(shape \(0, 3\)\)"),
        (TOKENS[:, :0], r"x is empty \(shape \(2, 0\)\)"),
        (TOKENS + 3, r"x holds id 6 at \[0, 0\], outside \[0, 6\) \(the model's vocab_size is 6\)"),
        (TOKENS - 4, r"x holds id -1 at \[0, 0\], outside \[0, 6\)"),
    ],
)
def test_check_tokens_rejects(tokens, message):
  with pytest.raises(InvalidInputError, match=message):
    validation.check_tokens(tokens, "x", 6)


def test_traced_tokens_are_checked_for_shape_and_dtype_only():
  @jax.jit
  def ids_in_range(tokens):
    validation.check_tokens(tokens, "x", 6)  # the values are unknown while tracing
    return tokens

  ids_in_range(TOKENS + 10)
  with pytest.raises(InvalidInputError, match="rank-2"):
    ids_in_range(TOKENS[0])


BATCH = {
    "encoder_input_tokens": TOKENS,
    "decoder_input_tokens": TOKENS[:, :2],
    "decoder_target_tokens": TOKENS[:, 1:],
    "decoder_loss_weights": np.ones((2, 2), np.float32),
    "encoder_segment_ids": np.ones((2, 3), np.int32),
    "anything_else": np.zeros(5),  # a numeric feature the model does not read: left alone
}


def test_check_batch_accepts_the_feature_converters_layout():
  validation.check_batch(BATCH, 6, validation.TOKEN_FEATURES)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"decoder_input_tokens": None}, r"batch lacks \['decoder_input_tokens'\]"),
        ({"encoder_input_tokens": TOKENS[:1]}, "disagree on the batch size"),
        ({"decoder_target_tokens": TOKENS}, "give them one shape"),
        (
            {"decoder_loss_weights": np.ones((2, 3))},
            r"decoder_loss_weights has shape \(2, 3\) but decoder_input_tokens has \(2, 2\)",
        ),
        ({"encoder_segment_ids": np.ones(3)}, "encoder_segment_ids has shape"),
        (
            {"inputs_pretokenized": np.array([b"a b", b"c"])},
            r"batch feature\(s\) \['inputs_pretokenized'\] hold text, which the model does not "
            r"read \(and a jitted call cannot take\): give the model's features only",
        ),
        ({"anything_else": "text"}, r"\['anything_else'\] hold text"),
        (
            {"encoder_input_tokens": TOKENS.tolist()},
            r"batch feature encoder_input_tokens is a list, not an array: give a \[batch, length\] "
            r"array of token ids, e.g. np.asarray\(tokens, np.int32\)",
        ),
    ],
)
def test_check_batch_rejects(changes, message):
  batch = {k: v for k, v in {**BATCH, **changes}.items() if v is not None}
  with pytest.raises(InvalidInputError, match=message):
    validation.check_batch(batch, 6, validation.TOKEN_FEATURES)


def test_check_batch_needs_a_mapping():
  with pytest.raises(InvalidInputError, match="batch must be a mapping"):
    validation.check_batch(TOKENS, 6)


@pytest.mark.parametrize("temperature", [0, 0.0, 1.5, np.float32(0.7), [0.0, 2.0], jnp.ones(2)])
def test_check_temperature_accepts(temperature):
  validation.check_temperature(temperature, rows=2)


@pytest.mark.parametrize(
    "temperature, message",
    [
        (-0.5, r"got -0\.5"),
        (float("inf"), "got inf"),
        (float("nan"), "got nan"),
        ([1.0, -1.0], r"got \[1\.0, -1\.0\]"),
        (np.ones(3), r"one per row of the batch \(\[2\]\); got shape \(3,\)"),
        (np.ones((2, 1)), r"got shape \(2, 1\)"),
        (None, "got None"),
        ("1.0", "got '1.0'"),
        (True, "got True"),
    ],
)
def test_check_temperature_rejects(temperature, message):
  with pytest.raises(InvalidInputError, match="temperature must be >= 0 and finite.*" + message):
    validation.check_temperature(temperature, rows=2)


def test_traced_temperature_is_checked_for_shape_only():
  jax.jit(lambda t: validation.check_temperature(t, rows=2) or t)(-1.0)
  with pytest.raises(InvalidInputError, match="shape"):
    jax.jit(lambda t: validation.check_temperature(t, rows=2) or t)(jnp.ones(3))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(topk=-1), "topk must be a non-negative integer"),
        (dict(topk=2.0), r"topk must be a non-negative integer \(0 = no cutoff\), got 2.0"),
        (dict(topk=9, vocab_size=8), "at most the vocab_size 8, got 9"),
        (dict(topp=1.01), r"topp must be in \[0, 1\]"),
        (dict(topp=True), "topp must be in.*got True"),
        (dict(topp="0.5"), "topp must be in.*got '0.5'"),
        (dict(topk=3, topp=0.5), "at most one of top-k and top-p"),
        (dict(temperature=-1.0), "temperature must be >= 0"),
    ],
)
def test_check_sampling_rejects(kwargs, message):
  with pytest.raises(InvalidInputError, match=message):
    validation.check_sampling(**kwargs)


def test_check_sampling_accepts():
  validation.check_sampling(None, np.int64(8), 0.0, vocab_size=8)
  validation.check_sampling(1.0, 0, 1)


@pytest.mark.parametrize("steps", [None, 1, 4, np.int32(4), jnp.int32(2)])
def test_check_max_decode_steps_accepts(steps):
  validation.check_max_decode_steps(steps, 4)


@pytest.mark.parametrize("steps", [0, -1, 5, np.int64(5), jnp.int32(5), 2.5, "3", True, [2]])
def test_check_max_decode_steps_rejects(steps):
  with pytest.raises(InvalidInputError, match="max_decode_steps must be None .* or an integer"):
    validation.check_max_decode_steps(steps, 4)


def test_traced_max_decode_steps_is_checked_for_its_dtype_only():
  """A traced count passes its dtype check and comes back as it is (its value is unknown)."""
  assert int(jax.jit(lambda s: validation.check_max_decode_steps(s, 4))(9)) == 9
  with pytest.raises(InvalidInputError, match="max_decode_steps"):
    jax.jit(lambda s: validation.check_max_decode_steps(s, 4))(2.0)


def test_check_eos_id():
  assert validation.check_eos_id(np.int64(1), 8) == 1
  for eos_id, message in (
      (0, r"eos_id is 0, but it must be an integer >= 1 \(0 is the padding id"),
      (-1, "eos_id is -1"),
      (None, r"no EOS id \(eos_id None\).*eos_id=1"),
      (8, r"eos_id 8 is not an id of the model \(vocab_size 8\)"),
      (1.0, "eos_id is 1.0"),
  ):
    with pytest.raises(InvalidInputError, match=message):
      validation.check_eos_id(eos_id, 8)


def test_check_vocabulary():
  validation.check_vocabulary(seqio.PassThroughVocabulary(8, eos_id=1), 8, "output_vocabulary")
  with pytest.raises(InvalidInputError, match="output_vocabulary has 9 ids but the model's"):
    validation.check_vocabulary(seqio.PassThroughVocabulary(9, eos_id=1), 8, "output_vocabulary")
  with pytest.raises(InvalidInputError, match="input_vocabulary must be a seqio.Vocabulary"):
    validation.check_vocabulary("spm", 8, "input_vocabulary")


def test_check_prng_key():
  for key in (None, jax.random.PRNGKey(0), jax.random.key(0)):
    validation.check_prng_key(key, "rng")
  for key in (0, np.zeros(2, np.int32), jax.random.split(jax.random.PRNGKey(0)), "seed"):
    with pytest.raises(InvalidInputError, match="rng must be one PRNG key"):
      validation.check_prng_key(key, "rng")


def test_check_decoder_params():
  validation.check_decoder_params(None, ["temperature"])
  validation.check_decoder_params({"anything": 1}, None)
  validation.check_decoder_params(
      {"temperature": 1.0, "return_trace": True}, ["temperature", "return_trace"]
  )
  with pytest.raises(InvalidInputError, match=r"unknown decoder_params \['temprature'\]: did you "):
    validation.check_decoder_params({"temprature": 1.0}, ["temperature", "topk"])
  with pytest.raises(InvalidInputError, match=r"decoder_params\['return_trace'\] must be True"):
    validation.check_decoder_params({"return_trace": "yes"}, None)
  with pytest.raises(InvalidInputError, match="decoder_params must be a mapping"):
    validation.check_decoder_params([("temperature", 1.0)], None)


def test_check_decode_call_checks_every_argument():
  args = dict(
      inputs=TOKENS,
      eos_id=1,
      num_decodes=2,
      temperature=np.array([0.5, 1.0]),
      topk=0,
      topp=0.9,
      max_decode_steps=3,
      decode_rng=jax.random.PRNGKey(0),
      vocab_size=6,
  )
  validation.check_decode_call(**args)
  for name, value, message in (
      ("inputs", TOKENS + 6, "inputs holds id"),
      ("eos_id", 0, "eos_id is 0"),
      ("num_decodes", 0, "num_decodes must be an integer >= 1"),
      ("temperature", np.ones(3), "temperature must be"),
      ("topk", 7, "topk must be"),
      ("max_decode_steps", 4, "max_decode_steps must be"),
      ("decode_rng", 1, "decode_rng must be one PRNG key"),
  ):
    with pytest.raises(InvalidInputError, match=message):
      validation.check_decode_call(**dict(args, **{name: value}))


def test_check_feature_lengths():
  assert validation.check_feature_lengths(
      {"inputs": np.int64(4), "targets": 2}, "L", ("inputs",)
  ) == {"inputs": 4, "targets": 2}
  for lengths, message in (
      ({}, "L must be a non-empty mapping"),
      ([("inputs", 4)], "L must be a non-empty mapping"),
      ({"targets": 4}, r"missing: \['inputs'\]"),
      ({"inputs": 0}, r"not an integer >= 1: \{'inputs': 0\}"),
      ({"inputs": True}, r"not an integer >= 1: \{'inputs': True\}"),
  ):
    with pytest.raises(InvalidInputError, match=message):
      validation.check_feature_lengths(lengths, "L", ("inputs",))


def test_check_temperatures():
  assert validation.check_temperatures([0, 1.5], "TEMPERATURES") == (0.0, 1.5)
  for temperatures, message in (
      ((), "TEMPERATURES is empty"),
      (1.0, "TEMPERATURES must be a sequence of temperatures"),
      ("0.0", "TEMPERATURES must be a sequence of temperatures"),
      ((0.0, -1.0), r"TEMPERATURES \(0.0, -1.0\): temperature must be >= 0"),
  ):
    with pytest.raises(InvalidInputError, match=message):
      validation.check_temperatures(temperatures, "TEMPERATURES")

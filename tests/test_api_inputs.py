"""The Python API's bad inputs, the mirror of `test_bad_inputs.py` for what a
researcher calls: the models' parameters (the target's checked as strictly as the drafter's), the
entry points' inputs and knobs, the drafters' constructors and `fit`, the verifiers.

Each case asserts the error's type and that its message names the problem and the fix, raised
before anything is traced or compiled and from outside jax (`test_bad_inputs._raise_before_tracing`).
The valid inputs of the ecosystem's types (boxed parameters, NumPy and jax scalars) are decoded
once, on the tiny models of `test_bad_inputs`.
"""

import ast
import functools
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow as tf

from test_bad_inputs import BAD, CONFIG, ENC, L, V, VOCAB, _batch, _raise_before_tracing
from test_bad_inputs import _predict, _watch_jax, _world
from test_bad_inputs import unfiltered_tracebacks  # noqa: F401  (a fixture)
from speculative_t5x import drafters
from speculative_t5x import feature_drafter
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import speculative
from speculative_t5x import table_drafters

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "speculative_t5x"


# ----------------------------------------------------------------------------- parameter trees


@functools.cache
def _trees() -> dict:
  """Parameter trees of other configs and kinds, by shape only (nothing allocated but zeros)."""

  def zeros(config):
    shapes = jax.eval_shape(functools.partial(network.init_params, config), jax.random.PRNGKey(0))
    return jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes)

  target = _world().params["base"]
  decoder = dict(target["decoder"])
  return {
      "int": jax.tree.map(lambda x: x.astype(np.int32), target),
      "bool": {**target, "encoder": jax.tree.map(lambda x: x > 0, target["encoder"])},
      "deeper": zeros(CONFIG.replace(num_decoder_layers=2)),
      "wider": zeros(CONFIG.replace(emb_dim=16)),
      "vocab": zeros(CONFIG.replace(vocab_size=64)),
      "heads": zeros(CONFIG.replace(num_heads=4, head_dim=2)),
      "relu": zeros(CONFIG.replace(mlp_activations=("relu",))),
      "tied": zeros(CONFIG.replace(logits_via_embedding=True)),
      "half": {**target, "decoder": {k: v for k, v in decoder.items() if k != "layers_0"}},
      "encoder only": {"encoder": target["encoder"], "token_embedder": target["token_embedder"]},
      "transposed": {
          **target,
          "decoder": {**decoder, "logits_dense": {"kernel": np.zeros((V, CONFIG.emb_dim))}},
      },
      "foreign": {"dense": {"kernel": np.zeros((3, 3), np.float32)}},
  }


def _base(tree, call="predict"):
  world = _world()
  params = _trees()[tree] if isinstance(tree, str) else tree
  if call == "predict":
    return world.base.predict_batch_with_aux(params, _batch())
  if call == "score":
    return world.base.score_batch(params, _batch())
  if call == "loss":
    return world.base.loss_fn(params, _batch(), None)
  return world.base.jit_predict(max_decode_steps=2)(params, _batch(), world.rng, 0.0)


def _spec(target=None, drafter=None, call="predict", kind="spec", **extra):
  world = _world()
  params = dict(world.params["spec"], **extra)
  if target is not None:
    params["target"] = _trees()[target] if isinstance(target, str) else target
  if drafter is not None:
    params["drafter"] = drafter
  model = getattr(world, kind)
  if call == "predict":
    return model.predict_batch_with_aux(params, _batch())
  if call == "score":
    return model.score_batch(params, _batch())
  return model.jit_predict()(params, _batch(), world.rng, 0.0)


NOT_TARGET = r"^{} are not this T5 model's parameters \(\d+ problem\(s\); the first: "
BASE = NOT_TARGET.format("params")
TARGET = NOT_TARGET.format(r"params\['target'\]")
CAST = r"cast them with jax\.tree\.map\(lambda x: x\.astype\(jnp\.float32\), params\)"
SIZE = r"they are another size of T5: their shapes fit a T5Config with "
HALF = r"parameters are missing and the rest fit: a half-restored tree .* Restore the whole"
PAIR_DICT = (
    r"they are a speculative pair's \{'target': \.\.\., 'drafter': \.\.\.\}: give this model"
)
VARIABLES = r"they are flax variables \{'params': \.\.\.\}, the tree one level up: pass variables"
FOREIGN = r"none of their paths is one of T5 1\.1's \(the T5X tree: token_embedder, encoder"
NOT_FLOAT = r"is dtype {}, not a floating type"
LAYER = r"decoder/layers_1/encoder_decoder_attention/key/kernel \(8, 8\) is not a parameter of"
PAIR = r"params of a SpeculativeEncoderDecoderModel must be a mapping \{'target': \.\.\., 'drafter'"
BOOL = "{} must be True or False"
INT = "{} must be an integer >= {}, got {}"

# (name, the call, the error, a regex its message matches)
ISSUE_CASES = [
    (
        "base: target params cast to int32",
        lambda: _base("int"),
        BAD,
        BASE + ".*" + NOT_FLOAT.format("int32"),
    ),
    ("spec: target params cast to int32", lambda: _spec("int"), BAD, TARGET + ".*" + CAST),
    ("base: an extra decoder layer", lambda: _base("deeper"), BAD, BASE + LAYER + ".*" + SIZE),
    ("spec: an extra decoder layer", lambda: _spec("deeper"), BAD, SIZE + r"num_decoder_layers=2"),
    (
        "spec: another model's tree for the target",
        lambda: _spec("foreign"),
        BAD,
        TARGET + ".*" + FOREIGN,
    ),
    (
        "base: a pair's {'target', 'drafter'}",
        lambda: _base(_world().params["spec"]),
        BAD,
        BASE + ".*" + PAIR_DICT,
    ),
    (
        "base: another size (emb_dim 16)",
        lambda: _base("wider"),
        BAD,
        BASE
        + r"decoder/decoder_norm/scale is \(16,\), .*"
        + SIZE
        + r"emb_dim=16 \(this model: 8\)",
    ),
    ("base: a layer missing", lambda: _base("half"), BAD, BASE + ".*" + HALF),
    (
        "PromptLookupDrafter: ngram longer than the sequences",
        lambda: _spec(kind="lookup", drafter={}),
        BAD,
        r"PromptLookupDrafter\.ngram 9 is longer than the decode \(4 tokens\).* ngram <= 4",
    ),
]

PARAM_CASES = [
    ("base: params None", lambda: _base(None), BAD, r"params must be the T5X parameter tree"),
    ("base: params a list", lambda: _base([1, 2]), BAD, r"params must be the T5X .*got list"),
    (
        "base: flax variables",
        lambda: _base({"params": _trees()["int"]}),
        BAD,
        BASE + ".*" + VARIABLES,
    ),
    ("base: bool leaves", lambda: _base("bool"), BAD, NOT_FLOAT.format("bool") + ".*" + CAST),
    (
        "base: a transposed kernel",
        lambda: _base("transposed"),
        BAD,
        r"decoder/logits_dense/kernel is \(32, 8\), the T5 model needs \(8, 32\)",
    ),
    ("base: another model's tree", lambda: _base("foreign"), BAD, BASE + ".*" + FOREIGN),
    (
        "base: another vocabulary",
        lambda: _base("vocab"),
        BAD,
        SIZE + r"vocab_size=64 \(this model: 32\)",
    ),
    (
        "base: other heads",
        lambda: _base("heads"),
        BAD,
        SIZE + r"num_heads=4 \(this model: 2\), head_dim=2",
    ),
    ("base: T5 1.0's MLP", lambda: _base("relu"), BAD, SIZE + r"mlp_activations of 1"),
    ("base: tied logits", lambda: _base("tied"), BAD, SIZE + r"logits_via_embedding=True"),
    (
        "base: the encoder alone",
        lambda: _base("encoder only"),
        BAD,
        BASE + r"decoder/decoder_norm/scale \(8,\) is missing",
    ),
    ("base: score_batch, int params", lambda: _base("int", "score"), BAD, BASE + ".*" + CAST),
    (
        "base: loss_fn, a deeper model",
        lambda: _base("deeper", "loss"),
        BAD,
        SIZE + "num_decoder_layers=2",
    ),
    ("base: jit_predict, int params", lambda: _base("int", "jit"), BAD, BASE + ".*" + CAST),
    ("base: jit_predict, a pair", lambda: _base(_world().params["spec"], "jit"), BAD, PAIR_DICT),
    (
        "spec: the target alone",
        lambda: _world().spec.predict_batch_with_aux(_world().params["base"], _batch()),
        BAD,
        PAIR + r".*the target's tree alone\? add the drafter's",
    ),
    (
        "spec: params None",
        lambda: _world().spec.predict_batch_with_aux(None, _batch()),
        BAD,
        PAIR + r".*got a NoneType",
    ),
    (
        "spec: a third entry",
        lambda: _spec(optimizer={}),
        BAD,
        r"also hold \['optimizer'\], which no part of the model reads",
    ),
    ("spec: another vocabulary", lambda: _spec("vocab"), BAD, TARGET + ".*vocab_size=64"),
    ("spec: half-restored target", lambda: _spec("half"), BAD, TARGET + ".*" + HALF),
    (
        "spec: score_batch, a wider target",
        lambda: _spec("wider", call="score"),
        BAD,
        TARGET + ".*emb_dim=16",
    ),
    (
        "spec: jit_predict, a deeper target",
        lambda: _spec("deeper", call="jit"),
        BAD,
        TARGET + ".*num_decoder_layers=2",
    ),
    (
        "spec: drafter tables cast to int32",
        lambda: _spec(
            drafter=jax.tree.map(
                lambda x: np.asarray(x).astype(np.int32), _world().params["spec"]["drafter"]
            )
        ),
        BAD,
        r"params\['drafter'\] are not this BigramDrafter's parameters .*backoff is dtype int32, not a floating type.*"
        + CAST,
    ),
    (
        "spec: a T5 drafter's params cast to int32",
        lambda: _spec(kind="t5", drafter=_trees()["int"]),
        BAD,
        r"params\['drafter'\] are not this T5Drafter's parameters .*is dtype int32, not a floating",
    ),
]

_TF_BATCH = lambda: _batch(encoder_input_tokens=tf.constant(ENC))  # noqa: E731
TF = r"is a TensorFlow tensor \(.*\), which jax does not take: convert it with \.numpy\(\)"

INPUT_CASES = [
    (
        "base: a tf.data batch",
        lambda: _predict("base", _TF_BATCH()),
        BAD,
        "encoder_input_tokens " + TF,
    ),
    (
        "spec: a tf.data batch",
        lambda: _predict("spec", _TF_BATCH()),
        BAD,
        "encoder_input_tokens " + TF,
    ),
    (
        "base: score_batch, a tf.data batch",
        lambda: _world().base.score_batch(_world().params["base"], _TF_BATCH()),
        BAD,
        TF,
    ),
    (
        "base: a tf temperature",
        lambda: _predict("base", decoder_params={"temperature": tf.constant(1.0)}),
        BAD,
        "temperature " + TF,
    ),
    (
        "base: a tf topp",
        lambda: _predict("base", decoder_params={"topp": tf.constant(0.5)}),
        BAD,
        "topp " + TF,
    ),
    (
        "jit_predict: a tuple of temperatures",
        lambda: _world().base.jit_predict(max_decode_steps=2)(
            _world().params["base"], _batch(), None, (1.0, 1.0)
        ),
        BAD,
        r"temperature \(1\.0, 1\.0\) is a Python tuple: give a number, or per-row",
    ),
    (
        "base: return_all_decodes 'yes'",
        lambda: _predict("base", return_all_decodes="yes"),
        BAD,
        BOOL.format("return_all_decodes"),
    ),
    (
        "base: prompt_with_targets 1",
        lambda: _predict("base", prompt_with_targets=1),
        BAD,
        BOOL.format("prompt_with_targets"),
    ),
    (
        "spec: prompt_with_targets 'no'",
        lambda: _predict("spec", prompt_with_targets="no"),
        BAD,
        BOOL.format("prompt_with_targets"),
    ),
    (
        "spec: return_all_decodes None",
        lambda: _predict("spec", return_all_decodes=None),
        BAD,
        BOOL.format("return_all_decodes"),
    ),
    (
        "score_batch: return_intermediates 'no'",
        lambda: _world().base.score_batch(_world().params["base"], _batch(), "no"),
        BAD,
        BOOL.format("return_intermediates"),
    ),
    (
        "loss_fn: dropout_rng 0",
        lambda: _world().base.loss_fn(_world().params["base"], _batch(), 0),
        BAD,
        r"dropout_rng must be one PRNG key, jax\.random\.PRNGKey\(seed\) or jax\.random\.key",
    ),
    (
        "decoder_params: topk a jax -1",
        lambda: _predict("base", decoder_params={"topk": _JAX["topk -1"]}),
        BAD,
        r"topk must be a non-negative integer \(0 = no cutoff\).*got -1",
    ),
    (
        "decoder_params: topp a jax [0.9, 0.9]",
        lambda: _predict("base", decoder_params={"topp": _JAX["topp rows"]}),
        BAD,
        r"topp must be in \[0, 1\] \(0 = no cutoff\)",
    ),
    (
        "decoder_params: topk a jax 2.5",
        lambda: _predict("spec", decoder_params={"topk": _JAX["2.5"]}),
        BAD,
        r"topk must be a non-negative integer .*got 2\.5",
    ),
]

_JIT = lambda **kwargs: _world().base.jit_predict(**kwargs)  # noqa: E731
KNOB_CASES = [
    (
        "jit_predict: topk a jax 2.5",
        lambda: _JIT(topk=_JAX["2.5"]),
        BAD,
        r"topk must be a non-negative integer .*got 2\.5",
    ),
    (
        "jit_predict: topp a numpy 1.5",
        lambda: _JIT(topp=np.float32(1.5)),
        BAD,
        r"topp must be in \[0, 1\] \(0 = no cutoff\), got 1\.5",
    ),
    (
        "jit_predict: max_decode_steps a jax 0",
        lambda: _JIT(max_decode_steps=_JAX["0"]),
        BAD,
        r"max_decode_steps must be None .* or an integer >= 1, got 0",
    ),
    (
        "jit_predict: num_decodes a jax 0",
        lambda: _JIT(num_decodes=_JAX["0"]),
        BAD,
        r"num_decodes must be an integer >= 1 \(samples per batch item\), got 0",
    ),
    (
        "jit_predict: return_all_decodes None",
        lambda: _JIT(return_all_decodes=None),
        BAD,
        BOOL.format("return_all_decodes"),
    ),
    (
        "jit_predict: topk a list",
        lambda: _JIT(topk=[2]),
        BAD,
        r"topk must be a non-negative integer .*got \[2\]",
    ),
    (
        "model: a config for a module",
        lambda: models.EncoderDecoderModel(CONFIG, VOCAB, VOCAB),
        BAD,
        r"module must be a network\.Transformer \(network\.Transformer\(config\)\), got T5Config",
    ),
    (
        "model: a larger vocabulary",
        lambda: models.EncoderDecoderModel(
            network.Transformer(CONFIG), VOCAB, seqio.PassThroughVocabulary(40, eos_id=1)
        ),
        BAD,
        r"output_vocabulary has 40 ids but the model's vocab_size is 32",
    ),
    (
        "model: label_smoothing 1",
        lambda: models.EncoderDecoderModel(
            network.Transformer(CONFIG), VOCAB, VOCAB, label_smoothing=1.0
        ),
        BAD,
        r"label_smoothing must be < 1",
    ),
    (
        "model: label_smoothing text",
        lambda: models.EncoderDecoderModel(
            network.Transformer(CONFIG), VOCAB, VOCAB, label_smoothing="0.1"
        ),
        BAD,
        r"label_smoothing must be a finite number >= 0",
    ),
    (
        "model: z_loss -1",
        lambda: models.EncoderDecoderModel(network.Transformer(CONFIG), VOCAB, VOCAB, z_loss=-1),
        BAD,
        r"z_loss must be a finite number >= 0 \(the z-loss coefficient\), got -1",
    ),
    (
        "model: loss_normalizing_factor 0",
        lambda: models.EncoderDecoderModel(
            network.Transformer(CONFIG), VOCAB, VOCAB, loss_normalizing_factor=0
        ),
        BAD,
        r"loss_normalizing_factor must be None or a number > 0",
    ),
    (
        "model: T5X's loss_normalizing_factor name",
        lambda: models.EncoderDecoderModel(
            network.Transformer(CONFIG),
            VOCAB,
            VOCAB,
            loss_normalizing_factor="NUM_REAL_TARGET_TOKENS",
        ),
        BAD,
        r"loss_normalizing_factor must be a finite number",
    ),
    (
        "model: decode_fn a name",
        lambda: models.EncoderDecoderModel(
            network.Transformer(CONFIG), VOCAB, VOCAB, decode_fn="temperature_sample"
        ),
        BAD,
        r"decode_fn must be a decoding loop \(a function",
    ),
    (
        "UnigramDrafter: smoothing a jax -1",
        lambda: table_drafters.UnigramDrafter(smoothing=_JAX["-1.0"]),
        ValueError,
        r"UnigramDrafter\.smoothing must be a finite number >= 0 \(added to every count\)",
    ),
    (
        "UnigramDrafter: smoothing text",
        lambda: table_drafters.UnigramDrafter(smoothing="1"),
        ValueError,
        r"UnigramDrafter\.smoothing must be a finite number, got '1'",
    ),
    (
        "BigramDrafter: backoff a numpy 1.5",
        lambda: table_drafters.BigramDrafter(backoff=np.float32(1.5)),
        ValueError,
        r"BigramDrafter\.backoff must be in \(0, 1\) \(the unigram's weight\)",
    ),
    (
        "LenientVerifier: lenience a jax 2",
        lambda: speculative.LenientVerifier(_JAX["2.0"]),
        ValueError,
        r"LenientVerifier\.lenience must be in \(0, 1\], got 2\.0",
    ),
]

# The drafters' integer fields: (name, the call, the field, its least value, the value shown).
_INTEGER_FIELDS = [
    (
        "PromptLookupDrafter: ngram a jax 0",
        lambda: table_drafters.PromptLookupDrafter(ngram=_JAX["0"]),
        "PromptLookupDrafter.ngram",
        1,
        0,
    ),
    (
        "PromptLookupDrafter: fallback_token -1",
        lambda: table_drafters.PromptLookupDrafter(fallback_token=-1),
        "PromptLookupDrafter.fallback_token",
        0,
        -1,
    ),
    (
        "PromptLookupDrafter: eos_id 0",
        lambda: table_drafters.PromptLookupDrafter(eos_id=0),
        "PromptLookupDrafter.eos_id",
        1,
        0,
    ),
    (
        "BigramDrafter: top a jax 0",
        lambda: table_drafters.BigramDrafter(top=_JAX["0"]),
        "BigramDrafter.top",
        1,
        0,
    ),
    (
        "BigramDrafter: vocab_size a float",
        lambda: table_drafters.BigramDrafter(vocab_size=32.0),
        "BigramDrafter.vocab_size",
        0,
        r"32\.0",
    ),
    (
        "T5Drafter: eos_id text",
        lambda: drafters.T5Drafter(CONFIG, eos_id="1"),
        "T5Drafter.eos_id",
        1,
        "'1'",
    ),
    (
        "SharedEncoderDrafter: encoder_emb_dim a jax 0",
        lambda: drafters.SharedEncoderDrafter(CONFIG, _JAX["0"]),
        "SharedEncoderDrafter.encoder_emb_dim",
        1,
        0,
    ),
    (
        "FeatureDrafter: feature_dim 0",
        lambda: feature_drafter.FeatureDrafter(CONFIG, 0),
        "FeatureDrafter.feature_dim",
        1,
        0,
    ),
]
KNOB_CASES += [
    (name, make, ValueError, INT.format(re.escape(field), least, shown))
    for name, make, field, least, shown in _INTEGER_FIELDS
]

_FIT = lambda targets: table_drafters.BigramDrafter(V).fit_params(targets)  # noqa: E731
FIT = r"BigramDrafter\.fit takes an iterable of target sequences, 1-D token id arrays"
_P, _Q = np.full((2, 3, V), 1 / V, np.float32), np.full((2, 2, V), 1 / V, np.float32)
_DRAFTS, _U = np.ones((2, 2), np.int32), np.zeros((2, 3), np.float32)
FIT_AND_VERIFIER_CASES = [
    (
        "fit_params: one sequence alone",
        lambda: _FIT(np.array([3, 4, 1])),
        ValueError,
        FIT + r".*item 0 has shape \(\): wrap one sequence in a list",
    ),
    (
        "fit_params: a [N, L] array in a list",
        lambda: _FIT([np.ones((2, 3), np.int32)]),
        ValueError,
        FIT + r".*item 0 has shape \(2, 3\): give the rows",
    ),
    (
        "fit_params: dataset examples",
        lambda: _FIT([{"targets": np.array([3, 1])}]),
        ValueError,
        FIT + r".*item 0 is a mapping of features \(\['targets'\]\): give its 'targets'",
    ),
    ("fit_params: a number", lambda: _FIT(3), ValueError, FIT + r" \(e\.g\. .*\), got int"),
    (
        "fit_params: a string",
        lambda: table_drafters.UnigramDrafter(V).fit_params(["3 4 1"]),
        ValueError,
        r"UnigramDrafter\.fit takes an iterable .*item 0 has shape \(\)",
    ),
    (
        "fit_params: float ids",
        lambda: _FIT([np.array([3.0, 1.0])]),
        ValueError,
        r"BigramDrafter\.fit needs integer token ids, got dtype float64",
    ),
    (
        "verify: p of another length",
        lambda: speculative.TokenVerifier().verify(_P[:, :2], _Q, _DRAFTS, _U),
        ValueError,
        r"p must be \[batch, gamma \+ 1, V\] = \[2, 3, V\] .*got \(2, 2, 32\)",
    ),
    (
        "verify: q of another vocabulary",
        lambda: speculative.TokenVerifier().verify(_P, _Q[..., :8], _DRAFTS, _U),
        ValueError,
        r"q must be \[batch, gamma, V\] = \[2, 2, 32\] \(the distribution each draft",
    ),
    (
        "verify: float drafts",
        lambda: speculative.BlockVerifier().verify(_P, _Q, _DRAFTS * 1.0, _U),
        ValueError,
        r"drafts must be \[batch, gamma\] integer token ids, got shape \(2, 2\) and dtype float64",
    ),
    (
        "verify: drafts of rank 1",
        lambda: speculative.TreeVerifier().verify(_P, _Q, _DRAFTS[0], _U),
        ValueError,
        r"drafts must be \[batch, gamma\] integer token ids, got shape \(2,\)",
    ),
    (
        "verify_greedy: target tokens of another length",
        lambda: speculative.TokenVerifier().verify_greedy(_DRAFTS, _DRAFTS),
        ValueError,
        r"target_tokens must be \[batch, gamma \+ 1\] = \[2, 3\]",
    ),
    (
        "verify: uniforms of another shape",
        lambda: speculative.LenientVerifier(0.5).verify(_P, _Q, _DRAFTS, _U[:, :2]),
        ValueError,
        r"need uniforms of shape \(2, 3\)",
    ),
]

API_CASES = ISSUE_CASES + PARAM_CASES + INPUT_CASES + KNOB_CASES + FIT_AND_VERIFIER_CASES


# jax values of the cases, made outside the watched calls (making one may compile).
_JAX = {}


@functools.cache
def _more_models() -> None:
  """The models and jax values of the cases beyond `_world`'s, built outside the watched calls."""
  _JAX.update(
      {
          "topk -1": jnp.asarray(-1),
          "topp rows": jnp.asarray([0.9, 0.9]),
          "2.5": jnp.asarray(2.5),
          "0": jnp.asarray(0),
          "2.0": jnp.asarray(2.0),
          "-1.0": jnp.asarray(-1.0),
      }
  )
  world = _world()
  module = network.Transformer(CONFIG)
  world.lookup = models.SpeculativeEncoderDecoderModel(
      module, table_drafters.PromptLookupDrafter(ngram=9), VOCAB, VOCAB, gamma=2
  )
  world.t5 = models.SpeculativeEncoderDecoderModel(
      module, drafters.T5Drafter(CONFIG), VOCAB, VOCAB, gamma=2
  )
  _trees()
  _world().base.jit_predict(max_decode_steps=2)
  _world().spec.jit_predict()


def test_the_cases_are_distinct_and_beyond_the_issue_there_are_forty():
  names = [name for name, *_ in API_CASES]
  assert len(set(names)) == len(names)
  assert len(API_CASES) - len(ISSUE_CASES) >= 40


@pytest.mark.parametrize(
    "make, error, message", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES]
)
def test_bad_api_input_gets_a_clear_error_before_tracing(make, error, message, unfiltered_tracebacks):  # noqa: F811
  del unfiltered_tracebacks
  _more_models()
  _raise_before_tracing(make, error, message)


# ----------------------------------------------------------------------------- valid inputs


def test_boxed_parameters_decode_as_unboxed_and_jax_scalars_as_python_numbers():
  """`Transformer(cfg).init(...)['params']` (boxed leaves) decodes as its unboxed tree in both
  models, through one compiled function each; `topp=jnp.asarray(0.9)` is `topp=0.9`."""
  world = _world()
  module = network.Transformer(CONFIG)
  tokens = jnp.ones((1, 1), jnp.int32)
  boxed = module.init(jax.random.PRNGKey(3), tokens, tokens, tokens)["params"]
  assert isinstance(boxed["token_embedder"]["embedding"], nn.LogicallyPartitioned)
  plain = nn.meta.unbox(boxed)
  base = world.base.jit_predict(max_decode_steps=2)
  expected = base(plain, _batch(), world.rng, 0.0)[0]
  with _watch_jax() as events:
    np.testing.assert_array_equal(base(boxed, _batch(), world.rng, 0.0)[0], expected)
  assert not events, f"the boxed tree was traced again: {events}"
  assert world.spec.jit_predict(topp=jnp.asarray(0.9)) is world.spec.jit_predict(topp=0.9)
  drafter = world.params["spec"]["drafter"]
  spec = world.spec.jit_predict()
  got = spec({"target": boxed, "drafter": drafter}, _batch(), world.rng, jnp.float32(0))[0]
  np.testing.assert_array_equal(
      got, spec({"target": plain, "drafter": drafter}, _batch(), world.rng, 0.0)[0]
  )
  # The speculative model at temperature 0 is the baseline, token for token.
  full = world.base.jit_predict()(plain, _batch(), world.rng, 0.0)[0]
  np.testing.assert_array_equal(got, full)


def test_numpy_and_jax_scalars_are_taken_for_their_values_by_the_constructors():
  lookup = table_drafters.PromptLookupDrafter(vocab_size=jnp.asarray(V), ngram=np.int64(2))
  assert (lookup.vocab_size, lookup.ngram) == (V, 2) and type(lookup.ngram) is int
  bigram = table_drafters.BigramDrafter(smoothing=jnp.asarray(0.5), backoff=np.float32(0.25))
  assert (bigram.smoothing, bigram.backoff) == (0.5, 0.25)
  assert speculative.LenientVerifier(jnp.asarray(0.5)).lenience == 0.5
  lookup.check_lengths(ENC.shape[1], L)  # ngram 2 <= the decode length 4


def test_the_package_imports_form_no_circle():
  """Every `speculative_t5x` module's imports of the package (annotations' included): no cycle."""
  graph = {}
  for path in PACKAGE.glob("*.py"):
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module == "speculative_t5x":
        imported |= {alias.name for alias in node.names}
      elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("speculative_t5x."):
        imported.add(node.module.split(".")[1])
    graph[path.stem] = imported & {p.stem for p in PACKAGE.glob("*.py")}
  assert "network" not in graph["layers"] and "config" in graph["layers"]
  done, on_path = set(), []

  def visit(module):
    if module in on_path:
      raise AssertionError(
          "import circle: " + " -> ".join(on_path[on_path.index(module) :] + [module])
      )
    if module in done:
      return
    on_path.append(module)
    for other in sorted(graph[module]):
      visit(other)
    on_path.pop()
    done.add(module)

  for module in sorted(graph):
    if module != "__init__":
      visit(module)

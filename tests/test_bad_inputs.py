"""Bad inputs at every entry point get a clear error before anything is traced or compiled.

Each case asserts the error's type and that its message names the problem. In this process: the
model API (the baseline and the speculative model: `predict_batch_with_aux`, `predict_batch`,
`jit_predict` and the function it returns, `score_batch`, `loss_fn`, the constructor), the
decoding functions and the input pipeline (`inference`, `tasks`), on tiny models built once. Each
such call is watched: no jax tracing or compilation event may happen during it, and no jax frame
may lie between the call and the raise (tracebacks unfiltered), so the error came from the checks
at the edge, not from inside a trace. The scripts run in subprocesses (importing them here would
register their absl flags beside other scripts'), the cases a session selects started together
when this module starts, one bad setting each; each must exit 1 before writing anything.
"""

import contextlib
import functools
import math
import os
import pathlib
import re
import tempfile
import traceback
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from conftest import ScriptRuns, tiny_config
from speculative_t5x import decoding
from speculative_t5x import draft_length
from speculative_t5x import drafters
from speculative_t5x import gin_utils
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import speculative
from speculative_t5x import table_drafters
from speculative_t5x import trees
from speculative_t5x.measuring import calibration
from speculative_t5x.running import bootstrap
from speculative_t5x.running import inference
from speculative_t5x.text import input_data
from speculative_t5x.text import tasks
from speculative_t5x.training import distillation
from speculative_t5x.training import training
from speculative_t5x.validation import InvalidInputError
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import pairs

REPO = pathlib.Path(__file__).resolve().parents[1]
JAX_DIR = os.path.dirname(jax.__file__)
# What tracing and compiling record (jax/_src/dispatch.py).
WATCHED_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)

V, L = 32, 4  # vocab_size and decode length of the tiny models
CONFIG = tiny_config(V, emb_dim=8, head_dim=4, mlp_dim=16, num_decoder_layers=1)
VOCAB = seqio.PassThroughVocabulary(V, eos_id=1)
ENC = np.array([[5, 6, 7, 1], [8, 9, 1, 0]], np.int32)  # [B, Le]
DEC = np.zeros((2, L), np.int32)  # [B, L]
TARGETS = np.array([[3, 4, 1, 0], [5, 1, 0, 0]], np.int32)  # [B, L]


# ----------------------------------------------------------------------------- the tiny world


@functools.cache
def _world() -> types.SimpleNamespace:
  """The models, their parameters and an rng, made once, outside the watched calls."""
  module = network.Transformer(CONFIG)
  spec = models.SpeculativeEncoderDecoderModel(
      module, table_drafters.BigramDrafter(), VOCAB, VOCAB, gamma=2
  )
  # Zero weights: the checks never read them, and the one decode run needs only their shapes.
  shapes = jax.eval_shape(functools.partial(network.init_params, CONFIG), jax.random.PRNGKey(0))
  target = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes)
  drafter = jax.tree.map(jnp.asarray, spec.drafter.init_params(jax.random.PRNGKey(1), {}))
  # A shared-encoder drafter of width 8, and the parameters of one of width 16.
  wide = network.shared_encoder_param_shapes(CONFIG.replace(emb_dim=16), CONFIG.emb_dim)
  return types.SimpleNamespace(
      base=models.EncoderDecoderModel(module, VOCAB, VOCAB),
      spec=spec,
      shared=models.SpeculativeEncoderDecoderModel(
          module, drafters.SharedEncoderDrafter(CONFIG, CONFIG.emb_dim), VOCAB, VOCAB, gamma=2
      ),
      wide_shared_params={
          "target": target,
          "drafter": jax.tree.map(np.zeros, wide, is_leaf=lambda x: isinstance(x, tuple)),
      },
      params={"base": target, "spec": {"target": target, "drafter": drafter}},
      rng=jax.random.PRNGKey(0),
      device_tokens=jnp.asarray(ENC - 10),  # negative ids, on the device
      device_temperature=jnp.float32(-1),
  )


def _batch(**changes) -> dict:
  """A good batch ([2, 4] each) with `changes`; a change to None removes the feature."""
  batch = {
      "encoder_input_tokens": ENC,
      "decoder_input_tokens": DEC,
      "decoder_target_tokens": TARGETS,
  }
  batch.update(changes)
  return {k: v for k, v in batch.items() if v is not None}


def _predict(kind="base", batch=None, **kwargs):
  world = _world()
  model = getattr(world, kind)
  return model.predict_batch_with_aux(
      world.params[kind], _batch() if batch is None else batch, **kwargs
  )


def _decode(kind="base", **decoder_params):
  return _predict(kind, decoder_params=decoder_params)


def _jit(kind="base", batch=None, temperature=0.0, **jit_kwargs):
  world = _world()
  predict = getattr(world, kind).jit_predict(**jit_kwargs)
  return predict(world.params[kind], _batch() if batch is None else batch, world.rng, temperature)


def _score(batch, kind="base"):
  world = _world()
  return getattr(world, kind).score_batch(world.params[kind], batch)


def _loss(batch):
  return _world().base.loss_fn(_world().params["base"], batch, None)


def _vocabulary_model(kind="base", size=V, eos_id=1):
  """A model over a vocabulary of `size` ids with `eos_id`, decoding (baseline) or built."""
  vocabulary = seqio.PassThroughVocabulary(size, eos_id=eos_id)
  if kind == "base":
    model = models.EncoderDecoderModel(network.Transformer(CONFIG), vocabulary, vocabulary)
    return model.predict_batch_with_aux(_world().params["base"], _batch())
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(CONFIG), table_drafters.BigramDrafter(), vocabulary, vocabulary
  )


def _speculative_model(**changes):
  kwargs = dict(
      module=network.Transformer(CONFIG),
      drafter=table_drafters.BigramDrafter(),
      input_vocabulary=VOCAB,
      output_vocabulary=VOCAB,
  )
  return models.SpeculativeEncoderDecoderModel(**{**kwargs, **changes})


def _temperature_sample(**changes):
  """The loop alone; its arguments are checked before the cache or the logits function is used."""
  kwargs = dict(inputs=DEC, cache=None, tokens_to_logits=None, eos_id=1)
  return decoding.temperature_sample(**{**kwargs, **changes})


def _speculative_sample(**changes):
  kwargs = dict(
      inputs=DEC,
      target_cache=None,
      target_logits_fn=None,
      drafter=_world().spec.drafter,
      drafter_params=None,
      drafter_state=None,
      eos_id=1,
      gamma=2,
  )
  return decoding.speculative_sample(**{**kwargs, **changes})


def _infer_config(**changes):
  pair = pairs.PairConfig(
      target_config=CONFIG,
      drafter=drafters.T5Drafter(CONFIG),
      checkpoint_path=None,
      random_init_seed=0,
      restore_dtype="float32",
  )
  kwargs = dict(
      mixture_or_task_name="demo_ende",
      task_feature_lengths={"inputs": 16, "targets": 8},
      output_dir="/tmp/unused",
      pair=pair,
      batch_size=2,
  )
  return inference.InferConfig(**{**kwargs, **changes})


def _model_batch(examples, batch_size=2):
  return inference.model_batch(examples, batch_size, {"inputs": 4, "targets": L}, V)


LENGTHS = {"inputs": 4, "targets": 4}
ID = r"at \[\d+, \d+\], outside \[0, 32\) \(the model's vocab_size is 32\)"
TEMPERATURE = r"temperature must be >= 0 and finite \(0 means greedy\)"
STEPS = r"max_decode_steps must be None \(decode up to the decode length\) or an integer >= 1"
RANK = r"must be a rank-2 \[batch, length\] array of token ids"
DTYPE = r"must hold integer token ids, got dtype"
EMPTY = r"is empty \(shape"
TOPK = r"topk must be a non-negative integer \(0 = no cutoff\), at most the vocab_size 32"
TOPP = r"topp must be in \[0, 1\] \(0 = no cutoff\)"
NUM_DECODES = r"num_decodes must be an integer >= 1 \(samples per batch item\)"
GAMMA = r"gamma must be an integer >= 1 \(the number of drafted tokens per target call\)"
EOS = r"eos_id is 0, but it must be an integer >= 1 \(0 is the padding id"
SIZES = "the token arrays disagree on the batch size"
BAD = InvalidInputError
CONFIG_ERROR = gin_utils.ConfigError


def _shown(value) -> str:
  """A value as a case's name shows it (an array by its entries, on one line)."""
  return f"array({value.tolist()})" if isinstance(value, np.ndarray) else repr(value)


def _calls(entry, call, error, rows) -> list[tuple]:
  """Cases of `call` that differ only by their keyword arguments: rows of (the arguments, a
  regex the message of `error` matches), each named '<entry>: ' and its arguments."""
  return [
      (
          f"{entry}: " + ", ".join(f"{key} {_shown(value)}" for key, value in kwargs.items()),
          functools.partial(call, **kwargs),
          error,
          message,
      )
      for kwargs, message in rows
  ]


# Settings the models' decode (decoder_params) and temperature_sample refuse alike.
_DECODE_SETTINGS = [
    (dict(max_decode_steps=np.int64(9)), STEPS + " and <= the decode length 4, got 9"),
    (dict(temperature=math.inf), TEMPERATURE + ".*got inf"),
]
# Settings both decoding functions (temperature_sample, speculative_sample) refuse alike.
_LOOP_SETTINGS = [(dict(num_decodes=0), NUM_DECODES), (dict(eos_id=0), EOS)]

# (name, the call, the error, a regex its message matches)
CASES = [
    # ---- token arrays, baseline predict_batch_with_aux / predict_batch
    (
        "base: no encoder_input_tokens",
        lambda: _predict(batch=_batch(encoder_input_tokens=None)),
        BAD,
        r"batch lacks \['encoder_input_tokens'\]",
    ),
    (
        "base: no decoder_input_tokens",
        lambda: _predict(batch=_batch(decoder_input_tokens=None)),
        BAD,
        r"batch lacks \['decoder_input_tokens'\]",
    ),
    (
        "base: batch is an array",
        lambda: _predict(batch=ENC),
        BAD,
        "batch must be a mapping of feature name",
    ),
    (
        "base: float encoder tokens",
        lambda: _predict(batch=_batch(encoder_input_tokens=ENC * 1.0)),
        BAD,
        "encoder_input_tokens " + DTYPE + " float64",
    ),
    (
        "base: float decoder tokens",
        lambda: _predict(batch=_batch(decoder_input_tokens=DEC * 1.0)),
        BAD,
        "decoder_input_tokens " + DTYPE + " float64",
    ),
    (
        "base: bool encoder tokens",
        lambda: _predict(batch=_batch(encoder_input_tokens=ENC > 0)),
        BAD,
        "encoder_input_tokens " + DTYPE + " bool",
    ),
    (
        "base: string tokens",
        lambda: _predict(batch=_batch(encoder_input_tokens=[["a", "b"]])),
        BAD,
        "encoder_input_tokens " + DTYPE + " <U1",
    ),
    (
        "base: ragged token lists",
        lambda: _predict(batch=_batch(encoder_input_tokens=[[1, 2], [3]])),
        BAD,
        r"encoder_input_tokens must be a \[batch, length\] array",
    ),
    (
        "base: rank-1 encoder tokens",
        lambda: _predict(batch=_batch(encoder_input_tokens=ENC[0])),
        BAD,
        "encoder_input_tokens " + RANK + r", got shape \(4,\)",
    ),
    (
        "base: rank-1 decoder tokens",
        lambda: _predict(batch=_batch(decoder_input_tokens=DEC[0])),
        BAD,
        "decoder_input_tokens " + RANK,
    ),
    (
        "base: rank-3 encoder tokens",
        lambda: _predict(batch=_batch(encoder_input_tokens=ENC[None])),
        BAD,
        "encoder_input_tokens " + RANK + r", got shape \(1, 2, 4\)",
    ),
    (
        "base: empty batch",
        lambda: _predict(
            batch=_batch(
                encoder_input_tokens=ENC[:0],
                decoder_input_tokens=DEC[:0],
                decoder_target_tokens=None,
            )
        ),
        BAD,
        "encoder_input_tokens " + EMPTY + r" \(0, 4\)\)",
    ),
    (
        "base: encoder length 0",
        lambda: _predict(batch=_batch(encoder_input_tokens=ENC[:, :0])),
        BAD,
        "encoder_input_tokens " + EMPTY + r" \(2, 0\)\)",
    ),
    (
        "base: decode length 0",
        lambda: _predict(batch=_batch(decoder_input_tokens=DEC[:, :0], decoder_target_tokens=None)),
        BAD,
        "decoder_input_tokens " + EMPTY + r" \(2, 0\)\)",
    ),
    (
        "base: batch sizes disagree",
        lambda: _predict(batch=_batch(decoder_input_tokens=DEC[:1], decoder_target_tokens=None)),
        BAD,
        SIZES + r": \{'encoder_input_tokens': 2, 'decoder_input_tokens': 1\}",
    ),
    (
        "base: encoder id = vocab_size",
        lambda: _predict(batch=_batch(encoder_input_tokens=ENC + V)),
        BAD,
        "encoder_input_tokens holds id 37 " + ID,
    ),
    (
        "base: negative encoder id",
        lambda: _predict(batch=_batch(encoder_input_tokens=ENC - 10)),
        BAD,
        "encoder_input_tokens holds id -5 " + ID,
    ),
    (
        "base: prompt id out of range",
        lambda: _predict(batch=_batch(decoder_input_tokens=DEC + V), prompt_with_targets=True),
        BAD,
        "decoder_input_tokens holds id 32 " + ID,
    ),
    (
        "base predict_batch: negative id",
        lambda: _world().base.predict_batch(
            _world().params["base"], _batch(encoder_input_tokens=ENC - 10)
        ),
        BAD,
        "encoder_input_tokens holds id -5 " + ID,
    ),
    # ---- score_batch and loss_fn
    (
        "score: no decoder_target_tokens",
        lambda: _score(_batch(decoder_target_tokens=None)),
        BAD,
        r"batch lacks \['decoder_target_tokens'\]",
    ),
    (
        "score: target id = vocab_size",
        lambda: _score(_batch(decoder_target_tokens=TARGETS + V)),
        BAD,
        "decoder_target_tokens holds id 35 " + ID,
    ),
    (
        "score: targets shaped unlike inputs",
        lambda: _score(_batch(decoder_target_tokens=TARGETS[:, :3])),
        BAD,
        r"decoder_input_tokens has shape \(2, 4\) and decoder_target_tokens \(2, 3\): give them one shape",
    ),
    (
        "score: loss weights shape",
        lambda: _score(_batch(decoder_loss_weights=np.ones((2, 3)))),
        BAD,
        r"decoder_loss_weights has shape \(2, 3\) but decoder_input_tokens has \(2, 4\)",
    ),
    (
        "score: float encoder tokens",
        lambda: _score(_batch(encoder_input_tokens=ENC * 1.0)),
        BAD,
        "encoder_input_tokens " + DTYPE,
    ),
    (
        "score: speculative, rank-1 decoder tokens",
        lambda: _score(_batch(decoder_input_tokens=DEC[0]), "spec"),
        BAD,
        "decoder_input_tokens " + RANK,
    ),
    (
        "loss_fn: negative target id",
        lambda: _loss(_batch(decoder_target_tokens=-TARGETS - 1)),
        BAD,
        "decoder_target_tokens holds id -4 " + ID,
    ),
    (
        "loss_fn: encoder_segment_ids shape",
        lambda: _loss(_batch(encoder_segment_ids=np.ones((2, 3), np.int32))),
        BAD,
        r"encoder_segment_ids has shape \(2, 3\) but encoder_input_tokens has \(2, 4\)",
    ),
    (
        "loss_fn: batch sizes disagree",
        lambda: _loss(_batch(decoder_target_tokens=TARGETS[:1], decoder_input_tokens=DEC[:1])),
        BAD,
        SIZES,
    ),
    # ---- decode settings, baseline
    *_calls(
        "base",
        _predict,
        BAD,
        [
            (dict(num_decodes=0), NUM_DECODES + ", got 0"),
            (dict(num_decodes=-1), NUM_DECODES + ", got -1"),
            (dict(num_decodes=1.5), NUM_DECODES + r", got 1.5 \(float\)"),
        ],
    ),
    *_calls(
        "base",
        _decode,
        BAD,
        _DECODE_SETTINGS
        + [
            (dict(max_decode_steps=0), STEPS + " and <= the decode length 4, got 0"),
            (dict(max_decode_steps=-2), STEPS + ".*got -2"),
            (dict(max_decode_steps=2.5), STEPS + ".*got 2.5"),
            (dict(max_decode_steps="3"), STEPS + ".*got '3'"),
            (dict(max_decode_steps=9), STEPS + " and <= the decode length 4, got 9"),
            (dict(temperature=math.nan), TEMPERATURE + ".*got nan"),
            (dict(temperature=-1.0), TEMPERATURE + r".*got -1\.0"),
            (dict(temperature="hot"), TEMPERATURE + ".*got 'hot'"),
            (dict(temperature=None), TEMPERATURE + ".*got None"),
            (
                dict(temperature=np.ones(3)),
                TEMPERATURE
                + r", one number or one per row of the batch \(\[2\]\); got shape \(3,\)",
            ),
            (dict(temperature=np.ones((2, 1))), TEMPERATURE + r".*got shape \(2, 1\)"),
            (dict(temperature=np.array([1.0, -0.5])), TEMPERATURE + r".*got \[1\.0, -0\.5\]"),
            (dict(topk=-1), TOPK + ", got -1"),
            (dict(topk=2.5, temperature=1.0), TOPK + ", got 2.5"),
            (dict(topk=V + 1, temperature=1.0), TOPK + ", got 33"),
            (dict(topk="5"), TOPK + ", got '5'"),
            (dict(topk=True, temperature=1.0), TOPK + ", got True"),
            (dict(topp=1.5), TOPP + ", got 1.5"),
            (dict(topp=-0.1), TOPP + ", got -0.1"),
            (dict(topp=math.nan), TOPP + ", got nan"),
            (dict(topp="0.9"), TOPP + ", got '0.9'"),
            (
                dict(topk=3, topp=0.9),
                "topk=3 and topp=0.9 were both set: at most one of top-k and top-p",
            ),
            (
                dict(temprature=1.0),
                r"unknown decoder_params \['temprature'\]: did you mean \['temperature'\]\? the decode function takes \[.*'topp'\]",
            ),
            (
                dict(rescale_log_probs="no"),
                r"decoder_params\['rescale_log_probs'\] must be True or False",
            ),
        ],
    ),
    (
        "base: decoder_params a list",
        lambda: _predict(decoder_params=[("temperature", 1.0)]),
        BAD,
        "decoder_params must be a mapping",
    ),
    (
        "base: rng and decode_rng",
        lambda: _predict(rng=_world().rng, decoder_params={"decode_rng": _world().rng}),
        ValueError,
        r"Got both `rng` and `decoder_params\['decode_rng'\]`",
    ),
    (
        "base: one key per example, for another number of examples",
        lambda: _predict(rng=np.zeros((7, 2), np.uint32), decoder_params={"temperature": 1.0}),
        BAD,
        "decode_rng holds 7 keys, one per example, but the batch has",
    ),
    (
        "base: rng an int",
        lambda: _predict(rng=0, decoder_params={"temperature": 1.0}),
        BAD,
        "decode_rng must be one PRNG key, jax.random.PRNGKey.*got 0",
    ),
    *_calls(
        "base vocabulary",
        _vocabulary_model,
        BAD,
        [
            (dict(eos_id=0), EOS + r".*PassThroughVocabulary\(size, eos_id=1\)"),
            (dict(eos_id=None), r"the output vocabulary has no EOS id \(eos_id None\)"),
            (dict(eos_id=V), r"eos_id 32 is not an id of the model \(vocab_size 32\)"),
            (dict(size=V + 8), "input_vocabulary has 40 ids but the model's vocab_size is 32"),
        ],
    ),
    # ---- jit_predict and the function it returns
    *_calls(
        "jit_predict",
        _jit,
        BAD,
        [
            (dict(num_decodes=0), NUM_DECODES + ", got 0"),
            (dict(max_decode_steps=0), STEPS + ", got 0"),
            (dict(max_decode_steps=np.int32(9)), STEPS + " and <= the decode length 4, got 9"),
            (dict(topk=-1), TOPK + ", got -1"),
            (dict(topp=2.0), TOPP + ", got 2.0"),
            (dict(temperature=math.inf), TEMPERATURE + ".*got inf"),
            (dict(temperature=np.ones(3, np.float32)), TEMPERATURE + r".*got shape \(3,\)"),
        ],
    ),
    (
        "jit_predict: jnp temperature -1",
        lambda: _jit(temperature=_world().device_temperature),
        BAD,
        TEMPERATURE + r".*got -1\.0",
    ),
    (
        "jit_predict: encoder id = vocab_size",
        lambda: _jit(batch=_batch(encoder_input_tokens=ENC + V)),
        BAD,
        "encoder_input_tokens holds id 37 " + ID,
    ),
    (
        "jit_predict: negative id on the device",
        lambda: _jit(batch=_batch(encoder_input_tokens=_world().device_tokens)),
        BAD,
        "encoder_input_tokens holds id -5 " + ID,
    ),
    (
        "jit_predict: batch sizes disagree",
        lambda: _jit(batch=_batch(decoder_input_tokens=DEC[:1], decoder_target_tokens=None)),
        BAD,
        SIZES,
    ),
    (
        "jit_predict: rank-1 decoder tokens",
        lambda: _jit(batch=_batch(decoder_input_tokens=DEC[0], decoder_target_tokens=None)),
        BAD,
        "decoder_input_tokens " + RANK,
    ),
    (
        "jit_predict: rng a seed",
        lambda: _world().base.jit_predict()(_world().params["base"], _batch(), 3, 1.0),
        BAD,
        "decode_rng must be one PRNG key",
    ),
    (
        "jit_predict speculative: id = vocab_size",
        lambda: _jit("spec", batch=_batch(encoder_input_tokens=ENC + V)),
        BAD,
        "encoder_input_tokens holds id 37 " + ID,
    ),
    (
        "jit_predict speculative: decode length 0",
        lambda: _jit(
            "spec", batch=_batch(decoder_input_tokens=DEC[:, :0], decoder_target_tokens=None)
        ),
        BAD,
        "decoder_input_tokens " + EMPTY,
    ),
    *_calls(
        "jit_predict speculative",
        functools.partial(_jit, "spec"),
        BAD,
        [
            (dict(num_decodes=-1), NUM_DECODES + ", got -1"),
            (dict(temperature=math.nan), TEMPERATURE + ".*got nan"),
        ],
    ),
    # ---- the speculative model
    (
        "spec: encoder id = vocab_size",
        lambda: _predict("spec", _batch(encoder_input_tokens=ENC + V)),
        BAD,
        "encoder_input_tokens holds id 37 " + ID,
    ),
    (
        "spec: empty batch",
        lambda: _predict(
            "spec",
            _batch(
                encoder_input_tokens=ENC[:0],
                decoder_input_tokens=DEC[:0],
                decoder_target_tokens=None,
            ),
        ),
        BAD,
        "encoder_input_tokens " + EMPTY,
    ),
    (
        "spec: rank-1 decoder tokens",
        lambda: _predict("spec", _batch(decoder_input_tokens=DEC[0], decoder_target_tokens=None)),
        BAD,
        "decoder_input_tokens " + RANK,
    ),
    (
        "spec: batch sizes disagree",
        lambda: _predict("spec", _batch(decoder_input_tokens=DEC[:1], decoder_target_tokens=None)),
        BAD,
        SIZES,
    ),
    ("spec: num_decodes 0", lambda: _predict("spec", num_decodes=0), BAD, NUM_DECODES + ", got 0"),
    *_calls(
        "spec",
        functools.partial(_decode, "spec"),
        BAD,
        _DECODE_SETTINGS
        + [
            (dict(max_decode_steps=0), STEPS + ".*got 0"),
            (dict(max_decode_steps=2.5), STEPS + ".*got 2.5"),
            (dict(topk=V + 1, temperature=1.0), TOPK + ", got 33"),
            (dict(top_k=3), r"unknown decoder_params \['top_k'\]: did you mean \['topk'\]\?"),
            (dict(cache_offset=1), r"unknown decoder_params \['cache_offset'\]"),
            (
                dict(return_trace="yes"),
                r"decoder_params\['return_trace'\] must be True or False, got 'yes'",
            ),
        ],
    ),
    (
        "spec: prompt_with_targets",
        lambda: _predict("spec", prompt_with_targets=True),
        ValueError,
        "prompt_with_targets=True is not supported by speculative decoding",
    ),
    *_calls(
        "spec init",
        _speculative_model,
        BAD,
        [
            (dict(gamma=0), GAMMA + ", got 0"),
            (dict(gamma=2.5), GAMMA + r", got 2.5 \(float\)"),
            (dict(gamma="4"), GAMMA + r", got '4' \(str\)"),
            (dict(gamma=True), GAMMA + r", got True \(bool\)"),
        ],
    ),
    (
        "spec init: drafter a string",
        lambda: _speculative_model(drafter="bigram"),
        ValueError,
        "a drafter must be a drafters.Drafter or a network.Transformer, got str",
    ),
    (
        "spec init: drafter of another vocab_size",
        lambda: _speculative_model(drafter=table_drafters.BigramDrafter(vocab_size=64)),
        ValueError,
        "drafter vocab_size 64 != target vocab_size 32",
    ),
    (
        "spec init: drafter of another eos_id",
        lambda: _speculative_model(drafter=table_drafters.BigramDrafter(eos_id=2)),
        ValueError,
        "drafter eos_id 2 != the output vocabulary's eos_id 1",
    ),
    (
        "spec init: verifier a string",
        lambda: _speculative_model(verifier="token"),
        ValueError,
        "verifier must be a speculative.Verifier",
    ),
    *_calls(
        "spec init vocabulary",
        functools.partial(_vocabulary_model, "spec"),
        BAD,
        [
            (dict(eos_id=0), EOS),
            (dict(size=V + 8), "input_vocabulary has 40 ids but the model's vocab_size is 32"),
        ],
    ),
    # ---- the decoding functions
    *_calls(
        "temperature_sample",
        _temperature_sample,
        BAD,
        _DECODE_SETTINGS
        + _LOOP_SETTINGS
        + [
            (dict(max_decode_steps=0), STEPS + ".*got 0"),
            (dict(topk=2.5), r"topk must be a non-negative integer \(0 = no cutoff\), got 2.5"),
            (dict(decode_rng=7), "decode_rng must be one PRNG key"),
        ],
    ),
    (
        "temperature_sample: rank-1 inputs",
        lambda: _temperature_sample(inputs=DEC[0]),
        BAD,
        "inputs " + RANK,
    ),
    (
        "temperature_sample: float inputs",
        lambda: _temperature_sample(inputs=DEC * 1.0),
        BAD,
        "inputs " + DTYPE,
    ),
    (
        "temperature_sample: length 0",
        lambda: _temperature_sample(inputs=DEC[:, :0]),
        BAD,
        "inputs " + EMPTY,
    ),
    *_calls(
        "speculative_sample",
        _speculative_sample,
        BAD,
        _LOOP_SETTINGS
        + [
            (dict(max_decode_steps=-1), STEPS + ".*got -1"),
            (dict(max_decode_steps=2.5), STEPS + ".*got 2.5"),
            (dict(gamma=0), GAMMA),
            (dict(temperature=math.inf), TEMPERATURE + ".*got inf"),
        ],
    ),
    (
        "speculative_sample: rank-1 inputs",
        lambda: _speculative_sample(inputs=DEC[0]),
        BAD,
        "inputs " + RANK,
    ),
    # ---- the input pipeline
    (
        "model_batch: no examples",
        lambda: _model_batch([]),
        BAD,
        "model_batch got 0 examples for batch_size 2: give 1 to 2",
    ),
    (
        "model_batch: more examples than batch_size",
        lambda: _model_batch([{"inputs": np.array([5, 1])}] * 3),
        BAD,
        "model_batch got 3 examples for batch_size 2",
    ),
    (
        "model_batch: inputs longer than the length",
        lambda: _model_batch([{"inputs": np.arange(2, 8)}]),
        BAD,
        r"example 0 of the batch has inputs .*needs 1 to lengths\['inputs'\] = 4 tokens",
    ),
    (
        "model_batch: empty inputs",
        lambda: _model_batch([{"inputs": np.array([5, 1])}, {"inputs": np.zeros(0, np.int32)}]),
        BAD,
        r"example 1 of the batch has inputs array\(\[\], dtype=int32\), but each needs 1",
    ),
    (
        "model_batch: no inputs",
        lambda: _model_batch([{"targets": np.array([3, 1])}]),
        BAD,
        "example 0 of the batch has inputs None",
    ),
    (
        "model_batch: id >= vocab_size (vocabulary mismatch)",
        lambda: _model_batch([{"inputs": np.array([40, 1])}]),
        BAD,
        r"example 0 of the batch has input ids \[40\], negative or >= the model's vocab_size 32: the task's vocabulary is not the model's",
    ),
    (
        "model_batch: negative id",
        lambda: _model_batch([{"inputs": np.array([-3, 1])}]),
        BAD,
        r"input ids \[-3\], negative or >= the model's vocab_size 32",
    ),
    *_calls(
        "infer config",
        _infer_config,
        CONFIG_ERROR,
        [
            (
                dict(temperature=-1.0),
                TEMPERATURE + r".*got -1\.0\. \(TEMPERATURE, inference.InferConfig.topk and .topp",
            ),
            (dict(temperature=math.inf), TEMPERATURE + ".*got inf.*TEMPERATURE"),
            (dict(temperature=math.nan), TEMPERATURE + ".*got nan"),
            (dict(temperature="0"), TEMPERATURE + ".*got '0'"),
            (dict(topk=-1), TOPK + ", got -1.*InferConfig.topk"),
            (dict(topk=V + 1), TOPK + ", got 33"),
            (dict(topp=2.0), TOPP + ", got 2.0"),
            (dict(topk=2, topp=0.5), "topk=2 and topp=0.5 were both set"),
            (dict(batch_size=True), "BATCH_SIZE must be an integer >= 1, got True"),
            (
                dict(task_feature_lengths={"inputs": True, "targets": 8}),
                "TASK_FEATURE_LENGTHS .* must give positive integer lengths for exactly 'inputs' and 'targets'",
            ),
            (dict(decode_seed=1.5), "decode_seed must be an integer >= 0, got 1.5"),
            (dict(split=3), "SPLIT must be a non-empty string, got 3"),
            (dict(output_dir=""), "INFER_OUTPUT_DIR must be a non-empty string, got ''"),
            (
                dict(mixture_or_task_name=None),
                "MIXTURE_OR_TASK_NAME must be a non-empty string, got None",
            ),
        ],
    ),
    (
        "feature_arrays: a feature without a length",
        lambda: tasks.feature_arrays("demo_ende", "test", "labels", LENGTHS),
        BAD,
        r"feature_lengths .* must give an integer length >= 1 for \['labels'\] \(missing: \['labels'\]",
    ),
    (
        "feature_arrays: limit 0",
        lambda: tasks.feature_arrays("demo_ende", "test", "inputs", LENGTHS, 0),
        BAD,
        r"limit \(examples to read\) must be an integer >= 1, got 0",
    ),
    (
        "feature_arrays: length 0",
        lambda: tasks.feature_arrays("demo_ende", "test", "inputs", {"inputs": 0}),
        BAD,
        r"not an integer >= 1: \{'inputs': 0\}",
    ),
    (
        "count_truncated: length -1",
        lambda: tasks.count_truncated("demo_ende", "test", {"inputs": -1}),
        BAD,
        r"not an integer >= 1: \{'inputs': -1\}",
    ),
    (
        "count_truncated: max_examples 0",
        lambda: tasks.count_truncated("demo_ende", "test", LENGTHS, 0),
        BAD,
        "max_examples must be an integer >= 1, got 0",
    ),
    (
        "get_task: a number for a name",
        lambda: tasks.get_task(3),
        BAD,
        "the task or mixture name must be a non-empty string, got 3",
    ),
]


@contextlib.contextmanager
def _watch_jax():
  """-> the tracing and compilation events recorded inside the block."""
  events = []

  def listen(event, duration, **kwargs):
    del duration, kwargs
    if event in WATCHED_EVENTS:
      events.append(event)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield events
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


@pytest.fixture(scope="module")
def unfiltered_tracebacks():
  """jax's internal frames kept in tracebacks, so an error raised while tracing shows them."""
  before = jax.config.jax_traceback_filtering
  jax.config.update("jax_traceback_filtering", "off")
  yield
  jax.config.update("jax_traceback_filtering", before)


def _raise_before_tracing(make, error, message, rule_traces=0):
  """Calls `make`, which must raise `error` matching `message` with no tracing or compilation on
  the way (but `rule_traces` abstract traces of a function alone, `jax.eval_shape`, which lowers
  and compiles nothing) and no jax frame in the traceback."""
  _world()
  with _watch_jax() as events, pytest.raises(error, match=message) as raised:
    make()
  assert (
      events == [WATCHED_EVENTS[0]] * rule_traces
  ), f"traced or compiled before the error: {events}"
  frames = [f.filename for f in traceback.extract_tb(raised.value.__traceback__)]
  assert not [f for f in frames if f.startswith(JAX_DIR)], "raised from inside jax: " + str(frames)


def test_the_watch_sees_tracing_and_errors_raised_while_tracing(unfiltered_tracebacks):
  """The two signs `_raise_before_tracing` looks for do show when a check sits inside a trace."""
  del unfiltered_tracebacks

  def check_inside(x):
    if x.shape[0] != 3:
      raise ValueError("checked while tracing")
    return x

  with _watch_jax() as events:
    jax.jit(lambda x: x + 1)(np.arange(2))
  assert "/jax/core/compile/backend_compile_duration" in events
  with pytest.raises(ValueError, match="checked while tracing") as raised:
    jax.jit(check_inside)(np.arange(2))
  frames = [f.filename for f in traceback.extract_tb(raised.value.__traceback__)]
  assert [f for f in frames if f.startswith(JAX_DIR)]


def test_jit_predict_checks_every_call_before_its_compiled_function(unfiltered_tracebacks):
  """After a good call has compiled the decode, the same function refuses ids out of range at
  the next call (the compiled function, run on them, would not fail: ids are not checked inside
  the loop) and nothing is traced or compiled again."""
  del unfiltered_tracebacks
  world = _world()
  predict = world.base.jit_predict(max_decode_steps=2)
  with _watch_jax() as events:
    decodes, _ = predict(world.params["base"], _batch(), world.rng, 0.0)
  # Traced at the first call (compiled too, or read from the persistent compilation cache).
  assert decodes.shape == (2, L) and WATCHED_EVENTS[0] in events
  _raise_before_tracing(
      lambda: predict(world.params["base"], _batch(encoder_input_tokens=ENC + V), world.rng, 0.0),
      InvalidInputError,
      "encoder_input_tokens holds id 37 " + ID,
  )


# ----------------------------------------------------------------------------- second round:
# calibration, pairs, distillation settings and the scripts' flags


_CONFIDENCE, _BETA = np.array([0.9, 0.2, 0.9]), np.array([0.5, 0.8, 1.0])


def _calibrate(**changes):
  """`calibration.calibrate` on one measured sequence, gamma 2, with `changes`."""
  kwargs = dict(
      positions=calibration.Positions([_CONFIDENCE], [_BETA]),
      gammas=[2],
      c=0.1,
      verify_cost={2: 1.2},
      thresholds=None,
  )
  return calibration.calibrate(**{**kwargs, **changes})


def _positions(confidence=_CONFIDENCE, beta=_BETA, *more):
  return calibration.Positions([confidence, *more[::2]], [beta, *more[1::2]])


def _pair(**changes):
  return pairs.PairConfig(**{"target_config": CONFIG, "random_init_seed": 0, **changes})


def _distillation(**changes):
  return distillation.Distillation(**{"target_dir": "/runs/target/model", **changes})


def _divergence(temperature, name="tvd"):
  logits = np.log(np.array([[[0.5, 0.3, 0.2], [0.25, 0.25, 0.5]]], np.float32))
  return distillation.token_divergence(name, logits, logits[:, ::-1], None, temperature)


THRESHOLD = r"threshold must be a finite number >= 0 and <= 1 \(a confidence: 0 never stops"
C = r"c must be a finite number >= 0 \(drafter step time over target step time\)"
PROBABILITY = r"it must be a probability in \[0, 1\]"
NOT_FLOATING = r"is not a floating type: use 'float32' or 'bfloat16'"
SEED = r"RANDOM_INIT_SEED must be an integer >= 0 \(None: weights from checkpoints\), got"
TAU = r"the divergence temperature tau is {}: give a finite number > 0 \(p and q are softmax"

MORE_CASES = [
    # ---- calibration: calibrate, predict, Positions, confidence_buckets
    *_calls(
        "calibrate",
        _calibrate,
        ValueError,
        [
            (dict(thresholds=[0.0, 1.5]), THRESHOLD + r".*got 1\.5"),
            (dict(thresholds=[-0.1]), THRESHOLD + r".*got -0\.1"),
            (
                dict(thresholds=[]),
                r"thresholds must be a non-empty sequence of numbers in \[0, 1\], got \[\]",
            ),
            (dict(c=math.inf), C + ", got inf"),
            (dict(c="0.1"), C + r", got '0\.1' \(str\)"),
            (
                dict(gammas=2),
                r"gammas must be a non-empty sequence of integers >= 1, e\.g\. \(1, 2, 4\), got 2",
            ),
            (
                dict(verify_cost={2: math.nan}),
                r"verify_cost\(2\) must be a finite number \(the target's time on gamma \+ 1 tokens.*got nan",
            ),
            (
                dict(verify_cost=1.2),
                "verify_cost must be a mapping or a function gamma -> cost, got 1.2",
            ),
            (
                dict(gammas=[1, 2, 3]),
                r"verify_cost has no entry for gamma \[1, 3\] \(it has \[2\]\): measure",
            ),
        ],
    ),
    (
        "calibrate: a fractional gamma",
        lambda: _calibrate(gammas=[2.5], verify_cost=lambda g: 1.2),
        ValueError,
        r"each of gammas must be an integer >= 1 .*got 2\.5 \(float\)",
    ),
    (
        "calibrate: a zero verify cost from a function",
        lambda: _calibrate(verify_cost=lambda g: 0.0),
        ValueError,
        r"verify_cost\(2\) must be > 0 \(the target's time on gamma \+ 1 tokens",
    ),
    (
        "calibrate: positions as a dict",
        lambda: _calibrate(positions={"confidence": [_CONFIDENCE]}),
        ValueError,
        "positions must be a calibration.Positions, got dict",
    ),
    (
        "predict: gamma 0",
        lambda: calibration.predict(_positions(), 0, 0.5, 0.1, 1.2),
        ValueError,
        r"gamma must be an integer >= 1 \(the most drafts per target call\), got 0",
    ),
    (
        "predict: a NaN threshold",
        lambda: calibration.predict(_positions(), 2, math.nan, 0.1, 1.2),
        ValueError,
        THRESHOLD + ".*got nan",
    ),
    (
        "Positions: confidences as text",
        lambda: _positions(np.array(["a", "b", "c"])),
        ValueError,
        r"confidence of sequence 0 must hold real numbers \(the drafter's largest probability\), got dtype <U1",
    ),
    (
        "Positions: a confidence above 1",
        lambda: _positions(np.array([0.9, 1.2, 0.9])),
        ValueError,
        "confidence of sequence 0 holds 1.2 at position 1: " + PROBABILITY,
    ),
    (
        "Positions: NaN beta in the second sequence",
        lambda: _positions(_CONFIDENCE, _BETA, _CONFIDENCE, np.array([math.nan, 0.5, 0.5])),
        ValueError,
        "beta of sequence 1 holds nan at position 0: " + PROBABILITY,
    ),
    (
        "Positions: 2-D arrays",
        lambda: _positions(_CONFIDENCE[None], _BETA[None]),
        ValueError,
        r"must be 1-D of one length, got \(1, 3\) and \(1, 3\)",
    ),
    (
        "confidence_buckets: decreasing edges",
        lambda: calibration.confidence_buckets(_positions(), [1.0, 0.5, 0.0]),
        ValueError,
        r"edges must be at least two increasing numbers \(bucket i is",
    ),
    (
        "confidence_buckets: a NaN edge",
        lambda: calibration.confidence_buckets(_positions(), [0.0, math.nan, 1.0]),
        ValueError,
        "each of edges must be a finite number, got nan",
    ),
    # ---- pairs: PairConfig, from_pair_dir, load_pair, the restore dtype
    *_calls(
        "PairConfig",
        _pair,
        CONFIG_ERROR,
        [
            (dict(restore_dtype="bool"), "RESTORE_DTYPE 'bool' " + NOT_FLOATING),
            (dict(restore_dtype="complex64"), "RESTORE_DTYPE 'complex64' " + NOT_FLOATING),
            (
                dict(restore_dtype="float33"),
                "RESTORE_DTYPE 'float33' is not a dtype: use 'float32' or 'bfloat16'",
            ),
            (dict(restore_dtype=16), "RESTORE_DTYPE 16 is not a dtype"),
            (dict(random_init_seed="0"), SEED + r" '0' \(str\)"),
            (dict(random_init_seed=-1), SEED + " -1"),
            (dict(random_init_seed=1.5), SEED + r" 1\.5 \(float\)"),
            (
                dict(checkpoint_path=5),
                "CHECKPOINT_PATH must be a checkpoint's path as a string .* or None, got 5",
            ),
        ],
    ),
    (
        "PairConfig: DRAFTER_CHECKPOINT_PATH a list",
        lambda: _pair(drafter=drafters.T5Drafter(CONFIG), drafter_checkpoint_path=["a"]),
        CONFIG_ERROR,
        r"DRAFTER_CHECKPOINT_PATH must be a checkpoint's path as a string .*got \['a'\]",
    ),
    (
        "from_pair_dir: restore_dtype int16",
        lambda: pairs.PairConfig.from_pair_dir("/nonexistent/pair", "int16"),
        CONFIG_ERROR,
        "from_pair_dir's restore_dtype 'int16' " + NOT_FLOATING,
    ),
    (
        "from_pair_dir: not a pair",
        lambda: pairs.PairConfig.from_pair_dir("/nonexistent/pair"),
        FileNotFoundError,
        r"/nonexistent/pair/target does not exist: .* is not a pair written by pairs\.save_pair",
    ),
    (
        "restore_params: dtype int8 before the path is read",
        lambda: checkpoints.restore_params(CONFIG, "/nonexistent/ckpt", dtype="int8"),
        BAD,
        "restore dtype 'int8' " + NOT_FLOATING,
    ),
    (
        "restore_model: an unknown dtype before config.json is read",
        lambda: checkpoints.restore_model("/nonexistent/model", dtype="bf16"),
        BAD,
        "restore dtype 'bf16' is not a dtype",
    ),
    # ---- distillation: token_divergence and the Distillation settings
    *_calls(
        "token_divergence",
        _divergence,
        ValueError,
        [
            (dict(temperature=0.0), TAU.format(r"0\.0")),
            (dict(temperature=-1.0, name="jsd"), TAU.format(r"-1\.0")),
            (dict(temperature=[1.0, 2.0]), TAU.format(r"\[1\.0, 2\.0\]")),
            (dict(temperature="1"), TAU.format("'1'")),
        ],
    ),
    *_calls(
        "Distillation",
        _distillation,
        CONFIG_ERROR,
        [
            (
                dict(target_dir=5),
                "Distillation.target_dir is 5: give the frozen target's checkpoints.save_model directory",
            ),
            (
                dict(divergence="TVD"),
                r"Distillation.divergence is 'TVD': use one of \('forward_kl'",
            ),
            (dict(divergence=None), "Distillation.divergence is None: use one of"),
            (dict(data="Drafter"), r"Distillation.data is 'Drafter': use one of \('references'"),
            (
                dict(data_temperature=True),
                "Distillation.data_temperature is True: give a finite number",
            ),
            (
                dict(data_temperature=math.inf),
                "Distillation.data_temperature is inf: give a finite number",
            ),
            (
                dict(divergence_temperature=-1.0),
                r"Distillation.divergence_temperature is -1\.0: give tau > 0",
            ),
            (
                dict(divergence_temperature=np.array([1.0])),
                r"Distillation.divergence_temperature is array\(\[1\.\]\): give a finite number",
            ),
            (
                dict(data="mixed", mix_fraction=-0.1),
                r"Distillation.mix_fraction is -0\.1: give a probability in \[0, 1\]",
            ),
            (
                dict(data="mixed", mix_fraction="0.5"),
                "Distillation.mix_fraction is '0.5': give a finite number",
            ),
        ],
    ),
]


# ----------------------------------------------------------------------------- the scripts

OUTPUT_FLAGS = {
    "infer.py": "--gin.INFER_OUTPUT_DIR='{out}'",
    "train.py": "--model_dir={out}",
    "measure_alpha.py": "--gin.ALPHA_OUTPUT_DIR='{out}'",
    "calibrate_draft_length.py": "--gin.CALIBRATION_OUTPUT_DIR='{out}'",
    "benchmark.py": "--output_dir={out}",
    "evaluate_demo.py": "--output_dir={out}",
}
START_UP_CHATTER = bootstrap._START_UP_CHATTER  # pylint: disable=protected-access
_INFER_TINY = [  # infer.gin, a unigram drafter, a tiny target
    "--gin_file=configs/runs/infer.gin",
    "--gin_file=configs/drafters/unigram.gin",
    "--gin_file=configs/models/t5_1_1_tiny.gin",
    "--gin_file=configs/tasks/demo_ende.gin",
    "--gin.TARGET_CONFIG=%T5_1_1_TINY",
]
_RANDOM = ["--gin.CHECKPOINT_PATH=None", "--gin.RANDOM_INIT_SEED=0"]
_DISTILL = ["--gin_file=configs/demo/train_drafter.gin", "--distill_from=demo_models/target"]
_TRAIN_TINY = [
    "--gin_file=configs/runs/train.gin",
    "--gin_file=configs/models/t5_1_1_tiny.gin",
    "--gin.MODEL_CONFIG=%T5_1_1_TINY",
]
# (case, script, flags, the start of its error line). The fixture adds the output directory's
# flag; a refused run must leave nothing there, config.gin included (which infer.py and train.py
# wrote before their settings were checked).
SCRIPT_CASES = [
    # first round: one bad flag per script
    (
        "infer.py: TEMPERATURE -1.0",
        "infer.py",
        [*_INFER_TINY, *_RANDOM, "--gin.TEMPERATURE=-1.0"],
        "infer.py: configuration error: temperature must be >= 0 and finite",
    ),
    (
        "measure_alpha.py: a negative temperature",
        "measure_alpha.py",
        ["--gin.TEMPERATURES=(0.0, -1.0)"],
        "measure_alpha.py: configuration error: TEMPERATURES (0.0, -1.0): temperature must be >= 0",
    ),
    (
        "train.py: a NaN --distill_temperature",
        "train.py",
        [
            "--gin_file=configs/runs/train.gin",
            "--distill_from=demo_models/target",
            "--distill_temperature=nan",
        ],
        "train.py: configuration error: --distill_temperature=nan: temperature must be >= 0 and "
        "finite",
    ),
    (
        "benchmark.py: a NaN temperature",
        "benchmark.py",
        ["--costs_only", "--temperatures=0,nan"],
        "benchmark.py: configuration error: temperatures (0.0, nan): temperature must be >= 0 and "
        "finite",
    ),
    (
        "evaluate_demo.py: gamma 0",
        "evaluate_demo.py",
        ["--gammas=2,0"],
        "evaluate_demo.py: configuration error: --gammas=2,0: give integers >= 1",
    ),
    # second round
    (
        "infer.py: RESTORE_DTYPE int8",
        "infer.py",
        [*_INFER_TINY, *_RANDOM, "--gin.RESTORE_DTYPE='int8'"],
        "infer.py: configuration error: RESTORE_DTYPE 'int8' is not a floating type: use "
        "'float32' or 'bfloat16'",
    ),
    (
        "infer.py: RANDOM_INIT_SEED as text",
        "infer.py",
        [*_INFER_TINY, "--gin.CHECKPOINT_PATH=None", "--gin.RANDOM_INIT_SEED='0'"],
        "infer.py: configuration error: RANDOM_INIT_SEED must be an integer >= 0",
    ),
    (
        "infer.py: a missing CHECKPOINT_PATH",
        "infer.py",
        [*_INFER_TINY, "--gin.CHECKPOINT_PATH='/nonexistent/ckpt'"],
        "infer.py: configuration error: CHECKPOINT_PATH '/nonexistent/ckpt': no checkpoint at",
    ),
    (
        "train.py: label smoothing in a distillation",
        "train.py",
        [*_DISTILL, "--gin.training.train.label_smoothing=0.1"],
        "train.py: configuration error: label_smoothing = 0.1 does not apply to distillation",
    ),
    (
        "train.py: a gin distill_temperature without distill_from",
        "train.py",
        [
            "--gin_file=configs/runs/train.gin",
            "--gin_file=configs/models/t5_1_1_tiny.gin",
            "--gin.MODEL_CONFIG=%T5_1_1_TINY",
            "--gin.training.train.distill_temperature=0.5",
        ],
        "train.py: configuration error: distill_temperature = 0.5 without distill_from",
    ),
    # third round: the settings train checks, unknown tasks, unused bindings refused before any
    # work, a calibration decode too short to time
    (
        "train.py: BATCH_SIZE 0",
        "train.py",
        [*_TRAIN_TINY, "--gin.BATCH_SIZE=0"],
        "train.py: configuration error: training.train.batch_size must be an integer >= 1",
    ),
    (
        "train.py: an unknown task",
        "train.py",
        [*_TRAIN_TINY, "--gin.MIXTURE_OR_TASK_NAME='demo_end'"],
        "train.py: configuration error: training.train.mixture_or_task_name: unknown task or "
        "mixture 'demo_end': did you mean 'demo_ende'?",
    ),
    (
        "train.py: a binding of a configurable train never calls",
        "train.py",
        [*_TRAIN_TINY, "--gin.drafters.SharedEncoderDrafter.encoder_emb_dim=1"],
        "train.py: configuration error: gin binding(s) this run never used:",
    ),
    (
        "train.py: a model file without its run file",
        "train.py",
        ["--gin_file=configs/models/t5_1_1_tiny.gin"],
        "train.py: configuration error: train needs ['mixture_or_task_name', "
        "'task_feature_lengths'], which no gin file of this run binds (files: "
        "configs/models/t5_1_1_tiny.gin): give the run file that binds them first",
    ),
    (
        "infer.py: a drafter file without its run file",
        "infer.py",
        ["--gin_file=configs/drafters/bigram.gin"],
        "The gin files parsed (configs/drafters/bigram.gin) read none of INFER_OUTPUT_DIR: if a "
        "run file that reads them is missing, give it first",
    ),
    (
        "measure_alpha.py: an unknown task",
        "measure_alpha.py",
        ["--gin.MIXTURE_OR_TASK_NAME='demo_end'"],
        "measure_alpha.py: configuration error: MIXTURE_OR_TASK_NAME: unknown task or mixture "
        "'demo_end': did you mean 'demo_ende'?",
    ),
    (
        "measure_alpha.py: a binding of a configurable it never calls",
        "measure_alpha.py",
        ["--gin.trees.DraftTree.parents=(0,)"],
        "measure_alpha.py: configuration error: gin binding(s) this run never used:",
    ),
    (
        "calibrate_draft_length.py: a decode too short to time",
        "calibrate_draft_length.py",
        ["--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 4}"],
        "calibrate_draft_length.py: configuration error: TASK_FEATURE_LENGTHS['targets'] = 4 is "
        "too short to time the decode steps",
    ),
    (
        "calibrate_draft_length.py: an unknown task",
        "calibrate_draft_length.py",
        ["--gin.MIXTURE_OR_TASK_NAME='wmt_ende'"],
        "calibrate_draft_length.py: configuration error: MIXTURE_OR_TASK_NAME: unknown task or "
        "mixture 'wmt_ende'",
    ),
    (
        "benchmark.py: an unknown task, before the models load",
        "benchmark.py",
        ["--task=demo_end"],
        "benchmark.py: configuration error: the inputs (--task, --split, --input_file, "
        "--num_examples): unknown task or mixture 'demo_end': did you mean 'demo_ende'?",
    ),
    (
        "benchmark.py: a split the task does not have, before the models load",
        "benchmark.py",
        ["--task=demo_ende", "--split=tset"],
        "benchmark.py: configuration error: the inputs (--task, --split, --input_file, "
        "--num_examples): the split 'tset' is not a split of demo_ende: use one of ['test', "
        "'train', 'validation'].",
    ),
    (
        "infer.py: a binding in a scope no call enters, before the models load",
        "infer.py",
        [*_INFER_TINY, *_RANDOM, "--gin.t5_1_1_tny/network.T5Config.dropout_rate=0.0"],
        "infer.py: configuration error: gin binding(s) this run never used:",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def script_runs(request, tmp_path_factory):
  """The cases of SCRIPT_CASES this session runs, all started when the module starts (most of each
  run is importing jax, TensorFlow and seqio: `ScriptRuns` forks all but each script's first
  case from one process that imported them once) -> case -> (its run, its output directory)."""
  selected = {
      item.callspec.params["case"]
      for item in request.session.items
      if item.originalname == test_a_bad_setting_stops_the_script_before_it_writes_anything.__name__
  }
  runs = ScriptRuns(tmp_path_factory.mktemp("forks"))
  outs = {}
  for case, script, flags, _ in SCRIPT_CASES:
    if case in selected:
      outs[case] = tmp_path_factory.mktemp("script") / "out"
      runs.add(case, script, *flags, OUTPUT_FLAGS[script].format(out=outs[case]))
  runs.start()
  yield {case: (runs[case], out) for case, out in outs.items()}
  runs.stop()


@pytest.mark.parametrize(
    "case, expected",
    [(case, line) for case, _, _, line in SCRIPT_CASES],
    ids=[case for case, *_ in SCRIPT_CASES],
)
def test_a_bad_setting_stops_the_script_before_it_writes_anything(case, expected, script_runs):
  """config.gin included: infer.py and train.py wrote it before their settings were checked. The
  scripts print no TensorFlow start-up line either (whatever they import first; checked where it
  can show: each script's first case, run as its own process)."""
  run, out = script_runs[case]
  returncode, _, stderr = run.result()
  assert returncode == 1, stderr[-3000:]
  assert any(line.startswith(expected) for line in stderr.splitlines()), stderr[-3000:]
  assert not out.exists(), sorted(p.name for p in out.iterdir())
  chatter = [line for line in stderr.splitlines() if START_UP_CHATTER.search(line)]
  assert not chatter, chatter


# ----------------------------------------------------------------------------- third round:
# trees, adaptive draft length, the shared-encoder drafter, distillation, calibration, pairs,
# training and the scripts' flags (their own cases)

_NEVER_WRITTEN = pathlib.Path(tempfile.gettempdir()) / "test_bad_inputs_refused_run"
_SHARED = functools.partial(drafters.SharedEncoderDrafter, CONFIG)
_BIG_VOCAB = tiny_config(64, emb_dim=8, head_dim=4, mlp_dim=16, num_decoder_layers=1)


def _train(**changes):
  """`training.train` with a good tiny setting and `changes`; a refused run must write nothing."""
  kwargs = dict(
      model_config=CONFIG,
      mixture_or_task_name="demo_ende",
      task_feature_lengths=LENGTHS,
      progress=False,
  )
  try:
    return training.train(changes.pop("model_dir", _NEVER_WRITTEN), **{**kwargs, **changes})
  finally:
    assert not _NEVER_WRITTEN.exists(), "a refused run wrote its model_dir"


def _tree_model(tree=(2, 1), **changes):
  return _speculative_model(draft_tree=tree, verifier=speculative.TreeVerifier(), **changes)


def _scores(confidence=(1, 3), beta=(1, 3), sequences=(1, 3), eos_id=1, dtype=np.int32):
  return calibration.positions_from_scores(
      np.full(confidence, 0.5), np.full(beta, 0.5), np.ones(sequences, dtype), eos_id
  )


def _load(config=None, eos_id=1, fit_targets=None):
  config = _pair(drafter=table_drafters.BigramDrafter()) if config is None else config
  return pairs.load_pair(config, eos_id, fit_targets)


TREE_BRANCHING = r"a draft tree's branching must hold integers >= 1 \(children per node\), got "
THRESHOLD_RULE = r"ConfidenceStop\.threshold must be"
SHARED_WIDTH = r"its encoder_emb_dim 16 != the target's emb_dim 8: it cross-attends to the target's"
LATER_TRAINING = "distil against"  # a missing or unfit target, named before anything is built
WIDE_DRAFTER_PARAMS = (
    r"^params\['drafter'\] are not this SharedEncoderDrafter's parameters \(\d+ problem\(s\); "
    r"the first: decoder/decoder_norm/scale is \(16,\), the SharedEncoderDrafter needs \(8,\)\)"
    r": .*Restore them with the drafter they were saved with \(pairs\.PairConfig\.from_pair_dir"
)

# (setting, bad value, the value as the message shows it, the least good value, its meaning):
# each a case of THIRD_CASES.
_TRAIN_INTEGERS = [
    ("batch_size", 0, "0", 1, "training rows per step"),
    ("batch_size", "32", r"'32' \(str\)", 1, "training rows per step"),
    ("batch_size", 2.5, r"2\.5 \(float\)", 1, "training rows per step"),
    ("num_steps", 0, "0", 1, "the step training ends at"),
    ("eval_period", -1, "-1", 0, "steps between evaluations; 0: never"),
    ("log_period", 0, "0", 1, "steps between log lines"),
    ("keep_checkpoints", 0, "0", 1, "checkpoints kept"),
    ("seed", -1, "-1", 0, "the data order and the initialization"),
    ("eval_examples", 0, "0", 1, "examples evaluated on; None: the whole split"),
]
_TRAIN_INTEGER_CASES = [
    (
        f"train: {setting} {value!r}",
        functools.partial(_train, **{setting: value}),
        CONFIG_ERROR,
        rf"training\.train\.{setting} must be an integer >= {least} \({re.escape(meaning)}\), "
        f"got {shown}",
    )
    for setting, value, shown, least, meaning in _TRAIN_INTEGERS
]


_SPM = str(REPO / "demo_models" / "sentencepiece.model")

THIRD_CASES = [
    # ---- the inputs of a sweep (scripts/benchmark.py), checked before anything loads
    (
        "inputs: an empty task name, not ignored",
        lambda: input_data.check_input_source("", "test", None, None, 2),
        ValueError,
        r"the task or mixture name must be a non-empty string, got ''",
    ),
    (
        "inputs: a task and an input file",
        lambda: input_data.check_input_source("demo_ende", "test", _SPM, _SPM, 2),
        ValueError,
        r"give a task \(demo_ende\) or an input file \(.*\), not both",
    ),
    (
        "inputs: an empty split name",
        lambda: input_data.check_input_source("demo_ende", "", None, None, 2),
        ValueError,
        r"the split \(a split's name, e\.g\. 'validation'\) must be a non-empty string",
    ),
    (
        "inputs: an input file without a sentencepiece model",
        lambda: input_data.check_input_source(None, "test", _SPM, None, 2),
        ValueError,
        r"the input file '.*' needs a sentencepiece model to tokenize it",
    ),
    (
        "inputs: an input file that does not exist",
        lambda: input_data.check_input_source(None, "test", "/nonexistent/lines.txt", _SPM, 2),
        ValueError,
        r"the input file '/nonexistent/lines\.txt' does not exist",
    ),
    (
        "inputs: a sentencepiece model that does not exist",
        lambda: input_data.check_input_source(None, "test", _SPM, "/nonexistent/spm.model", 2),
        ValueError,
        r"the sentencepiece model '/nonexistent/spm\.model' does not exist",
    ),
    (
        "inputs: a negative count of examples",
        lambda: input_data.check_input_source(None, "test", None, None, -1),
        ValueError,
        r"num_examples must be >= 0 \(0: every example\), got -1",
    ),
    (
        "inputs: a count of examples as text",
        lambda: input_data.check_input_source(None, "test", None, None, "2"),
        ValueError,
        r"num_examples must be an integer >= 0, got '2'",
    ),
    (
        "inputs: no random examples",
        lambda: input_data.check_input_source(None, "test", None, None, 0),
        ValueError,
        r"random inputs need num_examples >= 1, got 0",
    ),
    # ---- draft trees
    (
        "tree: more siblings than the vocabulary has tokens",
        lambda: _tree_model(tree=(V + 1,)),
        ValueError,
        rf"gives a node {V + 1} children, but the vocabulary has {V} tokens .*at most {V} children",
    ),
    (
        "distillation: logits of two shapes",
        lambda: distillation.token_divergence("tvd", np.zeros((1, 2, 5)), np.zeros((1, 2, 6))),
        ValueError,
        r"target_logits \(1, 2, 5\) and drafter_logits \(1, 2, 6\) must have one shape",
    ),
    (
        "jit_predict: a temperature as a Python list",
        lambda: _jit("spec", temperature=[0.5]),
        ValueError,
        r"temperature \[0\.5\] is a Python list: give a number, or per-row temperatures as an "
        r"array",
    ),
    (
        "model: the baseline's loop as decode_fn",
        lambda: _speculative_model(decode_fn=decoding.temperature_sample),
        ValueError,
        "decode_fn=decoding.temperature_sample is the baseline's loop.*use EncoderDecoderModel",
    ),
    *_calls(
        "tree",
        trees.DraftTree.from_branching,
        ValueError,
        [
            (dict(branching=(2, 0)), TREE_BRANCHING + "0 at depth 2"),
            (dict(branching=(2.5,)), TREE_BRANCHING + r"2\.5 at depth 1"),
            (dict(branching=(-1,)), TREE_BRANCHING + "-1"),
            (dict(branching=()), r"branching is empty: give at least one depth, e\.g\. \(2,\)"),
            (
                dict(branching="22"),
                r"must be a tuple \(k_1, \.\.\., k_D\) of children per depth, got '22'",
            ),
        ],
    ),
    (
        "tree: a parent after its node",
        lambda: trees.DraftTree((0, 2)),
        ValueError,
        r"DraftTree\.parents\[1\] = 2 must be in \[0, 1\]",
    ),
    (
        "tree: a bool parent",
        lambda: trees.DraftTree((0, True)),
        ValueError,
        r"DraftTree\.parents\[1\] must be an integer, got True",
    ),
    (
        "tree model: Algorithm 1's verifier",
        lambda: _speculative_model(draft_tree=(2, 1), verifier=speculative.TokenVerifier()),
        BAD,
        r"TokenVerifier verifies chains only: use speculative\.TreeVerifier\(\)",
    ),
    (
        "tree model: gamma not the depth",
        lambda: _tree_model(gamma=3),
        BAD,
        r"gamma 3 != the draft tree's depth 2",
    ),
    (
        "tree model: with a draft_stop",
        lambda: _tree_model(draft_stop=draft_length.ConfidenceStop(0.5)),
        BAD,
        "works on chains only: give draft_tree or draft_stop, not both",
    ),
    (
        "tree model: prompt lookup",
        lambda: _tree_model(drafter=table_drafters.PromptLookupDrafter()),
        BAD,
        "PromptLookupDrafter proposes chains only, not a draft tree",
    ),
    (
        "tree model: a tree as a dict",
        lambda: _speculative_model(draft_tree={"a": 1}),
        ValueError,
        r"branching must be a tuple .*got \{'a': 1\}",
    ),
    # ---- adaptive draft length
    *_calls(
        "ConfidenceStop",
        draft_length.ConfidenceStop,
        ValueError,
        [
            (dict(threshold=1.5), THRESHOLD_RULE + r" in \[0, 1\] \(a probability\), got 1\.5"),
            (dict(threshold=math.nan), THRESHOLD_RULE + r" in \[0, 1\] \(a probability\), got nan"),
            (dict(threshold="0.5"), THRESHOLD_RULE + r" a number in \[0, 1\], got '0\.5'"),
            (dict(threshold=True), THRESHOLD_RULE + r" a number in \[0, 1\], got True"),
            (
                dict(threshold=0.5, measure="mean"),
                r"ConfidenceStop\.measure must be one of \('max', 'draft'\), got 'mean'",
            ),
        ],
    ),
    (
        "spec init: draft_stop a number as text",
        lambda: _speculative_model(draft_stop="0.5"),
        ValueError,
        r"draft_stop must be a draft_length rule .*got '0\.5'",
    ),
    # ---- the shared-encoder drafter
    (
        "SharedEncoderDrafter: encoder_emb_dim 0",
        lambda: _SHARED(0),
        ValueError,
        r"SharedEncoderDrafter\.encoder_emb_dim must be an integer >= 1, got 0",
    ),
    (
        "SharedEncoderDrafter: a fractional encoder_emb_dim",
        lambda: _SHARED(7.5),
        ValueError,
        r"encoder_emb_dim must be an integer >= 1, got 7\.5",
    ),
    (
        "SharedEncoderDrafter: no config",
        lambda: drafters.SharedEncoderDrafter(None, 8),
        ValueError,
        r"SharedEncoderDrafter needs a network\.T5Config",
    ),
    (
        "SharedEncoderDrafter: another width in a pair",
        lambda: _pair(drafter=_SHARED(16)),
        CONFIG_ERROR,
        r"DRAFTER \(SharedEncoderDrafter\) does not fit TARGET_CONFIG: .*" + SHARED_WIDTH,
    ),
    (
        "SharedEncoderDrafter: another width in a model",
        lambda: _speculative_model(drafter=_SHARED(16)),
        ValueError,
        SHARED_WIDTH,
    ),
    (
        "SharedEncoderDrafter: another vocabulary in a pair",
        lambda: _pair(drafter=drafters.SharedEncoderDrafter(_BIG_VOCAB, 8)),
        CONFIG_ERROR,
        r"vocab_size 64 != TARGET_CONFIG vocab_size 32",
    ),
    (
        "restore_drafter_params(SharedEncoderDrafter): no checkpoint, before reading",
        lambda: checkpoints.restore_drafter_params(
            drafters.SharedEncoderDrafter(CONFIG, 8), "/nonexistent/drafter"
        ),
        FileNotFoundError,
        "no checkpoint at /nonexistent/drafter",
    ),
    (
        "restore_params: no checkpoint, before tracing",
        lambda: checkpoints.restore_params(CONFIG, "/nonexistent/target"),
        FileNotFoundError,
        "no checkpoint at /nonexistent/target",
    ),
    # ---- distillation
    *_calls(
        "Distillation",
        _distillation,
        CONFIG_ERROR,
        [
            (dict(target_dir=""), r"Distillation\.target_dir is '': give the frozen target's"),
            (
                dict(data="mixed", mix_fraction=1.5),
                r"mix_fraction is 1\.5: give a probability in \[0, 1\]",
            ),
            (dict(divergence_temperature=0), "divergence_temperature is 0: give tau > 0"),
            (dict(unroll_steps=0), r"unroll_steps is 0: give an integer >= 1"),
            (dict(step_decay=2.0), r"step_decay is 2\.0: give a weight in \(0, 1\]"),
            (
                dict(feature_loss_weight=-1.0),
                r"feature_loss_weight is -1\.0: give a finite number >= 0",
            ),
            (dict(feature_noise=math.nan), "feature_noise is nan: give a finite number >= 0"),
        ],
    ),
    (
        "checked_drafter: no target at target_dir",
        lambda: distillation.checked_drafter(_distillation(), drafters.T5Drafter(CONFIG), V, 1, {}),
        CONFIG_ERROR,
        r"Distillation\.target_dir '/runs/target/model': .*not a directory written by save_model",
    ),
    # ---- calibration
    (
        "calibrate: gamma 0",
        lambda: _calibrate(gammas=[0], verify_cost=lambda g: 1.2),
        BAD,
        r"each of gammas must be an integer >= 1 .*got 0",
    ),
    ("calibrate: a negative c", lambda: _calibrate(c=-0.1), BAD, C + r", got -0\.1"),
    (
        "calibrate: thresholds as text",
        lambda: _calibrate(thresholds="0.5"),
        ValueError,
        r"thresholds must be a non-empty sequence of numbers in \[0, 1\], got '0\.5'",
    ),
    (
        "calibrate: a cost table keyed by text",
        lambda: _calibrate(verify_cost={"2": 1.2}),
        ValueError,
        r"verify_cost has no entry for gamma \[2\] \(it has \['2'\]\)",
    ),
    (
        "Positions: no sequence",
        lambda: calibration.Positions([], []),
        ValueError,
        r"need one confidence and one beta array per sequence, got 0 and 0",
    ),
    (
        "Positions: two confidences, one beta",
        lambda: calibration.Positions([_CONFIDENCE] * 2, [_BETA]),
        ValueError,
        "got 2 and 1",
    ),
    (
        "Positions: a beta shorter than its confidence",
        lambda: _positions(_CONFIDENCE, _BETA[:2]),
        ValueError,
        r"must be 1-D of one length, got \(3,\) and \(2,\)",
    ),
    (
        "positions_from_scores: a beta longer than the sequences",
        lambda: _scores(beta=(1, 4)),
        ValueError,
        r"confidence, beta and sequences must each be \[batch, length\], one shape .*got \(1, 3\), \(1, 4\) and \(1, 3\)",
    ),
    (
        "positions_from_scores: 1-D scores",
        lambda: _scores((3,), (3,), (3,)),
        ValueError,
        r"must each be \[batch, length\]",
    ),
    ("positions_from_scores: eos_id 0", lambda: _scores(eos_id=0), BAD, EOS),
    (
        "positions_from_scores: float sequences",
        lambda: _scores(dtype=np.float32),
        ValueError,
        "sequences must hold integer token ids, got dtype float32",
    ),
    (
        "confidence_buckets: one edge",
        lambda: calibration.confidence_buckets(_positions(), [0.5]),
        ValueError,
        r"edges must be at least two increasing numbers",
    ),
    (
        "predict: a zero verify cost",
        lambda: calibration.predict(_positions(), 2, 0.5, 0.1, 0.0),
        ValueError,
        r"verify_cost\(2\) must be > 0",
    ),
    (
        "predict: a bool threshold",
        lambda: calibration.predict(_positions(), 2, True, 0.1, 1.2),
        BAD,
        THRESHOLD + r".*got True \(bool\)",
    ),
    (
        "predict: gamma 2.0",
        lambda: calibration.predict(_positions(), 2.0, 0.5, 0.1, 1.2),
        BAD,
        r"gamma must be an integer >= 1 .*got 2\.0 \(float\)",
    ),
    (
        "predict: a NaN c",
        lambda: calibration.predict(_positions(), 2, 0.5, math.nan, 1.2),
        BAD,
        C + ", got nan",
    ),
    # ---- pairs
    (
        "PairConfig: TARGET_CONFIG None",
        lambda: pairs.PairConfig(target_config=None, random_init_seed=0),
        CONFIG_ERROR,
        r"TARGET_CONFIG must be a network\.T5Config",
    ),
    (
        "PairConfig: DRAFTER a name",
        lambda: _pair(drafter="bigram"),
        CONFIG_ERROR,
        r"DRAFTER must be a drafters\.Drafter, e\.g\. @drafters\.T5Drafter\(\)",
    ),
    (
        "PairConfig: a drafter of another vocabulary",
        lambda: _pair(drafter=drafters.T5Drafter(_BIG_VOCAB)),
        CONFIG_ERROR,
        r"DRAFTER \(T5Drafter\) vocab_size 64 != TARGET_CONFIG vocab_size 32",
    ),
    (
        "PairConfig: no checkpoint and no seed",
        lambda: pairs.PairConfig(target_config=CONFIG),
        CONFIG_ERROR,
        "CHECKPOINT_PATH not set: give the checkpoint",
    ),
    (
        "from_pair_dir: a number",
        lambda: pairs.PairConfig.from_pair_dir(5),
        CONFIG_ERROR,
        r"from_pair_dir needs the directory pairs\.save_pair wrote .*got 5",
    ),
    (
        "from_pair_dir: None",
        lambda: pairs.PairConfig.from_pair_dir(None),
        CONFIG_ERROR,
        "from_pair_dir needs the directory .*got None",
    ),
    (
        "from_pair_dir: an empty path",
        lambda: pairs.PairConfig.from_pair_dir(""),
        CONFIG_ERROR,
        "from_pair_dir needs the directory .*got ''",
    ),
    (
        "load_pair: a dict for the config",
        lambda: _load({"checkpoint_path": None}),
        CONFIG_ERROR,
        r"load_pair needs a pairs\.PairConfig .*got dict",
    ),
    (
        "load_pair: eos_id 0, before the target is made",
        lambda: _load(eos_id=0),
        CONFIG_ERROR,
        "load_pair: eos_id is 0, but it must be an integer >= 1",
    ),
    (
        "load_pair: eos_id = vocab_size",
        lambda: _load(eos_id=V),
        CONFIG_ERROR,
        "load_pair: eos_id 32 is not an id of the model",
    ),
    (
        "load_pair: an n-gram drafter with nothing to fit it on",
        lambda: _load(),
        CONFIG_ERROR,
        "the BigramDrafter is fitted on target sequences, and this run has none",
    ),
    (
        "load_pair: fit_targets not a function",
        lambda: _load(fit_targets=[[5, 1]]),
        CONFIG_ERROR,
        r"fit_targets must be a function \(\) -> target token sequences",
    ),
    # ---- training.train and make_optimizer: before the task is read or anything is written
    *_TRAIN_INTEGER_CASES,
    (
        "train: pack as text",
        lambda: _train(pack="yes"),
        CONFIG_ERROR,
        "training.train.pack must be True or False, got 'yes'",
    ),
    (
        "train: feature lengths without targets",
        lambda: _train(task_feature_lengths={"inputs": 8}),
        CONFIG_ERROR,
        r"training\.train\.task_feature_lengths .* \(missing: \['targets'\]",
    ),
    (
        "train: an unknown task",
        lambda: _train(mixture_or_task_name="demo_end"),
        CONFIG_ERROR,
        r"training\.train\.mixture_or_task_name: unknown task or mixture 'demo_end': did you mean 'demo_ende'\? Give a registered name",
    ),
    (
        "train: an unknown eval_split",
        lambda: _train(eval_split="valid"),
        CONFIG_ERROR,
        r"eval_split 'valid' is not a split of demo_ende: use one of \['test', 'train', 'validation'\]",
    ),
    (
        "train: a missing init_from",
        lambda: _train(init_from="/nonexistent/model"),
        CONFIG_ERROR,
        r"training\.train\.init_from '/nonexistent/model' does not exist",
    ),
    (
        "train: model_dir a file",
        lambda: _train(model_dir=REPO / "README.md"),
        CONFIG_ERROR,
        r"model_dir .*README\.md is a file: give a directory",
    ),
    (
        "train: model_config a name",
        lambda: _train(model_config="t5_1_1_tiny"),
        CONFIG_ERROR,
        r"training\.train\.model_config must be a network\.T5Config",
    ),
    (
        "train: a model smaller than the task's vocabulary",
        lambda: _train(),
        CONFIG_ERROR,
        r"model vocab_size 32 < the task vocabulary's \d+ pieces",
    ),
    *_calls(
        "make_optimizer",
        functools.partial(training.make_optimizer, 10),
        CONFIG_ERROR,
        [
            (
                dict(learning_rate=math.nan),
                r"make_optimizer\.learning_rate must be a finite number > 0 .*got nan",
            ),
            (
                dict(clip_norm=-1.0),
                r"make_optimizer\.clip_norm must be a finite number > 0 .*got -1\.0",
            ),
            (
                dict(warmup_steps=1.5),
                r"make_optimizer\.warmup_steps must be an integer >= 0, got 1\.5",
            ),
        ],
    ),
    # ---- tasks and batches
    (
        "get_task: a misspelt name",
        lambda: tasks.get_task("wmt_t2t_ende_v03"),
        BAD,
        r"unknown task or mixture 'wmt_t2t_ende_v03': did you mean 'wmt_t2t_ende_v003'\? Give a registered name \(in gin, MIXTURE_OR_TASK_NAME",
    ),
    (
        "get_task: an empty name",
        lambda: tasks.get_task(""),
        BAD,
        "the task or mixture name must be a non-empty string, got ''",
    ),
    (
        "base: token arrays as nested lists",
        lambda: _predict(batch=_batch(encoder_input_tokens=ENC.tolist())),
        BAD,
        r"batch feature encoder_input_tokens is a list, not an array: give a \[batch, length\] array",
    ),
    (
        "spec: a text feature beside the tokens",
        lambda: _predict("spec", _batch(inputs_pretokenized=np.array([b"a", b"b"]))),
        BAD,
        r"batch feature\(s\) \['inputs_pretokenized'\] hold text",
    ),
    (
        "jit_predict: a text feature beside the tokens",
        lambda: _jit(batch=_batch(targets_pretokenized=np.array([b"a", b"b"]))),
        BAD,
        r"\['targets_pretokenized'\] hold text, which the model does not read \(and a jitted call cannot take\)",
    ),
    (
        "score: a text feature beside the tokens",
        lambda: _score(_batch(inputs_pretokenized=np.array(["a", "b"]))),
        BAD,
        r"\['inputs_pretokenized'\] hold text",
    ),
    # ---- parameters of another drafter
    (
        "shared: drafter params of another width",
        lambda: _world().shared.predict_batch_with_aux(_world().wide_shared_params, _batch()),
        BAD,
        WIDE_DRAFTER_PARAMS,
    ),
    (
        "jit_predict: drafter params of another width",
        lambda: _world().shared.jit_predict()(
            _world().wide_shared_params, _batch(), _world().rng, 0.0
        ),
        BAD,
        WIDE_DRAFTER_PARAMS,
    ),
    (
        "spec: the target's params alone",
        lambda: _world().spec.predict_batch_with_aux(_world().params["base"], _batch()),
        BAD,
        r"params of a SpeculativeEncoderDecoderModel must be a mapping \{'target': \.\.\., "
        r"'drafter': \.\.\.\} .*got one with the keys \['decoder', 'encoder', 'token_embedder'\]",
    ),
]


# ---- stop rules of another dtype or shape, refused where the model is built and where
# the loop is called, before the loop is traced: the rule alone is traced, once, on abstract
# arguments (logits [2, V], drafts [2]).

STOP_RULE = r"a draft_length rule must return bool \[rows\], one stop flag per row"
# (what the rule returns, the rule, what the message says it returns)
_BAD_STOP_RULES = [
    ("a float score", lambda logits, drafts: jnp.max(logits, axis=-1), r"returns float32 \[2\]"),
    (
        "a [rows, 1] column",
        lambda logits, drafts: jnp.max(logits, axis=-1, keepdims=True) < 0,
        r"returns bool \[2, 1\]",
    ),
    ("one flag for every row", lambda logits, drafts: jnp.all(logits < 0), r"returns bool \[\]"),
    ("a flag per vocabulary entry", lambda logits, drafts: logits[0] < 0, r"returns bool \[32\]"),
    ("no array", lambda logits, drafts: None, "returns None"),
    (
        "Python control flow on a traced array",
        lambda logits, drafts: drafts if drafts[0] else drafts,
        r"fails when called on (?=.*TracerBoolConversionError)",
    ),
]


@pytest.mark.parametrize("make", [_speculative_model, _speculative_sample], ids=["model", "loop"])
@pytest.mark.parametrize(
    "rule, returned", [r[1:] for r in _BAD_STOP_RULES], ids=[r[0] for r in _BAD_STOP_RULES]
)
def test_a_stop_rule_of_another_dtype_or_shape_is_refused_before_the_loop_is_traced(
    make, rule, returned, unfiltered_tracebacks
):
  del unfiltered_tracebacks
  message = rf"(?s)^draft_stop <lambda> {returned}.*logits \[rows, V\] = \[2, 32\] .*{STOP_RULE}"
  _raise_before_tracing(lambda: make(draft_stop=rule), BAD, message, rule_traces=1)


def test_a_stop_rule_of_bool_rows_is_accepted():
  def rule(logits, drafts):
    del drafts
    return jnp.max(logits, axis=-1) < 0

  assert _speculative_model(draft_stop=rule).draft_shape.draft_stop is rule


# ----------------------------------------------------------------------------- every round's cases

ALL_CASES = CASES + MORE_CASES + THIRD_CASES


def test_the_cases_are_distinct_and_each_round_has_its_share():
  names = [name for name, *_ in ALL_CASES]
  assert len(set(names)) == len(names)
  assert len(CASES) >= 60 and len(MORE_CASES) >= 40 and len(THIRD_CASES) >= 40


@pytest.mark.parametrize(
    "make, error, message", [c[1:] for c in ALL_CASES], ids=[c[0] for c in ALL_CASES]
)
def test_bad_input_gets_a_clear_error_before_tracing(make, error, message, unfiltered_tracebacks):
  del unfiltered_tracebacks
  _raise_before_tracing(make, error, message)

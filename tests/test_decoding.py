"""Whole-sequence exactness of speculative decoding, greedy equality, EOS / length truncation.

Distribution tests compare samples with the exact target distribution of whole sequences,
obtained by enumerating every sequence of a 5-token vocabulary up to length 3, with a Pearson
goodness-of-fit test at significance SIGNIFICANCE and fixed seeds.
"""
import functools
import itertools

import jax
import numpy as np
import pytest
import seqio

from conftest import FIXTURE_CONFIG, chisquare_pvalue, fixture_path
from speculative_t5x import drafters, models, network, sampling
from speculative_t5x.decoding import STAT_NAMES

SIGNIFICANCE = 1e-3
EOS = 1

# --- a 5-token world for distribution tests ------------------------------------------------------
SMALL_V, SMALL_L, SAMPLES = 5, 3, 10000
SMALL_TARGET = network.T5Config(vocab_size=SMALL_V, emb_dim=16, num_heads=2, num_encoder_layers=1,
                                num_decoder_layers=2, head_dim=8, mlp_dim=32,
                                mlp_activations=("gelu", "linear"), dropout_rate=0.0)
SMALL_DRAFTER = SMALL_TARGET.replace(emb_dim=8, num_decoder_layers=1, mlp_dim=16)
SMALL_INPUTS = np.array([[2, 3, 4, 2, 0], [4, 4, 3, 0, 0]], np.int32)  # two different rows


def _vocab(size, eos=EOS):
  return seqio.PassThroughVocabulary(size, eos_id=eos)


@functools.lru_cache(maxsize=None)
def _small_params():
  # Scale the output head so the target's distributions are far from uniform.
  target = network.init_params(SMALL_TARGET, jax.random.PRNGKey(1))
  target["decoder"]["logits_dense"]["kernel"] = target["decoder"]["logits_dense"]["kernel"] * 3
  return target, network.init_params(SMALL_DRAFTER, jax.random.PRNGKey(2))


def _exact_law(temperature, topk=0, topp=0.0):
  """{sequence (tuple of SMALL_L ids, 0 after EOS): probability} for each row of SMALL_INPUTS."""
  target, _ = _small_params()
  model = network.Transformer(SMALL_TARGET)
  full = np.array(list(itertools.product(range(SMALL_V), repeat=SMALL_L)), np.int32)
  laws = []
  for row in SMALL_INPUTS:
    enc = np.repeat(row[None], len(full), axis=0)
    dec_in = np.concatenate([np.zeros((len(full), 1), np.int32), full[:, :-1]], axis=1)
    # Targets all nonzero: a sampled 0 mid-sequence is a token, not padding, as in decoding.
    logits = model.apply({"params": target}, enc, dec_in, np.ones_like(full))
    p = np.asarray(sampling.distribution(logits, temperature, topk, topp))
    law = {}
    for seq, dist in zip(full, p):
      prob, out = 1.0, []
      for t, token in enumerate(seq):
        prob *= dist[t, token]
        out.append(int(token))
        if token == EOS:
          break
      key = tuple(out + [0] * (SMALL_L - len(out)))
      law[key] = prob  # sequences differing only after EOS share one key and one probability
    laws.append(law)
  return laws


def _assert_matches_target(decodes, laws):
  for row, law in zip(np.asarray(decodes), laws):
    keys = list(law)
    index = {k: i for i, k in enumerate(keys)}
    counts = np.zeros(len(keys))
    for seq in row:
      counts[index[tuple(int(t) for t in seq)]] += 1
    np.testing.assert_allclose(sum(law.values()), 1.0, rtol=1e-5)
    assert chisquare_pvalue(counts, [law[k] for k in keys]) > SIGNIFICANCE


def _small_model(drafter, gamma):
  return models.SpeculativeEncoderDecoderModel(network.Transformer(SMALL_TARGET), drafter,
                                               _vocab(SMALL_V), _vocab(SMALL_V), gamma=gamma)


def _sample_small(model, drafter_params, temperature, topk=0, topp=0.0, seed=0):
  target, _ = _small_params()
  batch = {"encoder_input_tokens": SMALL_INPUTS,
           "decoder_input_tokens": np.zeros((len(SMALL_INPUTS), SMALL_L), np.int32)}
  fn = model.jit_predict(num_decodes=SAMPLES, return_all_decodes=True, topk=topk, topp=topp)
  decodes, aux = fn({"target": target, "drafter": drafter_params}, batch,
                    jax.random.PRNGKey(seed), temperature)
  return decodes, aux


@pytest.mark.parametrize("gamma, temperature, topk, topp", [
    (1, 1.0, 0, 0.0), (3, 1.0, 0, 0.0), (3, 0.7, 3, 0.0), (1, 1.0, 0, 0.8)])
def test_t5_drafter_samples_the_exact_target_distribution(gamma, temperature, topk, topp):
  _, drafter_params = _small_params()
  model = _small_model(network.Transformer(SMALL_DRAFTER), gamma)
  decodes, aux = _sample_small(model, drafter_params, temperature, topk, topp)
  _assert_matches_target(decodes, _exact_law(temperature, topk, topp))
  stats = aux["speculative_stats"]
  assert np.all(np.asarray(stats["accepted_tokens"]) <= np.asarray(stats["drafted_tokens"]))
  assert 0 < np.sum(stats["accepted_tokens"]) < np.sum(stats["drafted_tokens"])


def _fitted_tables():
  rng = np.random.default_rng(0)
  corpus = [rng.integers(1, SMALL_V, 6) for _ in range(50)]
  return {"unigram": drafters.UnigramDrafter.fit(corpus, SMALL_V),
          "bigram": drafters.BigramDrafter.fit(corpus, SMALL_V, top=3)}


@pytest.mark.parametrize("kind", ["unigram", "bigram", "prompt_lookup"])
def test_table_and_lookup_drafters_sample_the_exact_target_distribution(kind):
  drafter = {"unigram": drafters.UnigramDrafter(vocab_size=SMALL_V),
             "bigram": drafters.BigramDrafter(vocab_size=SMALL_V),
             "prompt_lookup": drafters.PromptLookupDrafter(vocab_size=SMALL_V, ngram=1)}[kind]
  params = _fitted_tables().get(kind, {})
  decodes, _ = _sample_small(_small_model(drafter, 2), params, 1.0, seed=3)
  _assert_matches_target(decodes, _exact_law(1.0))


class _MismatchedQ(drafters.UnigramDrafter):
  """Hugging Face's bug #32867: drafts are greedy, but q reported is the sampling distribution."""

  def propose(self, params, state, sequences, length, gamma, u, standardize):
    drafts, _, state = super().propose(params, state, sequences, length, gamma, u,
                                       sampling.Standardizer(0.0))
    _, q, _ = super().propose(params, state, sequences, length, gamma, u, standardize)
    return drafts, q, state


def test_goodness_of_fit_detects_a_q_mismatch():
  """The distribution test has power: the bug HF shipped fails it."""
  drafter = _MismatchedQ(vocab_size=SMALL_V)
  decodes, _ = _sample_small(_small_model(drafter, 2), _fitted_tables()["unigram"], 1.0, seed=3)
  laws = _exact_law(1.0)
  with pytest.raises(AssertionError):
    _assert_matches_target(decodes, laws)


# --- greedy equality ------------------------------------------------------------------------------
TINY = network.T5Config(vocab_size=61, emb_dim=16, num_heads=2, num_encoder_layers=2,
                        num_decoder_layers=2, head_dim=8, mlp_dim=32,
                        mlp_activations=("gelu", "linear"), dropout_rate=0.0)
TINY_DRAFTER = TINY.replace(emb_dim=8, num_encoder_layers=1, num_decoder_layers=1, mlp_dim=16)
GREEDY_L = 10


@functools.lru_cache(maxsize=None)
def _tiny_params():
  return (network.init_params(TINY, jax.random.PRNGKey(10)),
          network.init_params(TINY_DRAFTER, jax.random.PRNGKey(11)))


def _random_inputs(count, seed=0, length=9):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, TINY.vocab_size, (count, length)).astype(np.int32)
  lengths = rng.integers(1, length + 1, count)
  return np.where(np.arange(length)[None] < lengths[:, None], tokens, 0)


def _batch(inputs, length=GREEDY_L):
  return {"encoder_input_tokens": inputs,
          "decoder_input_tokens": np.zeros((len(inputs), length), np.int32)}


@functools.lru_cache(maxsize=None)
def _baseline(eos=EOS, max_decode_steps=None):
  model = models.EncoderDecoderModel(network.Transformer(TINY), _vocab(61, eos), _vocab(61, eos))
  return model.jit_predict(max_decode_steps=max_decode_steps)


@functools.lru_cache(maxsize=None)
def _speculative(gamma, drafter_kind="t5", eos=EOS, max_decode_steps=None):
  drafter = network.Transformer(TINY if drafter_kind == "self" else TINY_DRAFTER)
  model = models.SpeculativeEncoderDecoderModel(network.Transformer(TINY), drafter,
                                                _vocab(61, eos), _vocab(61, eos), gamma=gamma)
  return model.jit_predict(max_decode_steps=max_decode_steps)


def _greedy_pair(inputs, gamma, drafter_kind="t5", eos=EOS, max_decode_steps=None):
  target, drafter = _tiny_params()
  drafter = target if drafter_kind == "self" else drafter
  rng = jax.random.PRNGKey(0)
  base, _ = _baseline(eos, max_decode_steps)(target, _batch(inputs), rng, 0.0)
  spec, aux = _speculative(gamma, drafter_kind, eos, max_decode_steps)(
      {"target": target, "drafter": drafter}, _batch(inputs), rng, 0.0)
  return np.asarray(base), np.asarray(spec), aux


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_equals_baseline_batch_1(gamma):
  inputs = _random_inputs(100, seed=gamma)
  for i in range(len(inputs)):
    base, spec, _ = _greedy_pair(inputs[i:i + 1], gamma)
    np.testing.assert_array_equal(spec, base, err_msg=f"input {i}")


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_equals_baseline_batch_3(gamma):
  inputs = _random_inputs(102, seed=100 + gamma)
  for i in range(0, len(inputs), 3):
    base, spec, aux = _greedy_pair(inputs[i:i + 3], gamma)
    np.testing.assert_array_equal(spec, base, err_msg=f"inputs {i}..{i + 2}")
  assert set(aux["speculative_stats"]) == set(STAT_NAMES)


def test_greedy_with_self_drafter_accepts_everything():
  inputs = _random_inputs(3, seed=5)
  base, spec, aux = _greedy_pair(inputs, 4, "self")
  np.testing.assert_array_equal(spec, base)
  stats = {k: np.asarray(v) for k, v in aux["speculative_stats"].items()}
  emitted = (base > 0).sum(1)  # no EOS in these outputs: every row runs to GREEDY_L
  np.testing.assert_array_equal(stats["target_calls"], np.ceil(emitted / 5))
  np.testing.assert_allclose(stats["beta_sum"], stats["beta_count"])  # beta = 1 everywhere
  np.testing.assert_array_equal(stats["accepted_tokens"] + stats["target_calls"], emitted)


def test_eos_inside_an_accepted_block_truncates():
  inputs = _random_inputs(3, seed=5)
  base, _, _ = _greedy_pair(inputs, 4, "self")
  eos = int(base[0, 6])  # a token the target emits mid-block: declare it EOS
  base_eos, spec_eos, aux = _greedy_pair(inputs, 4, "self", eos=eos)
  np.testing.assert_array_equal(spec_eos, base_eos)
  first = int(np.argmax(base_eos[0] == eos))
  assert first <= 6 and np.all(base_eos[0, first + 1:] == 0)
  assert int(aux["speculative_stats"]["target_calls"][0]) == first // 5 + 1


def test_max_decode_steps_inside_a_block_truncates():
  inputs = _random_inputs(3, seed=5)
  base, spec, aux = _greedy_pair(inputs, 3, "self", max_decode_steps=6)
  np.testing.assert_array_equal(spec, base)
  assert np.all(base[:, 6:] == 0) and np.all(base[:, :6] > 0)
  np.testing.assert_array_equal(aux["speculative_stats"]["target_calls"], [2, 2, 2])


def test_prompt_lookup_and_ngram_drafters_are_greedy_exact():
  target, _ = _tiny_params()
  inputs = _random_inputs(12, seed=9)
  corpus = list(inputs)
  cases = [(drafters.PromptLookupDrafter(vocab_size=61, ngram=2), {}),
           (drafters.UnigramDrafter(vocab_size=61), drafters.UnigramDrafter.fit(corpus, 61)),
           (drafters.BigramDrafter(vocab_size=61), drafters.BigramDrafter.fit(corpus, 61))]
  base, _ = _baseline()(target, _batch(inputs), jax.random.PRNGKey(0), 0.0)
  for drafter, params in cases:
    model = models.SpeculativeEncoderDecoderModel(network.Transformer(TINY), drafter, _vocab(61),
                                                  _vocab(61), gamma=3)
    spec, aux = model.jit_predict()({"target": target, "drafter": params}, _batch(inputs),
                                    jax.random.PRNGKey(0), 0.0)
    np.testing.assert_array_equal(spec, base, err_msg=type(drafter).__name__)
    assert np.all(np.asarray(aux["speculative_stats"]["drafter_calls"]) == 0)


@pytest.mark.parametrize("rescale_log_probs", [True, False])
def test_greedy_specialization_equals_the_traced_temperature_zero(rescale_log_probs):
  """A static greedy temperature compiles argmax-only loops; a traced 0 runs the general loops
  (distributions, conds): decodes, scores and statistics must be identical."""
  target, drafter = _tiny_params()
  inputs = _batch(_random_inputs(6, seed=21))
  baseline = models.EncoderDecoderModel(network.Transformer(TINY), _vocab(61), _vocab(61))
  speculative = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY), network.Transformer(TINY_DRAFTER), _vocab(61), _vocab(61),
      gamma=4)
  cases = [(baseline, target), (speculative, {"target": target, "drafter": drafter})]
  for model, params in cases:
    def predict(params, temperature, model=model):
      return model.predict_batch_with_aux(
          params, inputs, jax.random.PRNGKey(0),
          decoder_params={"temperature": temperature, "rescale_log_probs": rescale_log_probs})
    traced = jax.jit(predict)(params, np.float32(0.0))
    static = jax.jit(lambda params, model=model, predict=predict: predict(params, 0.0))(params)
    assert sampling.is_greedy(0.0)
    jax.tree.map(np.testing.assert_array_equal, static, traced)
    # jit_predict dispatches a concrete 0 to the static specialization.
    np.testing.assert_array_equal(model.jit_predict()(params, inputs, jax.random.PRNGKey(0), 0.0)[0],
                                  traced[0])


def test_same_rng_same_output_and_rng_matters():
  target, drafter = _tiny_params()
  params = {"target": target, "drafter": drafter}
  inputs = _random_inputs(3, seed=1)
  fn = _speculative(4)
  first, _ = fn(params, _batch(inputs), jax.random.PRNGKey(5), 1.0)
  again, _ = fn(params, _batch(inputs), jax.random.PRNGKey(5), 1.0)
  other, _ = fn(params, _batch(inputs), jax.random.PRNGKey(6), 1.0)
  np.testing.assert_array_equal(first, again)
  assert not np.array_equal(first, other)


def test_greedy_equals_t5x_own_decodes_on_the_fixture():
  """The fixture checkpoint as target, a different random drafter: T5X's greedy decodes."""
  from flax import serialization  # pylint: disable=g-import-not-at-top
  raw = serialization.msgpack_restore(fixture_path("test_t5_tiny.checkpoint_0").read_bytes())
  ref = np.load(fixture_path("t5x_tiny_reference.npz"))
  cfg = FIXTURE_CONFIG
  drafter_cfg = cfg.replace(num_encoder_layers=1, num_decoder_layers=1)
  vocab = _vocab(32128)
  spec = models.SpeculativeEncoderDecoderModel(network.Transformer(cfg),
                                               network.Transformer(drafter_cfg), vocab, vocab,
                                               gamma=3)
  base = models.EncoderDecoderModel(network.Transformer(cfg), vocab, vocab)
  params = {"target": raw["optimizer"]["target"],
            "drafter": network.init_params(drafter_cfg, jax.random.PRNGKey(3))}
  batch = {"encoder_input_tokens": ref["encoder_input_tokens"],
           "decoder_input_tokens": np.zeros_like(ref["greedy_decodes"])}
  robust = ref["greedy_rows_robust"]
  assert robust.sum() >= 10
  spec_out, _ = spec.jit_predict()(params, batch, jax.random.PRNGKey(0), 0.0)
  base_out, _ = base.jit_predict()(params["target"], batch, jax.random.PRNGKey(0), 0.0)
  np.testing.assert_array_equal(np.asarray(spec_out)[robust], ref["greedy_decodes"][robust])
  np.testing.assert_array_equal(np.asarray(base_out)[robust], ref["greedy_decodes"][robust])


# --- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda: _speculative(0), "gamma must be an integer >= 1"),
    (lambda: models.SpeculativeEncoderDecoderModel(
        network.Transformer(TINY), network.Transformer(TINY.replace(vocab_size=64)), _vocab(61),
        _vocab(61)), "drafter vocab_size 64 != target vocab_size 61"),
    (lambda: models.SpeculativeEncoderDecoderModel(
        network.Transformer(TINY), drafters.UnigramDrafter(vocab_size=61, eos_id=2), _vocab(61),
        _vocab(61)), "drafter eos_id 2 != the output vocabulary's eos_id 1"),
    (lambda: _call_with(temperature=-1.0), "temperature must be >= 0"),
    (lambda: _call_with(topk=5, topp=0.9), "at most one of top-k and top-p"),
    (lambda: _speculative(2)({"target": _tiny_params()[0], "drafter": _tiny_params()[1]},
                             _batch(_random_inputs(1)), jax.random.PRNGKey(0), -0.5),
     "temperature must be >= 0"),
])
def test_bad_input_raises_before_tracing(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def _call_with(temperature=1.0, topk=0, topp=0.0):
  target, drafter = _tiny_params()
  model = models.SpeculativeEncoderDecoderModel(network.Transformer(TINY),
                                                network.Transformer(TINY_DRAFTER), _vocab(61),
                                                _vocab(61), gamma=2)
  return model.predict_batch_with_aux({"target": target, "drafter": drafter},
                                      _batch(_random_inputs(1)),
                                      decoder_params={"temperature": temperature, "topk": topk,
                                                      "topp": topp})


def test_trace_replays_the_decoded_sequence():
  target, drafter = _tiny_params()
  model = models.SpeculativeEncoderDecoderModel(network.Transformer(TINY),
                                                network.Transformer(TINY_DRAFTER), _vocab(61),
                                                _vocab(61), gamma=3)
  inputs = _random_inputs(2, seed=4)
  decodes, aux = jax.jit(lambda p, b, r: model.predict_batch_with_aux(
      p, b, r, decoder_params={"temperature": 1.0, "return_trace": True}))(
          {"target": target, "drafter": drafter}, _batch(inputs), jax.random.PRNGKey(2))
  trace = {k: np.asarray(v) for k, v in aux["speculative_trace"].items()}
  for row in range(2):
    replay = []
    for it in range(GREEDY_L):
      block = list(trace["drafts"][row, it, :trace["accepted"][row, it]]) + [
          trace["token"][row, it]]
      replay += block[:trace["emitted"][row, it]]
    replay += [0] * (GREEDY_L - len(replay))
    np.testing.assert_array_equal(replay, np.asarray(decodes)[row])
    calls = int(aux["speculative_stats"]["target_calls"][row])
    assert np.count_nonzero(trace["emitted"][row]) == calls

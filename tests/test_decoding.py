"""Whole-sequence exactness of speculative decoding, greedy equality, EOS / length truncation;
the typed statistics, trace and decoded lengths; the model's decode_fn and verifier hooks.

Distribution tests compare samples with the exact target distribution of whole sequences,
obtained by enumerating every sequence of a 5-token vocabulary up to length 3, with a Pearson
goodness-of-fit test at significance SIGNIFICANCE and fixed seeds.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from conftest import FIXTURE_CONFIG, chisquare_pvalue, fixture_path, tiny_config
from speculative_t5x import decoding, draft_length, drafters, feature_drafter, models, network
from speculative_t5x import sampling, speculative, table_drafters
from speculative_t5x.decoding import STAT_NAMES

SIGNIFICANCE = 1e-3
EOS = 1

# --- a 5-token world for distribution tests ------------------------------------------------------
SMALL_V, SMALL_L, SAMPLES = 5, 3, 10000
SMALL_TARGET = tiny_config(
    SMALL_V,
    emb_dim=16,
    num_heads=2,
    head_dim=8,
    mlp_dim=32,
    num_encoder_layers=1,
    num_decoder_layers=2,
)
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


@functools.lru_cache(maxsize=None)
def _small_model_drafter(kind):
  """-> (drafter, params): SMALL_DRAFTER as a T5 drafter, or as a shared-encoder decoder reading
  the target's encoder output (of width 16, its own 8), or a feature drafter ('feature_layers':
  reading the target's layer 0 too; 'feature_source': drafting from (0, 1) and each row's
  source ids, 2-4 in SMALL_INPUTS' first row and 3-4 in its second)."""
  if kind == "t5":
    return network.Transformer(SMALL_DRAFTER), _small_params()[1]
  if kind in ("feature", "feature_layers", "feature_source"):
    # A draft vocabulary without token 3 (q = 0 there), or one its sources extend.
    drafter = feature_drafter.FeatureDrafter(
        SMALL_DRAFTER,
        SMALL_TARGET.emb_dim,
        draft_vocab=(0, 1) if kind == "feature_source" else (0, 1, 2),
        target_feature_layers=(0,) if kind == "feature_layers" else (),
        copy_source=kind == "feature_source",
    )
    params = drafter.init_params(jax.random.PRNGKey(3), {})
    return drafter, drafter.init_from_target(params, _small_params()[0])
  params = network.shared_encoder_init_params(
      SMALL_DRAFTER, SMALL_TARGET.emb_dim, jax.random.PRNGKey(3)
  )
  return drafters.SharedEncoderDrafter(SMALL_DRAFTER, SMALL_TARGET.emb_dim), params


@functools.lru_cache(maxsize=None)
def _exact_law(temperature, topk=0, topp=0.0):
  """{sequence (tuple of SMALL_L ids, 0 after EOS): probability} for each row of SMALL_INPUTS.
  Cached: the tests read the laws and never change them."""
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
    for seq, count in zip(*np.unique(row, axis=0, return_counts=True)):
      counts[index[tuple(int(t) for t in seq)]] += count
    np.testing.assert_allclose(sum(law.values()), 1.0, rtol=1e-5)
    assert chisquare_pvalue(counts, [law[k] for k in keys]) > SIGNIFICANCE


def _small_model(drafter, gamma):
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(SMALL_TARGET), drafter, _vocab(SMALL_V), _vocab(SMALL_V), gamma=gamma
  )


def _sample_small(model, drafter_params, temperature, topk=0, topp=0.0, seed=0):
  target, _ = _small_params()
  batch = {
      "encoder_input_tokens": SMALL_INPUTS,
      "decoder_input_tokens": np.zeros((len(SMALL_INPUTS), SMALL_L), np.int32),
  }
  fn = model.jit_predict(num_decodes=SAMPLES, return_all_decodes=True, topk=topk, topp=topp)
  decodes, aux = fn(
      {"target": target, "drafter": drafter_params}, batch, jax.random.PRNGKey(seed), temperature
  )
  return decodes, aux


@pytest.mark.parametrize(
    "kind, gamma, temperature, topk, topp",
    [
        ("t5", 1, 1.0, 0, 0.0),
        ("t5", 3, 1.0, 0, 0.0),
        ("t5", 3, 0.7, 3, 0.0),
        ("t5", 1, 1.0, 0, 0.8),
        ("shared_encoder", 3, 1.0, 0, 0.0),
        ("shared_encoder", 3, 0.7, 3, 0.0),
        ("feature", 3, 1.0, 0, 0.0),
        ("feature_layers", 3, 0.7, 3, 0.0),
        ("feature_source", 3, 1.0, 0, 0.0),
    ],
)
def test_model_drafters_sample_the_exact_target_distribution(kind, gamma, temperature, topk, topp):
  drafter, drafter_params = _small_model_drafter(kind)
  model = _small_model(drafter, gamma)
  decodes, aux = _sample_small(model, drafter_params, temperature, topk, topp)
  _assert_matches_target(decodes, _exact_law(temperature, topk, topp))
  stats = aux["speculative_stats"]
  assert np.all(np.asarray(stats["accepted_tokens"]) <= np.asarray(stats["drafted_tokens"]))
  assert 0 < np.sum(stats["accepted_tokens"]) < np.sum(stats["drafted_tokens"])


def _fitted_tables():
  rng = np.random.default_rng(0)
  corpus = [rng.integers(1, SMALL_V, 6) for _ in range(50)]
  return {
      "unigram": table_drafters.UnigramDrafter.fit(corpus, SMALL_V),
      "bigram": table_drafters.BigramDrafter.fit(corpus, SMALL_V, top=3),
  }


@pytest.mark.parametrize("kind", ["unigram", "bigram", "prompt_lookup"])
def test_table_and_lookup_drafters_sample_the_exact_target_distribution(kind):
  drafter = {
      "unigram": table_drafters.UnigramDrafter(vocab_size=SMALL_V),
      "bigram": table_drafters.BigramDrafter(vocab_size=SMALL_V),
      "prompt_lookup": table_drafters.PromptLookupDrafter(vocab_size=SMALL_V, ngram=1),
  }[kind]
  params = _fitted_tables().get(kind, {})
  decodes, _ = _sample_small(_small_model(drafter, 2), params, 1.0, seed=3)
  _assert_matches_target(decodes, _exact_law(1.0))


class _MismatchedQ(table_drafters.UnigramDrafter):
  """Hugging Face's bug #32867: drafts are greedy, but q reported is the sampling distribution."""

  def propose(self, params, state, sequences, length, gamma, u, standardize):
    drafts, _, state = super().propose(
        params, state, sequences, length, gamma, u, sampling.Standardizer(0.0)
    )
    _, q, _ = super().propose(params, state, sequences, length, gamma, u, standardize)
    return drafts, q, state


class _FirstRowsSourceInQ(feature_drafter.FeatureDrafter):
  """A batch-indexing bug: drafts from each row's own source ids, but reports every row's q as if
  its source were the first row's (in SMALL_INPUTS, the second row's q gives token 2 mass it
  cannot draft)."""

  def propose(self, params, state, sequences, length, gamma, u, standardize, stop=None):
    drafts, _, new_state = super().propose(
        params, state, sequences, length, gamma, u, standardize, stop
    )
    first = state.replace(
        source_ids=jnp.broadcast_to(state.source_ids[:1], state.source_ids.shape),
        source_kernel=jnp.broadcast_to(state.source_kernel[:1], state.source_kernel.shape),
    )
    _, q, _ = super().propose(params, first, sequences, length, gamma, u, standardize, stop)
    return drafts, q, new_state


def test_goodness_of_fit_detects_a_q_from_another_rows_source():
  drafter, params = _small_model_drafter("feature_source")
  wrong = _FirstRowsSourceInQ(
      drafter.config, drafter.feature_dim, drafter.draft_vocab, copy_source=True
  )
  decodes, _ = _sample_small(_small_model(wrong, 3), params, 1.0)
  with pytest.raises(AssertionError):
    _assert_matches_target(decodes, _exact_law(1.0))


def test_goodness_of_fit_detects_a_q_mismatch():
  """The distribution test has power: the bug HF shipped fails it."""
  drafter = _MismatchedQ(vocab_size=SMALL_V)
  decodes, _ = _sample_small(_small_model(drafter, 2), _fitted_tables()["unigram"], 1.0, seed=3)
  laws = _exact_law(1.0)
  with pytest.raises(AssertionError):
    _assert_matches_target(decodes, laws)


# --- greedy equality ------------------------------------------------------------------------------
TINY = tiny_config(
    61, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32, num_encoder_layers=2, num_decoder_layers=2
)
TINY_DRAFTER = TINY.replace(emb_dim=8, num_encoder_layers=1, num_decoder_layers=1, mlp_dim=16)
GREEDY_L = 10


@functools.lru_cache(maxsize=None)
def _tiny_params():
  return (
      network.init_params(TINY, jax.random.PRNGKey(10)),
      network.init_params(TINY_DRAFTER, jax.random.PRNGKey(11)),
  )


@functools.lru_cache(maxsize=None)
def _tiny_drafter(kind):
  """-> (drafter, params) of a drafter kind of _speculative: 'self' (the target), 't5'
  (TINY_DRAFTER), 'shared_encoder' (TINY_DRAFTER's decoder reading the target's encoder),
  'feature' or 'feature_layers' (a feature drafter, reading the target's layer 0 too),
  'feature_source' (a feature drafter of the even ids and each row's source ids)."""
  target, t5_params = _tiny_params()
  if kind == "self":
    return network.Transformer(TINY), target
  if kind == "t5":
    return network.Transformer(TINY_DRAFTER), t5_params
  if kind in ("feature", "feature_layers", "feature_source"):
    layers = (0,) if kind == "feature_layers" else ()
    copy_source = kind == "feature_source"
    drafter = feature_drafter.FeatureDrafter(
        TINY_DRAFTER,
        TINY.emb_dim,
        tuple(range(0, TINY.vocab_size, 2)) if copy_source else (),
        target_feature_layers=layers,
        copy_source=copy_source,
    )
    params = drafter.init_params(jax.random.PRNGKey(12), {})
    return drafter, drafter.init_from_target(params, target)
  params = network.shared_encoder_init_params(TINY_DRAFTER, TINY.emb_dim, jax.random.PRNGKey(12))
  return drafters.SharedEncoderDrafter(TINY_DRAFTER, TINY.emb_dim), params


def _random_inputs(count, seed=0, length=9):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, TINY.vocab_size, (count, length)).astype(np.int32)
  lengths = rng.integers(1, length + 1, count)
  return np.where(np.arange(length)[None] < lengths[:, None], tokens, 0)


def _batch(inputs, length=GREEDY_L):
  return {
      "encoder_input_tokens": inputs,
      "decoder_input_tokens": np.zeros((len(inputs), length), np.int32),
  }


@functools.lru_cache(maxsize=None)
def _baseline(eos=EOS, max_decode_steps=None):
  model = models.EncoderDecoderModel(network.Transformer(TINY), _vocab(61, eos), _vocab(61, eos))
  return model.jit_predict(max_decode_steps=max_decode_steps)


@functools.lru_cache(maxsize=None)
def _speculative(gamma, drafter_kind="t5", eos=EOS, max_decode_steps=None):
  drafter, _ = _tiny_drafter(drafter_kind)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY), drafter, _vocab(61, eos), _vocab(61, eos), gamma=gamma
  )
  return model.jit_predict(max_decode_steps=max_decode_steps)


def _greedy_pair(inputs, gamma, drafter_kind="t5", eos=EOS, max_decode_steps=None):
  target, _ = _tiny_params()
  _, drafter = _tiny_drafter(drafter_kind)
  rng = jax.random.PRNGKey(0)
  base, _ = _baseline(eos, max_decode_steps)(target, _batch(inputs), rng, 0.0)
  spec, aux = _speculative(gamma, drafter_kind, eos, max_decode_steps)(
      {"target": target, "drafter": drafter}, _batch(inputs), rng, 0.0
  )
  return np.asarray(base), np.asarray(spec), aux


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_equals_baseline_batch_1(gamma):
  inputs = _random_inputs(100, seed=gamma)
  for i in range(len(inputs)):
    base, spec, _ = _greedy_pair(inputs[i : i + 1], gamma)
    np.testing.assert_array_equal(spec, base, err_msg=f"input {i}")


@pytest.mark.parametrize(
    "kind, gamma",
    [
        ("t5", 1),
        ("t5", 4),
        ("t5", 8),
        ("shared_encoder", 4),
        ("feature", 3),
        ("feature_layers", 3),
        ("feature_source", 3),
    ],
)
def test_greedy_equals_baseline_batch_3(kind, gamma):
  """Ragged rows (random input lengths) that accept different numbers of drafts."""
  inputs = _random_inputs(102, seed=100 + gamma)
  for i in range(0, len(inputs), 3):
    base, spec, aux = _greedy_pair(inputs[i : i + 3], gamma, kind)
    np.testing.assert_array_equal(spec, base, err_msg=f"inputs {i}..{i + 2}")
  assert set(aux["speculative_stats"]) == set(STAT_NAMES)


class _NeedsDecodeParams(feature_drafter.FeatureDrafter):
  """Refuses to propose from anything but its `decode_params` form."""

  def propose(self, params, *args, **kwargs):
    assert isinstance(params, feature_drafter.DecodeParams), type(params)
    return super().propose(params, *args, **kwargs)


def test_the_loop_proposes_from_the_drafters_decode_params():
  drafter, params = _tiny_drafter("feature")
  spy = _NeedsDecodeParams(drafter.config, drafter.feature_dim)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY), spy, _vocab(61), _vocab(61), gamma=2
  )
  target, _ = _tiny_params()
  inputs, rng = _random_inputs(3, seed=7), jax.random.PRNGKey(0)
  base, _ = _baseline()(target, _batch(inputs), rng, 0.0)
  predict = model.jit_predict()
  spec, _ = predict({"target": target, "drafter": params}, _batch(inputs), rng, 0.0)
  np.testing.assert_array_equal(np.asarray(spec), np.asarray(base))
  # Made once by the caller instead (idempotent): the same decodes at T = 1.
  folded = spy.decode_params(params)
  assert spy.decode_params(folded) is folded
  sampled = [
      predict({"target": target, "drafter": p}, _batch(inputs), rng, 1.0)[0]
      for p in (params, folded)
  ]
  np.testing.assert_array_equal(np.asarray(sampled[0]), np.asarray(sampled[1]))


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
  assert first <= 6 and np.all(base_eos[0, first + 1 :] == 0)
  assert int(aux["speculative_stats"]["target_calls"][0]) == first // 5 + 1


def test_max_decode_steps_inside_a_block_truncates():
  inputs = _random_inputs(3, seed=5)
  base, spec, aux = _greedy_pair(inputs, 3, "self", max_decode_steps=6)
  np.testing.assert_array_equal(spec, base)
  assert np.all(base[:, 6:] == 0) and np.all(base[:, :6] > 0)
  np.testing.assert_array_equal(aux["speculative_stats"]["target_calls"], [2, 2, 2])


def test_a_traced_max_decode_steps_means_the_same_in_both_loops():
  """max_decode_steps as an argument of the caller's jax.jit, where it cannot be checked: both
  loops decode at most that many tokens, none at 0 or below, and up to L above L. The counting
  target of `test_the_verifier_decides_what_the_loop_keeps` emits 1 2 3 ... from BOS."""
  vocab, length = 16, 8
  drafter, params = _drafts_5(vocab)
  inputs = jnp.zeros((2, length), jnp.int32)

  def next_token(tokens):
    return 100.0 * jax.nn.one_hot((tokens + 1) % vocab, vocab)

  @jax.jit
  def baseline(steps):
    def tokens_to_logits(state):
      return next_token(state.cur_token)[:, 0], state.cache

    return decoding.temperature_sample(
        inputs, (), tokens_to_logits, vocab - 1, temperature=0.0, max_decode_steps=steps
    )[0][:, 0]

  @jax.jit
  def speculative(steps):
    output = decoding.speculative_sample(
        inputs,
        (),
        lambda tokens, cache, index: (next_token(tokens), cache),
        drafter,
        params,
        (),
        vocab - 1,
        gamma=3,
        temperature=0.0,
        max_decode_steps=steps,
    )
    return output.decodes[:, 0], output.stats.target_calls[:, 0]

  counting = np.arange(1, length + 1)
  for steps in (-3, 0, 1, 5, length, length + 4):
    expected = np.where(counting <= steps, counting, 0)
    base = baseline(steps)
    spec, calls = speculative(steps)
    np.testing.assert_array_equal(base, [expected] * 2, err_msg=f"baseline, steps {steps}")
    np.testing.assert_array_equal(spec, [expected] * 2, err_msg=f"speculative, steps {steps}")
    assert np.all((calls == 0) == (steps <= 0))


def test_prompt_lookup_and_ngram_drafters_are_greedy_exact():
  target, _ = _tiny_params()
  inputs = _random_inputs(12, seed=9)
  corpus = list(inputs)
  cases = [
      (table_drafters.PromptLookupDrafter(vocab_size=61, ngram=2), {}),
      (table_drafters.UnigramDrafter(vocab_size=61), table_drafters.UnigramDrafter.fit(corpus, 61)),
      (table_drafters.BigramDrafter(vocab_size=61), table_drafters.BigramDrafter.fit(corpus, 61)),
  ]
  base, _ = _baseline()(target, _batch(inputs), jax.random.PRNGKey(0), 0.0)
  for drafter, params in cases:
    model = models.SpeculativeEncoderDecoderModel(
        network.Transformer(TINY), drafter, _vocab(61), _vocab(61), gamma=3
    )
    spec, aux = model.jit_predict()(
        {"target": target, "drafter": params}, _batch(inputs), jax.random.PRNGKey(0), 0.0
    )
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
      network.Transformer(TINY), network.Transformer(TINY_DRAFTER), _vocab(61), _vocab(61), gamma=4
  )
  cases = [(baseline, target), (speculative, {"target": target, "drafter": drafter})]
  for model, params in cases:

    def predict(params, temperature, model=model):
      return model.predict_batch_with_aux(
          params,
          inputs,
          jax.random.PRNGKey(0),
          decoder_params={"temperature": temperature, "rescale_log_probs": rescale_log_probs},
      )

    traced = jax.jit(predict)(params, np.float32(0.0))
    static = jax.jit(lambda params, model=model, predict=predict: predict(params, 0.0))(params)
    assert sampling.is_greedy(0.0)
    jax.tree.map(np.testing.assert_array_equal, static, traced)
    if rescale_log_probs:  # jit_predict dispatches a concrete 0 to the static specialization.
      np.testing.assert_array_equal(
          model.jit_predict()(params, inputs, jax.random.PRNGKey(0), 0.0)[0], traced[0]
      )


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


@pytest.mark.parametrize("kind", ["baseline", "speculative"])
def test_one_key_per_example_gives_each_the_tokens_it_gets_alone(kind):
  """decode_rng [B, 2]: example b decodes, at T = 1 and with num_decodes 2, as it does alone in a
  batch of one with key b, whatever its neighbours; the same keys in another order follow their
  examples."""
  target, drafter = _tiny_params()
  if kind == "baseline":
    model = models.EncoderDecoderModel(network.Transformer(TINY), _vocab(61), _vocab(61))
    params = target
  else:
    model = models.SpeculativeEncoderDecoderModel(
        network.Transformer(TINY),
        network.Transformer(TINY_DRAFTER),
        _vocab(61),
        _vocab(61),
        gamma=3,
    )
    params = {"target": target, "drafter": drafter}
  inputs = _random_inputs(3, seed=11)
  keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(4), jnp.arange(3))
  predict = jax.jit(
      lambda batch, rng: model.predict_batch_with_aux(
          params, batch, rng, {"temperature": 1.0}, return_all_decodes=True, num_decodes=2
      )[0]
  )
  together = np.asarray(predict(_batch(inputs), keys))
  for b in range(3):
    alone = np.asarray(predict(_batch(inputs[b : b + 1]), keys[b]))
    np.testing.assert_array_equal(together[b], alone[0], err_msg=f"example {b}")
  order = np.array([2, 0, 1])
  shuffled = np.asarray(predict(_batch(inputs[order]), keys[order]))
  np.testing.assert_array_equal(shuffled, together[order])
  assert not np.array_equal(together[:, 0], together[:, 1])  # num_decodes draw apart


def test_greedy_equals_t5x_own_decodes_on_the_fixture():
  """The fixture checkpoint as target, a different random drafter: T5X's greedy decodes."""
  from flax import serialization  # pylint: disable=g-import-not-at-top

  raw = serialization.msgpack_restore(fixture_path("test_t5_tiny.checkpoint_0").read_bytes())
  ref = np.load(fixture_path("t5x_tiny_reference.npz"))
  cfg = FIXTURE_CONFIG
  drafter_cfg = cfg.replace(num_encoder_layers=1, num_decoder_layers=1)
  vocab = _vocab(32128)
  spec = models.SpeculativeEncoderDecoderModel(
      network.Transformer(cfg), network.Transformer(drafter_cfg), vocab, vocab, gamma=3
  )
  base = models.EncoderDecoderModel(network.Transformer(cfg), vocab, vocab)
  params = {
      "target": raw["optimizer"]["target"],
      "drafter": network.init_params(drafter_cfg, jax.random.PRNGKey(3)),
  }
  batch = {
      "encoder_input_tokens": ref["encoder_input_tokens"],
      "decoder_input_tokens": np.zeros_like(ref["greedy_decodes"]),
  }
  robust = ref["greedy_rows_robust"]
  assert robust.sum() >= 10
  spec_out, _ = spec.jit_predict()(params, batch, jax.random.PRNGKey(0), 0.0)
  base_out, _ = base.jit_predict()(params["target"], batch, jax.random.PRNGKey(0), 0.0)
  np.testing.assert_array_equal(np.asarray(spec_out)[robust], ref["greedy_decodes"][robust])
  np.testing.assert_array_equal(np.asarray(base_out)[robust], ref["greedy_decodes"][robust])


# --- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: _speculative(0), "gamma must be an integer >= 1"),
        (
            lambda: models.SpeculativeEncoderDecoderModel(
                network.Transformer(TINY),
                network.Transformer(TINY.replace(vocab_size=64)),
                _vocab(61),
                _vocab(61),
            ),
            "drafter vocab_size 64 != target vocab_size 61",
        ),
        (
            lambda: models.SpeculativeEncoderDecoderModel(
                network.Transformer(TINY),
                table_drafters.UnigramDrafter(vocab_size=61, eos_id=2),
                _vocab(61),
                _vocab(61),
            ),
            "drafter eos_id 2 != the output vocabulary's eos_id 1",
        ),
        (
            lambda: models.SpeculativeEncoderDecoderModel(
                network.Transformer(TINY),
                drafters.SharedEncoderDrafter(TINY_DRAFTER, 8),
                _vocab(61),
                _vocab(61),
            ),
            "encoder_emb_dim 8 != the target's emb_dim 16",
        ),
        (lambda: _call_with(temperature=-1.0), "temperature must be >= 0"),
        (lambda: _call_with(topk=5, topp=0.9), "at most one of top-k and top-p"),
        (
            lambda: _speculative(2)(
                {"target": _tiny_params()[0], "drafter": _tiny_params()[1]},
                _batch(_random_inputs(1)),
                jax.random.PRNGKey(0),
                -0.5,
            ),
            "temperature must be >= 0",
        ),
    ],
)
def test_bad_input_raises_before_tracing(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def _call_with(temperature=1.0, topk=0, topp=0.0):
  target, drafter = _tiny_params()
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY), network.Transformer(TINY_DRAFTER), _vocab(61), _vocab(61), gamma=2
  )
  return model.predict_batch_with_aux(
      {"target": target, "drafter": drafter},
      _batch(_random_inputs(1)),
      decoder_params={"temperature": temperature, "topk": topk, "topp": topp},
  )


def test_trace_replays_the_decoded_sequence():
  target, drafter = _tiny_params()
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY), network.Transformer(TINY_DRAFTER), _vocab(61), _vocab(61), gamma=3
  )
  inputs = _random_inputs(2, seed=4)
  decodes, aux = jax.jit(
      lambda p, b, r: model.predict_batch_with_aux(
          p, b, r, decoder_params={"temperature": 1.0, "return_trace": True}
      )
  )({"target": target, "drafter": drafter}, _batch(inputs), jax.random.PRNGKey(2))
  trace = {
      k: np.asarray(getattr(aux["speculative_trace"], k))
      for k in ("drafts", "accepted", "token", "emitted")
  }
  for row in range(2):
    replay = []
    for it in range(GREEDY_L):
      block = list(trace["drafts"][row, it, : trace["accepted"][row, it]]) + [
          trace["token"][row, it]
      ]
      replay += block[: trace["emitted"][row, it]]
    replay += [0] * (GREEDY_L - len(replay))
    np.testing.assert_array_equal(replay, np.asarray(decodes)[row])
    calls = int(aux["speculative_stats"]["target_calls"][row])
    assert np.count_nonzero(trace["emitted"][row]) == calls


# --- typed statistics, trace, decoded lengths ----------------------------------------------------
def _stats(**fields):
  return decoding.SpeculativeStats(**{name: np.asarray(value) for name, value in fields.items()})


# Two rows at gamma = 4, by hand: 3 and 2 target calls, 5 and 1 accepted drafts; beta summed over
# 7 and 3 verified positions. Pooled: alpha = (4.5 + 1.5) / (7 + 3) = 0.6 (the mean of the rows'
# means would be 0.571); tokens per call = (6 + 5) / 5 = 2.2; acceptance rate = 6 / 20 = 0.3.
ROWS = dict(
    target_calls=[3, 2],
    drafter_calls=[12, 8],
    drafted_tokens=[12, 8],
    accepted_tokens=[5, 1],
    beta_sum=[4.5, 1.5],
    beta_count=[7, 3],
)


def test_stats_pool_the_rows():
  stats = _stats(**ROWS)
  assert stats.alpha == pytest.approx(0.6)
  assert stats.tokens_per_call == pytest.approx(2.2)
  assert stats.acceptance_rate == pytest.approx(0.3)
  assert stats.totals() == {
      "target_calls": 5,
      "drafter_calls": 20,
      "drafted_tokens": 20,
      "accepted_tokens": 6,
      "beta_sum": 6.0,
      "beta_count": 10,
  }
  assert stats.summary() == pytest.approx(
      dict(stats.totals(), alpha=0.6, acceptance_rate=0.3, tokens_per_target_call=2.2)
  )
  nothing_drafted = _stats(**dict(ROWS, drafted_tokens=[0, 0]))
  with pytest.raises(ValueError, match="no drafted tokens"):
    _ = nothing_drafted.acceptance_rate


def test_stats_from_dict_as_dict_and_concatenate():
  stats = decoding.SpeculativeStats.from_dict(ROWS)
  assert tuple(stats.as_dict()) == STAT_NAMES
  assert set(STAT_NAMES) == set(ROWS)
  for name, value in stats.as_dict().items():
    np.testing.assert_array_equal(value, ROWS[name])
  missing = {name: value for name, value in ROWS.items() if name != "beta_count"}
  with pytest.raises(ValueError, match="beta_count"):
    decoding.SpeculativeStats.from_dict(missing)
  # [2] and [1, 2] rows (e.g. [B, N] of another decode) flattened into one [4] set.
  other = _stats(**{name: [[value[1], value[0]]] for name, value in ROWS.items()})
  both = decoding.SpeculativeStats.concatenate([stats, other])
  np.testing.assert_array_equal(both.target_calls, [3, 2, 2, 3])
  np.testing.assert_array_equal(both.beta_sum, [4.5, 1.5, 1.5, 4.5])
  assert both.alpha == pytest.approx(0.6)
  with pytest.raises(ValueError, match="no speculative stats"):
    decoding.SpeculativeStats.concatenate([])
  zeros = decoding.SpeculativeStats.zeros(3)
  assert all(np.asarray(v).shape == (3,) and not np.any(v) for v in zeros.as_dict().values())


def test_trace_record_writes_one_iteration():
  trace = decoding.SpeculativeTrace.zeros(2, 4, 3, 2)  # M = 3 drafts, depth D = 2
  record = jax.jit(
      lambda trace, i: trace.record(
          i,
          jnp.array([[1, 2, 3], [4, 5, 6]]),
          jnp.array([2, 0]),
          jnp.array([7, 8]),
          jnp.array([3, 1]),
          jnp.array([[1, 3], [2, 0]]),
      )
  )
  trace = record(trace, jnp.int32(1))
  drafts = np.zeros((2, 4, 3), np.int32)
  drafts[:, 1] = [[1, 2, 3], [4, 5, 6]]
  np.testing.assert_array_equal(trace.drafts, drafts)
  path = np.zeros((2, 4, 2), np.int32)
  path[:, 1] = [[1, 3], [2, 0]]
  np.testing.assert_array_equal(trace.path, path)
  np.testing.assert_array_equal(trace.accepted, [[0, 2, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(trace.token, [[0, 7, 0, 0], [0, 8, 0, 0]])
  np.testing.assert_array_equal(trace.emitted, [[0, 3, 0, 0], [0, 1, 0, 0]])


def test_decoded_lengths():
  decodes = np.array([[5, 1, 3, 0], [2, 2, 2, 2], [1, 1, 0, 0], [4, 4, 4, 1]])
  expected = [2, 4, 1, 4]  # up to and including the first EOS (1), else all 4
  lengths = decoding.decoded_lengths(decodes, 1)
  assert isinstance(lengths, np.ndarray)
  np.testing.assert_array_equal(lengths, expected)
  lengths = decoding.decoded_lengths(jnp.asarray(decodes), 1)
  assert isinstance(lengths, jax.Array)
  np.testing.assert_array_equal(lengths, expected)
  np.testing.assert_array_equal(decoding.decoded_lengths(decodes, 2), [4, 1, 4, 4])
  np.testing.assert_array_equal(
      decoding.decoded_lengths(decodes.reshape(2, 2, 4), 1), [[2, 4], [1, 4]]
  )  # [B, N, L] -> [B, N]
  assert int(decoding.decoded_lengths(decodes[0], 1)) == 2


# --- the model's decode_fn and verifier ----------------------------------------------------------
def test_the_models_decode_fn_is_its_decoding_path():
  calls = []

  def my_fn(*, inputs, num_decodes, **kwargs):
    calls.append(dict(kwargs, inputs=inputs, num_decodes=num_decodes))
    batch, length = inputs.shape
    stats = jax.tree.map(
        lambda x: x.reshape(batch, num_decodes),
        decoding.SpeculativeStats.zeros(batch * num_decodes),
    )
    return decoding.SpeculativeOutput(
        jnp.full((batch, num_decodes, length), 7, jnp.int32), jnp.zeros((batch, num_decodes)), stats
    )

  verifier = speculative.TokenVerifier()
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY),
      table_drafters.UnigramDrafter(),
      _vocab(61),
      _vocab(61),
      gamma=2,
      verifier=verifier,
      decode_fn=my_fn,
  )
  assert model.decode_fn is my_fn
  target, _ = _tiny_params()
  params = {"target": target, "drafter": {"logits": np.zeros(61, np.float32)}}
  decodes, aux = jax.jit(
      lambda params, batch: model.predict_batch_with_aux(
          params, batch, decoder_params={"temperature": 0.5}
      )
  )(params, _batch(_random_inputs(3)))
  np.testing.assert_array_equal(decodes, np.full((3, GREEDY_L), 7))
  assert set(aux["speculative_stats"]) == set(STAT_NAMES)
  assert len(calls) == 1
  call = calls[0]
  assert call["drafter"] is model.drafter and call["drafter"].vocab_size == 61
  assert call["verifier"] is verifier and call["gamma"] == 2 and call["eos_id"] == EOS
  assert call["drafter_params"]["logits"].shape == (61,) and call["temperature"] == 0.5
  assert call["inputs"].shape == (3, GREEDY_L) and call["num_decodes"] == 1


class _AcceptsEverything(speculative.TokenVerifier):
  """Wrong on purpose: keeps all gamma drafts, then the target's next token."""

  def verify(self, p, q, drafts, u, draw=sampling.sample):
    gamma = drafts.shape[1]
    _, _, beta = super().verify(p, q, drafts, u, draw)
    return jnp.full(drafts.shape[:1], gamma, jnp.int32), draw(u[:, gamma], p[:, gamma]), beta

  def verify_greedy(self, target_tokens, drafts):
    gamma = drafts.shape[1]
    _, _, beta = super().verify_greedy(target_tokens, drafts)
    return jnp.full(drafts.shape[:1], gamma, jnp.int32), target_tokens[:, gamma], beta


def _drafts_5(vocab_size):
  """A unigram drafter that drafts 5 (all but certainly when sampling), and its params."""
  drafter = table_drafters.UnigramDrafter(vocab_size=vocab_size, smoothing=1e-6)
  return drafter, drafter.fit_params([np.full(9, 5)])


COUNTING = [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize(
    "verifier, temperature, expected",
    [
        pytest.param(speculative.TokenVerifier(), 0.0, COUNTING, id="algorithm_1"),
        pytest.param(_AcceptsEverything(), 0.0, [5, 5, 5, 6, 5, 5, 5, 6], id="accepts_everything"),
        pytest.param(
            _AcceptsEverything(), 1.0, [5, 5, 5, 6, 5, 5, 5, 6], id="accepts_everything_sampled"
        ),
    ],
)
def test_the_verifier_decides_what_the_loop_keeps(verifier, temperature, expected):
  """A counting target whose next token is the previous one + 1 (a margin of 100 in the logits:
  one-hot also when sampled), decoded from BOS: 1 2 3 ... 8. Algorithm 1 keeps it whatever the
  drafter; a verifier accepting everything keeps the drafts 5 5 5 and the target's 6 after them."""
  vocab, length = 16, 8
  drafter, params = _drafts_5(vocab)

  def counting_target(tokens, cache, index):
    del index
    return 100.0 * jax.nn.one_hot((tokens + 1) % vocab, vocab), cache

  output = jax.jit(
      lambda params: decoding.speculative_sample(
          jnp.zeros((2, length), jnp.int32),
          (),
          counting_target,
          drafter,
          params,
          (),
          vocab - 1,
          gamma=3,
          verifier=verifier,
          temperature=temperature,
      )
  )(params)
  np.testing.assert_array_equal(np.asarray(output.decodes)[:, 0], [expected] * 2)


def test_the_models_verifier_reaches_the_loop():
  """The same wrong verifier given to the model: its greedy decodes start with the drafts 5 5 5,
  where the target's own (the baseline's) do not."""
  target, _ = _tiny_params()
  drafter, drafter_params = _drafts_5(61)
  inputs = _batch(_random_inputs(3, seed=7))
  rng = jax.random.PRNGKey(0)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY),
      drafter,
      _vocab(61),
      _vocab(61),
      gamma=3,
      verifier=_AcceptsEverything(),
  )
  wrong, _ = model.jit_predict()({"target": target, "drafter": drafter_params}, inputs, rng, 0.0)
  base, _ = _baseline()(target, inputs, rng, 0.0)
  np.testing.assert_array_equal(np.asarray(wrong)[:, :3], 5)
  assert not np.any(np.all(np.asarray(base)[:, :3] == 5, axis=1))


def test_a_lenient_verifier_in_the_loop():
  """Lenience (lossy, its law in tests/test_speculative.py) through the model: at l = 1 the tokens
  of Algorithm 1 for one rng; at l = 0.1 a higher alpha and more tokens per target call."""
  target, drafter_params = _tiny_params()
  inputs = _batch(_random_inputs(8, seed=3))
  rng = jax.random.PRNGKey(4)
  params = {"target": target, "drafter": drafter_params}
  outputs = {}
  for name, verifier in (
      ("algorithm_1", speculative.TokenVerifier()),
      ("l=1", speculative.LenientVerifier(1.0)),
      ("l=0.1", speculative.LenientVerifier(0.1)),
  ):
    model = models.SpeculativeEncoderDecoderModel(
        network.Transformer(TINY),
        drafters.T5Drafter(TINY_DRAFTER),
        _vocab(61),
        _vocab(61),
        gamma=3,
        verifier=verifier,
    )
    decodes, aux = model.jit_predict()(params, inputs, rng, 1.0)
    outputs[name] = np.asarray(decodes), decoding.SpeculativeStats.from_dict(
        aux["speculative_stats"]
    )
  np.testing.assert_array_equal(outputs["l=1"][0], outputs["algorithm_1"][0])
  exact, lenient = outputs["algorithm_1"][1], outputs["l=0.1"][1]
  assert lenient.alpha > exact.alpha + 0.05 and lenient.tokens_per_call > exact.tokens_per_call
  assert not np.array_equal(outputs["l=0.1"][0], outputs["algorithm_1"][0])


# --- block verification and broken drafters, whole sequences ------------------------------------
BLOCK = speculative.BlockVerifier()


def _block_model(drafter, gamma, verifier=BLOCK, draft_stop=None):
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(SMALL_TARGET),
      drafter,
      _vocab(SMALL_V),
      _vocab(SMALL_V),
      gamma=gamma,
      verifier=verifier,
      draft_stop=draft_stop,
  )


@pytest.mark.parametrize(
    "kind, gamma, temperature, topk",
    [
        ("t5", 3, 1.0, 0),
        ("t5", 3, 0.7, 3),
        ("bigram", 2, 1.0, 0),
        ("bigram", 3, 0.7, 3),
        ("feature", 3, 1.0, 0),
    ],
)
def test_block_verifier_samples_the_exact_target_distribution(kind, gamma, temperature, topk):
  if kind == "bigram":
    drafter, params = table_drafters.BigramDrafter(vocab_size=SMALL_V), _fitted_tables()["bigram"]
  else:
    drafter, params = _small_model_drafter(kind)
  decodes, aux = _sample_small(_block_model(drafter, gamma), params, temperature, topk, seed=5)
  _assert_matches_target(decodes, _exact_law(temperature, topk))
  stats = aux["speculative_stats"]
  assert 0 < np.sum(stats["accepted_tokens"]) < np.sum(stats["drafted_tokens"])


class _OutOfVocabularyDrafter(table_drafters.UnigramDrafter):
  """Proposes ids beyond the vocabulary (and negative ones) at every other position."""

  def propose(self, params, state, sequences, length, gamma, u, standardize):
    drafts, q, state = super().propose(params, state, sequences, length, gamma, u, standardize)
    broken = jnp.where(jnp.arange(gamma) % 2 == 0, self.vocab_size + 7, -3)
    return jnp.where(jnp.arange(gamma)[None] % 2 == 1, drafts, broken[None]), q, state


def _out_of_vocabulary_lookup():
  """Prompt lookup whose fallback is outside the vocabulary: its constructor refuses that, so the
  field is set past the check, as a buggy subclass could."""
  drafter = table_drafters.PromptLookupDrafter(vocab_size=SMALL_V, ngram=3, eos_id=EOS)
  object.__setattr__(drafter, "fallback_token", SMALL_V + 2)
  return drafter


def _broken_drafters():
  """name -> (drafter, params) of drafters that are broken but must not change the output."""
  _, t5_params = _small_params()
  nan_params = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), t5_params)
  # Every feature it predicts is NaN: its q rows are NaN, which the verifier rejects.
  feature, feature_params = _small_model_drafter("feature")
  # NaN scores for the source ids it adds to its draft vocabulary alone.
  copying, copying_params = _small_model_drafter("feature_source")
  return {
      "nan_weights": (network.Transformer(SMALL_DRAFTER), nan_params),
      "out_of_vocabulary": (
          _OutOfVocabularyDrafter(vocab_size=SMALL_V),
          _fitted_tables()["unigram"],
      ),
      "lookup_fallback_out_of_vocabulary": (_out_of_vocabulary_lookup(), {}),
      "nan_feature_head": (
          feature,
          dict(feature_params, fuse_bias=feature_params["fuse_bias"] * jnp.nan),
      ),
      "nan_source_head": (
          copying,
          dict(copying_params, source_head=copying_params["source_head"] * jnp.nan),
      ),
  }


@pytest.mark.parametrize(
    "name, verifier",
    [
        ("nan_weights", speculative.TokenVerifier()),
        ("nan_weights", speculative.BlockVerifier()),
        ("out_of_vocabulary", speculative.TokenVerifier()),
        ("lookup_fallback_out_of_vocabulary", speculative.TokenVerifier()),
        ("nan_feature_head", speculative.TokenVerifier()),
        ("nan_source_head", speculative.TokenVerifier()),
    ],
)
def test_a_broken_drafter_samples_the_exact_target_distribution(name, verifier):
  drafter, params = _broken_drafters()[name]
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(SMALL_TARGET),
      drafter,
      _vocab(SMALL_V),
      _vocab(SMALL_V),
      gamma=2,
      verifier=verifier,
  )
  decodes, _ = _sample_small(model, params, 1.0, seed=9)
  _assert_matches_target(decodes, _exact_law(1.0))


@pytest.mark.parametrize(
    "name, tree",
    [
        ("nan_weights", None),
        ("out_of_vocabulary", None),
        ("lookup_fallback_out_of_vocabulary", None),
        ("nan_weights", (2, 1)),
        ("nan_feature_head", None),
        ("nan_feature_head", (2, 1)),
        ("nan_source_head", (2, 1)),
    ],
)
def test_a_broken_drafter_gives_the_baselines_greedy_output(name, tree):
  drafter, params = _broken_drafters()[name]
  target, _ = _small_params()
  batch = {
      "encoder_input_tokens": SMALL_INPUTS,
      "decoder_input_tokens": np.zeros((len(SMALL_INPUTS), 8), np.int32),
  }
  base = models.EncoderDecoderModel(
      network.Transformer(SMALL_TARGET), _vocab(SMALL_V), _vocab(SMALL_V)
  )
  expected, _ = base.jit_predict()(target, batch, jax.random.PRNGKey(0), 0.0)
  model = _small_model(drafter, 3) if tree is None else _tree_model(SMALL_TARGET, drafter, tree)
  got, aux = model.jit_predict()(
      {"target": target, "drafter": params}, batch, jax.random.PRNGKey(0), 0.0
  )
  np.testing.assert_array_equal(got, expected)
  assert np.all(np.isfinite(np.asarray(aux["scores"])))


@pytest.mark.parametrize("gamma", [4])  # gamma 1: one draft, the two rules coincide
def test_block_verifier_greedy_equals_baseline(gamma):
  target, drafter = _tiny_params()
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY),
      network.Transformer(TINY_DRAFTER),
      _vocab(61),
      _vocab(61),
      gamma=gamma,
      verifier=speculative.BlockVerifier(),
  )
  fn = model.jit_predict()
  inputs = _random_inputs(45, seed=40 + gamma)
  for i in range(0, len(inputs), 3):
    base, _ = _baseline()(target, _batch(inputs[i : i + 3]), jax.random.PRNGKey(0), 0.0)
    spec, _ = fn(
        {"target": target, "drafter": drafter},
        _batch(inputs[i : i + 3]),
        jax.random.PRNGKey(0),
        0.0,
    )
    np.testing.assert_array_equal(spec, base, err_msg=f"inputs {i}..{i + 2}")


# --- adaptive draft length --------------------------------------------------------------------
# Thresholds near the median confidence of each drafter here, so rows stop at varied slots.
@pytest.mark.parametrize(
    "kind, verifier, temperature, topk",
    [
        ("t5", speculative.TokenVerifier(), 1.0, 0),
        ("t5", speculative.BlockVerifier(), 0.7, 3),
        ("bigram", speculative.TokenVerifier(), 0.7, 3),
        ("bigram", speculative.BlockVerifier(), 1.0, 0),
    ],
)
def test_adaptive_draft_length_samples_the_exact_target_distribution(
    kind, verifier, temperature, topk
):
  _, t5_params = _small_params()
  drafter, params, threshold = {
      "t5": (network.Transformer(SMALL_DRAFTER), t5_params, 0.46),
      "bigram": (
          table_drafters.BigramDrafter(vocab_size=SMALL_V),
          _fitted_tables()["bigram"],
          0.36,
      ),
  }[kind]
  model = _block_model(drafter, 3, verifier, draft_length.ConfidenceStop(threshold))
  decodes, aux = _sample_small(model, params, temperature, topk, seed=13)
  _assert_matches_target(decodes, _exact_law(temperature, topk))
  totals = decoding.SpeculativeStats.from_dict(aux["speculative_stats"]).totals()
  # The rule both stopped rows early and let them draft on.
  assert totals["target_calls"] < totals["drafted_tokens"] < 3 * totals["target_calls"]


def test_adaptive_draft_length_greedy_equals_baseline():
  target, drafter = _tiny_params()
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY),
      network.Transformer(TINY_DRAFTER),
      _vocab(61),
      _vocab(61),
      gamma=4,
      draft_stop=draft_length.ConfidenceStop(0.1),
  )
  fn = model.jit_predict()
  inputs = _random_inputs(60, seed=70)
  drafted = calls = 0
  for i in range(0, len(inputs), 3):
    rng = jax.random.PRNGKey(0)
    base, _ = _baseline()(target, _batch(inputs[i : i + 3]), rng, 0.0)
    spec, aux = fn({"target": target, "drafter": drafter}, _batch(inputs[i : i + 3]), rng, 0.0)
    np.testing.assert_array_equal(spec, base, err_msg=f"inputs {i}..{i + 2}")
    drafted += int(np.sum(aux["speculative_stats"]["drafted_tokens"]))
    calls += int(np.sum(aux["speculative_stats"]["target_calls"]))
  assert calls < drafted < 4 * calls


class _StepCountingBigram(table_drafters.BigramDrafter):
  """A bigram table standing in for a model drafter: each draft counts as one drafter step."""

  @property
  def steps_per_draft(self) -> int:
    return 1


def _chain_table(successor, confident):
  """Bigram params whose q(. | t) puts its mass on successor[t]: 0.95 if confident[t], else
  e^1.5 / (e^1.5 + V - 1) (about 0.07 at V = 61); the rest uniform."""
  vocab = len(successor)
  peak = np.where(confident, np.log(0.95 * (vocab - 1) / 0.05), 1.5).astype(np.float32)
  return {
      "unigram": np.zeros(vocab, np.float32),
      "next_ids": np.asarray(successor, np.int32)[:, None],
      "next_logp": peak[:, None],
      "backoff": np.zeros(vocab, np.float32),
  }


def _replay_adaptive_greedy(decodes, successor, confident, gamma, eos=EOS):
  """The stats the rule implies, replayed in Python from the greedy decodes [B, L]: per row,
  iterations, drafts, accepted drafts and the batch's drafter steps while the row was active."""
  rows, length = decodes.shape
  ends = [int(np.argmax(row == eos)) + 1 if np.any(row == eos) else length for row in decodes]
  position = [0] * rows
  stats = {name: np.zeros(rows, int) for name in ("calls", "drafted", "accepted", "steps")}
  while any(position[r] < ends[r] for r in range(rows)):
    plans = []
    for r in range(rows):
      if position[r] >= ends[r]:
        continue
      token = 0 if position[r] == 0 else int(decodes[r, position[r] - 1])
      drafts = []
      while len(drafts) < gamma:
        nxt = int(successor[token])
        drafts.append(nxt)
        if not confident[token]:  # the draft just made was unsure: stop after it
          break
        token = nxt
      matched = 0
      while (
          matched < len(drafts)
          and position[r] + matched < ends[r]
          and drafts[matched] == decodes[r, position[r] + matched]
      ):
        matched += 1
      plans.append((r, len(drafts), matched))
    steps = max(k for _, k, _ in plans)
    for r, k, matched in plans:
      stats["calls"][r] += 1
      stats["drafted"][r] += k
      stats["accepted"][r] += matched
      stats["steps"][r] += steps
      position[r] += min(matched + 1, ends[r] - position[r])
  return stats


def test_adaptive_draft_length_stats_count_the_steps_the_rule_implies():
  """A table drafter whose greedy chain and confidence are known: the loop's stats equal a replay
  of the rule over its (baseline-equal) output."""
  target, _ = _tiny_params()
  inputs = _random_inputs(12, seed=80)
  base = np.concatenate(
      [
          np.asarray(_baseline()(target, _batch(inputs[i : i + 3]), jax.random.PRNGKey(0), 0.0)[0])
          for i in range(0, 12, 3)
      ]
  )
  # Successors learnt from the target's own decodes, so drafts are often accepted.
  successor = np.arange(61) * 7 % 61
  for row in base:
    for previous, nxt in zip(np.concatenate([[0], row[:-1]]), row):
      successor[previous] = nxt
  confident = np.arange(61) % 3 != 0
  params = _chain_table(successor, confident)
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TINY),
      _StepCountingBigram(vocab_size=61, top=1),
      _vocab(61),
      _vocab(61),
      gamma=4,
      draft_stop=draft_length.ConfidenceStop(0.5),
  )
  fn = model.jit_predict()
  for i in range(0, 12, 3):
    spec, aux = fn(
        {"target": target, "drafter": params}, _batch(inputs[i : i + 3]), jax.random.PRNGKey(0), 0.0
    )
    np.testing.assert_array_equal(spec, base[i : i + 3])
    expected = _replay_adaptive_greedy(base[i : i + 3], successor, confident, 4)
    stats = {name: np.asarray(value) for name, value in aux["speculative_stats"].items()}
    np.testing.assert_array_equal(stats["target_calls"], expected["calls"])
    np.testing.assert_array_equal(stats["drafted_tokens"], expected["drafted"])
    np.testing.assert_array_equal(stats["accepted_tokens"], expected["accepted"])
    np.testing.assert_array_equal(stats["drafter_calls"], expected["steps"])
    assert np.sum(expected["accepted"]) > 0
    assert np.sum(expected["drafted"]) < 4 * np.sum(expected["calls"])


# --- draft trees ------------------------------------------------------------------------------
TREE = speculative.TreeVerifier()


def _tree_model(config, drafter, tree, verifier=TREE):
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(config),
      drafter,
      _vocab(config.vocab_size),
      _vocab(config.vocab_size),
      verifier=verifier,
      draft_tree=tree,
  )


@pytest.mark.parametrize(
    "kind, tree, temperature, topk",
    [
        ("t5", (2, 1), 1.0, 0),
        ("t5", (3, 2), 0.7, 3),
        ("t5", (2, 2, 1), 0.7, 3),
        ("bigram", (3, 2), 1.0, 0),
        ("bigram", (2, 2, 1), 0.7, 3),
        ("shared_encoder", (2, 2, 1), 0.7, 3),
        ("feature", (2, 2, 1), 1.0, 0),
        ("feature_layers", (2, 1), 0.7, 3),
        ("feature_source", (2, 1), 0.7, 3),
    ],
)
def test_a_draft_tree_samples_the_exact_target_distribution(kind, tree, temperature, topk):
  if kind == "bigram":
    drafter, params = table_drafters.BigramDrafter(vocab_size=SMALL_V), _fitted_tables()["bigram"]
  else:
    drafter, params = _small_model_drafter(kind)
  model = _tree_model(SMALL_TARGET, drafter, tree)
  decodes, aux = _sample_small(model, params, temperature, topk, seed=17)
  _assert_matches_target(decodes, _exact_law(temperature, topk))
  totals = decoding.SpeculativeStats.from_dict(aux["speculative_stats"]).totals()
  nodes, depth = model.draft_shape.num_drafts, model.draft_shape.depth
  assert totals["drafted_tokens"] == nodes * totals["target_calls"]
  assert totals["drafter_calls"] == (depth if kind != "bigram" else 0) * totals["target_calls"]
  assert 0 < totals["accepted_tokens"] < depth * totals["target_calls"]


class _UnadjustedSiblings(speculative.TreeVerifier):
  """The mistake: every sibling tested against the parent's p, not the residual left by the
  siblings rejected before it."""

  def verify_tree(self, p, q, drafts, u, draw=sampling.sample, tree=None):
    return speculative.accept_tree(p, q, drafts, u, draw, tree, adjust_siblings=False)


def test_unadjusted_sibling_acceptance_fails_the_same_test():
  drafter = table_drafters.BigramDrafter(vocab_size=SMALL_V)
  model = _tree_model(SMALL_TARGET, drafter, (3, 2), verifier=_UnadjustedSiblings())
  decodes, _ = _sample_small(model, _fitted_tables()["bigram"], 1.0, seed=17)
  with pytest.raises(AssertionError):
    _assert_matches_target(decodes, _exact_law(1.0))


@pytest.mark.parametrize("tree", [(4, 1, 1, 1), (2, 2, 1)])
def test_a_draft_tree_greedy_equals_baseline(tree):
  target, drafter = _tiny_params()
  fn = _tree_model(TINY, network.Transformer(TINY_DRAFTER), tree).jit_predict()
  inputs = _random_inputs(150, seed=90 + len(tree))
  for i in range(0, len(inputs), 3):
    rng = jax.random.PRNGKey(0)
    base, _ = _baseline()(target, _batch(inputs[i : i + 3]), rng, 0.0)
    spec, _ = fn({"target": target, "drafter": drafter}, _batch(inputs[i : i + 3]), rng, 0.0)
    np.testing.assert_array_equal(spec, base, err_msg=f"inputs {i}..{i + 2}")


def test_a_tree_drafted_by_the_target_accepts_a_whole_path():
  """With the target as its own drafter the first child of every node is the target's argmax:
  every call accepts D drafts (but where the decode ends), which needs the tree's attention and
  the cache compaction to be right."""
  target, _ = _tiny_params()
  model = _tree_model(TINY, network.Transformer(TINY), (2, 2, 1))
  inputs = _random_inputs(6, seed=95)
  base, _ = _baseline()(target, _batch(inputs), jax.random.PRNGKey(0), 0.0)
  spec, aux = model.jit_predict()(
      {"target": target, "drafter": target}, _batch(inputs), jax.random.PRNGKey(0), 0.0
  )
  np.testing.assert_array_equal(spec, base)
  stats = {name: np.asarray(value) for name, value in aux["speculative_stats"].items()}
  lengths = decoding.decoded_lengths(np.asarray(base), EOS)
  # Every call but the last emits D + 1 = 4 tokens.
  np.testing.assert_array_equal(stats["target_calls"], -(-lengths // 4))
  assert np.all(stats["accepted_tokens"] >= 3 * (stats["target_calls"] - 1))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(gamma=3), "gamma 3 != the draft tree's depth 2"),
        (dict(verifier=speculative.TokenVerifier()), "verifies chains only"),
        (dict(draft_stop=draft_length.ConfidenceStop(0.5)), "not both"),
    ],
)
def test_a_tree_with_settings_it_cannot_use_is_refused(changes, message):
  settings = dict(verifier=TREE, draft_tree=(2, 1)) | changes
  with pytest.raises(ValueError, match=message):
    models.SpeculativeEncoderDecoderModel(
        network.Transformer(TINY),
        network.Transformer(TINY_DRAFTER),
        _vocab(61),
        _vocab(61),
        **settings,
    )


def test_prompt_lookup_refuses_a_tree_at_construction():
  with pytest.raises(ValueError, match="PromptLookupDrafter proposes chains only"):
    _tree_model(TINY, table_drafters.PromptLookupDrafter(vocab_size=61), (2, 1))

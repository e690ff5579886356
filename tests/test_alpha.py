"""Table 3's alpha by teacher forcing on target-generated sequences."""

import jax
import jax.numpy as jnp
import numpy as np

from conftest import tiny_config
from speculative_t5x import alpha, drafters, network, sampling, table_drafters

CFG = tiny_config(23)
EOS = 1


def _setup():
  params = network.init_params(CFG, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  enc = jnp.asarray(rng.integers(2, 23, (4, 6)), jnp.int32)
  sequences = np.asarray(rng.integers(2, 23, (4, 7)), np.int32)
  sequences[1, 3], sequences[1, 4:] = EOS, 0  # row 1 ends at position 3
  return params, enc, jnp.asarray(sequences)


def test_generated_positions_stop_after_eos():
  _, _, sequences = _setup()
  valid = np.asarray(alpha.generated_positions(sequences, EOS))
  np.testing.assert_array_equal(valid.sum(1), [7, 4, 7, 7])


def test_self_drafter_has_alpha_one():
  params, enc, sequences = _setup()
  beta_sum, count = alpha.beta_totals(
      CFG, params, drafters.T5Drafter(CFG), params, enc, sequences, EOS, temperature=1.0
  )
  np.testing.assert_allclose(beta_sum, count, rtol=1e-5)


def test_greedy_unigram_alpha_counts_matches_of_its_argmax():
  """At temperature 0, beta is 1 exactly where the target's greedy token is the unigram's mode."""
  params, enc, sequences = _setup()
  model = network.Transformer(CFG)
  greedy = np.asarray(
      model.apply({"params": params}, enc, alpha.shift_right(sequences), jnp.ones_like(sequences))
  ).argmax(-1)
  table = table_drafters.UnigramDrafter.fit([np.array([5, 5, 5, 7, 9])], CFG.vocab_size)
  beta_sum, count = alpha.beta_totals(
      CFG,
      params,
      table_drafters.UnigramDrafter(vocab_size=23),
      table,
      enc,
      sequences,
      EOS,
      temperature=0.0,
  )
  valid = np.asarray(alpha.generated_positions(sequences, EOS))
  np.testing.assert_allclose(beta_sum, ((greedy == 5) & valid).sum(1))
  np.testing.assert_array_equal(count, valid.sum(1))


def test_prompt_lookup_beta_is_the_target_probability_of_its_draft():
  """Prompt lookup's q is the one-hot of its draft, so beta = p(draft) at every position; the
  drafts here come from `propose` itself, one position at a time."""
  params, _, sequences = _setup()
  enc = jnp.asarray(np.asarray(sequences)[:, [0, 1, 2, 5, 6, 4]])  # inputs that hold bigrams
  drafter = table_drafters.PromptLookupDrafter(vocab_size=CFG.vocab_size, eos_id=EOS)
  beta_sum, count = alpha.beta_totals(
      CFG, params, drafter, {}, enc, sequences, EOS, temperature=1.0
  )
  p = jax.nn.softmax(network.teacher_forced_logits(CFG, params, enc, alpha.shift_right(sequences)))
  valid = np.asarray(alpha.generated_positions(sequences, EOS))
  state = drafter.init_state({}, enc, sequences.shape[1])
  expected, copied = np.zeros(sequences.shape[0]), 0
  for t in range(sequences.shape[1]):
    drafts = np.asarray(
        drafter.propose({}, state, sequences, jnp.full((4,), t, jnp.int32), 1, None, None)[0][:, 0]
    )
    copied += int(np.sum(drafts != drafter.fallback_token))
    expected += np.where(valid[:, t], np.asarray(p)[np.arange(4), t, drafts], 0.0)
  assert copied >= 4  # the lookup found what to copy, not only its fallback
  np.testing.assert_allclose(beta_sum, expected, rtol=1e-5)
  np.testing.assert_array_equal(count, valid.sum(1))


def test_shared_encoder_drafter_beta_reads_the_targets_encoder_output():
  """beta_totals at T = 0.7, top-k 5 equals a direct computation: the target teacher-forced,
  and the drafter's decoder on the target's own encoder output (of width 16, its own 8)."""
  params, enc, sequences = _setup()
  drafter = drafters.SharedEncoderDrafter(CFG.replace(emb_dim=8, num_decoder_layers=1), 16)
  drafter_params = drafter.init_params(jax.random.PRNGKey(4), {})
  beta_sum, count = alpha.beta_totals(
      CFG, params, drafter, drafter_params, enc, sequences, EOS, temperature=0.7, topk=5
  )
  model, inputs = network.Transformer(CFG), alpha.shift_right(sequences)
  encoded = model.apply({"params": params}, enc, method=model.encode)
  q_logits = network.shared_encoder_teacher_forced_logits(
      drafter.config, drafter_params, encoded, enc, inputs
  )
  p_logits = network.teacher_forced_logits(CFG, params, enc, inputs)
  p, q = (sampling.distribution(x, 0.7, 5) for x in (p_logits, q_logits))
  valid = np.asarray(alpha.generated_positions(sequences, EOS))
  beta = np.asarray(jnp.sum(jnp.minimum(p, q), -1))
  np.testing.assert_allclose(beta_sum, np.where(valid, beta, 0.0).sum(1), rtol=1e-5)
  np.testing.assert_array_equal(count, valid.sum(1))
  assert 0.0 < float(np.sum(beta_sum)) < float(np.sum(count))


def test_measure_counts_generated_tokens_and_scores_each_drafter():
  params, enc, _ = _setup()
  other = network.init_params(CFG, jax.random.PRNGKey(7))
  shared = drafters.SharedEncoderDrafter(CFG, CFG.emb_dim)
  result = alpha.measure(
      CFG,
      params,
      {
          "self": (drafters.T5Drafter(CFG), params),
          "other": (drafters.T5Drafter(CFG), other),
          "lookup": (table_drafters.PromptLookupDrafter(23), {}),
          "shared": (shared, shared.init_params(jax.random.PRNGKey(8), {})),
      },
      [enc, enc],
      decode_length=5,
      temperature=1.0,
      eos_id=EOS,
      num_tokens=6,
  )
  assert result["self"]["tokens"] == result["other"]["tokens"] == result["lookup"]["tokens"] >= 6
  assert result["self"]["tokens"] <= 4 * 5  # stopped after the first batch
  np.testing.assert_allclose(result["self"]["alpha"], 1.0, rtol=1e-5)
  assert 0.0 < result["other"]["alpha"] < 1.0
  assert 0.0 <= result["lookup"]["alpha"] < 1.0
  assert 0.0 < result["shared"]["alpha"] < 1.0
  for row in result.values():  # the bins of the target's top probability add up to the row
    bins = row["by_confidence"]
    assert [b["top_p"][0] for b in bins] == [0.0, *alpha.CONFIDENCE_EDGES]
    np.testing.assert_allclose(sum(b["share"] for b in bins), 1.0)
    weighted = sum(b["share"] * b["alpha"] for b in bins if b["alpha"] is not None)
    np.testing.assert_allclose(weighted, row["alpha"], rtol=1e-6)


def test_binned_totals_split_beta_by_the_targets_top_probability():
  """At T = 0.7 with another T5 drafter: each position's beta lands in the bin of max_x p(x) at
  temperature 1, computed here from the target's logits; the bins add up to `beta_totals`."""
  params, enc, sequences = _setup()
  other = network.init_params(CFG, jax.random.PRNGKey(7))
  drafter = drafters.T5Drafter(CFG)
  edges = (0.15, 0.18, 0.21)
  sums, counts = alpha.binned_beta_totals(
      CFG, params, drafter, other, enc, sequences, EOS, 0.7, edges=edges
  )
  inputs = alpha.shift_right(sequences)
  p_logits = network.teacher_forced_logits(CFG, params, enc, inputs)
  p, q = (
      sampling.distribution(network.teacher_forced_logits(CFG, w, enc, inputs), 0.7)
      for w in (params, other)
  )
  beta = np.asarray(jnp.sum(jnp.minimum(p, q), -1))
  top = np.asarray(jax.nn.softmax(p_logits), np.float64).max(-1)
  bins = np.digitize(top, edges)
  valid = np.asarray(alpha.generated_positions(sequences, EOS))
  expected = np.stack([np.where(valid & (bins == k), beta, 0.0).sum(1) for k in range(4)], 1)
  np.testing.assert_allclose(sums, expected, rtol=1e-5, atol=1e-6)
  assert (np.asarray(counts).sum(0) > 0).sum() >= 2  # the edges split these positions
  np.testing.assert_array_equal(np.asarray(counts).sum(1), valid.sum(1))
  total, count = alpha.beta_totals(CFG, params, drafter, other, enc, sequences, EOS, 0.7)
  np.testing.assert_allclose(np.asarray(sums).sum(1), total, rtol=1e-5)
  np.testing.assert_array_equal(count, valid.sum(1))

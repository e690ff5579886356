"""Table 3's alpha by teacher forcing on target-generated sequences."""
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import alpha, drafters, network

CFG = network.T5Config(vocab_size=23, emb_dim=16, num_heads=2, num_encoder_layers=1,
                       num_decoder_layers=2, head_dim=8, mlp_dim=32,
                       mlp_activations=("gelu", "linear"), dropout_rate=0.0)
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
  beta_sum, count = alpha.beta_totals(CFG, params, drafters.T5Drafter(CFG), params, enc, sequences,
                                      EOS, temperature=1.0)
  np.testing.assert_allclose(beta_sum, count, rtol=1e-5)


def test_greedy_unigram_alpha_counts_matches_of_its_argmax():
  """At temperature 0, beta is 1 exactly where the target's greedy token is the unigram's mode."""
  params, enc, sequences = _setup()
  model = network.Transformer(CFG)
  greedy = np.asarray(model.apply({"params": params}, enc, alpha.shift_right(sequences),
                                  jnp.ones_like(sequences))).argmax(-1)
  table = drafters.UnigramDrafter.fit([np.array([5, 5, 5, 7, 9])], CFG.vocab_size)
  beta_sum, count = alpha.beta_totals(CFG, params, drafters.UnigramDrafter(vocab_size=23), table,
                                      enc, sequences, EOS, temperature=0.0)
  valid = np.asarray(alpha.generated_positions(sequences, EOS))
  np.testing.assert_allclose(beta_sum, ((greedy == 5) & valid).sum(1))
  np.testing.assert_array_equal(count, valid.sum(1))


def test_measure_counts_generated_tokens_and_scores_each_drafter():
  params, enc, _ = _setup()
  other = network.init_params(CFG, jax.random.PRNGKey(7))
  result = alpha.measure(CFG, params, {"self": (drafters.T5Drafter(CFG), params),
                                       "other": (drafters.T5Drafter(CFG), other)},
                         [enc, enc], decode_length=5, temperature=1.0, eos_id=EOS, num_tokens=6)
  assert result["self"]["tokens"] == result["other"]["tokens"] >= 6
  assert result["self"]["tokens"] <= 4 * 5  # stopped after the first batch
  np.testing.assert_allclose(result["self"]["alpha"], 1.0, rtol=1e-5)
  assert 0.0 < result["other"]["alpha"] < 1.0

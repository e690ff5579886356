"""The T5 drafter's cache across proposals and roll-backs: every q it returns must be the
drafter's distribution given the true prefix and its own earlier drafts, whatever the loop
accepted before (none, some, all gamma drafts: the catch-up block), row by row."""
import jax
import numpy as np

from speculative_t5x import alpha, drafters, network, sampling

CONFIG = network.T5Config(vocab_size=11, emb_dim=16, num_heads=2, num_encoder_layers=1,
                          num_decoder_layers=2, head_dim=8, mlp_dim=32,
                          mlp_activations=("gelu", "linear"), dropout_rate=0.0)
GAMMA, LENGTH = 3, 24
# Accepted drafts per iteration and row: both rows see rejections and full acceptances, at
# different iterations (so at some iterations only one row needs the catch-up block).
ACCEPTED = [(0, 3), (3, 1), (2, 3), (3, 3), (1, 0)]


def test_t5_drafter_q_equals_teacher_forcing_after_any_acceptance():
  params = network.init_params(CONFIG, jax.random.PRNGKey(0))
  drafter = drafters.T5Drafter(CONFIG)
  rng = np.random.default_rng(0)
  encoder = rng.integers(2, CONFIG.vocab_size, (2, 7)).astype(np.int32)
  state = drafter.init_state(params, encoder, LENGTH + GAMMA + 1)
  standardize = sampling.Standardizer(1.0)
  propose = jax.jit(lambda state, sequences, length, u: drafter.propose(
      params, state, sequences, length, GAMMA, u, standardize))
  # The decoder is causal: logits at a position do not depend on the tokens padded after it.
  forced = jax.jit(lambda enc, seq: alpha.teacher_forced_logits(CONFIG, params, enc, seq))
  sequences = np.zeros((2, LENGTH + GAMMA + 1), np.int32)
  length = np.zeros(2, np.int32)
  for iteration, accepted in enumerate(ACCEPTED):
    u = jax.random.uniform(jax.random.PRNGKey(iteration), (2, GAMMA))
    drafts, q, state = propose(state, sequences, length, u)
    drafts, q = np.asarray(drafts), np.asarray(q)
    for row in range(2):
      prefix = np.concatenate([sequences[row, :length[row]], drafts[row]])
      logits = forced(encoder[row:row + 1], np.pad(prefix, (0, LENGTH + GAMMA - len(prefix)))[None])
      expected = jax.nn.softmax(logits[0, length[row]:length[row] + GAMMA], axis=-1)
      np.testing.assert_allclose(q[row], expected, atol=2e-5,
                                 err_msg=f"iteration {iteration}, row {row}")
      # The loop's update: the accepted drafts, then a correction token of its own.
      n = accepted[row]
      new = np.append(drafts[row, :n], rng.integers(2, CONFIG.vocab_size))
      sequences[row, length[row]:length[row] + n + 1] = new
      length[row] += n + 1

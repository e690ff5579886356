"""What the model drafters propose, pinned down against their networks, and the protocol.

The exactness tests (test_decoding.py) pass for any q, so a wrong proposal would only lower alpha
silently. Here: the cache of the model drafters (T5, and the shared-encoder decoder reading the
target's encoder output) across proposals and roll-backs, for chains and trees (every q they
return is their distribution given the true prefix and their own earlier drafts, whatever the
loop accepted before); their teacher-forced logits and parameters; `for_target`, `as_drafter` and
the protocol's defaults. The drafters without a model call are test_table_drafters.py's.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from speculative_t5x import alpha, drafters, network, sampling, trees
from speculative_t5x import feature_drafter
from speculative_t5x import table_drafters
from speculative_t5x.training import training
from speculative_t5x.validation import InvalidInputError
from speculative_t5x.weights import checkpoints
from speculative_t5x.weights import pairs

CONFIG = tiny_config(11)
GAMMA, LENGTH = 3, 24
# Accepted drafts per iteration and row: both rows see rejections and full acceptances, at
# different iterations (so at some iterations only one row needs the catch-up block).
ACCEPTED = [(0, 3), (3, 1), (2, 3), (3, 3), (1, 0)]


E_TARGET = 24  # the target width a shared-encoder drafter reads, != CONFIG.emb_dim
MODEL_KINDS = ["t5", "shared_encoder"]


@functools.lru_cache(maxsize=None)
def _t5_params():
  return jax.jit(network.init_params, static_argnums=0)(CONFIG, jax.random.PRNGKey(0))


@functools.lru_cache(maxsize=None)
def _shared_params():
  init = jax.jit(network.shared_encoder_init_params, static_argnums=(0, 1))
  return init(CONFIG, E_TARGET, jax.random.PRNGKey(0))


def _model_drafter(kind, encoder):
  """-> (drafter, params, target_encoded): for the shared-encoder drafter a random stand-in for
  the target's encoder output of `encoder` [B, Le] ([B, Le, E_TARGET]); None for the T5 drafter."""
  if kind == "t5":
    return drafters.T5Drafter(CONFIG), _t5_params(), None
  encoded = np.random.default_rng(0).normal(size=encoder.shape + (E_TARGET,)).astype(np.float32)
  return drafters.SharedEncoderDrafter(CONFIG, E_TARGET), _shared_params(), encoded


def _teacher_forcing(drafter, params):
  """(encoder tokens [b, Le], target sequences [b, L], target_encoded [b, Le, E] or None) ->
  the drafter's teacher-forced logits [b, L, V]; the decoder is causal, so logits at a position
  do not depend on the tokens padded after it."""
  return jax.jit(
      lambda enc, seq, encoded: drafter.teacher_forced_logits(
          params, enc, alpha.shift_right(seq), target_encoded=encoded
      )
  )


def _rows(encoded, row):
  return None if encoded is None else encoded[row : row + 1]


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_model_drafter_q_equals_teacher_forcing_after_any_acceptance(kind):
  rng = np.random.default_rng(0)
  encoder = rng.integers(2, CONFIG.vocab_size, (2, 7)).astype(np.int32)
  drafter, params, encoded = _model_drafter(kind, encoder)
  state = drafter.init_state(params, encoder, LENGTH + GAMMA + 1, target_encoded=encoded)
  standardize = sampling.Standardizer(1.0)
  propose = jax.jit(
      lambda state, sequences, length, u: drafter.propose(
          params, state, sequences, length, GAMMA, u, standardize
      )
  )
  forced = _teacher_forcing(drafter, params)
  sequences = np.zeros((2, LENGTH + GAMMA + 1), np.int32)
  length = np.zeros(2, np.int32)
  for iteration, accepted in enumerate(ACCEPTED):
    u = jax.random.uniform(jax.random.PRNGKey(iteration), (2, GAMMA))
    drafts, q, state = propose(state, sequences, length, u)
    drafts, q = np.asarray(drafts), np.asarray(q)
    for row in range(2):
      prefix = np.concatenate([sequences[row, : length[row]], drafts[row]])
      logits = forced(
          encoder[row : row + 1],
          np.pad(prefix, (0, LENGTH + GAMMA - len(prefix)))[None],
          _rows(encoded, row),
      )
      expected = jax.nn.softmax(logits[0, length[row] : length[row] + GAMMA], axis=-1)
      np.testing.assert_allclose(
          q[row], expected, atol=2e-5, err_msg=f"iteration {iteration}, row {row}"
      )
      # The loop's update: the accepted drafts, then a correction token of its own.
      n = accepted[row]
      new = np.append(drafts[row, :n], rng.integers(2, CONFIG.vocab_size))
      sequences[row, length[row] : length[row] + n + 1] = new
      length[row] += n + 1


def _stop_after_multiples_of_three(logits, drafts):
  """A draft-length rule that reads only the drafter's output: stop after a draft 0 mod 3."""
  del logits
  return drafts % 3 == 0


def test_t5_drafter_under_a_stop_rule_drafts_its_chain_and_leaves_the_rest_empty():
  """Rows stop at different slots, and every later proposal (after roll-backs past or into the
  steps the batch took for other rows) still gives q equal to teacher forcing."""
  params = _t5_params()
  drafter = drafters.T5Drafter(CONFIG)
  rng = np.random.default_rng(1)
  encoder = rng.integers(2, CONFIG.vocab_size, (2, 7)).astype(np.int32)
  gamma = 4
  state = drafter.init_state(params, encoder, LENGTH + gamma + 1)
  propose = jax.jit(
      lambda state, sequences, length, u: drafter.propose(
          params,
          state,
          sequences,
          length,
          gamma,
          u,
          sampling.Standardizer(1.0),
          stop=_stop_after_multiples_of_three,
      )
  )
  forced = jax.jit(
      lambda enc, seq: drafter.teacher_forced_logits(params, enc, alpha.shift_right(seq))
  )
  sequences = np.zeros((2, LENGTH + gamma + 1), np.int32)
  length = np.zeros(2, np.int32)
  lengths_seen = set()
  for iteration in range(6):
    u = jax.random.uniform(jax.random.PRNGKey(10 + iteration), (2, gamma))
    drafts, q, state = propose(state, sequences, length, u)
    drafts, q = np.asarray(drafts), np.asarray(q)
    for row in range(2):
      # The rule by hand: drafts up to and including the first multiple of 3, the rest empty.
      stops = np.flatnonzero(drafts[row] % 3 == 0)
      drafted = stops[0] + 1 if len(stops) else gamma
      if drafted < gamma:
        assert np.all(drafts[row, drafted:] == drafters.EMPTY), (iteration, row, drafts[row])
        assert np.all(q[row, drafted:] == 0.0)
      assert np.all(drafts[row, :drafted] >= 0)
      lengths_seen.add(int(drafted))
      prefix = np.concatenate([sequences[row, : length[row]], drafts[row, :drafted]])
      logits = forced(
          encoder[row : row + 1], np.pad(prefix, (0, LENGTH + gamma - len(prefix)))[None]
      )
      expected = jax.nn.softmax(logits[0, length[row] : length[row] + drafted], axis=-1)
      np.testing.assert_allclose(
          q[row, :drafted], expected, atol=2e-5, err_msg=f"iteration {iteration}, row {row}"
      )
      n = min(drafted, (iteration + row) % 3 + 1)  # accept 1..3 of the drafted, in turn
      new = np.append(drafts[row, :n], rng.integers(2, CONFIG.vocab_size))
      sequences[row, length[row] : length[row] + n + 1] = new
      length[row] += n + 1
  assert len(lengths_seen) >= 2  # the rule stopped rows at different slots


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_model_drafter_tree_q_equals_teacher_forcing(kind):
  """q of node i is the drafter's distribution after the path to its parent, with its earlier
  siblings removed and renormalized (what `speculative.TreeVerifier` needs), over two proposals
  at ragged lengths, the second after part of the first tree was accepted."""
  tree = trees.DraftTree.from_branching((2, 2, 1))
  rng = np.random.default_rng(2)
  encoder = rng.integers(2, CONFIG.vocab_size, (2, 7)).astype(np.int32)
  drafter, params, encoded = _model_drafter(kind, encoder)
  state = drafter.init_state(params, encoder, LENGTH + tree.width, target_encoded=encoded)
  propose = jax.jit(
      lambda state, sequences, length, u: drafter.propose_tree(
          params, state, sequences, length, tree, u, sampling.Standardizer(1.0)
      )
  )
  forced = _teacher_forcing(drafter, params)
  sequences = np.zeros((2, LENGTH + tree.width), np.int32)
  sequences[1, :2] = rng.integers(2, CONFIG.vocab_size, 2)
  length = np.array([0, 2], np.int32)
  for iteration, accepted_nodes in enumerate([(8, 0), (1, 5)]):
    u = jax.random.uniform(jax.random.PRNGKey(20 + iteration), (2, tree.num_nodes))
    drafts, q, state = propose(state, sequences, length, u)
    drafts, q = np.asarray(drafts), np.asarray(q)
    for row in range(2):
      for node, parent in enumerate(tree.parents):
        depth = tree.depths[parent]
        prefix = np.concatenate(
            [sequences[row, : length[row]], drafts[row, tree.paths[parent, :depth] - 1]]
        )
        logits = forced(
            encoder[row : row + 1],
            np.pad(prefix, (0, sequences.shape[1] - len(prefix)))[None],
            _rows(encoded, row),
        )
        expected = np.asarray(jax.nn.softmax(logits[0, length[row] + depth]), np.float64)
        earlier = [j for j in range(node) if tree.parents[j] == parent]
        expected[drafts[row, earlier]] = 0.0
        np.testing.assert_allclose(
            q[row, node], expected / expected.sum(), atol=2e-5, err_msg=f"{iteration}, {row}"
        )
      # The loop's update: the drafts on the path to the accepted node, and a correction token.
      node = accepted_nodes[row]
      path = drafts[row, tree.paths[node + 1, : tree.depths[node + 1]] - 1]
      new = np.append(path, rng.integers(2, CONFIG.vocab_size))
      sequences[row, length[row] : length[row] + len(new)] = new
      length[row] += len(new)


def test_draft_chain_runs_only_while_some_row_drafts():
  """Drafter steps: the longest row's drafts; a rule that never stops takes gamma steps."""
  logits = jnp.log(jnp.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]]))[:, None]  # [2, 1, 4]

  def step(carry, tokens, i):
    # The next draft is the previous one + 1 (mod 4), with probability 0.7.
    return jnp.log(jax.nn.one_hot((tokens + 1) % 4, 4) * 0.6 + 0.1)[:, None], carry + 1

  u = jnp.zeros((2, 5))
  for stop, expected_drafts, expected_steps in [
      (None, [[0, 1, 2, 3, 0], [3, 0, 1, 2, 3]], 5),
      (lambda lg, d: d == 2, [[0, 1, 2, -1, -1], [3, 0, 1, 2, -1]], 4),
      (lambda lg, d: d >= 0, [[0, -1, -1, -1, -1], [3, -1, -1, -1, -1]], 1),
  ]:
    drafts, q, carry, steps = drafters.draft_chain(
        logits, step, 0, 5, u, sampling.Standardizer(0.0), stop
    )
    np.testing.assert_array_equal(drafts, expected_drafts)
    assert q is None  # greedy
    assert int(steps) == expected_steps and int(carry) == expected_steps - 1


def test_t5_drafter_teacher_forced_logits_are_the_networks():
  """Full-attention teacher forcing equals the network's, and the cached decode of the block."""
  drafter = drafters.T5Drafter(CONFIG)
  module = network.Transformer(CONFIG)

  @jax.jit
  def three_ways(params, encoder, decoder_inputs):
    _, cache = module.apply({"params": params}, encoder, 6, method=module.prefill)
    cached, _ = module.apply(
        {"params": params}, decoder_inputs, cache, jnp.zeros(2, jnp.int32), method=module.decode
    )
    return (
        drafter.teacher_forced_logits(params, encoder, decoder_inputs),
        network.teacher_forced_logits(CONFIG, params, encoder, decoder_inputs),
        cached,
    )

  encoder = np.array([[3, 4, 5, 6, 0], [7, 2, 9, 0, 0]], np.int32)
  decoder_inputs = np.array([[0, 5, 0, 7, 3, 3], [0, 8, 9, 10, 2, 1]], np.int32)  # a 0 token
  logits, network_logits, cached = three_ways(_t5_params(), encoder, decoder_inputs)
  np.testing.assert_array_equal(logits, network_logits)
  np.testing.assert_allclose(logits, cached, atol=2e-5)


# --- for_target, as_drafter, the protocol's defaults ---------------------------------------------
def test_for_target_fills_unset_fields_and_rejects_mismatches():
  t5 = drafters.T5Drafter(CONFIG).for_target(11, 1)
  assert (t5.vocab_size, t5.eos_id, t5.config) == (11, 1, CONFIG)
  with pytest.raises(ValueError, match="drafter vocab_size 11 != target vocab_size 12"):
    drafters.T5Drafter(CONFIG).for_target(12, 1)


def test_as_drafter():
  drafter = drafters.SharedEncoderDrafter(CONFIG, E_TARGET)
  assert drafters.as_drafter(drafter) is drafter
  t5 = drafters.as_drafter(network.Transformer(CONFIG))
  assert isinstance(t5, drafters.T5Drafter) and t5.config == CONFIG and t5.eos_id is None
  assert drafters.as_drafter(CONFIG).config == CONFIG
  with pytest.raises(ValueError, match="network.Transformer, got dict"):
    drafters.as_drafter({"emb_dim": 8})


# The fix every mismatch names.
RESTORE_FIX = (
    r"Restore them with the drafter they were saved with \(pairs\.PairConfig\.from_pair_dir, or "
    r"checkpoints\.read_drafter on their directory\), or build the drafter with the sizes they have"
)


def test_check_params_takes_the_drafters_own_parameters():
  drafter = drafters.SharedEncoderDrafter(CONFIG, E_TARGET)
  assert drafter.param_shapes() == jax.tree.map(lambda x: tuple(x.shape), _shared_params())
  drafter.check_params(_shared_params())
  drafters.T5Drafter(CONFIG).check_params(_t5_params())


def test_check_params_refuses_a_shared_encoder_drafter_of_another_width():
  """Parameters of a drafter reading an encoder output of width 16 (another target's), given to
  one reading width 24: the cross-attention kernels differ, and the first is named."""
  narrow = jax.eval_shape(
      lambda: network.shared_encoder_init_params(CONFIG, 16, jax.random.PRNGKey(0))
  )
  with pytest.raises(
      InvalidInputError,
      match=r"^drafter params are not this SharedEncoderDrafter's parameters \(4 problem\(s\); "
      r"the first: decoder/layers_0/encoder_decoder_attention/key/kernel is \(16, 16\), the "
      r"SharedEncoderDrafter needs \(24, 16\)\): .*" + RESTORE_FIX,
  ):
    drafters.SharedEncoderDrafter(CONFIG, E_TARGET).check_params(narrow)


def test_check_params_refuses_the_parameters_of_another_kind():
  """A T5 drafter's parameters given to a shared-encoder drafter of the same sizes: its encoder
  is what the other kind does not have."""
  t5 = jax.eval_shape(lambda: network.init_params(CONFIG, jax.random.PRNGKey(0)))
  with pytest.raises(
      InvalidInputError,
      match=r"^params\['drafter'\] are not this SharedEncoderDrafter's parameters \(\d+ "
      r"problem\(s\); the first: encoder/encoder_norm/scale \(16,\) is not a parameter of the "
      r"SharedEncoderDrafter\): .*" + RESTORE_FIX,
  ):
    drafters.SharedEncoderDrafter(CONFIG, CONFIG.emb_dim).check_params(t5, "params['drafter']")
  with pytest.raises(
      InvalidInputError,
      match=r"\(43 problem\(s\); the first: decoder/decoder_norm/scale \(16,\) is missing\)",
  ):
    drafters.T5Drafter(CONFIG).check_params({})


def test_shared_encoder_drafter_reads_the_targets_encoder_output_and_nothing_else():
  encoder = np.full((2, 7), 3, np.int32)
  drafter, params, encoded = _model_drafter("shared_encoder", encoder)
  assert drafters.stepped_network(drafter) == (CONFIG, E_TARGET)
  assert checkpoints.needs_checkpoint(drafter) and drafter.vocab_size == CONFIG.vocab_size
  with pytest.raises(ValueError, match=r"init_state needs target_encoded \[B, Le, 24\]"):
    drafter.init_state(params, encoder, 8)
  with pytest.raises(ValueError, match="teacher_forced_logits needs target_encoded"):
    drafter.teacher_forced_logits(params, encoder, encoder)
  with pytest.raises(
      ValueError,
      match=r"got target_encoded of shape \(2, 7, 16\), but it reads encoder outputs \[B, Le, "
      r"encoder_emb_dim = 24\]",
  ):
    drafter.init_state(params, encoder, 8, target_encoded=encoded[..., :16])
  drafter.check_target(CONFIG.replace(emb_dim=E_TARGET, num_heads=3))
  with pytest.raises(ValueError, match="encoder_emb_dim 24 != the target's emb_dim 16: .*= 16"):
    drafter.check_target(CONFIG)
  with pytest.raises(ValueError, match="vocab_size 11 != the target's vocab_size 12"):
    drafter.check_target(CONFIG.replace(emb_dim=E_TARGET, vocab_size=12))


@dataclasses.dataclass(frozen=True, eq=False)
class _Minimal(drafters.Drafter):
  """Only the abstract methods: proposes token 3."""

  vocab_size: int = 5
  eos_id: int | None = None

  def init_state(self, params, encoder_input_tokens, cache_length, target_encoded=None):
    return ()

  def propose(self, params, state, sequences, length, gamma, u, standardize):
    drafts = jnp.full((sequences.shape[0], gamma), 3, jnp.int32)
    return drafts, jax.nn.one_hot(drafts, self.vocab_size), state

  def teacher_forced_logits(
      self, params, encoder_input_tokens, decoder_input_tokens, target_encoded=None
  ):
    return jnp.zeros(decoder_input_tokens.shape + (self.vocab_size,))


def test_protocol_defaults_for_a_drafter_without_weights():
  drafter = _Minimal()
  assert drafter.init_params(jax.random.PRNGKey(0), {"encoder_input_tokens": (1, 4)}) == {}
  assert drafter.param_axes() is None
  assert not checkpoints.needs_checkpoint(drafter) and not pairs.learns_from_targets(drafter)
  assert drafter.steps_per_draft == 1
  with pytest.raises(ValueError, match="_Minimal has no checkpoint format .*/some/ckpt"):
    checkpoints.restore_drafter_params(drafter, "/some/ckpt")
  with pytest.raises(ValueError, match="_Minimal is not fitted from data"):
    pairs.fit_drafter_params(drafter, [np.array([1, 2])])
  with pytest.raises(ValueError, match="_Minimal has no checkpoint format, so .* to /some/ckpt"):
    checkpoints.save_drafter_params(drafter, "/some/ckpt", {})
  drafter.check_target(CONFIG)  # any target
  assert drafters.stepped_network(drafter) is None
  assert drafter.for_target(5, 1).eos_id == 1


def test_a_drafter_missing_an_abstract_method_cannot_be_made():
  class _NoPropose(drafters.Drafter):
    vocab_size, eos_id = 5, None

    def init_state(self, params, encoder_input_tokens, cache_length, target_encoded=None):
      return ()

    def teacher_forced_logits(
        self, params, encoder_input_tokens, decoder_input_tokens, target_encoded=None
    ):
      return None

  with pytest.raises(TypeError, match="propose"):
    _NoPropose()


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: drafters.SharedEncoderDrafter(CONFIG, 0),
            "SharedEncoderDrafter.encoder_emb_dim must be an integer >= 1",
        ),
        (
            lambda: drafters.SharedEncoderDrafter(network.Transformer(CONFIG), 8),
            "SharedEncoderDrafter needs a network.T5Config",
        ),
    ],
)
def test_bad_drafter_settings_are_refused(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_the_drafter_protocol_is_what_the_loop_calls_and_each_kind_meets_the_periphery_s_own():
  """The base class holds the parameters and the decoding calls and nothing of checkpoints,
  fitting or training; those are protocols of the weights and training layers, met by the kinds
  that have them."""
  assert {name for name in vars(drafters.Drafter) if not name.startswith("_")} == {
      "init_params", "param_shapes", "floating_params", "check_params", "param_axes",
      "check_lengths", "check_target", "for_target", "init_state", "decode_params", "propose",
      "propose_tree", "observe_features", "steps_per_draft", "teacher_forced_logits",
      "reads_target_features", "target_feature_layers", "draft_vocab",
  }  # fmt: skip
  kinds = {
      "t5": drafters.T5Drafter(CONFIG),
      "shared": drafters.SharedEncoderDrafter(CONFIG, E_TARGET),
      "feature": feature_drafter.FeatureDrafter(CONFIG, CONFIG.emb_dim),
      "unigram": table_drafters.UnigramDrafter(CONFIG.vocab_size),
      "bigram": table_drafters.BigramDrafter(CONFIG.vocab_size),
      "lookup": table_drafters.PromptLookupDrafter(CONFIG.vocab_size),
  }
  protocols = {
      "checkpointed": checkpoints.Checkpointed,
      "completed": checkpoints.CompletedFromTarget,
      "fitted": pairs.FittedFromTargets,
      "shares": training.SharesTarget,
  }
  met = {
      name: sorted(p for p, protocol in protocols.items() if isinstance(kind, protocol))
      for name, kind in kinds.items()
  }
  assert met == {
      "t5": ["checkpointed"],
      "shared": ["checkpointed"],
      "feature": ["checkpointed", "completed", "shares"],
      "unigram": ["fitted"],
      "bigram": ["fitted"],
      "lookup": [],
  }

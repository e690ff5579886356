"""sweep.py: the sweep's wiring (real decodes of tiny pairs, the timers replaced by known times),
its settings and its inputs. No timing is measured."""

import pathlib
import time

import jax
import numpy as np
import pytest
import seqio

from speculative_t5x import draft_length
from speculative_t5x import draft_shapes
from speculative_t5x import drafters
from speculative_t5x import network
from speculative_t5x import speculative
from speculative_t5x import trees
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.measuring import sweep
from speculative_t5x.text import input_data

REPO = pathlib.Path(__file__).resolve().parents[1]


def ms(value):
  return stopwatch.Timing(value, value, value, 0.0, 3)


def run_once(calls, outputs):
  """What a `stopwatch.time_calls` stand-in leaves in `outputs`: each call's result (real
  decodes)."""
  for key, (fn, args) in calls.items():
    outputs[key] = fn(*args)


def _replace_timers(
    monkeypatch,
    on_steps=lambda steps, geometry: None,
    on_example=lambda warmup, compiled: None,
    on_prefills=lambda calls: None,
):
  """Real decodes, timers replaced: every example call 1 ms, a decode step 1 ms per pass;
  on_steps(steps, geometry) sees each `step_costs.decode_step_calls`, on_example(warmup, compiled)
  each example's `stopwatch.time_calls`, on_prefills(calls) each `sweep.time_prefills`'."""

  def decode_step_calls(steps, geometry, temperature, batch):
    on_steps(steps, geometry)
    return {(name, passes): None for name in steps for passes in (1, 1 + step_costs.EXTRA_PASSES)}

  def time_calls(calls, repeats, warmup, compiled=False, outputs=None):
    if outputs is None:  # the prefills (`sweep.time_prefills`)
      on_prefills(calls)
    else:
      on_example(warmup, compiled)
      run_once(calls, outputs)
    return {key: ms(1.0) for key in calls}

  monkeypatch.setattr(stopwatch, "time_calls", time_calls)
  monkeypatch.setattr(step_costs, "decode_step_calls", decode_step_calls)
  monkeypatch.setattr(
      stopwatch,
      "time_rounds",
      lambda calls, repeats, warmup, compiled: {
          (name, passes): np.full(repeats, passes * 1e-3) for name, passes in calls
      },
  )


def _tiny_pair():
  config = network.T5Config(
      vocab_size=32,
      emb_dim=8,
      num_heads=2,
      num_encoder_layers=1,
      num_decoder_layers=1,
      head_dim=4,
      mlp_dim=16,
      dropout_rate=0.0,
  )
  return config, network.init_params(config, jax.random.PRNGKey(0))


def test_sweep_times_examples_side_by_side_and_costs_between_them(monkeypatch):
  """Real decodes of a tiny pair (the drafter a copy of the target), with the timers replaced by
  known times: baseline decodes 10 ms, speculative 4 ms, prefills 1 ms; decode steps (per
  marginal step) target 2 ms, target on 3 tokens 3 ms, iteration 5 ms. The prefills are timed
  once, before the first example: the examples share their shapes."""
  step_ms = {("target", 1): 2.0, ("target", 3): 3.0, ("iteration", "copy", 2): 5.0}
  rounds, example_calls, prefill_calls = [], [], []

  def time_calls(calls, repeats, warmup, compiled=False, outputs=None):
    if outputs is None:
      prefill_calls.append((sorted(calls, key=str), repeats, len(example_calls)))
      return {key: ms(1.0) for key in calls}
    example_calls.append((repeats, warmup, compiled))
    run_once(calls, outputs)
    assert {part for part, _ in calls} == {"decode"}
    return {key: ms(10.0 if key[1] == sweep.BASELINE else 4.0) for key in calls}

  def decode_step_calls(steps, geometry, temperature, batch):
    assert set(steps) == set(step_ms) and batch == 1 and temperature == 0.0
    return {(name, passes): None for name in steps for passes in (1, 1 + step_costs.EXTRA_PASSES)}

  def time_rounds(calls, repeats, warmup, compiled):
    rounds.append((repeats, warmup, compiled))
    return {
        (name, passes): np.full(repeats, passes * step_ms[name] * 1e-3) for name, passes in calls
    }

  monkeypatch.setattr(stopwatch, "time_calls", time_calls)
  monkeypatch.setattr(step_costs, "decode_step_calls", decode_step_calls)
  monkeypatch.setattr(stopwatch, "time_rounds", time_rounds)
  config, params = _tiny_pair()
  inputs = input_data.random_inputs(config.vocab_size, 2, 6, seed=0)
  vocabulary = seqio.PassThroughVocabulary(config.vocab_size, eos_id=1)
  measured = sweep.sweep(
      config,
      params,
      {"copy": (drafters.T5Drafter(config), params)},
      sweep.grid_settings(["copy"], [2]),
      [0.0],
      inputs[:, None],
      4,
      vocabulary=vocabulary,
      task="random",
      repeats=3,
      warmup=1,
      cost_repeats=3,
      steps_per_call=1,
  )
  assert rounds == [(2, 1, False), (1, 0, True)]  # the 3 rounds spread over the 2 examples
  # The first example compiles and warms the decodes; the second reuses them, timed at once.
  assert example_calls == [(3, 1, False), (3, 0, True)]
  assert prefill_calls == [([("copy", 2), sweep.BASELINE], sweep.PREFILL_REPEATS, 0)]
  assert measured.cost_rounds == 3
  (row,) = measured.rows
  assert (row.task, row.drafter, row.temperature, row.gamma) == ("random", "copy", 0.0, 2)
  assert (row.c, row.verify_cost, row.iteration_cost) == (1.0, 1.5, 2.5)
  assert row.alpha == 1.0 and row.outputs_match_baseline == 1.0  # the drafter is the target
  assert row.speedup == pytest.approx(2.5) and row.loop_speedup == pytest.approx(3.0)
  assert [len(measured.results[0.0][key]) for key in (sweep.BASELINE, ("copy", 2))] == [2, 2]
  assert measured.costs[0.0]["copy"].verify_cost(2) == 1.5


def test_cost_repeats_zero_times_no_step_and_leaves_the_step_figures_nan(monkeypatch):
  """cost_repeats=0: no decode step is built, compiled or timed; the rows' speedups come from the
  decodes as ever, and every figure made from the step costs is NaN, never a made-up value."""

  def refuse(*args, **kwargs):
    raise AssertionError("a decode step was built or timed with cost_repeats=0")

  example_calls = []
  _replace_timers(monkeypatch, on_example=lambda warmup, compiled: example_calls.append(warmup))
  for module, name in (
      (step_costs, "cost_steps"),
      (step_costs, "decode_step_calls"),
      (stopwatch, "time_rounds"),
  ):
    monkeypatch.setattr(module, name, refuse)
  config, params = _tiny_pair()
  inputs = input_data.random_inputs(config.vocab_size, 2, 6, seed=0)

  def run(temperatures, cost_repeats):
    return sweep.sweep(
        config,
        params,
        {"copy": (drafters.T5Drafter(config), params)},
        sweep.grid_settings(["copy"], [2]),
        temperatures,
        inputs[:, None],
        4,
        vocabulary=seqio.PassThroughVocabulary(config.vocab_size, eos_id=1),
        task="random",
        repeats=1,
        cost_repeats=cost_repeats,
    )

  measured = run([0.0, 1.0], 0)
  assert example_calls == [stopwatch.DEFAULT_WARMUP, 0] * 2
  assert measured.costs == {0.0: {}, 1.0: {}} and measured.cost_rounds == 0
  for row in measured.rows:
    if row.temperature == 0.0:
      assert row.outputs_match_baseline == 1.0
    assert row.speedup > 0 and row.alpha == pytest.approx(1.0)  # the drafter is the target
    for figure in (row.c, row.verify_cost, row.iteration_cost, row.c_in_loop, row.predicted):
      assert np.isnan(figure)
  with pytest.raises(ValueError, match=r"cost_repeats >= 0 \(0: no step costs\)"):
    run([0.0], -1)


def test_examples_of_several_lengths_compile_once_per_length_and_decode_as_if_padded(monkeypatch):
  """Examples cut to their own length buckets: the first example of each encoder length compiles
  and warms up, the costs are timed at the length most examples have, and every decode (real
  ones, of a random tiny pair at T = 0 and a drafter that is not the target) is the one the same
  example gives padded to the longest length."""
  example_calls, geometries, prefill_lengths = [], [], []

  def on_prefills(calls):
    (length,) = {args[1]["encoder_input_tokens"].shape[1] for _, args in calls.values()}
    prefill_lengths.append(length)

  _replace_timers(
      monkeypatch,
      on_steps=lambda steps, geometry: geometries.append(geometry),
      on_example=lambda warmup, compiled: example_calls.append((warmup, compiled)),
      on_prefills=on_prefills,
  )
  config, params = _tiny_pair()
  drafter_config = config.replace(emb_dim=6, num_heads=1, mlp_dim=8)
  drafter_params = network.init_params(drafter_config, jax.random.PRNGKey(5))
  lengths = [3, 9, 2, 5, 12]  # tokens before the padding, EOS included
  padded = np.zeros((len(lengths), 1, 12), np.int32)
  rng = np.random.default_rng(0)
  for row, length in zip(padded, lengths):
    row[0, : length - 1] = rng.integers(2, config.vocab_size, length - 1)
    row[0, length - 1] = 1
  buckets = sweep.pad_to_buckets(padded, 4)
  assert [x.shape for x in buckets] == [(1, 4), (1, 12), (1, 4), (1, 8), (1, 12)]

  def run(inputs):
    return sweep.sweep(
        config,
        params,
        {"small": (drafters.T5Drafter(drafter_config), drafter_params)},
        sweep.grid_settings(["small"], [2]),
        [0.0],
        inputs,
        8,
        vocabulary=seqio.PassThroughVocabulary(config.vocab_size, eos_id=1),
        task="random",
        repeats=1,
        warmup=2,
        cost_repeats=1,
        steps_per_call=1,
    )

  bucketed = run(buckets)
  # Lengths 4, 12, 4, 8, 12: each new length compiles and warms up, a length seen before does not.
  assert example_calls == [(2, False), (2, False), (0, True), (2, False), (0, True)]
  assert prefill_lengths == [4, 12, 8]  # the prefills timed once per length
  assert geometries[-1].encoder_length == 12  # 4 and 12 tie at two examples: the longer
  whole = run(padded)
  for key in (sweep.BASELINE, ("small", 2)):
    for a, b in zip(bucketed.results[0.0][key], whole.results[0.0][key], strict=True):
      np.testing.assert_array_equal(a.decodes, b.decodes)
  assert bucketed.rows[0].outputs_match_baseline == 1.0
  assert 0.0 <= bucketed.rows[0].alpha < 1.0  # a drafter that is not the target


def test_pad_to_buckets_cuts_trailing_padding_only():
  x = np.array(
      [
          [[5, 0, 7, 1, 0, 0, 0, 0, 0], [3, 1, 0, 0, 0, 0, 0, 0, 0]],  # row 0 ends at 4 tokens
          [[4, 4, 4, 4, 4, 4, 4, 4, 1], [1, 0, 0, 0, 0, 0, 0, 0, 0]],  # 9: capped at 9, not 12
          [[0] * 9, [0] * 9],  # all padding: one position
      ],
      np.int32,
  )
  buckets = sweep.pad_to_buckets(x, 3)
  assert [b.shape for b in buckets] == [(2, 6), (2, 9), (2, 3)]
  for bucket, example in zip(buckets, x):
    np.testing.assert_array_equal(bucket, example[:, : bucket.shape[1]])
    assert not example[:, bucket.shape[1] :].any()
  assert [b.shape for b in sweep.pad_to_buckets(x, 1)] == [(2, 4), (2, 9), (2, 1)]
  for bad, multiple in [(x[0], 3), (x, 0), (x, True)]:
    with pytest.raises(ValueError, match=r"need encoder inputs \[examples, batch, length\]"):
      sweep.pad_to_buckets(bad, multiple)


def test_most_common_length_breaks_ties_toward_the_longer():
  shapes = [(1, 8), (1, 16), (1, 8), (1, 16), (1, 32)]
  assert sweep.most_common_length([np.zeros(s) for s in shapes]) == 16
  assert sweep.most_common_length([np.zeros(s) for s in shapes[:3]]) == 8
  assert sweep.encoder_lengths([np.zeros(s) for s in shapes]) == {8: 2, 16: 2, 32: 1}


def test_cost_rounds_after_spreads_exactly_cost_repeats_rounds():
  """cost_repeats rounds in all, whatever the number of examples; the first example always gets
  one (it compiles the steps); more examples than rounds leave some without."""
  assert sweep.cost_rounds_after(3, 2) == [2, 1]
  assert sweep.cost_rounds_after(8, 2) == [4, 4]
  assert sweep.cost_rounds_after(10, 3) == [4, 3, 3]
  assert sweep.cost_rounds_after(1, 5) == [1, 0, 0, 0, 0]
  assert sweep.cost_rounds_after(4, 8) == [1, 0, 1, 0, 1, 0, 1, 0]
  for repeats, examples in [(10, 16), (10, 64), (7, 7), (5, 100)]:
    rounds = sweep.cost_rounds_after(repeats, examples)
    assert sum(rounds) == repeats and rounds[0] == 1 and max(rounds) == 1
  with pytest.raises(ValueError, match="cost_repeats >= 1"):
    sweep.cost_rounds_after(0, 4)


def test_sweep_takes_a_drafter_reading_the_targets_encoder(monkeypatch):
  """A drafters.SharedEncoderDrafter (narrower than the target) in the sweep: its drafter step is
  timed as its own decoder on a cache made from an encoder output of the target's width, and its
  greedy decodes (real ones; only the timers are replaced) equal the baseline's."""
  stages = {}
  _replace_timers(monkeypatch, on_steps=lambda steps, geometry: stages.update(steps))
  config, params = _tiny_pair()
  drafter_config = config.replace(emb_dim=6, num_heads=1, mlp_dim=8)
  drafter = drafters.SharedEncoderDrafter(drafter_config, encoder_emb_dim=config.emb_dim)
  drafter_params = network.shared_encoder_init_params(
      drafter_config, config.emb_dim, jax.random.PRNGKey(3)
  )
  inputs = input_data.random_inputs(config.vocab_size, 3, 6, seed=1)
  measured = sweep.sweep(
      config,
      params,
      {"shared": (drafter, drafter_params)},
      sweep.grid_settings(["shared"], [2]),
      [0.0],
      inputs[:, None],
      6,
      vocabulary=seqio.PassThroughVocabulary(config.vocab_size, eos_id=1),
      task="random",
      repeats=1,
      warmup=0,
      cost_repeats=1,
      steps_per_call=1,
  )
  (drafter_stage,) = stages["drafter", "shared"]
  assert (drafter_stage.config, drafter_stage.encoder_emb_dim) == (drafter_config, config.emb_dim)
  assert stages["iteration", "shared", 2][0].encoder_emb_dim == config.emb_dim
  (row,) = measured.rows
  assert (row.drafter, row.gamma, row.outputs_match_baseline) == ("shared", 2, 1.0)
  assert 0.0 <= row.alpha < 1.0  # a random drafter: some drafts rejected


@pytest.mark.parametrize(
    "drafters_of, settings, message",
    [
        (None, sweep.grid_settings(["d"], [2]), r"pass x\[:, None\]"),
        (None, [sweep.SweepSetting("d", "d", 2)], r"setting 'd': shape must be a draft_shapes"),
        (
            None,
            [sweep.SweepSetting("e", "e", draft_shapes.Chain(2))],
            r"names drafter 'e', which is not one of",
        ),
        (None, [("d", 2)], r"settings must be sweep\.SweepSetting objects"),
        (None, [], r"no settings to sweep"),
        (None, sweep.grid_settings(["d"], [2]) * 2, r"two settings share a \(label, gamma\)"),
        (33, sweep.grid_settings(["d"], [2]), r"drafter 'd' has vocab_size 33"),
        (None, sweep.grid_settings(["d"], [2]), r"the examples' batch sizes differ \(\[1, 2\]\)"),
    ],
    ids=[
        "one_example_dim",
        "not_a_shape",
        "unknown_drafter",
        "a_tuple",
        "none",
        "twice",
        "vocab",
        "two_batch_sizes",
    ],
)
def test_sweep_rejects_bad_arguments_before_compiling(drafters_of, settings, message):
  config, params = _tiny_pair()
  vocabulary = seqio.PassThroughVocabulary(config.vocab_size, eos_id=1)
  inputs = {
      r"pass x\[:, None\]": np.ones((2, 6)),
      r"the examples' batch sizes differ \(\[1, 2\]\)": [np.ones((1, 6)), np.ones((2, 8))],
  }.get(message, np.ones((2, 1, 6), np.int32))
  drafter_config = config if drafters_of is None else config.replace(vocab_size=drafters_of)
  with pytest.raises(ValueError, match=message):
    sweep.sweep(
        config,
        params,
        {"d": (drafters.T5Drafter(drafter_config), params)},
        settings,
        [0.0],
        inputs,
        4,
        vocabulary=vocabulary,
        task="t",
    )


def test_grid_settings_cross_the_axes_and_label_them():
  tree = trees.as_tree((2, 1))
  verifiers = {"token": speculative.TokenVerifier(), "block": speculative.BlockVerifier()}
  settings = sweep.grid_settings(["a", "b"], [3, 1, 3], verifiers, None, {"2x1": tree})
  assert [(s.label, s.drafter, s.gamma) for s in settings] == [
      ("a, token verification", "a", 1),
      ("a, token verification", "a", 3),
      ("a, block verification", "a", 1),
      ("a, block verification", "a", 3),
      ("a, tree 2x1", "a", 2),
      ("b, token verification", "b", 1),
      ("b, token verification", "b", 3),
      ("b, block verification", "b", 1),
      ("b, block verification", "b", 3),
      ("b, tree 2x1", "b", 2),
  ]
  assert settings[2].verifier == speculative.BlockVerifier() and settings[4].verifier is None
  assert settings[4].model_kwargs() == dict(draft_shape=draft_shapes.Tree(tree), verifier=None)
  assert settings[0].model_kwargs() == dict(
      draft_shape=draft_shapes.Chain(1), verifier=speculative.TokenVerifier()
  )
  assert sweep.cost_gammas(settings) == [1, 3, 4]  # the tree (2, 1) verifies its 4 nodes at once
  stops = {"static": None, "confident": draft_length.ConfidenceStop(0.5)}
  plain, adaptive = sweep.grid_settings(["a"], [4], None, stops)
  assert (plain.label, adaptive.label) == ("a, static draft length", "a, confident draft length")
  assert adaptive.shape == draft_shapes.Chain(4, draft_length.ConfidenceStop(0.5))


def test_steps_within_the_noise_get_more_rounds_then_an_error():
  """Rounds where a step's extra passes took no time (a busy machine) are topped up with
  EXTRA_COST_ROUNDS more, and the step resolves from all of them; a step that never does is the
  error naming it, after MAX_EXTRA_COST_ROUNDS."""
  geometry = step_costs.DecodeGeometry(4, 16, 0, 1)
  extra_passes = 1 + step_costs.EXTRA_PASSES

  def sleeper(seconds):
    return lambda: time.sleep(seconds)

  noisy = {("step", 1): [np.full(3, 0.004)], ("step", extra_passes): [np.full(3, 0.001)]}
  calls = {("step", 1): (sleeper(0.0), ()), ("step", extra_passes): (sleeper(0.004), ())}
  timings, extra = sweep._resolved_step_timings(calls, noisy, geometry)
  assert extra == sweep.EXTRA_COST_ROUNDS and timings["step"].repeats == 3 + extra
  assert timings["step"].median_ms > 0
  never = {("step", 1): (sleeper(0.002), ()), ("step", extra_passes): (sleeper(0.0), ())}
  with pytest.raises(ValueError, match="could not resolve the step time of step"):
    sweep._resolved_step_timings(never, noisy, geometry)

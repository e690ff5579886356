"""The timing harness (measuring/stopwatch.py, step_costs.py) and its random models
(workloads.py); the script: tests/test_benchmark_script.py. No timing is asserted: speed is measured by the
benchmarks, never by tests."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config

from speculative_t5x import drafters
from speculative_t5x import feature_drafter
from speculative_t5x import network
from speculative_t5x import table_drafters
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.measuring import workloads


def test_timing_statistics_from_known_times():
  timing = stopwatch.Timing.from_seconds([0.004, 0.001, 0.003, 0.002, 0.005])
  assert (timing.median_ms, timing.min_ms, timing.max_ms, timing.repeats) == (3.0, 1.0, 5.0, 5)
  assert timing.iqr_ms == pytest.approx(2.0)  # percentiles 25 and 75 of 1..5 ms: 2 and 4.
  per_step = timing.per_step(4)
  assert (per_step.median_ms, per_step.iqr_ms, per_step.repeats) == (0.75, 0.5, 5)


def test_time_calls_on_a_trivial_jitted_function():
  calls = []

  def double(x):
    calls.append(None)  # runs at trace time only: one compilation.
    return x * 2

  timing = stopwatch.time_calls(
      {"double": (jax.jit(double), (jnp.ones((8,)),))}, repeats=5, warmup=2
  )["double"]
  assert len(calls) == 1
  assert timing.repeats == 5
  assert 0 < timing.min_ms <= timing.median_ms <= timing.max_ms
  assert 0 <= timing.iqr_ms <= timing.max_ms - timing.min_ms
  assert set(timing.as_dict()) == {"median_ms", "min_ms", "max_ms", "iqr_ms", "repeats"}


def test_time_calls_times_every_call_in_every_round():
  runs = {"a": 0, "b": 0}

  def counting(name):
    def fn(x):
      runs[name] += 1
      return x

    return fn

  timings = stopwatch.time_calls(
      {"a": (counting("a"), (jnp.ones(2),)), "b": (counting("b"), (jnp.ones(2),))},
      repeats=4,
      warmup=1,
  )
  assert runs == {"a": 6, "b": 6}  # compile call + 1 warm-up + 4 rounds, each
  assert {name: t.repeats for name, t in timings.items()} == {"a": 4, "b": 4}
  stopwatch.time_rounds({"a": (counting("a"), (jnp.ones(2),))}, repeats=2, warmup=0, compiled=True)
  assert runs["a"] == 8  # already compiled, no warm-up: the 2 rounds only
  stopwatch.time_calls({"b": (counting("b"), (jnp.ones(2),))}, repeats=3, warmup=0, compiled=True)
  assert runs["b"] == 9  # time_calls passes `compiled` on: the 3 rounds only


def test_time_calls_keeps_each_calls_last_timed_result():
  """The results a caller reads come from the last timed round: no call runs once more."""
  runs = []

  def fn(x):
    runs.append(x)
    return jnp.asarray(len(runs))

  outputs = {}
  stopwatch.time_calls({"f": (fn, (0,))}, repeats=3, warmup=1, outputs=outputs)
  assert len(runs) == 5 and int(outputs["f"]) == 5  # compile, warm-up, 3 rounds: the 5th kept


def test_first_calls_run_each_functions_first_call_first(monkeypatch):
  """One thread (one core): the calls run in the order submitted, the first call of each
  function before any second one (which would wait for that function's compilation), and the
  outputs come back by name in the calls' order."""
  monkeypatch.setattr(stopwatch.os, "cpu_count", lambda: 1)
  order = []

  def f(x):
    order.append(("f", x))
    return jnp.asarray(x)

  def g(x):
    order.append(("g", x))
    return jnp.asarray(10 * x)

  calls = {"f1": (f, (1,)), "f2": (f, (2,)), "g1": (g, (1,)), "f3": (f, (3,)), "g2": (g, (2,))}
  outputs = stopwatch.first_calls(calls)
  assert order == [("f", 1), ("g", 1), ("f", 2), ("f", 3), ("g", 2)]
  assert list(outputs) == list(calls)
  assert [int(v) for v in outputs.values()] == [1, 2, 10, 3, 20]


def test_costs_from_the_seconds_of_the_step_calls():
  """Marginal step times (long call minus short call, per extra step) and the ratios of
  Theorem 3.8 from known call times: the arithmetic the benchmark script applies to the rounds
  it times between examples."""
  geometry = step_costs.DecodeGeometry(4, 16, 0, 2)
  extra = step_costs.EXTRA_PASSES * geometry.steps_per_call
  step_ms = {
      ("target", 1): 2.0,
      ("target", 3): 3.0,
      ("drafter", "d"): 0.5,
      ("iteration", "d", 2): 4.5,
  }
  seconds = {}
  for name, ms in step_ms.items():  # a fixed 1 ms per call, plus the steps; 3 rounds each.
    seconds[name, 1] = np.full(3, 1e-3 + geometry.steps_per_call * ms * 1e-3)
    seconds[name, 1 + step_costs.EXTRA_PASSES] = seconds[name, 1] + extra * ms * 1e-3
  timings = step_costs.marginal_step_timings(seconds, geometry)
  assert {name: pytest.approx(t.median_ms) for name, t in timings.items()} == step_ms
  costs = step_costs.costs_from_timings(timings, ["d"], [2], geometry)["d"]
  assert costs.c == pytest.approx(0.25) and costs.verify_cost(2) == pytest.approx(1.5)
  assert costs.iteration_cost(2) == pytest.approx(2.25)  # 4.5 ms against 2 * 0.5 + 3 apart
  assert costs.interference_ms(2) == pytest.approx(0.5)


def test_decode_costs_ratios_from_known_timings():
  ms = lambda value: stopwatch.Timing(value, value, value, 0.0, 1)  # noqa: E731
  geometry = step_costs.DecodeGeometry(4, 8, 0, 1)
  costs = step_costs.DecodeCosts(
      geometry,
      target_step=ms(2.0),
      drafter_step=ms(0.5),
      verify={3: ms(3.0)},
      iteration={3: ms(5.0)},
  )
  assert costs.c == 0.25 and costs.verify_cost(3) == 1.5
  assert costs.iteration_cost(3) == 2.5  # apart: 3 * 0.25 + 1.5 = 2.25
  assert costs.interference_ms(3) == pytest.approx(0.5)
  assert costs.c_in_loop(3) == pytest.approx((5.0 - 3.0) / 3 / 2.0)  # a draft in the loop: 0.33
  with pytest.raises(ValueError, match="no timing for gamma=4"):
    costs.iteration_cost(4)


def test_unresolvable_step_times_are_an_error(monkeypatch):
  """Extra steps that take no measurable time (noise larger than the steps) raise, naming it."""
  monkeypatch.setattr(
      stopwatch, "time_rounds", lambda calls, **kwargs: {name: np.full(3, 0.002) for name in calls}
  )
  config = network.T5Config(
      vocab_size=8,
      emb_dim=4,
      num_heads=1,
      num_encoder_layers=1,
      num_decoder_layers=1,
      head_dim=4,
      mlp_dim=4,
  )
  params = network.init_params(config, jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="could not resolve the step time of step"):
    step_costs.time_decode_steps(
        {"step": [step_costs.Stage(config, params, 1)]},
        step_costs.DecodeGeometry(4, 8, 0, 2),
        repeats=3,
    )


def test_decode_step_stages_must_share_a_vocabulary():
  small = network.T5Config(
      vocab_size=8,
      emb_dim=4,
      num_heads=1,
      num_encoder_layers=1,
      num_decoder_layers=1,
      head_dim=4,
      mlp_dim=4,
  )
  stages = [step_costs.Stage(small, {}, 1), step_costs.Stage(small.replace(vocab_size=9), {}, 2)]
  with pytest.raises(ValueError, match="share one vocabulary"):
    step_costs.decode_step_call(stages, step_costs.DecodeGeometry(4, 8, 0, 1))


def test_a_shared_encoder_stage_times_its_decoder_on_a_t5_shaped_cache():
  """A stage with encoder_emb_dim (a drafters.SharedEncoderDrafter's network) has no encoder: its
  cache is made from a random encoder output of that width, with the shapes a T5 of its config
  decodes against, and its steps are its decoder's."""
  config = network.T5Config(
      vocab_size=8, emb_dim=4, num_heads=1, num_decoder_layers=1, head_dim=4, mlp_dim=4
  )
  stages = {
      "t5": step_costs.Stage(config, network.init_params(config, jax.random.PRNGKey(0))),
      "shared": step_costs.Stage(
          config,
          network.shared_encoder_init_params(config, 12, jax.random.PRNGKey(0)),
          encoder_emb_dim=12,
      ),
  }
  caches = {}
  for name, stage in stages.items():
    assert isinstance(stage.module, network.Transformer) == (name == "t5")
    fn, args = step_costs.decode_step_call([stage], step_costs.DecodeGeometry(3, 6, 0, 2))
    assert fn(*args).shape == (1, 1)
    caches[name] = jax.tree.map(lambda x: (x.shape, x.dtype), args[1])
  assert caches["shared"] == caches["t5"]


@pytest.mark.parametrize("repeats, warmup", [(0, 1), (3, -1)])
def test_time_calls_rejects_bad_counts(repeats, warmup):
  with pytest.raises(ValueError, match="repeats >= 1 and warmup >= 0"):
    stopwatch.time_calls({"id": (jax.jit(lambda x: x), (1.0,))}, repeats=repeats, warmup=warmup)


def test_decode_geometry_fits_the_timed_blocks():
  geometry = step_costs.DecodeGeometry.for_decoding(
      encoder_length=16, decode_length=32, max_k=8, steps_per_call=8
  )
  assert (geometry.cache_length, geometry.position) == (40, 16)
  geometry.check(8)
  short = step_costs.DecodeGeometry.for_decoding(4, 4, max_k=3, steps_per_call=2)
  assert short.position + short.steps_per_call - 1 + 3 <= short.cache_length
  with pytest.raises(ValueError, match="lower steps_per_call"):
    step_costs.DecodeGeometry.for_decoding(4, 2, max_k=3, steps_per_call=8)


def test_random_drafter_kinds():
  target, drafter = tiny_config(16), object()  # the drafter is only passed through
  target_params, drafter_params = {"w": np.ones(2)}, {"w": np.zeros(2)}
  args = (target, target_params, drafter, drafter_params)
  copy, copy_params = workloads.random_drafter("copy", *args)
  assert isinstance(copy, drafters.T5Drafter) and copy.config == target
  assert copy_params is target_params
  assert workloads.random_drafter("independent", *args) == (drafter, drafter_params)
  with pytest.raises(ValueError, match="unknown random drafter kind 'twin'"):
    workloads.random_drafter("twin", *args)


def test_host_tokens_avoid_special_ids_and_follow_the_generator():
  tokens = np.asarray(workloads.host_tokens(np.random.default_rng(0), 6, (4, 50)))
  assert tokens.dtype == np.int32 and tokens.shape == (4, 50)
  assert tokens.min() >= 3 and tokens.max() < 6 and len(np.unique(tokens)) == 3
  again = np.asarray(workloads.host_tokens(np.random.default_rng(0), 6, (4, 50)))
  np.testing.assert_array_equal(tokens, again)


def test_a_drafter_without_single_network_steps_is_timed_by_its_own_proposal():
  """A FeatureDrafter (its proposal rebuilds gamma + 1 entries from features, then steps) and a
  bigram drafter (no network) are timed by `Drafter.propose` itself (`ProposalStage`): its step
  is a proposal of one draft, its iteration a proposal of gamma beside the verification; the
  drafts it feeds on are its own (a restricted draft vocabulary shows through)."""
  target = network.T5Config(
      vocab_size=16, emb_dim=8, num_heads=1, num_decoder_layers=1, head_dim=4, mlp_dim=8
  )
  target_params = network.init_params(target, jax.random.PRNGKey(0))
  head = target.replace(emb_dim=4, mlp_dim=8)
  feature = feature_drafter.FeatureDrafter(head, 8, draft_vocab=(5, 6), eos_id=1)
  bigram = table_drafters.BigramDrafter(vocab_size=16, eos_id=1)
  pool = {
      "feature": (feature, feature.init_params(jax.random.PRNGKey(1), {})),
      "bigram": (bigram, bigram.init_params(jax.random.PRNGKey(1), {})),
  }
  steps = step_costs.cost_steps(target, target_params, pool, [2])
  for name in pool:
    assert [type(s).__name__ for s in steps["drafter", name]] == ["ProposalStage"]
    assert [s.gamma for s in steps["drafter", name]] == [1]
    assert [type(s).__name__ for s in steps["iteration", name, 2]] == ["ProposalStage", "Stage"]
  geometry = step_costs.DecodeGeometry(3, 10, 3, 2)
  proposal = step_costs.ProposalStage.of(feature, pool["feature"][1], 2, 8)
  fn, args = step_costs.decode_step_call([proposal], geometry, temperature=1.0)
  assert set(np.asarray(fn(*args)).ravel().tolist()) <= {5, 6}
  record = step_costs.drafter_record(feature)
  assert record["kind"] == "FeatureDrafter" and record["config"]["emb_dim"] == 4
  assert record["draft_vocab"] == (5, 6)


def test_busy_warning_rests_on_the_processes_running_now():
  quiet = {"load_1m": 3.0, "load_5m": 3.0, "load_15m": 3.0, "cpus": 2, "runnable_others": 0}
  assert stopwatch.busy_warning(quiet) is None  # a high average from work that has ended
  busy = dict(quiet, runnable_others=2)
  assert "2 other process(es) running" in stopwatch.busy_warning(busy)
  unknown = dict(quiet, runnable_others=None)  # no /proc/loadavg: the 1-minute average decides
  assert "1-minute load average 3.00 > 0.5" in stopwatch.busy_warning(unknown)
  assert stopwatch.busy_warning(dict(unknown, load_1m=0.2)) is None
  load = stopwatch.machine_load()
  assert set(load) == {"load_1m", "load_5m", "load_15m", "cpus", "runnable_others"}
  assert load["runnable_others"] is None or load["runnable_others"] >= 0


@dataclasses.dataclass(frozen=True)
class _CountingStage:
  """Adds 1 to every token per step: a call's output counts the steps it ran."""

  params: jax.Array
  vocab_size: int
  k: int = 1
  span: int = 1
  init_key = "counting"

  def init_cache(self, params, encoder_tokens, cache_length, rng):
    del params, encoder_tokens, cache_length, rng
    return ()

  def run(self, params, cache, tokens, position, u, standardize, temperature):
    del params, position, u, standardize, temperature
    return tokens + 1, cache


def test_the_two_calls_of_a_stage_list_share_one_program_and_run_their_passes():
  """decode_step_calls' 1-pass and (1 + EXTRA_PASSES)-pass calls: one compiled program (the pass
  count is traced), each running passes x steps_per_call steps."""
  geometry = step_costs.DecodeGeometry(3, 12, 2, 2)
  stage = _CountingStage(jnp.zeros((1, 4)), vocab_size=16)
  calls = step_costs.decode_step_calls({"count": [stage]}, geometry)
  (fn, args), (more_fn, more_args) = calls["count", 1], calls["count", 1 + step_costs.EXTRA_PASSES]
  assert fn is more_fn
  start = np.asarray(args[2])
  for passes, call_args in ((1, args), (1 + step_costs.EXTRA_PASSES, more_args)):
    np.testing.assert_array_equal(fn(*call_args), start + passes * geometry.steps_per_call)
  assert fn._cache_size() == 1


def test_the_program_cache_keeps_the_most_recently_used(monkeypatch):
  """`step_costs.shared` keeps at most MAX_PROGRAMS functions, dropping the least recently used:
  a key used again stays, the oldest other one is made anew."""
  monkeypatch.setattr(step_costs, "_PROGRAMS", type(step_costs._PROGRAMS)())
  monkeypatch.setattr(step_costs, "MAX_PROGRAMS", 2)
  made = []

  def make(name):
    made.append(name)
    return name

  for key in ("a", "b", "a", "c", "a", "b"):
    assert step_costs.shared(("test", key), lambda key=key: make(key)) == key
  assert made == ["a", "b", "c", "b"]

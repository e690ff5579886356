r"""A T5-XXL target decoded on one accelerator, beside the bandwidth floor and beside
Hugging Face, in stages that fit a device budget.

One command runs everything, most important first, each stage skipped (and said so, in the output
and in results.json) where its time estimated from what the run measured so far (compile and
steps) does not fit what is left of --budget_s:

  setup      the target's random bfloat16 weights drawn on the device (`device_init`, a leaf at a
             time, never on the host in float32); the copy bandwidth of a large device-to-device
             copy, measured in the same run; the bytes of every model;
  baseline   the target's greedy decode (`models.EncoderDecoderModel`), ms per token against the
             bandwidth floor: the decoder's bytes per step (`roofline.call_bytes`: its weights
             and cache, read once per step) over the copy bandwidth;
  chain ...  a speculative decode (Algorithm 1) beside the baseline on the same examples
             (`sweep.time_example`), with the decode-step costs behind it timed side by side
             (`benchmark` steps: c, the verification cost, the iteration cost): one
             `report.SpeedupRow` (alpha, speedup, efficiency in situ, ...) per drafter, gamma and
             temperature;
  costs      the drafters' single steps and the target's verification of k = 2..8 tokens;
  tree       one draft tree (`draft_shapes.Tree`);
  hf         the same weights as `transformers.T5ForConditionalGeneration` in bfloat16 on the same
             device (`hf_device`, by DLPack), `generate` timed as the baseline and with
             `assistant_model=` the same drafter (batch 1, greedy, a constant number of assistant
             tokens), its greedy output compared with ours; this stage has its own share of the
             budget (--hf_budget_s) and runs last.

Drafters (random weights): T5 1.1 small, base and large shapes (their own encoders), and the
target's first 1 and 2 decoder layers with its embedding and head reading its encoder output
(`device_init.truncated_shared_encoder`): a nonzero alpha from random weights at a realistic
price per draft. The paper's Table 2 is projected from the measured c and verification costs at
the paper's alpha (`theory.speedup_hardware_aware`).

--sizes=tiny runs the same stages on tiny models in well under a minute on a CPU
(benchmarks/tests/test_bench_xxl_gpu.py); --sizes=xxl is the device run (docs/results_gpu.md has the
command). --abstract_only traces the init and the decode programs at the chosen sizes with
abstract arrays (jax.eval_shape and .lower(): nothing allocated, nothing compiled) and reports
the bytes. Results: results.json and results.md in --output_dir, rewritten after every stage, so
a run stopped early keeps what it measured. Exit status 1 if a stage failed.

It needs no TensorFlow (the GPU image has none): it reads no task, and decoding imports JAX alone.
"""

from __future__ import annotations

import os

# Before JAX starts: torch shares the device in the hf stage, so JAX must not take 75% of it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# pylint: disable=g-import-not-at-top,wrong-import-position
import dataclasses
import json
import math
import pathlib
import platform
import sys
import time
import traceback
from typing import Any, Callable, Sequence

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import device_init
from speculative_t5x import draft_shapes
from speculative_t5x import drafters as drafters_lib
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import theory
from speculative_t5x import trees
from speculative_t5x.measuring import report
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.measuring import sweep
from speculative_t5x.projections import paper
from speculative_t5x.projections import roofline
from speculative_t5x.text import input_data
from speculative_t5x.text import vocabularies

EOS_ID = 1
TASK = "random"
PAPER_DRAFTERS = ("small", "base", "large")
SHARED = {"shared1": 1, "shared2": 2}  # drafter name -> the target's decoder layers it keeps


@dataclasses.dataclass(frozen=True)
class Sizes:
  """One --sizes preset: the target's and the T5 drafters' dimensions, dtypes, lengths, the tree,
  and the default compile time assumed for a program before any was measured."""

  target: roofline.DecoderShape
  encoder_layers: int
  drafters: dict[str, tuple[roofline.DecoderShape, int]]  # name -> (decoder shape, enc layers)
  dtype: str  # activations
  param_dtype: str
  input_length: int
  decode_length: int
  tree: tuple[int, ...]
  copy_megabytes: float
  default_compile_s: float
  hf_gamma: int
  steps_per_call: int = step_costs.DEFAULT_STEPS_PER_CALL


def _tiny(emb, heads, mlp, layers, vocab=512):
  return roofline.DecoderShape(emb, heads, 8, mlp, layers, vocab)


SIZES = {
    "xxl": Sizes(
        target=roofline.T5_1_1["xxl"],
        encoder_layers=24,
        drafters={
            name: (roofline.T5_1_1[name], roofline.T5_1_1[name].num_layers)
            for name in PAPER_DRAFTERS
        },
        dtype="bfloat16",
        param_dtype="bfloat16",
        input_length=512,
        decode_length=128,
        tree=(4, 2, 1, 1),
        copy_megabytes=4096.0,
        default_compile_s=60.0,
        hf_gamma=5,
    ),
    "tiny": Sizes(
        target=_tiny(32, 4, 64, 3),
        encoder_layers=3,  # HF's T5 sizes its decoder cache by the encoder's layers
        drafters={
            "small": (_tiny(16, 2, 32, 1), 1),
            "base": (_tiny(16, 2, 32, 2), 1),
            "large": (_tiny(24, 3, 48, 2), 2),
        },
        dtype="float32",
        param_dtype="float32",
        input_length=16,
        decode_length=64,
        tree=(2, 1),
        copy_megabytes=16.0,
        default_compile_s=2.0,
        hf_gamma=3,
        # 32 x 4 extra steps per timed call: a tiny network's steps must outweigh a busy CPU's
        # noise (benchmarks/tests/test_bench_batched.py).
        steps_per_call=32,
    ),
}


def t5_config(shape: roofline.DecoderShape, encoder_layers: int, dtype: str) -> network.T5Config:
  """The T5 1.1 network of a decoder shape (gated GELU, untied head, no dropout)."""
  return network.T5Config(
      vocab_size=shape.vocab_size,
      dtype=dtype,
      emb_dim=shape.emb_dim,
      num_heads=shape.num_heads,
      head_dim=shape.head_dim,
      mlp_dim=shape.mlp_dim,
      num_encoder_layers=encoder_layers,
      num_decoder_layers=shape.num_layers,
      mlp_activations=("gelu", "linear"),
      dropout_rate=0.0,
      logits_via_embedding=False,
  )


def decoder_shape(config: network.T5Config) -> roofline.DecoderShape:
  return roofline.DecoderShape(
      config.emb_dim,
      config.num_heads,
      config.head_dim,
      config.mlp_dim,
      config.num_decoder_layers,
      config.vocab_size,
  )


@dataclasses.dataclass(frozen=True)
class Options:
  """What one run does (the flags, or a test's arguments)."""

  sizes: str = "tiny"
  output_dir: str = "/tmp/speculative_t5x/bench_xxl_gpu"
  budget_s: float = 540.0
  hf_budget_s: float = 120.0
  num_examples: int = 1
  repeats: int = 3
  cost_repeats: int = 10
  gammas: tuple[int, ...] = (3, 5, 7)
  temperatures: tuple[float, ...] = (0.0, 1.0)
  hf: bool = True
  hf_repeats: int = 2
  stages: tuple[str, ...] = ()  # only these stage names (prefixes); empty: all
  compilation_cache_dir: str | None = None  # None: <output_dir>/jax_cache; '': none
  seed: int = 0


# ----------------------------------------------------------------------------------------------
# The stage list, most important first
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Stage:
  name: str
  kind: str  # 'setup', 'baseline', 'chain', 'costs', 'tree', 'hf'
  temperature: float = 0.0
  drafter: str | None = None
  gamma: int | None = None


def stage_list(options: Options) -> list[Stage]:
  """Every stage in the order they run: the baseline, T5-small's chains at T = 0, the
  shared-encoder drafters, the costs behind Table 2, then T = 1, the tree, the remaining rows and
  HF last."""
  gammas = sorted(options.gammas)
  mid = gammas[len(gammas) // 2]
  t0 = min(options.temperatures)
  stages = [Stage("setup", "setup"), Stage(f"baseline t={t0:g}", "baseline", t0)]

  def chain(drafter, t, g):
    return Stage(f"chain {drafter} gamma {g} t={t:g}", "chain", t, drafter, g)

  stages += [chain("small", t0, g) for g in gammas]
  stages += [chain(name, t0, mid) for name in SHARED]
  stages.append(Stage(f"costs t={t0:g}", "costs", t0))
  for t in options.temperatures:
    if t == t0:
      continue
    stages += [
        chain("small", t, mid),
        chain("shared1", t, mid),
        Stage(f"costs t={t:g}", "costs", t),
    ]
  stages.append(Stage(f"tree shared1 t={t0:g}", "tree", t0, "shared1"))
  first = {s.name for s in stages}
  rest = [
      chain(name, t, g)
      for t in options.temperatures
      for name in ("shared1", "shared2", "small", "base", "large")
      for g in gammas
  ]
  stages += [s for s in rest if s.name not in first]
  if options.hf:
    stages.append(Stage("hf", "hf", t0, "shared1"))
  if options.stages:
    stages = [
        s for s in stages if s.kind == "setup" or any(s.name.startswith(p) for p in options.stages)
    ]
  return stages


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------
class Bench:
  """The run's state: models, compiled calls, what was measured, the budget."""

  def __init__(self, options: Options):
    self.options = options
    self.sizes = SIZES[options.sizes]
    self.start = time.perf_counter()
    self.out = pathlib.Path(options.output_dir)
    self.out.mkdir(parents=True, exist_ok=True)
    sizes = self.sizes
    self.param_dtype = jnp.dtype(sizes.param_dtype)
    self.target_config = t5_config(sizes.target, sizes.encoder_layers, sizes.dtype)
    self.vocabulary = vocabularies.PassThroughVocabulary(
        self.target_config.vocab_size, eos_id=EOS_ID
    )
    self.target = network.Transformer(self.target_config)
    self.params = None
    self.drafters: dict[str, tuple[drafters_lib.Drafter, Any]] = {}
    self.gammas_timed = list(range(1, max(max(options.gammas), 7) + 1))
    max_k = max(max(self.gammas_timed), trees.DraftTree.from_branching(sizes.tree).num_nodes) + 1
    self.geometry = step_costs.DecodeGeometry.for_decoding(
        sizes.input_length, sizes.decode_length, max_k, sizes.steps_per_call
    )
    inputs = input_data.random_inputs(
        self.target_config.vocab_size, options.num_examples, sizes.input_length, options.seed
    )
    self.batches = [
        {
            "encoder_input_tokens": jnp.asarray(x[None], jnp.int32),
            "decoder_input_tokens": jnp.zeros((1, sizes.decode_length), jnp.int32),
        }
        for x in inputs
    ]
    self.rngs = [
        jax.random.fold_in(jax.random.PRNGKey(options.seed), i) for i in range(len(self.batches))
    ]
    self.baseline = models.EncoderDecoderModel(self.target, self.vocabulary, self.vocabulary)
    self.baseline_predict = self.baseline.jit_predict()
    self.baseline_prefill = jax.jit(self.baseline.prefill)
    self.compiled: set = set()  # (what, temperature) of the programs compiled so far
    self.compile_s: dict[str, list[float]] = {}  # program kind -> measured compile seconds
    self.run_s: dict[str, list[float]] = {}  # stage kind -> seconds beyond compilation
    self.calls: dict = {}  # (temperature, step name) -> (fn, args)
    self.steps: dict = {}  # (temperature, step name) -> Timing
    self.baseline_results: dict = {}  # temperature -> [ExampleResult]
    self.results: dict[str, Any] = {
        "run": self.run_info(),
        "stages": [],
        "rows": [],
        "baseline": {},
        "costs": {},
        "table2_projected": [],
        "hf": None,
        "compile_s": {},
    }
    self.rows: list[report.SpeedupRow] = []
    self.failed = False

  # ---- bookkeeping
  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def log(self, message: str) -> None:
    print(f"[{self.elapsed():7.1f} s] {message}", flush=True)

  def run_info(self) -> dict:
    import importlib.metadata  # pylint: disable=g-import-not-at-top

    versions = {}
    for package in ("jax", "jaxlib", "flax", "numpy", "torch", "transformers"):
      try:
        versions[package] = importlib.metadata.version(package)
      except importlib.metadata.PackageNotFoundError:
        versions[package] = None
    return {
        "command": sys.argv,
        "options": dataclasses.asdict(self.options),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "versions": versions,
        "machine": platform.platform(),
        "python": platform.python_version(),
        "target_config": dataclasses.asdict(self.target_config),
        "geometry": dataclasses.asdict(self.geometry),
        "load_before": stopwatch.machine_load(),
    }

  def compile_estimate(self, kind: str) -> float:
    seen = self.compile_s.get(kind) or [s for v in self.compile_s.values() for s in v]
    return max(seen) if seen else self.sizes.default_compile_s

  def run_estimate(self, kind: str) -> float:
    seen = self.run_s.get(kind)
    if seen:
      return max(seen)
    base = self.run_s.get("baseline")
    return 3 * max(base) if base else 0.0

  def first_call(self, kind: str, fn: Callable, args: Sequence[Any]) -> Any:
    """Runs fn(*args) once (its compilation) and records how long it took, less one more call's
    time, as the compile seconds of a program of `kind`."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    again = time.perf_counter() - start
    seconds = max(0.0, first - again)
    self.compile_s.setdefault(kind, []).append(seconds)
    self.results["compile_s"].setdefault(kind, []).append(seconds)
    self.log(f"  compiled a {kind} program in {seconds:.1f} s (one call {again * 1e3:.1f} ms)")
    return out

  def write(self) -> None:
    self.results["elapsed_s"] = self.elapsed()
    self.results["table2_projected"] = self.table2()
    tmp = self.out / "results.json.tmp"
    tmp.write_text(json.dumps(self.results, indent=2, default=_json_default))
    tmp.replace(self.out / "results.json")
    (self.out / "results.md").write_text(self.markdown())

  # ---- models
  def setup(self) -> dict:
    options, sizes = self.options, self.sizes
    if options.compilation_cache_dir != "":
      cache = options.compilation_cache_dir or str(self.out / "jax_cache")
      jax.config.update("jax_compilation_cache_dir", cache)
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
      self.log(f"persistent compilation cache: {cache}")
    start = time.perf_counter()
    self.params = jax.block_until_ready(
        device_init.random_params_on_device(self.target_config, options.seed, self.param_dtype)
    )
    init_s = time.perf_counter() - start
    self.log(f"target initialised on {jax.devices()[0]} in {init_s:.1f} s")
    bandwidth = device_init.copy_bandwidth(sizes.copy_megabytes)
    self.log(f"copy bandwidth {bandwidth['bytes_per_s'] / 1e9:.0f} GB/s")
    shape = decoder_shape(self.target_config)
    step_bytes = roofline.call_bytes(shape, self.geometry.position, sizes.input_length)
    info = {
        "target_init_s": init_s,
        "target_bytes": device_init.tree_bytes(self.params),
        "bandwidth": bandwidth,
        "decoder_bytes_per_step": step_bytes,
        "floor_ms_per_token": step_bytes / bandwidth["bytes_per_s"] * 1e3,
        "context_length": self.geometry.position,
    }
    self.results["setup"] = info
    return info

  def drafter(self, name: str) -> tuple[drafters_lib.Drafter, Any]:
    if name not in self.drafters:
      if name in SHARED:
        self.drafters[name] = device_init.truncated_shared_encoder(
            self.target_config, self.params, SHARED[name]
        )
      else:
        shape, encoder_layers = self.sizes.drafters[name]
        config = t5_config(shape, encoder_layers, self.sizes.dtype)
        start = time.perf_counter()
        params = jax.block_until_ready(
            device_init.random_params_on_device(
                config, self.options.seed + 1 + PAPER_DRAFTERS.index(name), self.param_dtype
            )
        )
        self.log(f"drafter {name} initialised in {time.perf_counter() - start:.1f} s")
        self.drafters[name] = (drafters_lib.T5Drafter(config), params)
    return self.drafters[name]

  # ---- timing pieces
  def time_baseline(self, t: float) -> list[report.ExampleResult]:
    if t not in self.baseline_results:
      args = (self.params, self.batches[0], self.rngs[0], jnp.float32(t))
      self.first_call("decode", self.baseline_predict, args)
      self.first_call("prefill", self.baseline_prefill, (self.params, self.batches[0]))
      self.compiled.add(("baseline", t))
      results = self.decode(
          {
              sweep.BASELINE: sweep.Setting(
                  self.baseline_predict, self.baseline_prefill, self.params
              )
          },
          t,
      )
      self.baseline_results[t] = results[sweep.BASELINE]
    return self.baseline_results[t]

  def decode(self, settings: dict, t: float) -> dict:
    """Every example's decodes of `settings` (compiled already), side by side."""
    results = {key: [] for key in settings}
    for batch, rng in zip(self.batches, self.rngs):
      for key, result in sweep.time_example(
          settings, batch, rng, t, EOS_ID, repeats=self.options.repeats, warmup=1, compiled=True
      ).items():
        results[key].append(result)
    return results

  def time_steps(self, t: float, steps: dict) -> dict:
    """Marginal step timings of `steps` (name -> benchmark stages) at temperature t, compiling
    only those not compiled before; every name's timing is stored in self.steps."""
    new = {name: stages for name, stages in steps.items() if (t, name) not in self.calls}
    for (name, passes), call in step_costs.decode_step_calls(
        new, self.geometry, temperature=t
    ).items():
      self.calls[t, (name, passes)] = call
      if passes == 1:
        self.first_call("step", *call)
        self.calls[t, name] = True
    calls = {
        (name, passes): self.calls[t, (name, passes)]
        for name in steps
        for passes in (1, 1 + step_costs.EXTRA_PASSES)
    }
    try:
      seconds = stopwatch.time_rounds(calls, repeats=self.options.cost_repeats, warmup=1)
      timings = step_costs.marginal_step_timings(seconds, self.geometry)
    except ValueError as e:  # a step within the noise (tiny models on a busy CPU): once more
      self.log(f"  {e} Timing again with 3x the rounds.")
      seconds = stopwatch.time_rounds(calls, repeats=3 * self.options.cost_repeats, warmup=0)
      timings = step_costs.marginal_step_timings(seconds, self.geometry)
    for name, timing in timings.items():
      self.steps[t, name] = timing
    return timings

  def step_estimate(self, t: float, names: Sequence) -> float:
    return sum(self.compile_estimate("step") for n in names if (t, n) not in self.calls)

  # ---- stages
  def estimate(self, stage: Stage) -> float:
    """Seconds the stage is expected to take, from what was measured so far."""
    t = stage.temperature
    baseline = 0.0
    if stage.kind in ("baseline", "chain", "tree") and ("baseline", t) not in self.compiled:
      baseline = self.compile_estimate("decode") + self.compile_estimate("prefill")
      baseline += self.run_estimate("baseline") if stage.kind != "baseline" else 0.0
    if stage.kind == "setup":
      return 0.0
    if stage.kind == "baseline":
      return baseline + self.step_estimate(t, [("target", 1)]) + self.run_estimate("baseline")
    if stage.kind in ("chain", "tree"):
      k = self.stage_k(stage)
      names = [("target", 1), ("target", k), ("drafter", stage.drafter)]
      if stage.kind == "chain":
        names.append(("iteration", stage.drafter, stage.gamma))
      return (
          baseline
          + self.compile_estimate("speculative")
          + self.step_estimate(t, names)
          + self.run_estimate(stage.kind)
      )
    if stage.kind == "costs":
      names = [("target", g + 1) for g in self.gammas_timed] + [
          ("drafter", d) for d in PAPER_DRAFTERS
      ]
      return self.step_estimate(t, names) + self.run_estimate("costs")
    if stage.kind == "hf":
      return self.hf_estimate()
    raise ValueError(stage.kind)

  def stage_k(self, stage: Stage) -> int:
    if stage.kind == "tree":
      return trees.DraftTree.from_branching(self.sizes.tree).num_nodes + 1
    return stage.gamma + 1

  def run_stage(self, stage: Stage) -> dict:
    t = stage.temperature
    if stage.kind == "setup":
      return self.setup()
    if stage.kind == "baseline":
      results = self.time_baseline(t)
      self.time_steps(t, {("target", 1): [step_costs.Stage(self.target_config, self.params, 1)]})
      return self.baseline_summary(t, results)
    if stage.kind in ("chain", "tree"):
      return self.speculative_stage(stage)
    if stage.kind == "costs":
      steps = {
          ("target", g + 1): [step_costs.Stage(self.target_config, self.params, g + 1)]
          for g in self.gammas_timed
      }
      steps[("target", 1)] = [step_costs.Stage(self.target_config, self.params, 1)]
      for name in PAPER_DRAFTERS:
        drafter, params = self.drafter(name)
        config, _ = step_costs.drafter_network(drafter)
        steps[("drafter", name)] = [step_costs.Stage(config, params, 1)]
      timings = self.time_steps(t, steps)
      target = timings[("target", 1)].median_ms
      costs = {
          "target_step_ms": target,
          "verify_cost": {
              str(g + 1): timings[("target", g + 1)].median_ms / target for g in self.gammas_timed
          },
          "c": {name: timings[("drafter", name)].median_ms / target for name in PAPER_DRAFTERS},
          "drafter_step_ms": {
              name: timings[("drafter", name)].median_ms for name in PAPER_DRAFTERS
          },
      }
      self.results["costs"][f"t={t:g}"] = costs
      return costs
    if stage.kind == "hf":
      return self.hf_stage(stage)
    raise ValueError(stage.kind)

  def baseline_summary(self, t: float, results) -> dict:
    tokens = sum(r.tokens for r in results)
    ms = sum(r.timing.median_ms for r in results)
    loop_ms = ms - sum(r.prefill.median_ms for r in results)
    setup = self.results["setup"]
    step_ms = self.steps[t, ("target", 1)].median_ms
    summary = {
        "temperature": t,
        "tokens": tokens,
        "ms_per_token": ms / tokens,
        "loop_ms_per_token": loop_ms / tokens,
        "prefill_ms": float(np.mean([r.prefill.median_ms for r in results])),
        "target_step_ms": step_ms,
        "floor_ms_per_token": setup["floor_ms_per_token"],
        "loop_over_floor": loop_ms / tokens / setup["floor_ms_per_token"],
        "step_over_floor": step_ms / setup["floor_ms_per_token"],
        "decodes": [r.decodes.tolist() for r in results],
    }
    self.results["baseline"][f"t={t:g}"] = summary
    self.log(
        f"  baseline t={t:g}: {summary['loop_ms_per_token']:.3f} ms/token in the loop, step "
        f"{step_ms:.3f} ms, floor {summary['floor_ms_per_token']:.3f} ms "
        f"({summary['loop_over_floor']:.2f}x the floor)"
    )
    return summary

  def speculative_stage(self, stage: Stage) -> dict:
    t = stage.temperature
    baseline_results = self.time_baseline(t)
    drafter, drafter_params = self.drafter(stage.drafter)
    shape = (
        draft_shapes.Tree(trees.DraftTree.from_branching(self.sizes.tree))
        if stage.kind == "tree"
        else draft_shapes.Chain(stage.gamma)
    )
    model = models.SpeculativeEncoderDecoderModel(
        self.target, drafter, self.vocabulary, self.vocabulary, draft_shape=shape
    )
    setting = sweep.Setting(
        model.jit_predict(),
        jax.jit(model.prefill),
        {"target": self.params, "drafter": drafter.decode_params(drafter_params)},
    )
    args = (setting.params, self.batches[0], self.rngs[0], jnp.float32(t))
    self.first_call("speculative", setting.predict, args)
    key = (stage.drafter, shape.depth)
    base = sweep.Setting(self.baseline_predict, self.baseline_prefill, self.params)
    results = self.decode({sweep.BASELINE: base, key: setting}, t)
    k = shape.num_drafts
    config, encoder_emb_dim = step_costs.drafter_network(drafter)
    steps = {
        ("target", 1): [step_costs.Stage(self.target_config, self.params, 1)],
        ("target", k + 1): [step_costs.Stage(self.target_config, self.params, k + 1)],
        ("drafter", stage.drafter): [
            step_costs.Stage(config, drafter_params, 1, encoder_emb_dim=encoder_emb_dim)
        ],
    }
    iteration = {}
    if stage.kind == "chain":
      name = ("iteration", stage.drafter, stage.gamma)
      steps[name] = [
          step_costs.Stage(config, drafter_params, 1, stage.gamma, encoder_emb_dim),
          step_costs.Stage(self.target_config, self.params, stage.gamma + 1),
      ]
    timings = self.time_steps(t, steps)
    if stage.kind == "chain":
      iteration = {stage.gamma: timings[("iteration", stage.drafter, stage.gamma)]}
    costs = step_costs.DecodeCosts(
        self.geometry,
        timings[("target", 1)],
        timings[("drafter", stage.drafter)],
        {k: timings[("target", k + 1)]},
        iteration,
    )
    row = report.SpeedupRow.from_results(
        TASK, stage.drafter, t, shape, costs, results[sweep.BASELINE], results[key]
    )
    self.rows.append(row)
    record = {
        "stage": stage.name,
        **row.as_dict(),
        "target_step_ms": costs.target_step.as_dict(),
        "drafter_step_ms": costs.drafter_step.as_dict(),
        "verify_ms": costs.verify[k].as_dict(),
        "iteration_ms": iteration[stage.gamma].as_dict() if iteration else None,
    }
    record["speculative_decodes"] = [r.decodes.tolist() for r in results[key]]
    self.results["rows"].append(record)
    self.log(
        f"  {stage.name}: alpha {row.alpha:.3f}, tokens/call {row.tokens_per_target_call:.2f}, "
        f"c {row.c:.3f}, verify {row.verify_cost:.2f}, speedup {row.speedup:.2f}x (loop "
        f"{row.loop_speedup:.2f}x), efficiency in situ {row.efficiency_in_situ:.2f}, outputs "
        f"match the baseline {row.outputs_match_baseline:.2f}"
    )
    del baseline_results
    return {"alpha": row.alpha, "speedup": row.speedup}

  # ---- Hugging Face
  def hf_estimate(self) -> float:
    base = self.results["baseline"].get(f"t={min(self.options.temperatures):g}")
    if base is None:
      return math.inf
    # HF's Python loop: assume 5x our greedy ms per token, for the baseline and one assisted
    # generate, each run 1 + hf_repeats times, plus the conversion at the copy bandwidth.
    per_generate = 5 * base["ms_per_token"] * self.sizes.decode_length / 1e3
    convert = (
        4
        * self.results["setup"]["target_bytes"]
        / self.results["setup"]["bandwidth"]["bytes_per_s"]
    )
    return convert + 2 * (1 + self.options.hf_repeats) * per_generate + 10.0

  def hf_stage(self, stage: Stage) -> dict:
    import torch  # pylint: disable=g-import-not-at-top

    import hf_device  # pylint: disable=g-import-not-at-top

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[self.sizes.param_dtype]
    cache = {}
    start = time.perf_counter()
    target = hf_device.to_hf_model_on_device(self.params, self.target_config, dtype, cache)
    layers = SHARED[stage.drafter]
    # The shared-encoder drafter as HF can run it: a full T5 whose encoder is the target's (the
    # same tensors), run once per generate call, and the target's first decoder layers.
    drafter_config = self.target_config.replace(num_decoder_layers=layers)
    _, shared_params = device_init.truncated_shared_encoder(self.target_config, self.params, layers)
    drafter_params = {**self.params, "decoder": shared_params["decoder"]}
    assistant = hf_device.to_hf_model_on_device(drafter_params, drafter_config, dtype, cache)
    convert_s = time.perf_counter() - start
    device = next(target.parameters()).device
    gamma = self.sizes.hf_gamma
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    ours = self.baseline_results.get(stage.temperature) or self.time_baseline(stage.temperature)
    runs = []
    for i, batch in enumerate(self.batches):
      ids = torch.from_numpy(np.array(batch["encoder_input_tokens"])).to(device)
      kwargs = dict(
          input_ids=ids,
          attention_mask=(ids != 0).long(),
          max_new_tokens=self.sizes.decode_length,
          do_sample=False,
          num_beams=1,
      )
      assisted = dict(
          assistant_model=assistant,
          num_assistant_tokens=gamma,
          num_assistant_tokens_schedule="constant",
          assistant_confidence_threshold=0.0,
      )
      record = {"example": i}
      for name, extra in (("baseline", {}), ("assisted", assisted)):
        times = []
        with torch.inference_mode():
          for r in range(1 + self.options.hf_repeats):
            sync()
            t0 = time.perf_counter()
            out = target.generate(**kwargs, **extra)
            sync()
            if r:
              times.append(time.perf_counter() - t0)
        tokens = out[0, 1:].cpu().numpy()  # after the decoder start token
        length = int(decoding_length(tokens))
        record[name] = {
            "median_ms": float(np.median(times) * 1e3),
            "tokens": length,
            "ms_per_token": float(np.median(times) * 1e3 / length),
            "decode": tokens[:length].tolist(),
        }
      our = np.asarray(ours[i].decodes[0])
      our = our[: int(decoding_length(our))].tolist()
      record["ours_baseline_decode"] = our
      record["hf_baseline_equals_ours"] = record["baseline"]["decode"] == our
      record["hf_assisted_equals_hf_baseline"] = (
          record["assisted"]["decode"] == record["baseline"]["decode"]
      )
      record["common_prefix_with_ours"] = _common_prefix(record["baseline"]["decode"], our)
      runs.append(record)
    ours_row = next(
        (
            r
            for r in self.results["rows"]
            if r["drafter"] == stage.drafter
            and r["temperature"] == stage.temperature
            and r["gamma"] == gamma
            and r["draft_tree"] is None
        ),
        None,
    )
    base = self.results["baseline"][f"t={stage.temperature:g}"]
    summary = {
        "drafter": stage.drafter,
        "num_assistant_tokens": gamma,
        "convert_s": convert_s,
        "device": str(device),
        "examples": runs,
        "hf_baseline_ms_per_token": float(np.mean([r["baseline"]["ms_per_token"] for r in runs])),
        "hf_assisted_ms_per_token": float(np.mean([r["assisted"]["ms_per_token"] for r in runs])),
        "ours_baseline_ms_per_token": base["ms_per_token"],
        "ours_speculative_ms_per_token": None,
        "greedy_identical": all(
            r["hf_baseline_equals_ours"] and r["hf_assisted_equals_hf_baseline"] for r in runs
        ),
    }
    if ours_row is not None:
      summary["ours_speculative_ms_per_token"] = sum(
          t["median_ms"] for t in ours_row["speculative_ms"]["per_example"]
      ) / sum(ours_row["speculative_tokens"])
      summary["ours_over_hf_assisted"] = (
          summary["ours_speculative_ms_per_token"] / summary["hf_assisted_ms_per_token"]
      )
    self.results["hf"] = summary
    self.log(
        f"  hf: baseline {summary['hf_baseline_ms_per_token']:.2f} ms/token (ours "
        f"{base['ms_per_token']:.2f}), assisted {summary['hf_assisted_ms_per_token']:.2f} "
        f"ms/token; greedy identical: {summary['greedy_identical']}"
    )
    del target, assistant, cache
    return {k: v for k, v in summary.items() if k != "examples"}

  # ---- Table 2 projected from the measured costs
  def table2(self) -> list[dict]:
    """Each Table 2 row whose drafter's step and the target's verification at its gamma were
    timed at its temperature (by any stage): Theorem 3.8 at the paper's alpha and gamma with
    the measured c, and the hardware-aware speedup with the measured verification cost."""
    lines = []
    for row in paper.TABLE_2:
      t = row.temperature
      timings = [
          self.steps.get((t, name))
          for name in (("target", 1), ("drafter", row.drafter), ("target", row.gamma + 1))
      ]
      if None in timings:
        continue
      target, drafter, verify = (timing.median_ms for timing in timings)
      c, verify = drafter / target, verify / target
      lines.append(
          {
              "task": row.task,
              "drafter": row.drafter,
              "temperature": t,
              "gamma": row.gamma,
              "alpha_paper": row.alpha,
              "c_measured": c,
              "c_paper": row.c,
              "verify_cost_measured": verify,
              "projected_speedup": float(theory.speedup(row.alpha, row.gamma, c)),
              "projected_speedup_hw": float(
                  theory.speedup_hardware_aware(row.alpha, row.gamma, c, verify)
              ),
              "paper_speedup": row.speedup,
              "paper_expected": row.expected_speedup,
          }
      )
    return lines

  # ---- the report
  def markdown(self) -> str:
    r = self.results
    info = r["run"]
    out = [
        f"# bench_xxl_gpu --sizes={self.options.sizes}",
        "",
        f"{info['date']}; {info['backend']} {info['devices'][:1]}; versions {info['versions']}; "
        f"elapsed {r.get('elapsed_s', 0):.0f} s of a {self.options.budget_s:.0f} s budget.",
        "",
        "## Stages",
        "",
        "| stage | status | estimated s | took s | note |",
        "|---|---|---|---|---|",
    ]
    for s in r["stages"]:
      out.append(
          f"| {s['stage']} | {s['status']} | {s['estimated_s']:.1f} | "
          f"{s.get('took_s', float('nan')):.1f} | {s.get('reason', s.get('error', ''))} |"
      )
    setup = r.get("setup")
    if setup:
      out += [
          "",
          f"Copy bandwidth {setup['bandwidth']['bytes_per_s'] / 1e9:.0f} GB/s; target weights "
          f"{setup['target_bytes'] / 1e9:.2f} GB (initialised in {setup['target_init_s']:.1f} s); "
          f"decoder bytes per step {setup['decoder_bytes_per_step'] / 1e9:.3f} GB: floor "
          f"{setup['floor_ms_per_token']:.3f} ms per token.",
      ]
    for t, b in r["baseline"].items():
      out.append(
          f"Baseline {t}: {b['ms_per_token']:.3f} ms/token ({b['loop_ms_per_token']:.3f} in the "
          f"loop, {b['loop_over_floor']:.2f}x the floor; a step {b['target_step_ms']:.3f} ms, "
          f"{b['step_over_floor']:.2f}x the floor)."
      )
    compile_s = {k: f"{sum(v):.1f} s in {len(v)}" for k, v in r["compile_s"].items()}
    out += ["", f"Compile times by program kind: {compile_s}.", ""]
    if self.rows:
      out += ["## Rows", "", report.markdown_table(self.rows), report.NOTES, ""]
    for t, costs in r["costs"].items():
      out.append(
          f"Costs {t}: target step {costs['target_step_ms']:.3f} ms; verify cost by k "
          + ", ".join(f"{k}: {v:.2f}" for k, v in costs["verify_cost"].items())
          + "; c "
          + ", ".join(f"{k}: {v:.3f}" for k, v in costs["c"].items())
          + "."
      )
    if r["table2_projected"]:
      out += [
          "",
          "## Table 2 projected (paper's alpha, measured c and verify cost)",
          "",
          "| task | drafter | T | gamma | alpha | c | verify | Thm 3.8 | hw-aware | paper |",
          "|---|---|---|---|---|---|---|---|---|---|",
      ]
      for p in r["table2_projected"]:
        out.append(
            f"| {p['task']} | {p['drafter']} | {p['temperature']:g} | {p['gamma']} | "
            f"{p['alpha_paper']} | {p['c_measured']:.3f} | {p['verify_cost_measured']:.2f} | "
            f"{p['projected_speedup']:.2f}x | {p['projected_speedup_hw']:.2f}x | "
            f"{p['paper_speedup']}x |"
        )
    hf = r["hf"]
    if hf:
      ours = hf["ours_speculative_ms_per_token"]
      out += [
          "",
          "## Hugging Face, same weights and drafter",
          "",
          f"HF generate {hf['hf_baseline_ms_per_token']:.3f} ms/token, assisted "
          f"({hf['drafter']}, {hf['num_assistant_tokens']} constant) "
          f"{hf['hf_assisted_ms_per_token']:.3f} ms/token; ours {hf['ours_baseline_ms_per_token']:.3f}"
          f" and {'not timed' if ours is None else f'{ours:.3f}'} ms/token; greedy output "
          f"identical: {hf['greedy_identical']}.",
      ]
    return "\n".join(out) + "\n"


def decoding_length(tokens: np.ndarray) -> int:
  """Tokens up to and including the first EOS (all if none), trailing padding dropped."""
  tokens = np.asarray(tokens)
  eos = np.nonzero(tokens == EOS_ID)[0]
  if eos.size:
    return int(eos[0]) + 1
  nonzero = np.nonzero(tokens)[0]
  return int(nonzero[-1]) + 1 if nonzero.size else 0


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
  n = 0
  for x, y in zip(a, b):
    if x != y:
      break
    n += 1
  return n


def _json_default(value):
  if isinstance(value, (np.integer, np.floating)):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  if dataclasses.is_dataclass(value):
    return dataclasses.asdict(value)
  return str(value)


def run(options: Options) -> dict:
  """Runs every stage that fits the budget -> the results (also in results.json); a failed
  stage is recorded with its error and the run goes on (`Bench.failed`)."""
  bench = Bench(options)
  main_budget = options.budget_s - (options.hf_budget_s if options.hf else 0.0)
  for stage in stage_list(options):
    limit = options.budget_s if stage.kind == "hf" else main_budget
    left = limit - bench.elapsed()
    try:
      estimate = bench.estimate(stage)
    except Exception as e:  # pylint: disable=broad-except
      estimate = math.inf
      bench.log(f"could not estimate {stage.name}: {e}")
    record = {"stage": stage.name, "estimated_s": estimate, "left_s": left}
    if stage.kind != "setup" and (bench.params is None or estimate > left):
      record["status"] = "skipped"
      record["reason"] = (
          "the setup failed"
          if bench.params is None
          else f"estimated {estimate:.0f} s, {max(left, 0):.0f} s left of the budget"
      )
      bench.log(f"SKIPPED {stage.name}: {record['reason']}")
      bench.results["stages"].append(record)
      bench.write()
      continue
    bench.log(f"stage {stage.name} (estimated {estimate:.1f} s, {left:.0f} s left)")
    compiled_before = sum(sum(v) for v in bench.compile_s.values())
    start = time.perf_counter()
    try:
      record["result"] = bench.run_stage(stage)
      record["status"] = "done"
    except Exception as e:  # pylint: disable=broad-except
      record["status"] = "failed"
      record["error"] = f"{type(e).__name__}: {e}"
      bench.failed = True
      traceback.print_exc()
      bench.log(f"FAILED {stage.name}: {record['error']}")
    took = time.perf_counter() - start
    record["took_s"] = took
    compiled = sum(sum(v) for v in bench.compile_s.values()) - compiled_before
    if record["status"] == "done" and stage.kind != "setup":
      bench.run_s.setdefault(stage.kind, []).append(max(0.0, took - compiled))
    bench.results["stages"].append(record)
    bench.write()
  bench.results["run"]["load_after"] = stopwatch.machine_load()
  bench.results["failed"] = bench.failed
  bench.write()
  bench.log(f"wrote {bench.out / 'results.json'} and {bench.out / 'results.md'}")
  return bench.results


# ----------------------------------------------------------------------------------------------
# Abstract check at full size: nothing allocated, nothing compiled
# ----------------------------------------------------------------------------------------------
def abstract_check(options: Options) -> dict:
  """The init and the decode programs traced with abstract arrays -> bytes of the parameters,
  the caches and the decodes' outputs, and how long each trace and lowering took."""
  sizes = SIZES[options.sizes]
  dtype = jnp.dtype(sizes.param_dtype)
  config = t5_config(sizes.target, sizes.encoder_layers, sizes.dtype)
  result = {"sizes": options.sizes, "programs": {}}
  start = time.perf_counter()
  target = device_init.abstract_params(config, dtype)
  result["target_param_bytes"] = device_init.tree_bytes(target)
  result["init_trace_s"] = time.perf_counter() - start
  drafters = {}
  for name in PAPER_DRAFTERS:
    shape, layers = sizes.drafters[name]
    drafter_config = t5_config(shape, layers, sizes.dtype)
    drafters[name] = (
        drafters_lib.T5Drafter(drafter_config),
        device_init.abstract_params(drafter_config, dtype),
    )
    result[f"{name}_param_bytes"] = device_init.tree_bytes(drafters[name][1])
  for name, layers in SHARED.items():
    drafters[name] = device_init.truncated_shared_encoder(config, target, layers)
    own = device_init.tree_bytes(drafters[name][1]["decoder"]) - device_init.tree_bytes(
        {k: v for k, v in drafters[name][1]["decoder"].items() if not k.startswith("layers_")}
    )
    result[f"{name}_decoder_layer_bytes"] = own
  vocabulary = vocabularies.PassThroughVocabulary(config.vocab_size, eos_id=EOS_ID)
  module = network.Transformer(config)
  batch = {
      "encoder_input_tokens": jax.ShapeDtypeStruct((1, sizes.input_length), jnp.int32),
      "decoder_input_tokens": jax.ShapeDtypeStruct((1, sizes.decode_length), jnp.int32),
  }
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
  baseline = models.EncoderDecoderModel(module, vocabulary, vocabulary)
  start = time.perf_counter()
  cache = jax.eval_shape(baseline.prefill, target, batch)
  result["target_cache_bytes"] = device_init.tree_bytes(cache)
  result["prefill_trace_s"] = time.perf_counter() - start

  def lower(name, model, params):
    for greedy in (True, False):
      start = time.perf_counter()
      fn = jax.jit(
          lambda p, b, r, t, greedy=greedy: model.predict_batch_with_aux(
              p, b, r, decoder_params={"temperature": 0.0 if greedy else t}
          )
      )
      lowered = fn.lower(params, batch, rng, jax.ShapeDtypeStruct((), jnp.float32))
      result["programs"][f"{name} {'greedy' if greedy else 'sampled'}"] = {
          "lower_s": time.perf_counter() - start,
          "hlo_chars": len(lowered.as_text()),
      }

  lower("baseline", baseline, target)
  for name in ("small", "shared1"):
    drafter, params = drafters[name]
    model = models.SpeculativeEncoderDecoderModel(
        module, drafter, vocabulary, vocabulary, draft_shape=draft_shapes.Chain(max(options.gammas))
    )
    lower(
        f"speculative {name} gamma {max(options.gammas)}",
        model,
        {"target": target, "drafter": params},
    )
  result["geometry_position"] = step_costs.DecodeGeometry.for_decoding(
      sizes.input_length, sizes.decode_length, 8
  ).position
  return result


# ----------------------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------------------
_SIZES = flags.DEFINE_enum(
    "sizes", "tiny", sorted(SIZES), "Model sizes: xxl (the device run) or tiny."
)
_OUTPUT_DIR = flags.DEFINE_string("output_dir", Options.output_dir, "Where results go.")
_BUDGET = flags.DEFINE_float("budget_s", Options.budget_s, "Seconds the whole run may take.")
_HF_BUDGET = flags.DEFINE_float(
    "hf_budget_s", Options.hf_budget_s, "Seconds of --budget_s kept for the hf stage."
)
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", Options.num_examples, "Random examples.")
_REPEATS = flags.DEFINE_integer("repeats", Options.repeats, "Timed decodes per example.")
_COST_REPEATS = flags.DEFINE_integer("cost_repeats", Options.cost_repeats, "Step-timing rounds.")
_GAMMAS = flags.DEFINE_list("gammas", ["3", "5", "7"], "Chain lengths.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Temperatures.")
_HF = flags.DEFINE_bool("hf", True, "Run the Hugging Face stage (torch and transformers).")
_HF_REPEATS = flags.DEFINE_integer("hf_repeats", Options.hf_repeats, "Timed HF generates.")
_STAGES = flags.DEFINE_list("stages", [], "Only the stages whose names start with these.")
_CACHE = flags.DEFINE_string(
    "compilation_cache_dir",
    None,
    "JAX's persistent cache (default <output_dir>/jax_cache; '': none).",
)
_ABSTRACT = flags.DEFINE_bool(
    "abstract_only", False, "Only trace the init and decode programs abstractly; report bytes."
)


def main(argv):
  del argv
  options = Options(
      sizes=_SIZES.value,
      output_dir=_OUTPUT_DIR.value,
      budget_s=_BUDGET.value,
      hf_budget_s=_HF_BUDGET.value,
      num_examples=_NUM_EXAMPLES.value,
      repeats=_REPEATS.value,
      cost_repeats=_COST_REPEATS.value,
      gammas=tuple(int(g) for g in _GAMMAS.value),
      temperatures=tuple(float(t) for t in _TEMPERATURES.value),
      hf=_HF.value,
      hf_repeats=_HF_REPEATS.value,
      stages=tuple(_STAGES.value),
      compilation_cache_dir=_CACHE.value,
  )
  if _ABSTRACT.value:
    result = abstract_check(options)
    print(json.dumps(result, indent=2))
    out = pathlib.Path(options.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "abstract.json").write_text(json.dumps(result, indent=2))
    return
  results = run(options)
  if results["failed"]:
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)

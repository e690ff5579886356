r"""Why k tokens cost what they do on XLA:CPU: the demo target's decoder matmuls, timed per k.

The demo target's decoder (4 layers of 512 wide, mlp 1024, gated GELU, an 8000-token head; 64 MB
of float32 weights) does, per token and layer, the projections q, k, v, o of self-attention,
q and o of cross-attention, the MLP's two input kernels and its output kernel, then the head.
This times those matmuls alone, as one chain on k rows [k, 512], for k = 1, 2, 4, 8, in
variants that each change one thing:

- `separate`: every kernel its own dot, as `layers.py` computes them;
- `fused`: one [512, 1536] dot for q, k and v, and one [512, 2048] dot for the MLP's two input
  kernels (fewer, wider dots);
- `highest`: `separate` at `precision=HIGHEST`;
- `numpy`: the `separate` matmuls in NumPy (OpenBLAS), outside XLA.

Each jitted variant runs the chain `--steps` times in a fori_loop (the next input a function of
the last output, so nothing is hoisted), timed against a loop of 1 + EXTRA_PASSES times as many
steps (`stopwatch.time_rounds`, side by side, the median of `--repeats` rounds): a step's marginal
time. XLA flags change a process's compiler: pass them in XLA_FLAGS and run again, e.g.

  python benchmarks/bench_cpu_dots.py --output_dir=/tmp/dots
  XLA_FLAGS=--xla_cpu_use_thunk_runtime=false python benchmarks/bench_cpu_dots.py --output_dir=...
  taskset -c 0 python benchmarks/bench_cpu_dots.py --output_dir=/tmp/dots_one_core

Writes bench_cpu_dots.json and bench_cpu_dots.md into --output_dir (with XLA_FLAGS, the cores
this process may use and the 1-minute load average) and prints the table.
"""

from __future__ import annotations

import json
import os
import time

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import gin_utils
from speculative_t5x.measuring import step_costs
from speculative_t5x.measuring import stopwatch
from speculative_t5x.running import run_dir

EMB, MLP, VOCAB, LAYERS = 512, 1024, 8000, 4
VARIANTS = ("separate", "fused", "highest", "numpy")
OUTPUTS = ("bench_cpu_dots.json", "bench_cpu_dots.md")

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Directory for the results.")
_KS = flags.DEFINE_list("ks", ["1", "2", "4", "8"], "Rows per matmul chain; must include 1.")
_REPEATS = flags.DEFINE_integer("repeats", 15, "Timed rounds (median).", lower_bound=3)
_STEPS = flags.DEFINE_integer("steps", 4, "Chain steps per short call.", lower_bound=1)
flags.mark_flag_as_required("output_dir")
run_dir.define_overwrite_flag()


def weights(seed: int = 0) -> dict[str, np.ndarray]:
  """The decoder's kernels [in, out], float32, scaled so activations stay O(1)."""
  rng = np.random.default_rng(seed)
  shapes = {"q": (EMB, EMB), "k": (EMB, EMB), "v": (EMB, EMB), "o": (EMB, EMB)}
  shapes.update({"cq": (EMB, EMB), "co": (EMB, EMB), "wi0": (EMB, MLP), "wi1": (EMB, MLP)})
  shapes.update({"wo": (MLP, EMB)})
  params = {
      f"{layer}/{name}": (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
      for layer in range(LAYERS)
      for name, shape in shapes.items()
  }
  params["head"] = (rng.standard_normal((EMB, VOCAB)) / np.sqrt(EMB)).astype(np.float32)
  return params


def fused(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """q|k|v and wi0|wi1 concatenated along the output axis, once, outside the timed loop."""
  out = {"head": params["head"]}
  for layer in range(LAYERS):
    p = lambda name, layer=layer: params[f"{layer}/{name}"]  # noqa: E731
    out[f"{layer}/qkv"] = np.concatenate([p("q"), p("k"), p("v")], axis=1)
    out[f"{layer}/wi"] = np.concatenate([p("wi0"), p("wi1")], axis=1)
    for name in ("o", "cq", "co", "wo"):
      out[f"{layer}/{name}"] = p(name)
  return out


def chain(xp, params, x, variant: str, precision=None):
  """One decoder's matmuls on x [k, EMB] -> the head's logits [k, VOCAB] (xp: jnp or np)."""
  dot = (lambda a, b: jnp.dot(a, b, precision=precision)) if xp is jnp else np.dot
  for layer in range(LAYERS):
    p = lambda name, layer=layer: params[f"{layer}/{name}"]  # noqa: E731
    if variant == "fused":
      q, k, v = xp.split(dot(x, p("qkv")), 3, axis=1)
    else:
      q, k, v = dot(x, p("q")), dot(x, p("k")), dot(x, p("v"))
    x = x + dot(q * xp.tanh(k) + v, p("o"))
    x = x + dot(dot(x, p("cq")), p("co"))
    if variant == "fused":
      gate, linear = xp.split(dot(x, p("wi")), 2, axis=1)
    else:
      gate, linear = dot(x, p("wi0")), dot(x, p("wi1"))
    x = x + dot(xp.tanh(gate) * linear, p("wo"))
    x = x / xp.sqrt(xp.mean(x * x, axis=1, keepdims=True) + 1e-6)
  return dot(x, params["head"])


def jitted(variant: str, params, k: int):
  """(fn, args) for `stopwatch.time_rounds`: passes x --steps chain steps in a fori_loop."""
  precision = jax.lax.Precision.HIGHEST if variant == "highest" else None
  base = "fused" if variant == "fused" else "separate"

  @jax.jit
  def run(params, x, passes):
    def step(_, x):
      logits = chain(jnp, params, x, base, precision)
      return x + 1e-3 * logits[:, :EMB]

    return jax.lax.fori_loop(0, passes * _STEPS.value, step, x)

  x = jnp.ones((k, EMB), jnp.float32)
  device_params = jax.device_put(params)
  return {p: (run, (device_params, x, jnp.int32(p))) for p in (1, 1 + step_costs.EXTRA_PASSES)}


def numpy_call(params, k: int):
  """The `separate` chain in NumPy, as a call of passes x --steps steps."""
  x = np.ones((k, EMB), np.float32)

  def run(passes):
    y = x
    for _ in range(passes * _STEPS.value):
      y = y + 1e-3 * chain(np, params, y, "separate")[:, :EMB]
    return jnp.zeros(())  # time_rounds blocks on a jax value

  return {p: (run, (p,)) for p in (1, 1 + step_costs.EXTRA_PASSES)}


def main(argv):
  if len(argv) > 1:
    raise gin_utils.ConfigError(f"unexpected arguments {argv[1:]}: all options are --flags")
  try:
    ks = sorted({int(k) for k in _KS.value})
  except ValueError as e:
    raise gin_utils.ConfigError(f"--ks={','.join(_KS.value)}: give integers, e.g. 1,2,4,8") from e
  if ks[0] != 1 or min(ks) < 1:
    raise gin_utils.ConfigError(f"--ks={','.join(_KS.value)}: give integers >= 1, including 1")
  output = run_dir.OutputDir(
      _OUTPUT_DIR.value, OUTPUTS, "--output_dir", flags.FLAGS.overwrite
  ).check()
  load = stopwatch.machine_load()
  params = weights()
  by_variant = {"separate": params, "highest": params, "fused": fused(params), "numpy": params}
  calls = {}
  for variant in VARIANTS:
    for k in ks:
      made = (
          numpy_call(params, k) if variant == "numpy" else jitted(variant, by_variant[variant], k)
      )
      calls.update({(variant, k, passes): call for passes, call in made.items()})
  start = time.perf_counter()
  seconds = stopwatch.time_rounds(calls, repeats=_REPEATS.value)
  extra = step_costs.EXTRA_PASSES * _STEPS.value
  ms = {
      (variant, k): stopwatch.Timing.from_seconds(
          (seconds[variant, k, 1 + step_costs.EXTRA_PASSES] - seconds[variant, k, 1]) / extra
      ).median_ms
      for variant in VARIANTS
      for k in ks
  }
  header = "| variant | " + " | ".join(f"k = {k}" for k in ks) + " |"
  lines = [header, "|---" * (len(ks) + 1) + "|"]
  for variant in VARIANTS:
    cells = [f"{ms[variant, 1]:.2f} ms"] + [
        f"{ms[variant, k]:.2f} ms ({ms[variant, k] / ms[variant, 1]:.2f}x)" for k in ks[1:]
    ]
    lines.append(f"| {variant} | " + " | ".join(cells) + " |")
  context = {
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "cores": len(os.sched_getaffinity(0)),
      "load_before": load,
      "seconds": time.perf_counter() - start,
      "weights_mb": sum(p.nbytes for p in params.values()) / 2**20,
  }
  table = "\n".join(lines)
  note = (
      f"\nXLA_FLAGS={context['xla_flags'] or '(none)'}; {context['cores']} core(s); load before "
      f"{load['load_1m']:.2f}; {context['weights_mb']:.0f} MB of float32 kernels; the median of "
      f"{_REPEATS.value} rounds of marginal chain steps.\n"
  )
  print(table + note)
  output.write(
      {
          "bench_cpu_dots.json": json.dumps(
              {"ms": {f"{v} k={k}": t for (v, k), t in ms.items()}, **context}, indent=1
          ),
          "bench_cpu_dots.md": table + "\n" + note,
      }
  )


if __name__ == "__main__":
  gin_utils.run(main)

r"""XLA:TPU's COST MODEL of one speculative iteration's programs, per TPU generation, and Table 2
projected from it: a compiler's estimate, not a measurement (nothing runs).

For each TPU generation (one chip of --slices) and task geometry (CNN/DailyMail: 512 encoder
positions, 128 decoded; WMT En-De: 64 and 64), compiles with libtpu on this host
(`tpu_costs`, bfloat16, batch 1):
  - the T5-XXL target's cached decode of k tokens, k = 1..8, 16, 32;
  - one step of each drafter: T5 1.1 small, base and large, and a shared-encoder drafter of
    XXL width with one decoder layer (`drafters.SharedEncoderDrafter`, reading the target's
    encoder output);
  - Algorithm 1 on [1, gamma, 32128] distributions for gamma 3, 5, 7;
and reports bytes accessed, FLOPs and optimal_seconds as `compiled.cost_analysis()` gives them.

From the bytes (batch-1 decoding is bound by them: FLOPs / bytes is about 1 for k = 1) come
verify_cost(k) = bytes(k) / bytes(1) and c = bytes(drafter step) / bytes(target step), and Table 2
projected by Theorem 3.8's hardware-aware form (`theory.speedup_hardware_aware`) with the
paper's alpha and gamma, beside the paper's measured speedup and `roofline`'s projection.

  python benchmarks/tpu_cost_model.py --output_dir=/tmp/tpu_costs
  python benchmarks/tpu_cost_model.py --slices=v4-8 --tasks=EnDe,CNNDM

Writes tpu_costs.json and tpu_costs.md into --output_dir.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from speculative_t5x import drafters  # noqa: E402
from speculative_t5x import gin_utils  # noqa: E402
from speculative_t5x import network  # noqa: E402
from speculative_t5x import theory  # noqa: E402
from speculative_t5x.projections import paper  # noqa: E402
from speculative_t5x.projections import roofline  # noqa: E402
from speculative_t5x.running import run_dir  # noqa: E402
import tpu_costs  # noqa: E402
from speculative_t5x.tpu import tpu_topology  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", "/tmp/speculative_t5x/tpu_costs", "Where the tables go.")
flags.DEFINE_list("slices", list(tpu_topology.GENERATIONS), "One chip of each of these slices.")
flags.DEFINE_list("tasks", ["CNNDM"], "Task geometries: CNNDM (512/128), EnDe (64/64).")
flags.DEFINE_list("ks", ["1", "2", "3", "4", "5", "6", "7", "8", "16", "32"], "Target k values.")

GEOMETRY = {"CNNDM": (512, 128), "EnDe": (64, 64)}  # (encoder length, decoded length)
VOCAB = 32128
GAMMAS = (3, 5, 7)

run_dir.define_overwrite_flag()
OUTPUTS = ("tpu_costs.json", "tpu_costs.md")


def t5_config(size: str, decoder_layers: int | None = None) -> network.T5Config:
  shape = roofline.T5_1_1[size]
  return network.T5Config(
      vocab_size=VOCAB,
      emb_dim=shape.emb_dim,
      num_heads=shape.num_heads,
      head_dim=shape.head_dim,
      mlp_dim=shape.mlp_dim,
      num_encoder_layers=shape.num_layers,
      num_decoder_layers=decoder_layers or shape.num_layers,
      dtype="bfloat16",
      mlp_activations=("gelu", "linear"),
      dropout_rate=0.0,
      logits_via_embedding=False,
  )


DRAFTERS = {
    "small": lambda: drafters.T5Drafter(t5_config("small")),
    "base": lambda: drafters.T5Drafter(t5_config("base")),
    "large": lambda: drafters.T5Drafter(t5_config("large")),
    "shared_xxl_1layer": lambda: drafters.SharedEncoderDrafter(t5_config("xxl", 1), 4096),
}


def measure(slice_name: str, task: str, ks: list[int]) -> dict:
  device = tpu_topology.devices(slice_name)[0]
  encoder_length, decoded = GEOMETRY[task]
  out = {"slice": slice_name, "device_kind": device.device_kind, "task": task}
  target = tpu_costs.target_drafter(t5_config("xxl"))
  out["target"] = {}
  for k in ks:
    start = time.perf_counter()
    cost = tpu_costs.decode_cost(target, k, device, encoder_length, decoded)
    out["target"][k] = dict(cost.as_dict(), compile_seconds=time.perf_counter() - start)
    print(slice_name, task, "target k =", k, cost, flush=True)
  out["drafters"] = {}
  for name, make in DRAFTERS.items():
    drafter = make()
    cost = tpu_costs.decode_cost(
        drafter, 1, device, encoder_length, decoded, drafters.stepped_network(drafter)[1]
    )
    out["drafters"][name] = cost.as_dict()
    print(slice_name, task, name, cost, flush=True)
  out["verifier"] = {
      gamma: tpu_costs.verifier_cost(gamma, VOCAB, device).as_dict() for gamma in GAMMAS
  }
  return out


def project(result: dict) -> list[dict]:
  """Table 2's rows of this task with c and verify_cost from the cost model's bytes."""
  target = result["target"]
  one = target[1]["bytes_accessed"]
  encoder_length, decoded = GEOMETRY[result["task"]]
  rows = []
  for row in paper.TABLE_2:
    if row.task != result["task"] or (row.gamma + 1) not in target:
      continue
    c = result["drafters"][row.drafter]["bytes_accessed"] / one
    verify = target[row.gamma + 1]["bytes_accessed"] / one
    chip = roofline.TPU_V4
    shapes = roofline.T5_1_1
    roof_c = roofline.cost_coefficient(
        shapes[row.drafter], shapes["xxl"], chip, decoded, encoder_length
    )
    roof_verify = float(
        roofline.verify_cost(shapes["xxl"], row.gamma + 1, chip, decoded, encoder_length)
    )
    rows.append(
        {
            "row": row.config_name,
            "alpha": row.alpha,
            "gamma": row.gamma,
            "c": c,
            "verify_cost": verify,
            "speedup": float(theory.speedup_hardware_aware(row.alpha, row.gamma, c, verify)),
            "roofline_c": roof_c,
            "roofline_verify_cost": roof_verify,
            "roofline_speedup": float(
                theory.speedup_hardware_aware(row.alpha, row.gamma, roof_c, roof_verify)
            ),
            "paper_c": row.c,
            "paper_expected": row.expected_speedup,
            "paper_speedup": row.speedup,
        }
    )
  return rows


def markdown(results: list[dict]) -> str:
  lines = [
      "**XLA:TPU's cost model (a compiler's estimate, not a measurement)**, batch 1, bfloat16, "
      "one chip, compiled with `xla_max_cross_program_prefetches=0`.",
      "",
  ]
  for result in results:
    target = result["target"]
    one = target[1]
    lines += [
        f"### {result['slice']} ({result['device_kind']}), {result['task']} geometry",
        "",
        "| program | GB accessed | GFLOP | optimal_seconds (as given) | bytes / target k=1 |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, cost in target.items():
      lines.append(
          f"| T5-XXL decode, k = {k} | {cost['bytes_accessed'] / 1e9:.2f} | "
          f"{cost['flops'] / 1e9:.1f} | {cost['optimal_seconds']:.3g} | "
          f"{cost['bytes_accessed'] / one['bytes_accessed']:.3f} |"
      )
    for name, cost in result["drafters"].items():
      lines.append(
          f"| drafter step, {name} | {cost['bytes_accessed'] / 1e9:.3f} | "
          f"{cost['flops'] / 1e9:.2f} | {cost['optimal_seconds']:.3g} | "
          f"{cost['bytes_accessed'] / one['bytes_accessed']:.4f} |"
      )
    for gamma, cost in result["verifier"].items():
      lines.append(
          f"| Algorithm 1, gamma = {gamma} | {cost['bytes_accessed'] / 1e9:.4f} | "
          f"{cost['flops'] / 1e9:.4f} | {cost['optimal_seconds']:.3g} | "
          f"{cost['bytes_accessed'] / one['bytes_accessed']:.5f} |"
      )
    rows = project(result)
    if rows:
      lines += [
          "",
          "| row | alpha | gamma | c (bytes) | verify_cost(gamma+1) | projected | roofline c, "
          "verify, projected | paper c, EXP, measured |",
          "|---|---:|---:|---:|---:|---:|---|---|",
      ]
      for r in rows:
        lines.append(
            f"| {r['row']} | {r['alpha']} | {r['gamma']} | {r['c']:.4f} | "
            f"{r['verify_cost']:.3f} | {r['speedup']:.2f}x | {r['roofline_c']:.4f}, "
            f"{r['roofline_verify_cost']:.3f}, {r['roofline_speedup']:.2f}x | {r['paper_c']}, "
            f"{r['paper_expected']}x, {r['paper_speedup']}x |"
        )
    lines.append("")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  output = run_dir.OutputDir(FLAGS.output_dir, OUTPUTS, "--output_dir", FLAGS.overwrite)
  output.check()  # before any work
  for name in FLAGS.slices:
    tpu_topology.get_slice(name)
  for task in FLAGS.tasks:
    if task not in GEOMETRY:
      raise app.UsageError(f"--tasks: {task!r} is not one of {sorted(GEOMETRY)}.")
  ks = [int(k) for k in FLAGS.ks]
  if 1 not in ks or min(ks) < 1:
    raise app.UsageError(f"--ks={FLAGS.ks}: give positive k values including 1 (the unit).")
  tpu_topology.check_libtpu()
  results = []
  for name in FLAGS.slices:
    for task in FLAGS.tasks:
      results.append(measure(name, task, ks))
      for result in results:
        result["projection"] = project(result)
      # The tables so far, both at once: a run that stops keeps the rows it has measured.
      output.write(
          {"tpu_costs.json": json.dumps(results, indent=2), "tpu_costs.md": markdown(results)}
      )
  print(markdown(results))


if __name__ == "__main__":
  gin_utils.run(main)

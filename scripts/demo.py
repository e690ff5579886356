"""The README's main command: speculative vs baseline decoding on the shipped demo pair.

It translates held-out English sentences into German with the trained demo target and drafter in
`demo_models/` (see its MODEL_CARD.md), prints a few of them, then a Table-2-style row per
temperature: alpha and tokens per target call from the run's own statistics, c and the
verification cost timed on compiled single steps, the measured speedup over the baseline per
decoded token (batch 1, compile excluded, the two timed side by side, median over repeats,
identical inputs and rng) and Theorem 3.8's prediction. It
checks that the greedy output is identical to the baseline's.

Without `demo_models/` it falls back to a tiny random pair, labelled as such (its alpha says
nothing about real drafters).

  python scripts/demo.py [--pair_dir=demo_models] [--num_examples=24] [--gamma=4]
"""
from __future__ import annotations

import os
import pathlib
import sys

from absl import app
from absl import flags
from absl import logging

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import seqio  # noqa: E402

from speculative_t5x import benchmark, checkpoints, decoding, models, network, theory  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
PREFIX = "translate English to German: "

_PAIR_DIR = flags.DEFINE_string("pair_dir", str(REPO / "demo_models"),
                                "Directory written by checkpoints.save_pair (+ sentencepiece.model).")
_TEST_FILE = flags.DEFINE_string("test_file", str(REPO / "data" / "demo_ende" / "test.tsv"),
                                 "Held-out English<TAB>German pairs.")
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 24, "Sentences to decode and time.")
_SHOW = flags.DEFINE_integer("show", 5, "Translations to print.")
_GAMMA = flags.DEFINE_integer("gamma", 2, "Drafted tokens per target call (2 suits the demo pair).")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Temperatures to run.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per example (median is used).")
_DECODE_LENGTH = flags.DEFINE_integer("decode_length", 64, "Decoder length (max output tokens).")


def _demo_pair():
  """-> (target (config, params), drafter (config, params), vocabulary or None, label)."""
  pair_dir = pathlib.Path(_PAIR_DIR.value)
  if (pair_dir / "target").exists():
    pair = checkpoints.restore_pair(pair_dir)  # ((params, config), (params, config))
    (target_params, target_cfg), (drafter_params, drafter_cfg) = pair
    vocab = seqio.SentencePieceVocabulary(str(pair_dir / "sentencepiece.model"))
    return ((target_cfg, target_params), (drafter_cfg, drafter_params), vocab,
            f"trained demo pair from {pair_dir}")
  print(f"[demo] {pair_dir} holds no trained pair: using a tiny RANDOM pair instead "
        "(mechanics only; its alpha is not meaningful).")
  target_cfg = network.T5Config(vocab_size=512, emb_dim=64, num_heads=4, num_encoder_layers=2,
                                num_decoder_layers=2, head_dim=16, mlp_dim=128,
                                mlp_activations=("gelu", "linear"), dropout_rate=0.0)
  drafter_cfg = target_cfg.replace(emb_dim=32, num_heads=2, num_encoder_layers=1,
                                   num_decoder_layers=1, mlp_dim=64)
  return ((target_cfg, benchmark.random_params(target_cfg, 0)),
          (drafter_cfg, benchmark.random_params(drafter_cfg, 1)), None, "random tiny pair")


def _inputs(vocab, vocab_size):
  """-> (encoder tokens [N, Le] int32, sources, references)."""
  if vocab is None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(4, 16, _NUM_EXAMPLES.value)
    tokens = np.zeros((_NUM_EXAMPLES.value, 16), np.int32)
    for i, n in enumerate(lengths):
      tokens[i, :n] = rng.integers(3, vocab_size, n)
      tokens[i, n - 1] = 1
    return tokens, None, None
  lines = pathlib.Path(_TEST_FILE.value).read_text(encoding="utf-8").splitlines()
  pairs = [line.split("\t")[:2] for line in lines[:_NUM_EXAMPLES.value]]
  encoded = [vocab.encode(PREFIX + en) + [vocab.eos_id] for en, _ in pairs]
  width = int(np.ceil(max(len(e) for e in encoded) / 8) * 8)
  tokens = np.zeros((len(encoded), width), np.int32)
  for i, e in enumerate(encoded):
    tokens[i, :len(e)] = e
  return tokens, [en for en, _ in pairs], [de for _, de in pairs]


def _decoded_tokens(decodes, eos_id: int) -> int:
  """Tokens of a [1, L] decode up to and including the first EOS (all L if none)."""
  eos = np.flatnonzero(np.asarray(decodes)[0] == eos_id)
  return int(eos[0]) + 1 if eos.size else int(np.asarray(decodes).shape[-1])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  (target_cfg, target_params), (drafter_cfg, drafter_params), vocab, label = _demo_pair()
  seq_vocab = vocab or seqio.PassThroughVocabulary(target_cfg.vocab_size, eos_id=1)
  gamma = _GAMMA.value
  baseline = models.EncoderDecoderModel(network.Transformer(target_cfg), seq_vocab, seq_vocab)
  speculative = models.SpeculativeEncoderDecoderModel(
      network.Transformer(target_cfg), network.Transformer(drafter_cfg), seq_vocab, seq_vocab,
      gamma=gamma)
  params = {"target": target_params, "drafter": drafter_params}
  encoder_tokens, sources, references = _inputs(vocab, target_cfg.vocab_size)
  length = _DECODE_LENGTH.value
  base_fn, spec_fn = baseline.jit_predict(), speculative.jit_predict()
  print(f"[demo] {label}: target {target_cfg.emb_dim}d x {target_cfg.num_decoder_layers} layers, "
        f"drafter {drafter_cfg.emb_dim}d x {drafter_cfg.num_decoder_layers} layers, gamma {gamma}, "
        f"{len(encoder_tokens)} examples at batch 1, backend {jax.default_backend()}")

  geometry = benchmark.DecodeGeometry.for_decoding(encoder_tokens.shape[1], length, gamma + 1)
  rows, identical = [], None
  for temperature in [float(t) for t in _TEMPERATURES.value]:
    costs = benchmark.measure_costs(target_cfg, target_params,
                                    {"drafter": (drafter_cfg, drafter_params)}, [gamma], geometry,
                                    temperature=temperature, repeats=10)["drafter"]
    ms = {"base": 0.0, "spec": 0.0}
    token_counts = {"base": 0, "spec": 0}
    stats, outputs = [], []
    for i in range(len(encoder_tokens)):
      batch = {"encoder_input_tokens": encoder_tokens[i:i + 1],
               "decoder_input_tokens": np.zeros((1, length), np.int32)}
      calls = {"base": (base_fn, (target_params, batch, jax.random.PRNGKey(i), temperature)),
               "spec": (spec_fn, (params, batch, jax.random.PRNGKey(i), temperature))}
      timings = benchmark.time_calls(calls, repeats=_REPEATS.value)  # side by side
      decodes = {}
      for key, (fn, args) in calls.items():
        decodes[key], aux = fn(*args)
        ms[key] += timings[key].median_ms
        token_counts[key] += _decoded_tokens(decodes[key], seq_vocab.eos_id)
      stats.append(aux["speculative_stats"])
      outputs.append(np.asarray(decodes["spec"][0]))
      if temperature == 0:
        same = bool(np.array_equal(np.asarray(decodes["base"]), np.asarray(decodes["spec"])))
        identical = same if identical is None else identical and same
    summary = decoding.stats_summary(jax.tree.map(lambda *x: np.concatenate(x), *stats))
    alpha = min(summary["alpha"], 1.0)
    # Per decoded token: at temperature 1 the two decodes are different samples.
    speedup = (ms["base"] / token_counts["base"]) / (ms["spec"] / token_counts["spec"])
    rows.append((temperature, alpha, summary["tokens_per_target_call"], costs, speedup,
                 theory.speedup(alpha, gamma, costs.c),
                 theory.speedup_hardware_aware(alpha, gamma, costs.c, costs.verify_cost(gamma))))
    if temperature == 0 and vocab is not None:
      print("\nTranslations (temperature 0, speculative decoding):")
      for src, ref, out in list(zip(sources, references, outputs))[:_SHOW.value]:
        print(f"  EN  {src}\n  DE  {vocab.decode(out.tolist())}\n  ref {ref}\n")

  print("c: drafter step / target step; verify: target on gamma+1 tokens / on 1 (steps timed "
        "with their standardization and draw)")
  print("| temp | gamma | alpha | tokens/call | c | verify | speedup | Thm 3.8 | hw-aware |")
  print("|---|---|---|---|---|---|---|---|---|")
  for t, alpha, tokens, costs, speedup, predicted, predicted_hw in rows:
    print(f"| {t:g} | {gamma} | {alpha:.2f} | {tokens:.2f} | {costs.c:.3f} | "
          f"{costs.verify_cost(gamma):.2f} | {speedup:.2f}x | {predicted:.2f}x | "
          f"{predicted_hw:.2f}x |")
  if identical is not None:
    print(f"\nGreedy speculative output identical to the baseline on all {len(encoder_tokens)} "
          f"examples: {identical}")
    if not identical:
      sys.exit(1)


if __name__ == "__main__":
  app.run(main)

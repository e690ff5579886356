r"""Table 3: alpha, the mean over target-generated tokens of beta = sum_x min(p, q).

For each temperature, the target generates outputs for the inputs of a task split; the target and
every drafter are then teacher-forced on those outputs (`speculative_t5x.alpha`). Drafters: the
T5 drafter of the pair, and unigram and bigram tables fitted on the task's training targets (the
paper's Table 3 rows). Writes alpha.json and alpha.md into --output_dir.

  python scripts/measure_alpha.py                       # the demo pair on the demo task
  python scripts/measure_alpha.py --pair_dir=/path/to/pair --task=demo_ende --num_tokens=10000
"""
from __future__ import annotations

import json
import os
import pathlib

from absl import app
from absl import flags
from absl import logging

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import seqio  # noqa: E402
import tqdm  # noqa: E402

from speculative_t5x import alpha, checkpoints, drafters, tasks  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]

_PAIR_DIR = flags.DEFINE_string("pair_dir", str(REPO / "demo_models"),
                                "A (target, drafter) directory written by checkpoints.save_pair.")
_TASK = flags.DEFINE_string("task", tasks.DEMO_ENDE_TASK, "seqio task providing the inputs.")
_SPLIT = flags.DEFINE_string("split", "test", "Split whose inputs the target continues.")
_TRAIN_SPLIT = flags.DEFINE_string("train_split", "train", "Split the n-gram tables are fitted on.")
_NGRAM_EXAMPLES = flags.DEFINE_integer("ngram_examples", 50000, "Training targets for n-grams.")
_FEATURE_LENGTHS = flags.DEFINE_list("feature_lengths", ["64", "64"], "Inputs, targets lengths.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Temperatures (t=0 is argmax).")
_NUM_TOKENS = flags.DEFINE_integer("num_tokens", 10000, "Target-generated tokens per setting.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Examples per generation batch.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", "/tmp/speculative_t5x/alpha", "Results directory.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  (target_params, target_cfg), (drafter_params, drafter_cfg) = checkpoints.restore_pair(
      _PAIR_DIR.value)
  vocab_file = pathlib.Path(_PAIR_DIR.value) / "sentencepiece.model"
  task_name = _TASK.value
  if task_name == tasks.DEMO_ENDE_TASK and vocab_file.exists():
    tasks.register_demo_task(vocabulary=seqio.SentencePieceVocabulary(str(vocab_file)))
  task = tasks.get_task(task_name)
  eos_id = task.output_features["targets"].vocabulary.eos_id
  input_length, target_length = (int(x) for x in _FEATURE_LENGTHS.value)
  lengths = {"inputs": input_length, "targets": target_length}
  inputs = tasks.feature_arrays(task, _SPLIT.value, "inputs", lengths)
  train_targets = tasks.feature_arrays(task, _TRAIN_SPLIT.value, "targets", lengths,
                                       _NGRAM_EXAMPLES.value)
  vocab_size = target_cfg.vocab_size
  candidates = {
      f"T5 drafter ({drafter_cfg.emb_dim}d x {drafter_cfg.num_decoder_layers})":
          (drafters.T5Drafter(drafter_cfg, eos_id=eos_id), drafter_params),
      "unigram": (drafters.UnigramDrafter(vocab_size=vocab_size, eos_id=eos_id),
                  drafters.UnigramDrafter.fit(train_targets, vocab_size)),
      "bigram": (drafters.BigramDrafter(vocab_size=vocab_size, eos_id=eos_id),
                 drafters.BigramDrafter.fit(train_targets, vocab_size)),
  }
  batches = [inputs[i:i + _BATCH_SIZE.value] for i in range(0, len(inputs), _BATCH_SIZE.value)]
  results = {}
  for temperature in [float(t) for t in _TEMPERATURES.value]:
    results[f"t={temperature:g}"] = alpha.measure(
        target_cfg, target_params, candidates, tqdm.tqdm(batches, desc=f"t={temperature:g}"),
        target_length, temperature, eos_id, _NUM_TOKENS.value)
  out = pathlib.Path(_OUTPUT_DIR.value)
  out.mkdir(parents=True, exist_ok=True)
  (out / "alpha.json").write_text(json.dumps(results, indent=2))
  lines = [f"Alpha on `{task_name}` ({_SPLIT.value}), target from {_PAIR_DIR.value}",
           "", "| drafter | " + " | ".join(results) + " | tokens |",
           "|---|" + "---|" * (len(results) + 1)]
  for name in candidates:
    cells = [f"{results[t][name]['alpha']:.3f}" for t in results]
    tokens = min(results[t][name]["tokens"] for t in results)
    lines.append(f"| {name} | " + " | ".join(cells) + f" | {tokens} |")
  (out / "alpha.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)

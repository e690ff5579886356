"""Builds the offline English-German demo corpus from gettext catalogs, and its vocabulary.

A thin command-line front end of `speculative_t5x.demo_corpus` (which documents the corpus): it
finds the German `.mo` catalogs, builds the corpus into --output_dir and prints a summary.

Outputs in --output_dir (read by the `demo_ende` task in speculative_t5x/text/tasks.py):
  {train,validation,test}.tsv   one pair per line, `english<TAB>german`, no header
  sentencepiece.model           unigram model with T5's ids: pad 0, eos 1, unk 2, no bos
  stats.json                    catalogs, what was dropped and why, split sizes, word counts

Usage:
  python benchmarks/build_demo_corpus.py --output_dir=data/demo_ende
"""

import json
import pathlib

from absl import app
from absl import flags

from speculative_t5x.running import bootstrap

bootstrap.start()  # first: keeps JAX off an absent TPU, imports TensorFlow quietly

import demo_corpus
from speculative_t5x import gin_utils
from speculative_t5x.running import run_dir

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir",
    str(REPO_ROOT / "data" / "demo_ende"),
    "Directory for the TSV splits, the vocabulary and stats.json.",
)
_MO_GLOBS = flags.DEFINE_list(
    "mo_globs",
    list(demo_corpus.DEFAULT_MO_GLOBS),
    "Glob patterns of German .mo catalogs (regional variants such as de_CH are left out on "
    "purpose: Swiss spelling differs).",
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the shuffle that assigns pairs to splits.")
_VALIDATION_SIZE = flags.DEFINE_integer("validation_size", 2000, "Pairs in the validation split.")
_TEST_SIZE = flags.DEFINE_integer("test_size", 2000, "Pairs in the test split.")
_MAX_CHARS = flags.DEFINE_integer(
    "max_chars",
    200,
    "Drop pairs whose English or German side is longer than this many characters "
    "(multi-paragraph --help texts); 0 keeps everything.",
)
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8000, "SentencePiece vocabulary size (pieces).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags")
  run_dir.check_writable(_OUTPUT_DIR.value, "--output_dir")  # before any work
  mo_files = demo_corpus.find_catalogs(_MO_GLOBS.value)
  if not mo_files:
    raise app.UsageError(
        f"no .mo catalogs match --mo_globs={','.join(_MO_GLOBS.value)}; install "
        "packages with German translations or point --mo_globs at catalogs"
    )
  try:
    stats = demo_corpus.build(
        mo_files,
        _OUTPUT_DIR.value,
        _SEED.value,
        _VALIDATION_SIZE.value,
        _TEST_SIZE.value,
        _MAX_CHARS.value,
        _VOCAB_SIZE.value,
    )
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  print(
      json.dumps(
          {
              "output_dir": _OUTPUT_DIR.value,
              "catalogs": len(stats["catalogs"]),
              "pairs": {s: v["pairs"] for s, v in stats["splits"].items()},
              "dropped": stats["dropped"],
              "vocabulary_pieces": stats["vocabulary"]["pieces"],
              "file_bytes": stats["file_bytes"],
          },
          indent=2,
      )
  )


if __name__ == "__main__":
  gin_utils.run(main)

"""The demo corpus (an offline En-De corpus beside the package): where it lives and its fixed names.
No TensorFlow: the demo decodes without seqio; `tasks.register_demo_task` reads the corpus as a
seqio task."""

import os
import pathlib

DEMO_ENDE_TASK = "demo_ende"
TRANSLATE_EN_DE_PREFIX = "translate English to German: "
DEMO_SPLITS = ("train", "validation", "test")
DEMO_VOCABULARY_FILE = "sentencepiece.model"

# Where the demo corpus lives: $SPECULATIVE_T5X_DEMO_DATA, else data/demo_ende beside the package.
DEMO_DATA_ENV = "SPECULATIVE_T5X_DEMO_DATA"
# The repository's data/demo_ende in a clone; the package's copy (package data) once installed.
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_DEMO_DATA_DIR = next(
    (
        path
        for path in (
            _PACKAGE_DIR.parent / "data" / "demo_ende",
            _PACKAGE_DIR / "data" / "demo_ende",
        )
        if path.is_dir()
    ),
    _PACKAGE_DIR.parent / "data" / "demo_ende",
)


def demo_data_dir() -> pathlib.Path:
  """The demo corpus directory: $SPECULATIVE_T5X_DEMO_DATA if set, else data/demo_ende."""
  return pathlib.Path(os.environ.get(DEMO_DATA_ENV) or DEFAULT_DEMO_DATA_DIR)

"""Shared test set-up: one CPU device, float32 matmuls, and the T5X fixtures beside the project."""
import os
import pathlib

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT.parent / "shared" / "fixtures" / "t5x"


def fixture_path(name: str) -> pathlib.Path:
  """Path of a T5X fixture; skips the calling test where ../shared/fixtures/t5x is absent."""
  path = FIXTURES / name
  if not path.exists():
    pytest.skip(f"T5X fixture {path} is absent (it ships only beside the project's own clone, "
                "in ../shared/fixtures/t5x); this test needs files written by T5X itself.")
  return path

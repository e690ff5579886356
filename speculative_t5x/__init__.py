"""Exact speculative decoding (Leviathan, Kalman, Matias, ICML 2023) for T5 1.1 in JAX/Flax.

Importing the package imports TensorFlow (which seqio and TFDS need) once, quietly, where it is
installed (decoding needs JAX alone: scripts/run_without_tensorflow.py runs the demo and the
benchmark without it), and hides the GPUs from it as T5X does (TensorFlow only feeds data; JAX owns the accelerators): its C++ start-up
lines (no CUDA driver, CPU features, oneDNN) are written before any log level applies, so they are
captured and dropped; every other line it writes is passed on to stderr. TF_CPP_MIN_LOG_LEVEL is
set to 2 unless the user set it; a user's TF_CPP_MIN_LOG_LEVEL=0 (show everything) keeps the
start-up lines too.

Where libtpu is installed (the test extras install it, to compile for TPU on any host:
docs/tpu.md) but the host has no TPU chip and JAX_PLATFORMS is unset, JAX would try the TPU
backend at start-up and print libtpu's warnings; the package then sets JAX_PLATFORMS=cpu (or
leaves a GPU host to JAX, setting TPU_SKIP_MDS_QUERY=1 only), as JAX's CPU fallback would end
anyway. On a TPU VM nothing changes.

No environment variable silences those lines (TensorFlow 2.21 writes them whatever its log
level), so the capture must be the first import of TensorFlow: every script imports
`speculative_t5x` before seqio, TFDS or TensorFlow (its first third-party import where one of those
comes before the package's modules), and tests/test_bad_inputs.py checks that each script's
`--help` prints nothing else.
"""

import importlib.util
import os
import re
import sys
import tempfile

__version__ = "0.1.0"

_START_UP_CHATTER = re.compile(
    r"All log messages before absl::InitializeLog|cudart_stub\.cc|cpu_feature_guard\.cc"
    r"|oneDNN custom operations|rebuild TensorFlow with the appropriate compiler flags"
    r"|Unable to register cu(DNN|FFT|BLAS) factory|computation placer already registered"
    r"|TF-TRT Warning|cuda_platform\.cc|failed call to cuInit"
)


def _import_tensorflow_quietly() -> None:
  """Imports TensorFlow with file descriptor 2 captured; re-emits what is not start-up chatter."""
  if "tensorflow" in sys.modules:
    return  # imported before the package: its start-up lines are already written
  if importlib.util.find_spec("tensorflow") is None:
    return  # decoding and training need no TensorFlow; seqio's tasks and TFDS do
  if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0":  # the user asked for every line
    import tensorflow  # pylint: disable=g-import-not-at-top

    tensorflow.config.set_visible_devices([], "GPU")
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow  # pylint: disable=g-import-not-at-top

      # As T5X does: TensorFlow only feeds data (seqio, TFDS); JAX owns the accelerators.
      tensorflow.config.set_visible_devices([], "GPU")
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      for line in captured.read().decode("utf-8", "replace").splitlines():
        if line.strip() and not _START_UP_CHATTER.search(line):
          print(line, file=sys.stderr)


def _has_tpu_chip() -> bool:
  """TPU chips appear as /dev/accel* (v2-v5e) or /dev/vfio/<n> (v5p, v6e)."""
  dev = "/dev"
  names = os.listdir(dev) if os.path.isdir(dev) else []
  vfio = os.listdir(f"{dev}/vfio") if os.path.isdir(f"{dev}/vfio") else []
  return any(n.startswith("accel") for n in names) or any(n.isdigit() for n in vfio)


def _skip_absent_tpu() -> None:
  """JAX_PLATFORMS=cpu where libtpu is installed on a host with no TPU chip and no GPU."""
  if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
    return
  if _has_tpu_chip():
    return
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  if not os.path.exists("/dev/nvidia0"):
    os.environ["JAX_PLATFORMS"] = "cpu"


_skip_absent_tpu()
_import_tensorflow_quietly()

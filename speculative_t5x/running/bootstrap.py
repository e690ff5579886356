"""Process set-up for the main scripts, as T5X's main scripts do it: importing the package changes
nothing, so a script calls `start()` first, before anything imports JAX's backends or TensorFlow.

`start()` does two things.
- Where libtpu is installed (the test extras install it, to compile for TPU on any host) but the
  host has no TPU chip and JAX_PLATFORMS is unset, JAX would try the TPU backend and print
  libtpu's warnings: it sets JAX_PLATFORMS=cpu (on a GPU host only TPU_SKIP_MDS_QUERY=1), as JAX's
  own fallback would end anyway. On a TPU VM nothing changes.
- With `tensorflow=True` and TensorFlow installed, it imports TensorFlow with file descriptor 2
  captured, drops its C++ start-up lines (written before any log level applies: no environment
  variable silences them) and passes every other line on; it hides the GPUs from TensorFlow, which
  only feeds data (seqio, TFDS) while JAX owns the accelerators. TF_CPP_MIN_LOG_LEVEL=0 keeps
  every line.
"""

import importlib.util
import os
import re
import sys
import tempfile

_START_UP_CHATTER = re.compile(
    r"All log messages before absl::InitializeLog|cudart_stub\.cc|cpu_feature_guard\.cc"
    r"|oneDNN custom operations|rebuild TensorFlow with the appropriate compiler flags"
    r"|Unable to register cu(DNN|FFT|BLAS) factory|computation placer already registered"
    r"|TF-TRT Warning|cuda_platform\.cc|failed call to cuInit"
)


def _import_tensorflow_quietly() -> None:
  """Imports TensorFlow with file descriptor 2 captured; re-emits what is not start-up chatter."""
  if "tensorflow" in sys.modules:
    return  # imported already: its start-up lines are written
  if importlib.util.find_spec("tensorflow") is None:
    return  # decoding needs JAX alone; seqio's tasks and TFDS need TensorFlow
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

      tensorflow.config.set_visible_devices([], "GPU")
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      for line in captured.read().decode("utf-8", "replace").splitlines():
        if line.strip() and not _START_UP_CHATTER.search(line):
          print(line, file=sys.stderr)


def has_tpu_chip() -> bool:
  """TPU chips appear as /dev/accel* (v2-v5e) or /dev/vfio/<n> (v5p, v6e)."""
  dev = "/dev"
  names = os.listdir(dev) if os.path.isdir(dev) else []
  vfio = os.listdir(f"{dev}/vfio") if os.path.isdir(f"{dev}/vfio") else []
  return any(n.startswith("accel") for n in names) or any(n.isdigit() for n in vfio)


def _skip_absent_tpu() -> None:
  """JAX_PLATFORMS=cpu where libtpu is installed on a host with no TPU chip and no GPU."""
  if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
    return
  if has_tpu_chip():
    return
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  if not os.path.exists("/dev/nvidia0"):
    os.environ["JAX_PLATFORMS"] = "cpu"


def start(tensorflow: bool = True) -> None:
  """Keeps JAX off an absent TPU; with `tensorflow`, imports TensorFlow quietly where installed.

  Call it first in a main script: the TensorFlow capture only works on TensorFlow's first import.
  Scripts that read no seqio task pass tensorflow=False and never load it.
  """
  _skip_absent_tpu()
  if tensorflow:
    _import_tensorflow_quietly()

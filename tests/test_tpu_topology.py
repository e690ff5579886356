"""`tpu_topology`: Cloud TPU slices by name, their compile-only devices, and libtpu's version."""

import numpy as np
import pytest

from conftest import requires_libtpu
from speculative_t5x.tpu import tpu_topology


@requires_libtpu
def test_libtpu_is_the_version_jax_pins():
  assert tpu_topology.libtpu_problem() is None


@requires_libtpu
def test_slices_have_their_chips_and_hosts():
  v4_16 = tpu_topology.devices("v4-16")
  assert len(v4_16) == 8 and {d.device_kind for d in v4_16} == {"TPU v4"}
  assert sorted({d.process_index for d in v4_16}) == [0, 1]
  assert tpu_topology.get_slice("v4-16").hosts == 2
  assert len(tpu_topology.devices("v5litepod-1")) == 1
  with pytest.raises(ValueError, match="unknown TPU slice 'v4-9'.*v4-8"):
    tpu_topology.get_slice("v4-9")


def test_a_missing_or_mismatched_libtpu_names_the_install_command(monkeypatch):
  monkeypatch.setattr(tpu_topology.importlib.util, "find_spec", lambda name: None)
  problem = tpu_topology.libtpu_problem()
  assert "libtpu is not installed" in problem and "pip install" in problem
  monkeypatch.undo()
  versions = {"jax": "0.10.2", "libtpu": "0.0.40.1"}
  monkeypatch.setattr(tpu_topology.importlib.metadata, "version", versions.__getitem__)
  problem = tpu_topology.libtpu_problem()
  assert "libtpu 0.0.40.1 does not match jax 0.10.2" in problem
  assert 'pip install "libtpu==0.0.42.*"' in problem
  with pytest.raises(RuntimeError, match="does not match"):
    tpu_topology.devices("v4-8")
  assert np.isfinite(tpu_topology.get_slice("v6e-4").hbm_bandwidth)

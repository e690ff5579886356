"""The benchmarks' tests share the suite's set-up and helpers (tests/conftest.py, loaded here under
its own name) and import the benches and their helpers from benchmarks/."""

import importlib.util
import pathlib
import sys

_REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_REPO / "benchmarks"))

_spec = importlib.util.spec_from_file_location("suite_conftest", _REPO / "tests" / "conftest.py")
_suite = importlib.util.module_from_spec(_spec)
sys.modules["suite_conftest"] = _suite
_spec.loader.exec_module(_suite)
globals().update({k: v for k, v in vars(_suite).items() if not k.startswith("__")})

_BENCHES = {}


def load_bench(name: str):
  """benchmarks/`name`.py as a module, executed once a process. The absl flags it defines are
  removed again: benches share flag names (--repeats, --pair_dir) with each other and with the
  scripts the suite loads, and the functions under test take their settings as arguments."""
  # pylint: disable=g-import-not-at-top
  from absl import flags

  if name not in _BENCHES:
    spec = importlib.util.spec_from_file_location(name, _REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses read their module's annotations there
    before = set(flags.FLAGS)
    spec.loader.exec_module(module)
    for flag_name in set(flags.FLAGS) - before:
      delattr(flags.FLAGS, flag_name)
    _BENCHES[name] = module
  return _BENCHES[name]


# Both conftest.py files are modules named `conftest`, and the one pytest loads last holds the
# name: the benches' tests import what is this file's own from `bench_conftest`.
sys.modules["bench_conftest"] = sys.modules[__name__]

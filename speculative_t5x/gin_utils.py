"""Gin on the command line, the T5X way (t5x/gin_utils.py): --gin_file, --gin_bindings and the
--gin.NAME=value shorthand, search paths that find the shipped configs from any directory, and
macros left %gin.REQUIRED named before anything runs.

Every script parses its configuration through `parse_gin_flags` and runs through `run`:

  flags.DEFINE_multi_string("gin_file", None, ...)
  flags.DEFINE_multi_string("gin_bindings", [], ...)
  def main(argv):
    gin_utils.parse_gin_flags(FLAGS.gin_file, FLAGS.gin_bindings, default_files=[...])
    ...
  if __name__ == "__main__":
    gin_utils.run(main)

`include 'configs/runs/infer.gin'` and `--gin_file=configs/paper/ende_small_t0.gin` resolve
against the working directory, then the shipped configs (`config_root`): the repository's
`configs/` in a clone, the package's copy once installed. Relative paths named inside a config
(checkpoints such as 'demo_models/target') resolve the same way (`resolve_path`).
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import sys
import tokenize
from typing import Callable, Sequence

from absl import app
import gin

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
_REQUIRED_MACRO = re.compile(r"^(\w+) = %gin\.REQUIRED$", re.MULTILINE)


class ConfigError(ValueError):
  """A problem with a run's configuration, fixed in gin or on the command line (the message
  names the macro or flag)."""


def config_root() -> pathlib.Path:
  """The directory holding `configs/`: the repository root in a clone, the installed package
  (which ships the gin files as package data) otherwise."""
  repository = PACKAGE_DIR.parent
  if (repository / "configs" / "runs").is_dir():
    return repository
  return PACKAGE_DIR


def search_paths() -> list[str]:
  """Where gin files and their includes are looked up: the working directory, then
  `config_root()`."""
  return [str(pathlib.Path.cwd()), str(config_root())]


def resolve_path(path: str | os.PathLike) -> str:
  """A relative local `path` as the first of `search_paths()` that has it (the working
  directory's, else the repository's); URLs, absolute paths and paths found nowhere unchanged."""
  path = os.fspath(path)
  if "://" in path or os.path.isabs(path):
    return path
  for root in search_paths():
    candidate = os.path.join(root, path)
    if os.path.exists(candidate):
      return candidate
  return path


class _QuietSearch(logging.Filter):
  """Drops gin's log lines on looking a file up in each search path ("Path not found" errors for
  every path that lacks it): a file is found in a later path, or the parse reports it missing."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.module != "resource_reader"


def rewrite_gin_args(argv: Sequence[str]) -> list[str]:
  """T5X's shorthand: --gin.NAME=value -> --gin_bindings=NAME = value."""
  rewritten = []
  for arg in argv:
    if arg.startswith("--gin."):
      name, equals, value = arg[len("--gin.") :].partition("=")
      if not equals:
        raise ConfigError(f"{arg} has no value: write --gin.{name}=value")
      arg = f"--gin_bindings={name} = {value}"
    rewritten.append(arg)
  return rewritten


def unset_required_macros() -> list[str]:
  """Names of the parsed gin macros still bound to %gin.REQUIRED."""
  return sorted(_REQUIRED_MACRO.findall(gin.config_str()))


def parse_gin_flags(
    gin_files: Sequence[str] | None,
    gin_bindings: Sequence[str] = (),
    default_files: Sequence[str] = (),
) -> None:
  """Parses gin files (`default_files` when none are given) and bindings, checks that no macro
  is left %gin.REQUIRED, and finalizes the configuration.

  Raises:
    ConfigError: no file to parse, a file that is missing or does not parse, or a macro left
      %gin.REQUIRED (named in the message).
  """
  files = list(gin_files or default_files)
  if not files:
    raise ConfigError(
        "no gin file given: pass --gin_file=configs/runs/<run>.gin (or a file "
        "including one, e.g. configs/paper/ende_small_t0.gin)"
    )
  for path in search_paths():
    gin.add_config_file_search_path(path)
  quiet = _QuietSearch()
  logging.getLogger().addFilter(quiet)
  try:
    gin.parse_config_files_and_bindings(files, list(gin_bindings), finalize_config=False)
  except (OSError, SyntaxError, ValueError, tokenize.TokenError) as e:
    raise ConfigError(f"gin: {e}") from e
  finally:
    logging.getLogger().removeFilter(quiet)
  missing = unset_required_macros()
  if missing:
    raise ConfigError(
        f"gin macro(s) {', '.join(missing)} are %gin.REQUIRED but not set: bind "
        f"them, e.g. --gin.{missing[0]}=\"'value'\" (strings need inner quotes), or "
        "include a file that sets them (configs/tasks/, configs/models/, "
        "configs/drafters/)"
    )
  gin.finalize()


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing after the --gin.NAME=value rewrite (the `flags_parser` of `run`)."""
  try:
    argv = rewrite_gin_args(argv)
  except ConfigError as e:
    sys.exit(f"{pathlib.Path(argv[0]).name}: {e}")
  return app.parse_flags_with_usage(argv)


def run(main: Callable[[Sequence[str]], None]) -> None:
  """`absl.app.run(main)` with the gin shorthand; a `ConfigError` ends the run with its message
  and exit status 1 (no traceback: the message says what to fix)."""

  def checked_main(argv):
    try:
      main(argv)
    except ConfigError as e:
      sys.exit(f"{pathlib.Path(argv[0]).name}: configuration error: {e}")

  app.run(checked_main, flags_parser=parse_flags)

"""Gin on the command line, the T5X way (t5x/gin_utils.py): --gin_file, --gin_bindings and the
--gin.NAME=value shorthand, search paths that find the shipped configs from any directory, and
configuration mistakes named instead of ignored: macros left %gin.REQUIRED, misspelt macros and
bindings the run never used.

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

Gin itself ignores a binding nothing reads, so `--gin.TEMPRATURE=1.0` would run at the default
temperature. Here it is a `ConfigError` listing close matches, in two steps:
  - `parse_gin_flags`, before anything runs (`check_macros`): a macro bound on the command line
    must be read by a binding of this run, a macro bound in a gin file by a binding of this run
    or of a shipped config, and every macro read must be bound;
  - a script as soon as it has built its configuration, before any work, and `run` again after
    `main` returns (`check_unused_bindings`, from gin's operative config): a parameter binding
    given on the command line must have been used by a call of its configurable, and one from a
    gin file wherever its configurable was called in its scope. The early check leaves aside the
    configurables the script's work may still call (its `later`) and those their bindings refer
    to, which the check after `main` judges.
Gin files are layered, so the rules for them are looser: a file may bind a macro for the runs
that read it (configs/models/ files), a later file may replace the binding that read a macro
(configs/runs/benchmark_small.gin's gammas, which read GAMMA), and a file may configure what a
run never calls (a run file's T5 drafter after configs/drafters/bigram.gin
replaced DRAFTER; inference.InferConfig when scripts/benchmark.py reads a paper file).
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import pathlib
import re
import sys
import tokenize
from typing import Any, Callable, Collection, Mapping, Sequence

from absl import app
import gin

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
_REQUIRED_MACRO = re.compile(r"^(\w+) = %gin\.REQUIRED$", re.MULTILINE)
_MACRO_SELECTOR = (
    "gin.macro"  # A macro binding `NAME = value` is gin's ('NAME', 'gin.macro').value.
)
_BINDING_NAME = re.compile(r"^\s*([\w./]+)\s*=")
# A macro's name where a gin file reads it (%NAME, not %gin.REQUIRED) or binds it (NAME = ...).
_MACRO_NAME = re.compile(r"%([A-Za-z_]\w*)(?![\w.])|^([A-Za-z_]\w*)\s*=", re.MULTILINE)
# (scope, selector, parameter) of the parameter bindings the last `parse_gin_flags` was given on
# the command line (--gin_bindings, --gin.NAME=value): they must be used (`check_unused_bindings`).
_COMMAND_LINE_BINDINGS: set[tuple[str, str, str]] = set()
# The gin files the last `parse_gin_flags` parsed, as given.
_PARSED_FILES: list[str] = []
# gin's error for a configurable called with parameters marked gin.REQUIRED left unbound.
_REQUIRED_BINDINGS = re.compile(
    r"Required bindings for `([\w.]+)` not provided in config: (\[.*?\])"
)


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


def _close_matches(name: str, known) -> str:
  """' (did you mean A or B?)' for the names of `known` close to `name`, else ''."""
  matches = difflib.get_close_matches(name, sorted(set(known)), n=3)
  return f" (did you mean {' or '.join(matches)}?)" if matches else ""


@functools.cache
def shipped_macros() -> frozenset[str]:
  """Names of the macros the shipped gin files (`config_root()/configs`) bind or read."""
  texts = [
      re.sub("#.*", "", path.read_text()) for path in (config_root() / "configs").rglob("*.gin")
  ]
  return frozenset(read or bound for text in texts for read, bound in _MACRO_NAME.findall(text))


def check_macros(command_line: Collection[str] = ()) -> None:
  """Raises one ConfigError naming every unknown macro, with close matches; call it after
  parsing. Unknown are:
    - a macro bound on the command line (`command_line`: their names) that no binding of this
      run reads (a misspelt `--gin.TEMPRATURE=1.0`, which gin would ignore);
    - a macro bound in a gin file that no binding of this run reads, and that no shipped config
      binds or reads (`shipped_macros`): a name no config knows;
    - a macro read (%NAME) but never bound.
  A macro is read by a binding that refers to it, in a configurable's parameters or in another
  macro, whether or not this run calls that configurable. The close matches of a macro bound but
  unread are among the macros this run reads (and for a gin file's, the shipped ones too); of a
  macro read but unbound, among those bound.
  """
  config = gin.config._CONFIG  # pylint: disable=protected-access
  bound = {scope for scope, selector in config if selector == _MACRO_SELECTOR}
  macro = gin.get_configurable(gin.config.macro)
  read = {ref.config_key[0] for ref in gin.config.iterate_references(config, to=macro)}
  known = read | shipped_macros()
  problems = [
      f"  {name} is bound on the command line but nothing in this run reads it"
      f"{_close_matches(name, read)}"
      for name in sorted(bound - read)
      if name in command_line
  ]
  problems += [
      f"  {name} is bound in a gin file but no config knows it{_close_matches(name, known)}"
      for name in sorted(bound - known)
      if name not in command_line
  ]
  problems += [
      f"  %{name} is read but never bound{_close_matches(name, bound)}"
      for name in sorted(read - bound)
  ]
  if problems:
    unread = [name for name in bound - read if name in command_line]
    missing_run_file = (
        f"\nThe gin files parsed ({', '.join(_PARSED_FILES)}) read none of "
        f"{', '.join(sorted(unread))}: if a run file that reads them is missing, give it first "
        "(e.g. configs/runs/<run>.gin), then any drafter, model or task file."
        if unread and _PARSED_FILES
        else ""
    )
    raise ConfigError(
        "unknown gin macro(s):\n" + "\n".join(problems) + "\nSpell each macro as the gin files "
        "read it (config.gin of a run lists them), or bind it in a file this run includes."
        + missing_run_file
    )


def _binding_name(scope: str, selector: str, parameter: str) -> str:
  """'scope/module.Configurable.parameter' as gin files write it (the shortest unique selector)."""
  minimal = gin.config._REGISTRY.minimal_selector(selector)  # pylint: disable=protected-access
  return f"{scope}/{minimal}.{parameter}" if scope else f"{minimal}.{parameter}"


def _selector(configurable: Callable | str) -> str:
  """The full selector of a configurable (a function or class gin registered, or its name)."""
  if isinstance(configurable, str):
    found = gin.config._REGISTRY.get_match(configurable)  # pylint: disable=protected-access
  else:
    found = gin.config._inverse_lookup(configurable)  # pylint: disable=protected-access
  if found is None:
    raise ValueError(f"{configurable!r} is not a gin configurable")
  return found.selector


def _referred_selectors(config: Mapping[tuple[str, str], Any], selectors: set[str]) -> set[str]:
  """`selectors` and those of every configurable their bindings in `config` refer to (@name or
  @name()), directly, through macros or through other such configurables."""
  found = set(selectors)
  keys = [key for key in config if key[1] in found]
  seen = set(keys)
  while keys:
    key = keys.pop()
    for reference in gin.config.iterate_references({key: config[key]}):
      referred = reference.config_key  # (scope, selector); a macro's is (its name, gin.macro)
      if referred[1] == _MACRO_SELECTOR:  # the macro's own binding, `NAME = value`
        more = [referred] if referred in config else []
      else:  # the configurable's bindings, in any scope
        found.add(referred[1])
        more = [k for k in config if k[1] == referred[1]]
      more = [k for k in more if k not in seen]
      seen.update(more)
      keys += more
  return found


def check_unused_bindings(later: Collection[Callable | str] | None = None) -> None:
  """Raises one ConfigError naming every parameter binding this run has not used, with close
  matches among the parameters it did use: a binding given on the command line that no call of
  its configurable took, and a binding from a gin file that no call took although its
  configurable was called in its scope (the caller, or a more specific scope, always set the
  parameter). Uses gin's operative config, so call it once the run's configurables were called
  (`run` calls it after `main`).

  A script calls it early too, before any work, once it has built its configuration, with
  `later`: the configurables (functions, classes or their names) its work may still call (e.g.
  the model classes `pairs.load_pair` builds). Their bindings are left to the check after `main`,
  and so are those of the configurables their bindings refer to (`_referred_selectors`: a
  model's `draft_stop = @draft_length.ConfidenceStop()` is called when the model is); every other
  binding is judged now, so a misplaced one stops the run before anything is loaded, decoded or
  written.
  """
  config = gin.config._CONFIG  # pylint: disable=protected-access
  operative = dict(gin.config._OPERATIVE_CONFIG)  # pylint: disable=protected-access
  pending = _referred_selectors(config, {_selector(c) for c in later or ()})
  if pending:
    config = {key: value for key, value in config.items() if key[1] not in pending}
  used, called = set(), set()
  for (scope, selector), parameters in operative.items():
    components = scope.split("/") if scope else []
    # A call in scope a/b read each parameter from the binding of a/b, else a, else no scope.
    scopes = ["/".join(components[:i]) for i in range(len(components), -1, -1)]
    called.update((partial, selector) for partial in scopes)
    for parameter in parameters:
      binding = next((p for p in scopes if parameter in config.get((p, selector), {})), None)
      if binding is not None:
        used.add((binding, selector, parameter))
  unused = [
      (scope, selector, parameter)
      for (scope, selector), parameters in config.items()
      if selector != _MACRO_SELECTOR
      for parameter in parameters
      if (scope, selector, parameter) not in used
      and ((scope, selector) in called or (scope, selector, parameter) in _COMMAND_LINE_BINDINGS)
  ]
  if not unused:
    return
  known = [
      _binding_name(scope, selector, parameter)
      for (scope, selector), parameters in operative.items()
      if selector != _MACRO_SELECTOR
      for parameter in parameters
  ]
  problems = []
  for scope, selector, parameter in sorted(unused):
    name = _binding_name(scope, selector, parameter)
    where = (
        "given on the command line"
        if (scope, selector, parameter) in _COMMAND_LINE_BINDINGS
        else "bound in a gin file"
    )
    problems.append(f"  {name} ({where}){_close_matches(name, known)}")
  raise ConfigError(
      "gin binding(s) this run never used:\n" + "\n".join(problems) + "\nBind a parameter of "
      "a configurable this run calls, in the scope it is called in (gin.operative_config_str() "
      "lists them), or remove the binding."
  )


def _bound_names(gin_bindings: Sequence[str]) -> tuple[set[str], set[tuple[str, str, str]]]:
  """(names of the macros, (scope, selector, parameter) of the parameters) that `gin_bindings`
  bind; statements other than bindings (include, import) are left out."""
  macros, parameters = set(), set()
  for binding in gin_bindings:
    match = _BINDING_NAME.match(binding)
    if match and "." not in match.group(1):
      macros.add(match.group(1))
    elif match:
      key = gin.config.ParsedBindingKey.parse(match.group(1))
      parameters.add((key.scope, key.complete_selector, key.arg_name))
  return macros, parameters


def parse_gin_flags(
    gin_files: Sequence[str] | None,
    gin_bindings: Sequence[str] = (),
    default_files: Sequence[str] = (),
) -> None:
  """Parses gin files (`default_files` when none are given) and bindings, checks the macros
  (`check_macros`) and that none is left %gin.REQUIRED, finalizes the configuration, and
  remembers which bindings came from the command line (`check_unused_bindings`).

  Raises:
    ConfigError: no file to parse, a file that is missing or does not parse, a macro bound but
      never read or read but never bound, or a macro left %gin.REQUIRED (named in the message).
  """
  files = list(gin_files or default_files)
  if not files:
    raise ConfigError(
        "no gin file given: pass --gin_file=configs/runs/<run>.gin (or a file "
        "including one, e.g. configs/paper/ende_small_t0.gin)"
    )
  _COMMAND_LINE_BINDINGS.clear()
  _PARSED_FILES[:] = files
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
  macros, parameters = _bound_names(gin_bindings)
  _COMMAND_LINE_BINDINGS.update(parameters)
  check_macros(command_line=macros)
  missing = unset_required_macros()
  if missing:
    raise ConfigError(
        f"gin macro(s) {', '.join(missing)} are %gin.REQUIRED but not set: bind "
        f"them, e.g. --gin.{missing[0]}=\"'value'\" (strings need inner quotes), or "
        "include a file that sets them (configs/tasks/, configs/models/, "
        "configs/drafters/)"
    )
  try:
    gin.finalize()
  except ValueError as e:
    raise ConfigError(f"gin: {e}") from e


def unbound_required_settings(error: BaseException) -> ConfigError | None:
  """gin's RuntimeError for a configurable called with gin.REQUIRED parameters left unbound, as a
  ConfigError naming them and the fix (a run file missing, or an overlay given alone); None for
  any other error."""
  match = _REQUIRED_BINDINGS.search(str(error))
  if match is None:
    return None
  given = ", ".join(_PARSED_FILES) or "none"
  return ConfigError(
      f"{match.group(1)} needs {match.group(2)}, which no gin file of this run binds (files: "
      f"{given}): give the run file that binds them first (e.g. the script's default, or "
      "configs/runs/<run>.gin), then any configs/drafters/, configs/models/, configs/tasks/ or "
      "configs/runs/baseline.gin file after it, or bind them with --gin.NAME=value."
  )


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing after the --gin.NAME=value rewrite (the `flags_parser` of `run`)."""
  try:
    argv = rewrite_gin_args(argv)
  except ConfigError as e:
    sys.exit(f"{pathlib.Path(argv[0]).name}: {e}")
  return app.parse_flags_with_usage(argv)


def run(main: Callable[[Sequence[str]], None]) -> None:
  """`absl.app.run(main)` with the gin shorthand, and `check_unused_bindings` once `main` has
  returned; a `ConfigError`, or gin's error for settings left unbound (`unbound_required_settings`),
  ends the run with its message and exit status 1 (no traceback: the message says what to fix)."""

  def checked_main(argv):
    try:
      try:
        main(argv)
      except RuntimeError as e:
        unbound = unbound_required_settings(e)
        if unbound is None:
          raise
        raise unbound from e
      check_unused_bindings()
    except ConfigError as e:
      sys.exit(f"{pathlib.Path(argv[0]).name}: configuration error: {e}")

  app.run(checked_main, flags_parser=parse_flags)

"""A run's output directory: checked before any work, and written all at once when the work is done.

Every script that writes results follows the same discipline, through `OutputDir`:

  1. Before any model loads or any work (`OutputDir.check`): the directory must exist as a
     directory or be creatable, and be writable (tested by creating and removing a probe file in
     it, or in its nearest existing ancestor: a path under a file or under /proc is refused); and
     it must not hold another run's outputs (any of the run's file names) unless the run was told
     to replace them (`overwrite`, a script's --overwrite). The error names the directory, the
     files found and the fix. A refused run creates nothing.
  2. While it works, the run writes each output under a temporary name in the directory
     (`OutputDir.stage` for a text file, `OutputDir.stage_dir` for a directory such as an orbax
     checkpoint): `.<name>.<random>.tmp`, which no reader mistakes for an output.
  3. When the work is done, `OutputDir.commit` puts them in place with SIGINT and SIGTERM held
     back: every output of the run's names that this run did not write (an older run's) is
     removed, and every staged output renamed to its name. The run's record (config.gin) is one of
     them, written with the results rather than before the work.
  4. A run that fails or is interrupted before `commit` removes what it staged (`OutputDir` as a
     context manager; a killed process leaves only hidden temporaries, which the next commit
     clears).

So the directory holds the old complete run untouched or the new complete run, never a mix, and
no existing output is replaced unless `overwrite` says so.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from typing import IO, Iterator, Mapping, Sequence

from absl import flags

from speculative_t5x import gin_utils

_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_SCRATCH = "scratch"  # the name of `OutputDir.scratch_dir`'s temporaries


def _temporary_name(name: str, kind: str = "tmp") -> str:
  return f".{name}.{secrets.token_hex(4)}.{kind}"


def _is_temporary_of(entry: str, name: str) -> bool:
  return entry.startswith(f".{name}.") and entry.endswith((".tmp", ".old"))


def _remove(path: pathlib.Path) -> None:
  if path.is_dir() and not path.is_symlink():
    shutil.rmtree(path, ignore_errors=True)
  else:
    with contextlib.suppress(FileNotFoundError):
      path.unlink()


def define_overwrite_flag(where: str = "--output_dir") -> None:
  """The --overwrite flag of a script whose outputs go to `where` (a flag or macro), defined as
  the calling script's own flag (its module's, as `flags.DEFINE_bool` in the script would)."""
  flags.DEFINE_bool(
      "overwrite",
      False,
      f"Replace another run's outputs in {where} (all of them); without it a directory holding "
      "them is refused before any work.",
      module_name=sys._getframe(1).f_globals["__name__"],  # pylint: disable=protected-access
  )


def check_writable(path: str | os.PathLike, what: str) -> None:
  """That a directory can be written at `path`: `path` itself if it is a directory, else its
  nearest existing ancestor (where the directory will be created), must be a directory this
  process can create a file in. Creates nothing that outlives the
  check. Raises gin_utils.ConfigError naming `what` (the flag or macro), the path and the fix.
  URLs (gs://...) are left to the writer."""
  text = os.fspath(path)
  if not text:
    raise gin_utils.ConfigError(f"{what} is empty: give a directory to write the outputs to.")
  if "://" in text:
    return
  path = pathlib.Path(os.path.abspath(text))
  existing = path
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  if not existing.is_dir():
    where = "is a file" if existing == path else f"is under {existing}, which is a file"
    raise gin_utils.ConfigError(
        f"{what} {text} {where}: give a directory (new, or one this run may write in)."
    )
  try:
    descriptor, probe = tempfile.mkstemp(dir=existing, prefix=".write_probe.")
  except OSError as e:
    where = "" if existing == path else f" (its nearest existing ancestor {existing})"
    raise gin_utils.ConfigError(
        f"{what} {text} cannot be written{where}: {e.strerror or e}. Give a directory this "
        "process may create files in."
    ) from e
  os.close(descriptor)
  os.unlink(probe)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
  """SIGINT and SIGTERM are held back inside the block (only the main thread can hold them) and
  delivered as soon as it ends: a handful of renames is not cut in the middle."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  received = []
  previous = {sig: signal.signal(sig, lambda s, _: received.append(s)) for sig in _HELD_SIGNALS}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    for sig in dict.fromkeys(received):
      signal.raise_signal(sig)


class OutputDir:
  """The output directory of one run, whose outputs are `names` (files or directories).

  path: the directory. names: every output a run of this kind may write there (config.gin
  included); a directory holding any of them holds another run's outputs. what: the flag or
  macro that sets `path`, for messages. overwrite: replace another run's outputs (all of them,
  also those this run does not write) instead of refusing the run. overwrite_hint: how a user
  asks for `overwrite`, for messages.
  """

  def __init__(
      self,
      path: str | os.PathLike,
      names: Sequence[str],
      what: str,
      overwrite: bool = False,
      overwrite_hint: str = "--overwrite",
  ):
    self.path = pathlib.Path(os.path.abspath(os.fspath(path)))
    self.names = tuple(names)
    self.what = what
    self.overwrite = overwrite
    self.overwrite_hint = overwrite_hint
    self._staged: dict[str, pathlib.Path] = {}
    self._scratch: list[pathlib.Path] = []

  def existing(self) -> list[str]:
    """The run's outputs that the directory holds now."""
    return [name for name in self.names if (self.path / name).exists()]

  def check(self, refuse_existing: bool = True) -> OutputDir:
    """Before any work: writable (`check_writable`), and (if `refuse_existing`) holding no
    other run's outputs unless `overwrite`. Raises gin_utils.ConfigError naming the problem."""
    check_writable(self.path, self.what)
    found = self.existing()
    if refuse_existing and found and not self.overwrite:
      raise gin_utils.ConfigError(
          f"{self.what} {self.path} holds another run's outputs ({', '.join(found)}): give a "
          f"new directory, or {self.overwrite_hint} to replace that run whole (its "
          f"{', '.join(self.names)})."
      )
    return self

  def _new_temporary(self, name: str) -> pathlib.Path:
    if name not in self.names:
      raise ValueError(f"{name!r} is not one of this run's outputs {self.names}")
    self.path.mkdir(parents=True, exist_ok=True)
    previous = self._staged.pop(name, None)
    if previous is not None:
      _remove(previous)
    temporary = self.path / _temporary_name(name)
    self._staged[name] = temporary
    return temporary

  @contextlib.contextmanager
  def stage(self, name: str) -> Iterator[IO[str]]:
    """A text file handle for output `name`, written under a temporary name until `commit`."""
    temporary = self._new_temporary(name)
    with open(temporary, "w", encoding="utf-8") as f:
      yield f

  def stage_text(self, name: str, text: str) -> None:
    """Output `name` holding `text`, in place at `commit`."""
    with self.stage(name) as f:
      f.write(text)

  def write(self, texts: Mapping[str, str]) -> None:
    """Outputs {name: text}, staged and committed together (`commit`): the run's whole output."""
    with self:
      for name, text in texts.items():
        self.stage_text(name, text)
      self.commit()

  def stage_dir(self, name: str) -> pathlib.Path:
    """A path (not yet existing) to write output directory `name` to, in place at `commit`."""
    return self._new_temporary(name)

  def scratch_dir(self) -> pathlib.Path:
    """A new empty directory inside `path` for a writer that puts several outputs in one
    directory (e.g. `checkpoints.save_model`'s params/ and config.json); `adopt` stages them."""
    self.path.mkdir(parents=True, exist_ok=True)
    scratch = self.path / _temporary_name(_SCRATCH)
    scratch.mkdir()
    self._scratch.append(scratch)
    return scratch

  def adopt(self, scratch: pathlib.Path) -> None:
    """Stages every entry of `scratch` (from `scratch_dir`), each of which must be an output."""
    for entry in sorted(os.listdir(scratch)):
      os.replace(scratch / entry, self._new_temporary(entry))

  def commit(self) -> None:
    """Puts the staged outputs in place, with SIGINT and SIGTERM held back: removes the outputs
    of `names` this run did not stage (another run's: `check` allowed it only with overwrite),
    replaces those it did, and clears temporaries a killed run left."""
    self.path.mkdir(parents=True, exist_ok=True)
    trash = []
    with signals_held():
      for name in self.names:
        target = self.path / name
        if target.exists() or target.is_symlink():
          old = self.path / _temporary_name(name, "old")
          os.replace(target, old)
          trash.append(old)
        if name in self._staged:
          staged = self._staged[name]
          if staged.is_file():
            os.chmod(staged, 0o644)  # mkstemp-like modes are 0600; results are ordinary files.
          os.replace(staged, target)
      self._staged.clear()
    for old in trash:
      _remove(old)
    self._clear_stale()
    self._scratch.clear()

  def discard(self) -> None:
    """Removes what this run staged and has not committed."""
    for temporary in [*self._staged.values(), *self._scratch]:
      _remove(temporary)
    self._staged.clear()
    self._scratch.clear()

  def _clear_stale(self) -> None:
    for entry in os.listdir(self.path):
      if any(_is_temporary_of(entry, name) for name in (*self.names, _SCRATCH)):
        _remove(self.path / entry)

  def __enter__(self) -> OutputDir:
    return self

  def __exit__(self, *exc_info) -> None:
    self.discard()

"""The offline English-German demo corpus: gettext catalogs -> clean, split pairs and a vocabulary.

Debian packages install their German translations as compiled gettext catalogs (`.mo` files) under
the system locale directory; each message is an English source string (msgid) and its German
translation (msgstr). `build` reads them, cleans and deduplicates the pairs, splits them with a
seeded shuffle and trains a SentencePiece vocabulary on the training split. The output is a pure
function of the catalogs present and the arguments: `stats.json` lists every catalog used (path,
the Debian package and version that installed it, size, sha256), so two machines with different
packages can see why their corpora differ, and `apt-get install` the same packages.

Files written to the output directory (read by the `demo_ende` task in speculative_t5x/text/tasks.py):
  {train,validation,test}.tsv   one pair per line, `english<TAB>german`, no header
  sentencepiece.model           unigram model with T5's ids: pad 0, eos 1, unk 2, no bos
  stats.json                    catalogs, what was dropped and why, split sizes, word counts

benchmarks/build_demo_corpus.py is the command-line front end.
"""

import collections
import dataclasses
import glob
import hashlib
import io
import json
import os
import pathlib
import random
import re
import shutil
import struct
import subprocess
import tempfile
from typing import Iterable, Optional, Sequence

from absl import logging
import sentencepiece as spm

SPLITS = ("train", "validation", "test")
# The catalogs of the German locale (regional variants such as de_CH are left out on purpose:
# Swiss spelling differs).
DEFAULT_MO_GLOBS = (
    "/usr/share/locale/de/LC_MESSAGES/*.mo",
    "/usr/share/locale-langpack/de/LC_MESSAGES/*.mo",
)

# The .mo magic number as a little-endian uint32; read big-endian it is 0xde120495.
_MO_MAGIC = 0x950412DE
# gettext joins a message context to its msgid with EOT, and plural forms with NUL.
_CONTEXT_SEPARATOR = "\x04"
_PLURAL_SEPARATOR = "\x00"
# Accelerator (mnemonic) markers: GTK's "_File" and Qt/KDE's "&File".
_ACCELERATOR_MARKERS = ("_", "&")
# printf conversions (with positional index, flags, width, precision, length modifier, and gettext's
# <PRIu64> macros), Python's %(name)s and {name} fields. "%%" is a literal percent sign, matched so
# that it is skipped; the space flag is left out because "100% of" is prose, not "% o".
_PLACEHOLDER = re.compile(
    r"%%|%(?:(?P<position>\d+\$)|\(\w+\))?[-+0#']*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
    r"(?:hh|h|ll|l|L|q|j|z|Z|t|I32|I64|I)?(?:[diouxXeEfFgGaAcspnmCS]|<PRI\w+>)"
    r"|\{\w*(?:[:!][^{}]*)?\}"
)
# GnuPG's "|NAME|use encoding NAME" and "|pinentry-label|_Cancel": a hint for translators.
_HINT_PREFIX = re.compile(r"^\|[^|\n]*\|")
_SNAKE_CASE = re.compile(r"[a-z0-9]+_[a-z0-9]+")
_SENTENCE_END = ".:…!?"


@dataclasses.dataclass(frozen=True)
class Message:
  """One catalog entry: the English msgid (and msgid_plural) and the German msgstr forms."""

  msgid: str
  msgid_plural: Optional[str]
  msgstrs: tuple[str, ...]


def read_mo(path: str) -> tuple[list[Message], int]:
  """Parses a compiled gettext catalog; returns its messages (no header) and the undecodable count.

  The format (GNU gettext manual, "The Format of GNU MO Files"): a magic number giving the byte
  order, a revision, the message count N, and the offsets of two tables of N (length, offset) pairs
  for the original and the translated strings. The header (msgid "") names the charset.
  """
  data = pathlib.Path(path).read_bytes()
  if len(data) < 20:
    raise ValueError(f"{path} is not a gettext .mo catalog: {len(data)} bytes is too short")
  for byte_order in ("<", ">"):
    if struct.unpack(byte_order + "I", data[:4])[0] == _MO_MAGIC:
      break
  else:
    raise ValueError(
        f"{path} is not a gettext .mo catalog: bad magic number {data[:4].hex()}; "
        "pass compiled .mo files, not .po sources"
    )
  count, originals_offset, translations_offset = struct.unpack(byte_order + "3I", data[8:20])

  def string(table_offset, index):
    length, offset = struct.unpack_from(byte_order + "2I", data, table_offset + 8 * index)
    return data[offset : offset + length]

  raw = [(string(originals_offset, i), string(translations_offset, i)) for i in range(count)]
  header = next((msgstr for msgid, msgstr in raw if not msgid), b"")
  charset = re.search(rb"charset=([\w.:-]+)", header)
  charset = charset.group(1).decode("ascii") if charset else "utf-8"
  messages, undecodable = [], 0
  for msgid, msgstr in raw:
    if not msgid:
      continue
    try:
      msgid, msgstr = msgid.decode(charset), msgstr.decode(charset)
    except UnicodeDecodeError:
      undecodable += 1
      continue
    except LookupError as e:
      raise ValueError(f"{path} declares charset {charset!r}, which Python cannot decode") from e
    msgid = msgid.split(_CONTEXT_SEPARATOR)[-1]
    singular, _, plural = msgid.partition(_PLURAL_SEPARATOR)
    messages.append(Message(singular, plural or None, tuple(msgstr.split(_PLURAL_SEPARATOR))))
  return messages, undecodable


def message_pairs(message: Message) -> list[tuple[str, str]]:
  """(English, German) pairs of one message.

  A singular message gives one pair. A plural message gives (msgid, msgstr[0]) and, when the
  catalog has a second form, (msgid_plural, msgstr[1]): German's Plural-Forms is `n != 1`, so
  form 0 is the singular and form 1 the plural.
  """
  pairs = [(message.msgid, message.msgstrs[0])]
  if message.msgid_plural is not None and len(message.msgstrs) > 1:
    pairs.append((message.msgid_plural, message.msgstrs[1]))
  return pairs


def _word_at(text: str, index: int) -> str:
  """The run of word characters (and the marker itself) around text[index]."""
  start, end = index, index + 1
  while start > 0 and text[start - 1].isalnum():
    start -= 1
  while end < len(text) and (text[end].isalnum() or text[end] == "_"):
    end += 1
  return text[start:end]


def _accelerator_index(text: str, other: str, marker: str) -> int:
  """Index of `marker` in `text` if it marks a keyboard accelerator there, else -1 (see below)."""
  index = text.find(marker)
  if index < 0 or text.count(marker) != 1 or index + 1 == len(text):
    return -1
  after = text[index + 1]
  before = text[index - 1] if index > 0 else ""
  if not after.isalpha() or (before.isupper() or before.isdigit()) and after.isupper():
    return -1
  if marker == "&" and re.match(r"&#?\w+;", text[index:]):
    return -1
  if _word_at(text, index).casefold() in other.casefold():
    return -1
  return index


def strip_accelerators(english: str, german: str) -> tuple[str, str]:
  """Removes keyboard accelerators ("_Save" / "_Speichern", "&Open" / "Ö&ffnen") from a pair.

  Translators keep the accelerator, so a marker is removed only when both sides have one. On each
  side it must be the only one of its kind, be followed by a letter, not join a capital or digit to
  a capital (LC_ALL, AT&T, KP_Down), not start an XML entity (&amp;), and the word around it must
  not occur in the other side (identifiers such as search_path are copied untranslated). An English
  word in lowercase snake case ("new_version" / "neue_Version") is an identifier the translator
  rewrote, so it keeps its marker; GTK's rare lowercase mnemonics ("Y t_ilt:") keep theirs too.
  """
  for marker in _ACCELERATOR_MARKERS:
    i, j = _accelerator_index(english, german, marker), _accelerator_index(german, english, marker)
    if i >= 0 and j >= 0 and not _SNAKE_CASE.fullmatch(_word_at(english, i)):
      english, german = english[:i] + english[i + 1 :], german[:j] + german[j + 1 :]
  return english, german


def placeholders(text: str) -> list[str]:
  """Sorted format placeholders of `text`, positional indices removed (%2$s counts as %s)."""
  return sorted(
      match.group(0).replace(match.group("position") or "", "")
      for match in _PLACEHOLDER.finditer(text)
      if match.group(0) != "%%"
  )


def clean_pair(english: str, german: str, max_chars: int) -> tuple[Optional[tuple[str, str]], str]:
  """Cleans one pair; returns ((english, german), "kept") or (None, reason) to leave it out.

  Cleaning removes GnuPG's "|ARG|" hints, strips accelerators and collapses whitespace (newlines,
  tabs and column padding of --help texts) to single spaces. The reasons to leave a pair out are
  "untranslated", "no_letters" (English without letters), "identical" (copied untranslated),
  "placeholder_mismatch" (different format placeholders) and "too_long" (over `max_chars`).
  """
  if not german.strip():
    return None, "untranslated"
  english, german = _HINT_PREFIX.sub("", english), _HINT_PREFIX.sub("", german)
  english, german = strip_accelerators(english, german)
  english, german = " ".join(english.split()), " ".join(german.split())
  if not any(c.isalpha() for c in english):
    return None, "no_letters"
  if english == german:
    return None, "identical"
  if placeholders(english) != placeholders(german):
    return None, "placeholder_mismatch"
  if max_chars and max(len(english), len(german)) > max_chars:
    return None, "too_long"
  return (english, german), "kept"


def _group_key(english: str) -> str:
  """English differing only in case or final punctuation ("Open", "open...") shares a split."""
  return english.casefold().rstrip(_SENTENCE_END + " ")


def _sha256(path: str) -> str:
  return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def owning_packages(paths: Sequence[str]) -> dict[str, str]:
  """Maps each path installed by a Debian package to "package=version" (`apt-get install` it).

  Empty where dpkg is absent; paths no package owns are left out.
  """
  if not paths or shutil.which("dpkg-query") is None:
    return {}
  search = subprocess.run(["dpkg-query", "--search", *paths], capture_output=True, text=True)
  wanted, owners = set(paths), {}
  for line in search.stdout.splitlines():
    package, _, path = line.partition(": ")
    if "," not in package and path in wanted:
      owners[path] = package
  if not owners:
    return {}
  versions = subprocess.run(
      [
          "dpkg-query",
          "--show",
          "--showformat=${binary:Package} ${Version}\\n",
          *sorted(set(owners.values())),
      ],
      capture_output=True,
      text=True,
      check=True,
  ).stdout
  versions = dict(line.split(" ", 1) for line in versions.splitlines())
  return {path: f"{package.split(':')[0]}={versions[package]}" for path, package in owners.items()}


def build_corpus(
    mo_files: Sequence[str], seed: int, validation_size: int, test_size: int, max_chars: int
) -> tuple[dict[str, list[tuple[str, str]]], dict]:
  """Reads, cleans, deduplicates and splits the pairs of `mo_files`; returns (splits, stats).

  Deduplication keeps one German translation per English string: the one most catalogs give, ties
  broken by the smallest string, so the result does not depend on the order of the files. Pairs are
  grouped by `_group_key`, groups are shuffled with `random.Random(seed)`, and whole groups go to
  test, then validation, until each holds at least its size; the rest is train.
  """
  translations = collections.defaultdict(collections.Counter)
  dropped = collections.Counter()
  files = []
  for path in sorted(set(mo_files)):
    messages, undecodable = read_mo(path)
    dropped["undecodable"] += undecodable
    kept = 0
    for message in messages:
      for english, german in message_pairs(message):
        pair, reason = clean_pair(english, german, max_chars)
        if pair is None:
          dropped[reason] += 1
          continue
        translations[pair[0]][pair[1]] += 1
        kept += 1
    files.append(
        {
            "path": path,
            "bytes": os.path.getsize(path),
            "sha256": _sha256(path),
            "messages": len(messages),
            "pairs_kept": kept,
        }
    )
  packages = owning_packages([f["path"] for f in files])
  for f in files:
    f["package"] = packages.get(f["path"])

  pairs = [
      (english, min(counts, key=lambda german: (-counts[german], german)))
      for english, counts in translations.items()
  ]
  groups = collections.defaultdict(list)
  for english, german in pairs:
    groups[_group_key(english)].append((english, german))
  keys = sorted(groups)
  random.Random(seed).shuffle(keys)
  splits = {split: [] for split in SPLITS}
  targets = {"test": test_size, "validation": validation_size}
  for key in keys:
    split = next((s for s in ("test", "validation") if len(splits[s]) < targets[s]), "train")
    splits[split].extend(sorted(groups[key]))
  if not splits["train"]:
    raise ValueError(
        f"{len(pairs)} pairs from {len(files)} catalogs leave nothing for train after "
        f"validation_size={validation_size} and test_size={test_size}; lower them or "
        "add catalogs"
    )

  kept_total = sum(f["pairs_kept"] for f in files)
  stats = {
      "seed": seed,
      "validation_size": validation_size,
      "test_size": test_size,
      "max_chars": max_chars,
      "catalogs": files,
      "pairs_read": kept_total + sum(dropped.values()),
      "dropped": dict(sorted(dropped.items())),
      "duplicates_removed": kept_total - len(pairs),
      "english_with_several_translations": sum(len(c) > 1 for c in translations.values()),
      "splits": {
          split: {
              "pairs": len(rows),
              "english_words": sum(len(en.split()) for en, _ in rows),
              "german_words": sum(len(de.split()) for _, de in rows),
          }
          for split, rows in splits.items()
      },
  }
  return splits, stats


def train_vocabulary(pairs: Iterable[tuple[str, str]], vocab_size: int) -> bytes:
  """Trains a SentencePiece unigram model on both sides of `pairs`; returns the serialized model.

  Ids follow T5: pad 0 (also the decoder's start token), eos 1, unk 2, no bos. Training uses one
  thread so the model is the same on every machine.
  """
  sentences = [text for pair in pairs for text in pair]
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=0.9999,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        num_threads=1,
        minloglevel=2,
    )
  except RuntimeError as e:
    raise ValueError(
        f"cannot train a {vocab_size}-piece vocabulary on {len(sentences)} sentences "
        f"({e}); lower vocab_size"
    ) from e
  return model.getvalue()


def _write_atomically(path: pathlib.Path, content: bytes) -> None:
  """Writes through a temporary file and a rename, so an interrupted run leaves no partial file."""
  with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, delete=False) as f:
    f.write(content)
  os.chmod(f.name, 0o644)  # readable like any checked-out file; temporary files are 0600
  os.replace(f.name, path)


def write_corpus(
    output_dir: str, splits: dict[str, list[tuple[str, str]]], stats: dict, vocabulary: bytes
) -> dict:
  """Writes the TSV splits, the vocabulary and stats.json (with file sizes) to `output_dir`."""
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  files = {
      f"{split}.tsv": "".join(f"{en}\t{de}\n" for en, de in rows).encode("utf-8")
      for split, rows in splits.items()
  }
  files["sentencepiece.model"] = vocabulary
  for name, content in files.items():
    _write_atomically(out / name, content)
  stats = dict(stats, file_bytes={name: len(content) for name, content in files.items()})
  _write_atomically(
      out / "stats.json", (json.dumps(stats, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
  )
  return stats


def find_catalogs(patterns: Iterable[str]) -> list[str]:
  """The sorted, distinct files matching any of the glob `patterns`."""
  return sorted({path for pattern in patterns for path in glob.glob(pattern)})


def build(
    mo_files: Sequence[str],
    output_dir: str,
    seed: int = 0,
    validation_size: int = 2000,
    test_size: int = 2000,
    max_chars: int = 200,
    vocab_size: int = 8000,
) -> dict:
  """Builds the corpus of `mo_files` and its vocabulary into `output_dir`; returns stats.json.

  `max_chars` drops pairs with a longer English or German side (0 keeps everything);
  `vocab_size` is the number of SentencePiece pieces. See `build_corpus` for the split.
  """
  if not mo_files:
    raise ValueError(
        "no .mo catalogs given: install packages with German translations or point "
        "the globs at catalogs"
    )
  logging.info("Reading %d catalogs", len(mo_files))
  splits, stats = build_corpus(mo_files, seed, validation_size, test_size, max_chars)
  vocabulary = train_vocabulary(splits["train"], vocab_size)
  processor = spm.SentencePieceProcessor(model_proto=vocabulary)
  stats["vocabulary"] = {
      "pieces": processor.vocab_size(),
      "pad_id": processor.pad_id(),
      "eos_id": processor.eos_id(),
      "unk_id": processor.unk_id(),
      "bos_id": processor.bos_id(),
  }
  return write_corpus(output_dir, splits, stats, vocabulary)

"""Tests of speculative_t5x/text/tasks.py (seqio tasks, metrics, truncation), of the demo corpus builder
benchmarks/demo_corpus.py and of its front end benchmarks/build_demo_corpus.py (run in a
subprocess, so its absl flags stay out of this process), on TFDS mock data, seqio's test vocabulary
and tiny .mo files written here."""

import ast
import gettext
import importlib
import json
import os
import pathlib
import struct
import subprocess
import sys

import gin
import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

from speculative_t5x.running import bootstrap
import demo_corpus as corpus
from speculative_t5x.text import demo_data
from speculative_t5x.text import tasks

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TEST_VOCABULARY_PATH = (
    pathlib.Path(seqio.__file__).parent / "test_data" / "sentencepiece" / "sentencepiece.model"
)
SUFFIX = "_test_vocab"
EOS_ID = 1


@pytest.fixture(scope="module")
def vocabulary():
  return tasks.get_vocabulary(str(TEST_VOCABULARY_PATH))


@pytest.fixture(scope="module")
def mock_tasks(vocabulary):
  """WMT and CNN/DM registered with the test vocabulary, reading 4 TFDS mock examples a split."""
  wmt, cnn = tasks.register_tasks(vocabulary, suffix=SUFFIX)
  with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE, num_examples=4):
    yield {"wmt": wmt, "cnn": cnn}


def _examples(task_name, lengths, split="test"):
  # The mock TFDS builders have no split sizes, which seqio's in-memory cache check reads.
  dataset = tasks.get_task(task_name).get_dataset(
      lengths, split=split, shuffle=False, try_in_mem_cache=False
  )
  return list(dataset.as_numpy_iterator())


# ----------------------------------------------------------------------------- tasks


def test_default_tasks_are_registered_with_t5_names_and_vocabulary():
  wmt = tasks.get_task("wmt_t2t_ende_v003")
  cnn = tasks.get_task("cnn_dailymail_v002")
  assert wmt.source.tfds_dataset.name == "wmt_t2t_translate/de-en:1.0.0"
  assert cnn.source.tfds_dataset.name == "cnn_dailymail:3.4.0"
  for task in (wmt, cnn):
    assert task.output_features["targets"].vocabulary.sentencepiece_model_file == (
        "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model"
    )
    assert task.output_features["inputs"].add_eos and task.output_features["targets"].add_eos
  assert wmt.metric_fns == [tasks.bleu] and cnn.metric_fns == [tasks.rouge]
  assert tasks.get_task("demo_ende").metric_fns == [tasks.bleu]


def test_registration_is_idempotent(vocabulary):
  importlib.reload(tasks)
  assert tasks.register_tasks(vocabulary, SUFFIX) == tasks.register_tasks(vocabulary, SUFFIX)
  assert "wmt_t2t_ende_v003" in seqio.TaskRegistry.names()


@pytest.mark.parametrize(
    "key, prefix", [("wmt", "translate English to German: "), ("cnn", "summarize: ")]
)
def test_task_preprocesses_and_tokenizes(mock_tasks, vocabulary, key, prefix):
  examples = _examples(mock_tasks[key], {"inputs": 4096, "targets": 4096})
  assert len(examples) == 4
  prefix_ids = vocabulary.encode(prefix.rstrip())
  for ex in examples:
    assert ex["inputs_pretokenized"].decode().startswith(prefix)
    assert list(ex["inputs"][: len(prefix_ids)]) == prefix_ids
    assert ex["inputs"][-1] == EOS_ID and ex["targets"][-1] == EOS_ID
    assert list(ex["targets"][:-1]) == vocabulary.encode(ex["targets_pretokenized"].decode())


def test_short_feature_lengths_truncate_and_keep_eos(mock_tasks):
  full = _examples(mock_tasks["cnn"], None)
  lengths = {"inputs": 8, "targets": 6}
  for short, long in zip(_examples(mock_tasks["cnn"], lengths), full):
    for key, length in lengths.items():
      assert len(short[key]) == min(length, len(long[key]))
      assert short[key][-1] == EOS_ID
      assert list(short[key][:-1]) == list(long[key][: len(short[key]) - 1])

  count = tasks.count_truncated(mock_tasks["cnn"], "test", lengths)
  expected = {key: sum(len(ex[key]) > length for ex in full) for key, length in lengths.items()}
  assert count.examples == 4 and count.truncated == expected and expected["inputs"] == 4
  assert str(count) == f"inputs 4, targets {expected['targets']} of 4 examples are truncated"
  assert tasks.count_truncated(mock_tasks["wmt"], "test", {"inputs": 10**6}).truncated == {
      "inputs": 0
  }
  with pytest.raises(ValueError, match="does not have"):
    tasks.count_truncated(mock_tasks["wmt"], "test", {"input": 8})


def test_unknown_task_names_close_matches():
  with pytest.raises(
      ValueError,
      match=r"unknown task or mixture 'wmt_t2t_ende_v03'.*did you mean " r"'wmt_t2t_ende_v003'",
  ):
    tasks.get_task("wmt_t2t_ende_v03")
  with pytest.raises(ValueError, match="import speculative_t5x.text.tasks"):
    tasks.get_task("glue_cola")


def test_check_split_names_the_setting_and_the_splits():
  task = tasks.get_task("demo_ende")
  tasks.check_split(task, "validation", "SPLIT")
  with pytest.raises(ValueError, match=r"^SPLIT 'dev' is not a split of demo_ende: use one of "):
    tasks.check_split(task, "dev", "SPLIT")
  with pytest.raises(ValueError, match=r"--split \(a split's name.*\) must be a non-empty"):
    tasks.check_split(task, "", "--split")
  listed_none = seqio.Task(
      "listed_none",
      seqio.FunctionDataSource(lambda split, shuffle_files: None, splits=()),
      output_features={},
  )
  tasks.check_split(listed_none, "anything", "SPLIT")  # its reading tells


@pytest.mark.parametrize("name", ["wmt_ende", "cnn_dailymail", "demo_ende"])
def test_task_gin_files_name_registered_tasks(name):
  gin.clear_config()
  try:
    gin.parse_config_file(str(REPO_ROOT / "configs" / "tasks" / f"{name}.gin"))
    task = tasks.get_task(gin.query_parameter("%MIXTURE_OR_TASK_NAME"))
    lengths = gin.query_parameter("%TASK_FEATURE_LENGTHS")
  finally:
    gin.clear_config()
  assert set(lengths) == set(task.output_features)


# ----------------------------------------------------------------------------- metrics


def test_bleu_known_values():
  assert tasks.bleu(["Das ist ein Test ."], ["Das ist ein Test ."]) == {"bleu": pytest.approx(100)}
  assert tasks.bleu(["eins zwei drei vier"], ["fünf sechs sieben acht"])["bleu"] == 0
  # Same length (no brevity penalty); 1- to 4-gram precisions 5/6, 3/5, 2/4, 1/3.
  score = tasks.bleu(["the cat sat on a mat"], ["the cat sat on the mat"])["bleu"]
  assert score == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)


def test_rouge_known_values():
  same = tasks.rouge(["The cat sat. It was happy."], ["The cat sat. It was happy."])
  assert same == {key: pytest.approx(100) for key in ("rouge1", "rouge2", "rougeL", "rougeLsum")}
  # Prediction "the cat" against "the cat sat": unigram P 1, R 2/3; bigram P 1, R 1/2.
  half = tasks.rouge(["the cat sat", "a b"], ["the cat", "a b"])
  assert half["rouge1"] == pytest.approx((80 + 100) / 2)
  assert half["rouge2"] == pytest.approx((200 / 3 + 100) / 2)
  assert half["rougeL"] == pytest.approx((80 + 100) / 2)


@pytest.mark.parametrize("metric", [tasks.bleu, tasks.rouge])
def test_metrics_reject_mismatched_inputs(metric):
  with pytest.raises(ValueError, match="2 targets but 1 predictions"):
    metric(["a", "b"], ["a"])
  with pytest.raises(ValueError, match="empty"):
    metric([], [])


# ----------------------------------------------------------------------------- demo task


def test_demo_task_reads_a_local_corpus(tmp_path, vocabulary):
  pairs = {
      "train": [("Open file", "Datei öffnen"), ("Close", "Schließen")],
      "validation": [("Save", "Speichern")],
      "test": [("Print", "Drucken")],
  }
  for split, rows in pairs.items():
    (tmp_path / f"{split}.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in rows))
  name = tasks.register_demo_task(tmp_path, vocabulary, name="demo_ende" + SUFFIX)
  for split, rows in pairs.items():
    examples = _examples(name, {"inputs": 64, "targets": 64}, split)
    assert [
        (ex["inputs_pretokenized"].decode(), ex["targets_pretokenized"].decode()) for ex in examples
    ] == [("translate English to German: " + en, de) for en, de in rows]
    assert all(ex["targets"][-1] == EOS_ID for ex in examples)

  (tmp_path / "test.tsv").write_text("one\ttwo\tthree\n")
  with pytest.raises(tf.errors.InvalidArgumentError, match="english<TAB>german"):
    _examples(name, None, "test")
  tasks.register_demo_task(tmp_path / "absent", vocabulary, name="demo_ende" + SUFFIX)
  with pytest.raises(FileNotFoundError, match="build_demo_corpus.py"):
    _examples(name, None, "test")
  with pytest.raises(ValueError, match="not 'dev'"):
    _examples(name, None, "dev")


def test_demo_data_dir_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv(demo_data.DEMO_DATA_ENV, str(tmp_path))
  assert demo_data.demo_data_dir() == tmp_path
  monkeypatch.delenv(demo_data.DEMO_DATA_ENV)
  assert demo_data.demo_data_dir() == REPO_ROOT / "data" / "demo_ende"


# ----------------------------------------------------------------------------- corpus builder


def write_mo(path, messages, charset="UTF-8", byte_order="<"):
  """Writes a GNU .mo catalog of {msgid: msgstr} (plurals joined by NUL, context by EOT)."""
  header = (
      f"Content-Type: text/plain; charset={charset}\n"
      "Plural-Forms: nplurals=2; plural=(n != 1);\n"
  )
  entries = sorted(
      [(b"", header.encode("ascii"))]
      + [(k.encode(charset), v.encode(charset)) for k, v in messages.items()]
  )
  originals_offset = 28
  translations_offset = originals_offset + 8 * len(entries)
  data_offset = translations_offset + 8 * len(entries)
  tables, blob = [], b""
  for column in (0, 1):
    for entry in entries:
      tables.append(struct.pack(byte_order + "2I", len(entry[column]), data_offset + len(blob)))
      blob += entry[column] + b"\0"
  pathlib.Path(path).write_bytes(
      struct.pack(
          byte_order + "7I",
          0x950412DE,
          0,
          len(entries),
          originals_offset,
          translations_offset,
          0,
          0,
      )
      + b"".join(tables)
      + blob
  )


CATALOG_A = {
    "Open file": "Datei öffnen",
    "_Save": "_Speichern",
    "Menu\x04&Quit": "&Beenden",
    "%d file\x00%d files": "%d Datei\x00%d Dateien",
    "Set LC_ALL first": "Zuerst LC_ALL setzen",
    "Use    many\n  spaces": "Viele\tLeerzeichen  nutzen",
    "|NAME|use encoding NAME": "|NAME|Kodierung NAME benutzen",
    "Copy": "Kopieren",
    "OK": "OK",
    "Untranslated": "",
    "%s of %d": "%s von",
    "100% done": "100% fertig",
    "A " + "very " * 60 + "long message": "Eine sehr lange Nachricht",
    "::": "::",
}
CATALOG_B = {"Copy": "Kopie", "open file...": "Datei öffnen ...", "Close": "Schließen"}
CATALOG_C = {"Copy": "Kopieren", "Quit": "Beenden"}
EXPECTED_PAIRS = {
    ("Open file", "Datei öffnen"),
    ("Save", "Speichern"),
    ("Quit", "Beenden"),
    ("%d file", "%d Datei"),
    ("%d files", "%d Dateien"),
    ("Set LC_ALL first", "Zuerst LC_ALL setzen"),
    ("Use many spaces", "Viele Leerzeichen nutzen"),
    ("use encoding NAME", "Kodierung NAME benutzen"),
    ("Copy", "Kopieren"),
    ("100% done", "100% fertig"),
    ("open file...", "Datei öffnen ..."),
    ("Close", "Schließen"),
}


@pytest.fixture
def catalogs(tmp_path):
  write_mo(tmp_path / "a.mo", CATALOG_A)
  write_mo(tmp_path / "b.mo", CATALOG_B, charset="ISO-8859-1", byte_order=">")
  write_mo(tmp_path / "c.mo", CATALOG_C)
  return [str(tmp_path / name) for name in ("a.mo", "b.mo", "c.mo")]


def test_written_catalogs_read_the_same_with_python_gettext(catalogs):
  messages, undecodable = corpus.read_mo(catalogs[1])
  assert undecodable == 0
  with open(catalogs[1], "rb") as f:
    translations = gettext.GNUTranslations(f)
  for message in messages:
    assert translations.gettext(message.msgid) == message.msgstrs[0]
  plural = next(m for m in corpus.read_mo(catalogs[0])[0] if m.msgid_plural)
  assert (plural.msgid, plural.msgid_plural, plural.msgstrs) == (
      "%d file",
      "%d files",
      ("%d Datei", "%d Dateien"),
  )


def test_read_mo_rejects_other_files(tmp_path):
  (tmp_path / "x.po").write_text('msgid "a"\nmsgstr "b"\n' * 3)
  with pytest.raises(ValueError, match="bad magic number"):
    corpus.read_mo(str(tmp_path / "x.po"))


def test_build_corpus_cleans_deduplicates_and_splits(catalogs):
  splits, stats = corpus.build_corpus(
      catalogs, seed=0, validation_size=2, test_size=2, max_chars=200
  )
  pairs = [pair for rows in splits.values() for pair in rows]
  assert set(pairs) == EXPECTED_PAIRS and len(pairs) == len(EXPECTED_PAIRS)
  assert stats["dropped"] == {
      "identical": 1,
      "no_letters": 1,
      "placeholder_mismatch": 1,
      "too_long": 1,
      "undecodable": 0,
      "untranslated": 1,
  }
  # "Copy" thrice (the majority translation wins), "Quit" twice.
  assert stats["duplicates_removed"] == 3
  assert [c["pairs_kept"] for c in stats["catalogs"]] == [10, 3, 2]
  assert all(c["package"] is None and len(c["sha256"]) == 64 for c in stats["catalogs"])
  # "Open file" and "open file..." differ only in case and final dots: one split holds both.
  split_of = {en: split for split, rows in splits.items() for en, _ in rows}
  assert split_of["Open file"] == split_of["open file..."]
  assert len(splits["test"]) >= 2 and len(splits["validation"]) >= 2 and splits["train"]

  again, _ = corpus.build_corpus(
      list(reversed(catalogs)), seed=0, validation_size=2, test_size=2, max_chars=200
  )
  assert again == splits
  others = [corpus.build_corpus(catalogs, seed, 2, 2, 200)[0]["test"] for seed in range(1, 6)]
  assert any(set(test) != set(splits["test"]) for test in others)
  with pytest.raises(ValueError, match="nothing for train"):
    corpus.build_corpus(catalogs, seed=0, validation_size=6, test_size=6, max_chars=200)


def test_accelerators_and_placeholders():
  strip = corpus.strip_accelerators
  assert strip("Sa_ve As", "Speichern _unter") == ("Save As", "Speichern unter")
  assert strip("&Open", "Ö&ffnen") == ("Open", "Öffnen")
  assert strip("AT&T syntax", "AT&T-Syntax") == ("AT&T syntax", "AT&T-Syntax")
  assert strip("new_version", "neue_Version") == ("new_version", "neue_Version")
  assert strip("_Cancel", "Abbrechen") == ("_Cancel", "Abbrechen")
  assert strip("Save &amp; quit", "Speichern &amp; beenden")[0] == "Save &amp; quit"
  assert corpus.placeholders("%2$s of %1$d (%%) {name}") == ["%d", "%s", "{name}"]


def test_script_writes_corpus_vocabulary_and_stats(tmp_path):
  words = ["file", "folder", "window", "printer", "message", "user", "group", "table"]
  german = ["Datei", "Ordner", "Fenster", "Drucker", "Nachricht", "Benutzer", "Gruppe", "Tabelle"]
  verbs = [("Open", "öffnen"), ("Close", "schließen"), ("Delete", "löschen"), ("Copy", "kopieren")]
  write_mo(
      tmp_path / "ui.mo", {f"{v} {w}": f"{g} {d}" for v, d in verbs for w, g in zip(words, german)}
  )
  out = tmp_path / "corpus"
  result = subprocess.run(
      [
          sys.executable,
          str(REPO_ROOT / "benchmarks" / "build_demo_corpus.py"),
          f"--mo_globs={tmp_path}/*.mo",
          f"--output_dir={out}",
          "--validation_size=4",
          "--test_size=4",
          "--vocab_size=40",
      ],
      capture_output=True,
      text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
  )
  assert result.returncode == 0, result.stderr
  stats = json.loads((out / "stats.json").read_text())
  assert {s: v["pairs"] for s, v in stats["splits"].items()} == {
      "train": 24,
      "validation": 4,
      "test": 4,
  }
  assert stats["vocabulary"] == {"pieces": 40, "pad_id": 0, "eos_id": 1, "unk_id": 2, "bos_id": -1}
  assert stats["file_bytes"]["train.tsv"] == (out / "train.tsv").stat().st_size
  rows = [line.split("\t") for line in (out / "test.tsv").read_text().splitlines()]
  assert len(rows) == 4 and all(len(row) == 2 for row in rows)
  vocabulary = tasks.get_vocabulary(str(out / "sentencepiece.model"))
  assert vocabulary.decode(vocabulary.encode("Open file")) == "Open file"


# ----------------------------------------------------------------------------- TensorFlow's
# start-up lines: no environment variable silences them, so the bootstrap's quiet import must be
# the first import of TensorFlow in every entry point (speculative_t5x/running/bootstrap.py).
_TENSORFLOW_IMPORTERS = ("seqio", "tensorflow", "tensorflow_datasets", "t5")


def _imports_before_the_package(path: pathlib.Path) -> list[str]:
  """The top-level modules `path` imports before it calls `bootstrap.start()` (all of them, and
  "no bootstrap.start()", where it never does)."""
  names = []
  for node in ast.parse(path.read_text()).body:
    if (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func) == "bootstrap.start"
    ):
      return names
    if isinstance(node, ast.Import):
      modules = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      modules = [node.module]
    else:
      continue
    names += [m.split(".")[0] for m in modules]
  return names + ["no bootstrap.start()"]


_ENTRY_POINTS = sorted(
    str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "scripts").glob("*.py")
) + ["tests/conftest.py"]


@pytest.mark.parametrize("entry_point", _ENTRY_POINTS)
def test_entry_points_import_the_package_before_tensorflow(entry_point):
  early = _imports_before_the_package(REPO_ROOT / entry_point)
  assert not set(early) & set(_TENSORFLOW_IMPORTERS + ("no bootstrap.start()",)), (
      f"{entry_point} imports {sorted(set(early) & set(_TENSORFLOW_IMPORTERS))} before "
      "bootstrap.start(): TensorFlow's start-up lines would print; call bootstrap.start() first"
  )


def test_the_bootstrap_imports_tensorflow_quietly_unless_the_user_asks_for_every_line():
  """Started before seqio: no start-up line. A user's TF_CPP_MIN_LOG_LEVEL=0 keeps them."""
  code = "from speculative_t5x.running import bootstrap; bootstrap.start(); import seqio"
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  runs = {
      level: subprocess.Popen(
          [sys.executable, "-c", code],
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
          env=dict(env, **({"TF_CPP_MIN_LOG_LEVEL": level} if level else {})),
      )
      for level in ("", "0")
  }
  outputs = {level: run.communicate(timeout=300) for level, run in runs.items()}
  chatter = bootstrap._START_UP_CHATTER  # pylint: disable=protected-access
  quiet_err = outputs[""][1]
  assert runs[""].returncode == 0, quiet_err
  assert not [line for line in quiet_err.splitlines() if chatter.search(line)], quiet_err
  loud_err = outputs["0"][1]
  assert [line for line in loud_err.splitlines() if chatter.search(line)], loud_err

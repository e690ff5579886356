"""The README's and docs/'s Python snippets run, on a tiny random pair, so they cannot rot.

Each ```python block of README.md is executed in turn in one namespace, after three rewrites that
shrink what the README names to a size a test can run (each rewrite must apply where the README
has it, so a README that changes its examples shows up here):
  - every model dimension given as `name=<int>` (vocab_size, emb_dim, num_heads, head_dim,
    mlp_dim, num_encoder_layers, num_decoder_layers) becomes a tiny one;
  - a SentencePiece vocabulary at a gs:// path becomes a 32-id pass-through vocabulary;
  - `draft_vocab.frequent_tokens(...)` (which reads a task's whole train split) becomes ids
    1..15.
The names a snippet uses without defining them (the README's "given these") are made on first
use: `params` (the random parameters of the snippet's `model`), `batch` (two rows), the tiny
`target`, `drafter`, `vocab`, `target_config`, `drafter_config` and `head_config`. The first
snippet's decode runs at temperature 1 and its statistics are read; the later snippets build
models, whose constructors check every setting.
"""

import pathlib
import re

import jax
import numpy as np
import pytest
import seqio

from conftest import tiny_config
from speculative_t5x import drafters
from speculative_t5x import network

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
V = 32
TINY_DIMENSIONS = {
    "vocab_size": V,
    "emb_dim": 8,
    "num_heads": 2,
    "head_dim": 4,
    "mlp_dim": 16,
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
}
_DIMENSION = re.compile(rf"\b({'|'.join(TINY_DIMENSIONS)})=\d+")
_GS_VOCABULARY = re.compile(r"seqio\.SentencePieceVocabulary\(\s*\"gs://[^\"]*\"\)")
_FREQUENT_TOKENS = re.compile(r"draft_vocab\.frequent_tokens\([^)]*\)")
REWRITES = (
    (_DIMENSION, lambda m: f"{m.group(1)}={TINY_DIMENSIONS[m.group(1)]}"),
    (_GS_VOCABULARY, lambda m: f"seqio.PassThroughVocabulary({V}, eos_id=1)"),
    (_FREQUENT_TOKENS, lambda m: "tuple(range(1, 16))"),
)
TINY = tiny_config(V, **{k: v for k, v in TINY_DIMENSIONS.items() if k != "vocab_size"})


def python_snippets(text: str) -> list[str]:
  return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


class _Given(dict):
  """The snippets' namespace: what they define, and what they take as given, made on first use."""

  def __missing__(self, name):
    given = {
        "params": lambda: self["model"].get_initial_variables(
            jax.random.PRNGKey(0),
            {"encoder_input_tokens": (2, 4), "decoder_input_tokens": (2, 4)},
        )["params"],
        "batch": lambda: {
            "encoder_input_tokens": np.array([[5, 6, 7, 1], [8, 9, 1, 0]], np.int32),
            "decoder_input_tokens": np.zeros((2, 4), np.int32),
        },
        "target": lambda: network.Transformer(TINY),
        "drafter": lambda: drafters.T5Drafter(TINY),
        "vocab": lambda: seqio.PassThroughVocabulary(V, eos_id=1),
        "target_config": lambda: TINY,
        "drafter_config": lambda: TINY,
        "head_config": lambda: TINY,
    }
    if name not in given:
      raise KeyError(name)
    self[name] = given[name]()
    return self[name]


def test_the_readme_has_a_snippet_and_every_rewrite_applies():
  """The README shows the API in one snippet; the guide's pages show the rest. A rewrite that no
  snippet needs any more is dead, and fails here."""
  assert python_snippets(README.read_text())
  pages = [README, *sorted((README.parent / "docs").glob("*.md"))]
  text = "\n".join(snippet for page in pages for snippet in python_snippets(page.read_text()))
  for pattern, _ in REWRITES:
    assert pattern.search(text), f"{pattern.pattern} no longer matches a README or docs snippet"


# The README is a front door: it fits on a screen or three, and its figures live in
# docs/results.md. A figure: a number with its unit or decimals (1.14x, 56.5 s, 33M, 0.68), or an
# integer of two or more digits, in prose and in code blocks alike; versions (jax==0.10.2),
# "T5 1.1", row names (R1), link targets and inline code are not.
_FIGURE = re.compile(
    r"(?<![\w.=/])\d+(\.\d+)?(x|%| ?[kKMG]i?B|M\b| ?s\b| ?ms\b)"  # with a unit
    r"|(?<![\w.=/])\d+\.\d+\b(?!\.)"  # decimals
    r"|(?<![\w.=/])\d{2,}\b"  # integers of two or more digits
)
_NOT_FIGURES = re.compile(
    r"T5 1\.1|`[^`\n]*`|\b[\w-]+==?[\d.*]+|Python \d\.\d+|\]\([^)]*\)|ICML \d{4}"
)


def readme_figures(text: str) -> list[str]:
  return [m.group(0) for m in _FIGURE.finditer(_NOT_FIGURES.sub(" ", text))]


def test_the_readme_fits_its_budget():
  text = README.read_text()
  assert len(text.splitlines()) <= 120
  figures = readme_figures(text)
  assert len(figures) <= 20, figures


def test_the_figure_count_counts_figures_and_not_versions():
  assert readme_figures("1.14x and 56.5 s, 33M, alpha 0.68, 48 sentences, 1.4x-3.4x") == [
      "1.14x",
      "56.5 s",
      "33M",
      "0.68",
      "48",
      "1.4x",
      "3.4x",
  ]
  assert readme_figures("T5 1.1, jax==0.10.2, Python 3.11, `gamma=4`, ICML 2023, R1") == []


def run_snippets(page: pathlib.Path):
  """Every ```python block of `page`, rewritten, in order in one namespace -> the namespace after
  each block (a list)."""
  namespace, after = _Given(), []
  for i, snippet in enumerate(python_snippets(page.read_text())):
    for pattern, replacement in REWRITES:
      snippet = pattern.sub(replacement, snippet)
    try:
      exec(compile(snippet, f"{page.name} python snippet {i}", "exec"), {}, namespace)  # noqa: S102
    except Exception as e:  # noqa: BLE001  (the snippet's number and text in the failure)
      pytest.fail(f"{page.name} snippet {i} fails: {type(e).__name__}: {e}\n{snippet}")
    after.append(dict(namespace))
  return after


def test_the_readme_snippets_run_on_a_tiny_pair():
  for i, namespace in enumerate(run_snippets(README)):
    if i == 0:
      decodes, aux = namespace["decodes"], namespace["aux"]
      assert decodes.shape == (2, 4) and np.all((decodes >= 0) & (decodes < V))
      assert np.all(np.asarray(aux["speculative_stats"]["target_calls"]) >= 1)
      assert 0.0 <= float(namespace["stats"].alpha) <= 1.0


DOCS = sorted((README.parent / "docs").glob("*.md"))


def test_the_docs_have_snippets():
  assert len([page for page in DOCS if python_snippets(page.read_text())]) >= 3


@pytest.mark.parametrize("page", [page.name for page in DOCS if python_snippets(page.read_text())])
def test_every_docs_page_s_snippets_run_on_a_tiny_pair(page):
  """Each page of docs/ runs alone, in a namespace of its own, with the README's rewrites."""
  assert run_snippets(README.parent / "docs" / page)

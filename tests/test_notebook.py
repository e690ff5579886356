"""notebooks/speculative_decoding.ipynb runs top to bottom on CPU (its quick setting) and shows
Figure 1's coloured tokens and the gamma sweep's figure; the committed file carries no outputs.

The kernel is this interpreter (the venv's), through a kernelspec written to a temporary
JUPYTER_PATH, so the notebook imports the same packages as the tests.
"""

import json
import pathlib
import sys

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "speculative_decoding.ipynb"
KERNEL_NAME = "speculative_t5x_test"
TIMEOUT_SECONDS = 600  # per cell; the quick run takes about three minutes on 2 CPU cores.


@pytest.fixture
def kernel_name(tmp_path, monkeypatch):
  spec_dir = tmp_path / "kernels" / KERNEL_NAME
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(
      json.dumps(
          {
              "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
              "display_name": "speculative_t5x tests",
              "language": "python",
          }
      )
  )
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
  monkeypatch.setenv("SPECULATIVE_T5X_NOTEBOOK_QUICK", "1")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  return KERNEL_NAME


def _outputs(notebook, output_type=None):
  return [
      output
      for cell in notebook.cells
      if cell.cell_type == "code"
      for output in cell.outputs
      if output_type in (None, output.output_type)
  ]


def test_committed_without_outputs():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(notebook)
  code = [cell for cell in notebook.cells if cell.cell_type == "code"]
  assert code and all(
      not cell.outputs and cell.execution_count is None for cell in code
  ), "commit the notebook with outputs cleared (jupyter nbconvert --clear-output --inplace)"


def test_runs_and_shows_figure1_and_the_sweep(kernel_name):
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  NotebookClient(
      notebook,
      kernel_name=kernel_name,
      timeout=TIMEOUT_SECONDS,
      resources={"metadata": {"path": str(NOTEBOOK.parent)}},
  ).execute()

  errors = _outputs(notebook, "error")
  assert not errors, "\n".join(f"{e.ename}: {e.evalue}" for e in errors)
  html = "".join(
      output.data.get("text/html", "") for output in _outputs(notebook) if "data" in output
  )
  assert 'class="spec-legend"' in html
  assert html.count('class="spec-figure1"') >= 4  # 2 sentences x 2 temperatures
  for kind in ("accepted", "correction"):
    assert f'class="spec-{kind}"' in html, kind
  pngs = [
      output.data["image/png"]
      for output in _outputs(notebook)
      if "data" in output and "image/png" in output.data
  ]
  assert len(pngs) == 1
  text = "".join(output.get("text", "") for output in _outputs(notebook, "stream"))
  assert "identical to the baseline on all 2 sentences: True" in text
  # The sweep's table is report.markdown_table: a Table-2 row per gamma and temperature (QUICK
  # sweeps GAMMA = 4 alone).
  tables = "".join(
      output.data.get("text/markdown", "") for output in _outputs(notebook) if "data" in output
  )
  assert "| task | drafter | temp | gamma | alpha | tokens/call |" in tables
  for temperature in (0, 1):
    assert f"| demo_ende | drafter | {temperature} | 4 |" in tables
  assert "| demo_ende | drafter | 0 | 1 |" not in tables

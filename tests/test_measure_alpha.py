"""scripts/measure_alpha.py: Table 3 on the shipped demo pair's target."""

import json

from conftest import require_demo_pair, run_script


def test_measure_alpha_writes_table_3(tmp_path):
  require_demo_pair()
  run_script(
      "measure_alpha.py",
      f"--gin.ALPHA_OUTPUT_DIR='{tmp_path}'",
      "--gin.NUM_TOKENS=100",
      "--gin.BATCH_SIZE=8",
      "--gin.NGRAM_FIT_EXAMPLES=500",
      "--gin.TEMPERATURES=(0.0,)",
  )
  results = json.loads((tmp_path / "alpha.json").read_text())["t=0"]
  assert set(results) == {"shared-encoder drafter (256d x 2)", "unigram", "bigram", "prompt lookup"}
  for name, value in results.items():
    assert value["tokens"] >= 100
    assert 0.0 <= value["alpha"] <= 1.0 if name == "prompt lookup" else 0.0 < value["alpha"] < 1.0
  table = (tmp_path / "alpha.md").read_text()
  assert "| unigram |" in table
  assert "t=0: alpha by the target's top probability" in table
  assert "| share of positions |" in table and "| [0.9, 1] |" in table

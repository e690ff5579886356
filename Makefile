# Two entry points; each creates (or reuses) .venv and installs what it needs.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo lint test

$(STAMP): setup.py
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python scripts/demo.py

# Google-style formatting (pyink, 2-space indents) and lint (ruff); configured in pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/pyink --check --quiet speculative_t5x scripts tests setup.py
	$(VENV)/bin/ruff check --quiet speculative_t5x scripts tests setup.py

test: lint
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile --durations=15 tests

# Two entry points; each creates (or reuses) .venv and installs what it needs: `make demo` the
# package alone, `make lint` and `make test` the package with its test extras (torch, transformers,
# jupyter, the linters), which take about as long again to install and the demo never imports.
PY ?= python3
VENV := .venv
PACKAGE := $(VENV)/.installed-package
TEST_EXTRAS := $(VENV)/.installed-test

.PHONY: demo lint test

$(PACKAGE): setup.py
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e .
	touch $(PACKAGE)

$(TEST_EXTRAS): $(PACKAGE)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(TEST_EXTRAS)

demo: $(PACKAGE)
	$(VENV)/bin/python scripts/demo.py

# Google-style formatting (pyink, 2-space indents) and lint (ruff); configured in pyproject.toml.
lint: $(TEST_EXTRAS)
	$(VENV)/bin/pyink --check --quiet speculative_t5x scripts tests setup.py
	$(VENV)/bin/ruff check --quiet speculative_t5x scripts tests setup.py

test: lint
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile --durations=15 tests

# Two entry points; each creates (or reuses) .venv and installs what it needs.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test

$(STAMP): setup.py
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python scripts/demo.py

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q tests

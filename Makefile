# Two entry points; each creates (or reuses) .venv and installs what it needs. `make demo`: what
# decoding needs (requirements-decoding.txt) and the package without its other dependencies; the
# demo reads no seqio task, so it runs without TensorFlow, whose install takes longer than the
# demo's own. `make lint` and `make test`: the package with all its dependencies and its test
# extras (torch, transformers, jupyter, the linters).
PY ?= python3
VENV := .venv
DECODING := $(VENV)/.installed-decoding
PACKAGE := $(VENV)/.installed-package
TEST_EXTRAS := $(VENV)/.installed-test

.PHONY: demo lint test

# `make demo` installs decoding's requirements without byte-compiling them, which halves their
# install: Python compiles what the demo imports as it imports it. The other targets compile them,
# for the tests' many processes.
PIP_COMPILE ?=

# The venv is made without ensurepip's pip, which is slower to install, and the host's pip (22.3 or
# later: --python) installs the newest pip into it; with no such pip on the host, ensurepip's,
# upgraded.
$(DECODING): setup.py requirements-decoding.txt
	test -x $(VENV)/bin/python || $(PY) -m venv --without-pip $(VENV)
	test -x $(VENV)/bin/pip || $(PY) -m pip --python $(VENV)/bin/python install -q --upgrade pip \
	  || ($(VENV)/bin/python -m ensurepip >/dev/null && $(VENV)/bin/python -m pip install -q --upgrade pip)
	$(VENV)/bin/pip install -q $(PIP_COMPILE) -r requirements-decoding.txt
	$(VENV)/bin/pip install -q --no-deps -e .
	touch $(DECODING)

$(PACKAGE): $(DECODING)
	$(VENV)/bin/pip install -q -e .
	touch $(PACKAGE)

$(TEST_EXTRAS): $(PACKAGE)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(TEST_EXTRAS)

demo: PIP_COMPILE := --no-compile
demo: $(DECODING)
	$(VENV)/bin/python scripts/demo.py

# Google-style formatting (pyink, 2-space indents), lint (ruff) and the import contracts
# (import-linter: imports run one way); configured in pyproject.toml.
lint: $(TEST_EXTRAS)
	$(VENV)/bin/pyink --check --quiet speculative_t5x scripts benchmarks tests setup.py
	$(VENV)/bin/ruff check --quiet speculative_t5x scripts benchmarks tests setup.py
	$(VENV)/bin/lint-imports

test: lint
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile --durations=15 tests benchmarks/tests

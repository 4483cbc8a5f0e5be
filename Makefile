# The two commands a new user needs: `make train` and `make test`.
# Both create .venv on first use and reinstall only when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: train test test-all lint clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "jaxformer needs Python >= 3.11, found " + sys.version.split()[0] + " (set PYTHON=python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

train: $(STAMP)
	$(PY) -m jaxformer train --task dates --out runs/dates-$$(date +%Y%m%d-%H%M%S)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n 2

test-all: $(STAMP)
	$(PY) -m pytest -q -n 2

lint: $(STAMP)
	$(PY) -m ruff check jaxformer experiments tests
	$(PY) -m ruff format --check jaxformer experiments tests

clean:
	rm -rf $(VENV) results runs

# The two commands a new user needs: `make train` and `make test`.
# Both create .venv on first use and reinstall only when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: train test test-all lint bench clean

# torch is pinned to exactly 2.13.0 for the PyTorch parity tests: CI has that CPU wheel on
# disk, while another version or an open range would pull gigabytes of CUDA packages.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "jaxformer needs Python >= 3.11, found " + sys.version.split()[0] + " (set PYTHON=python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet torch==2.13.0
	@touch $(STAMP)

train: $(STAMP)
	$(PY) -m jaxformer train --task dates --out runs/dates-$$(date +%Y%m%d-%H%M%S)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n 2

test-all: $(STAMP)
	$(PY) -m pytest -q -n 2

# Benchmarks run with tcmalloc (Debian/Ubuntu: apt-get install libtcmalloc-minimal4) preloaded
# when it is installed: XLA's CPU runtime allocates its temporary buffers on every call, and
# with glibc's malloc each call page-faults them in anew (see README, Performance).
TCMALLOC ?= $(firstword $(wildcard /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 /usr/lib/libtcmalloc_minimal.so.4))
BENCH_ENV := $(if $(TCMALLOC),LD_PRELOAD=$(TCMALLOC))

# The torch baseline uses the torch==2.13.0 that $(STAMP) installs.
bench: $(STAMP)
	@$(if $(TCMALLOC),,echo "note: libtcmalloc_minimal.so.4 not found (apt-get install libtcmalloc-minimal4); timing with the system malloc")
	$(BENCH_ENV) $(PY) experiments/xla_vs_eager.py --quick
	$(BENCH_ENV) $(PY) experiments/attention_bench.py --quick
	$(BENCH_ENV) $(PY) experiments/throughput.py --quick
	$(PY) experiments/update_readme.py

lint: $(STAMP)
	$(PY) -m ruff check jaxformer experiments tests
	$(PY) -m ruff format --check jaxformer experiments tests

clean:
	rm -rf $(VENV) results runs

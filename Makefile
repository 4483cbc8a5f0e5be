# The two commands a new user needs: `make train` and `make test`.
# Both create .venv on first use and reinstall only when pyproject.toml changes.
# The default line is the newest Python >= 3.12 found on PATH or in pyenv's versions: the
# JAX that libtpu and the newest tokamax need. PYTHON= picks another, in .venv-<version>:
# PYTHON=python3.11 is the second JAX line (jax 0.10), the one with CPU torch wheels.

PYENV_ROOT ?= $(or $(shell pyenv root 2>/dev/null),$(HOME)/.pyenv)
CANDIDATES := $(foreach m,19 18 17 16 15 14 13 12,$(wildcard \
	$(PYENV_ROOT)/versions/3.$(m).*/bin/python3.$(m) $(addsuffix /python3.$(m),$(subst :, ,$(PATH)))))
NEWEST     := $(shell for p in $(CANDIDATES); do "$$p" -c '' 2>/dev/null && echo "$$p" && break; done)
PYTHON     ?= $(or $(NEWEST),python3)
PY_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
VENV       ?= $(if $(filter $(or $(NEWEST),python3),$(PYTHON)),.venv,.venv-$(PY_VERSION))
PY         := $(VENV)/bin/python
RUN        := $(VENV)/.installed-run
DEV        := $(VENV)/.installed-dev
OLD_LINE   := $(if $(NEWEST),,$(info make: no Python >= 3.12 found (PATH, pyenv): $(PYTHON) $(PY_VERSION) gets an older JAX, no libtpu (TPU compiles) and tokamax 0.0.12))

.PHONY: train test test-library test-core test-all test-gpu gpu-report lint docs bench bench-xla clean

# `make train` needs the package alone; the tests add pytest, hypothesis, ruff, tokenizers,
# wandb (offline W&B runs of --tracker wandb), the kernels extra, the docs extra (mkdocs,
# pinned) for `make docs`, and the lab (lab/, jaxformer-lab, with its data extra and ray,
# pinned) unless LAB is empty: `make test-library` checks the library's suite without it.
# Python 3.11 (CI runs its whole suite) adds torch pinned to exactly 2.13.0 for the PyTorch
# parity tests (CI has that CPU wheel on disk, while another version or an open range would
# pull gigabytes of CUDA packages), transformers and safetensors for the Hugging Face
# parity tests, and lm-eval with accelerate (the lab's eval extra) for the harness's; newer Pythons have no CPU torch wheel on
# disk, so their parity tests are skipped, and add the tpu extra (libtpu: TPU programs
# compiled with no TPU).
LAB        ?= lab
DEV_311    := '.[dev,docs]' torch==2.13.0 transformers==5.23.0 safetensors==0.8.0 wandb==0.31.0 \
	lm-eval==0.4.13 accelerate==1.15.0
DEV_OTHER  := '.[dev,docs,tpu]' wandb==0.31.0
DEV_EXTRAS := $(if $(filter 3.11,$(PY_VERSION)),$(DEV_311),$(DEV_OTHER)) \
	$(if $(LAB),-e '$(LAB)[data]' ray==2.60.0)

# The environment is made anew when its Python is not the line's (a .venv of an older
# default line), else kept.
$(VENV)/.python-$(PY_VERSION):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "jaxformer needs Python >= 3.11, found " + sys.version.split()[0] + " (set PYTHON=python3.11)")'
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@touch $@

$(RUN): pyproject.toml $(VENV)/.python-$(PY_VERSION)
	$(PY) -m pip install --quiet -e .
	@touch $(RUN)

$(DEV): $(RUN) $(if $(LAB),$(LAB)/pyproject.toml)
	$(PY) -m pip install --quiet -e $(DEV_EXTRAS)
	@touch $(DEV)

train: $(RUN)
	$(PY) -m jaxformer train --task dates --out runs/dates-$$(date +%Y%m%d-%H%M%S)

test: $(DEV)
	$(PY) -m pytest -q -m "not slow" -n 2

# The library's suite alone, in an environment without the lab (what a fork of the library
# keeps; tests/test_layering.py checks that the library's tests import no lab module).
test-library:
	$(MAKE) VENV=$(VENV)-library LAB= test-library-here
test-library-here: $(DEV)
	$(PY) -c 'import importlib.util as u, sys; sys.exit("the lab is installed" if u.find_spec("jaxformer_lab") else 0)'
	$(PY) -m pytest -q -m "not slow" -n 2 --ignore=tests/lab

test-all: $(DEV)
	$(PY) -m pytest -q -n 2

# The tests of what changes between JAX releases: the math, the modules, the attention
# kernels (TPU in Pallas interpret mode, GPU lowered for an abstract GPU), the models,
# decoding, the train steps and their structure, parallelism, and TPU compiles: a quick
# check of another JAX (`make PYTHON=... test-core`); `make test` runs them all.
CORE_TESTS := tests/functional tests/nn tests/test_models.py tests/test_decode.py \
	tests/train/test_steps.py tests/train/test_step_structure.py tests/train/test_lm_head.py \
	tests/parallel tests/test_layering.py tests/lab/test_aot.py
test-core: $(DEV)
	$(PY) -m pytest -q -m "not slow" -n 2 $(CORE_TESTS)

# On a machine with an NVIDIA GPU and a CUDA build of JAX already installed (no .venv: pip's
# default JAX is CPU-only): the tests of the code that runs differently on a GPU (attention
# kernels and "auto", layers, models, decoding, training steps, interop), on the GPU, with
# float32 products pinned to full precision (tests/conftest.py). `make test` runs on the CPU.
# $(call need_gpu,WHAT TO DO INSTEAD) refuses at once, in one line, where $(PYTHON)'s JAX
# sees no GPU (or cannot be imported).
need_gpu = @$(PYTHON) -c 'import importlib.util as u, sys; \
	gpu = u.find_spec("jax") is not None and __import__("jax").default_backend() == "gpu"; \
	sys.exit(0 if gpu else "make $@ needs an NVIDIA GPU and a CUDA build of JAX; $(1)")'
test-gpu:
	$(call need_gpu,`make test` runs the suite on the CPU)
	JAX_PLATFORMS=cuda,cpu PYTHONPATH=. $(PYTHON) -m pytest -q -m "not slow" tests/functional tests/nn \
		tests/test_models.py tests/test_decode.py tests/train/test_steps.py tests/train/test_lm_head.py \
		tests/interop

# The GPU tables in parts of at most 4 minutes each (compile included), in priority order,
# jaxformer against its pure-JAX and PyTorch peers first, on the GPU machine as test-gpu (a
# CUDA build of JAX already installed; tokamax from the wheels: see the docstring of
# jaxformer/gpu_report.py). Resumable: each call runs the parts not yet finished while
# they fit in 9 minutes, and merges them into results/gpu_report/{summary.json,gpu_tables.md};
# call again until its last line says "left": []. `make gpu-report PARTS=peers` runs part
# one alone (about 3 minutes); FORCE=1 reruns finished parts. `jaxformer gpu-report
# --dry-run` checks on a CPU that every part starts.
gpu-report:
	$(call need_gpu,`jaxformer gpu-report --dry-run` checks on a CPU that every part starts)
	PYTHONPATH=.:lab:$$PWD/.site $(PYTHON) -m jaxformer_lab gpu-report --out results/gpu_report \
		$(if $(PARTS),--parts $(PARTS)) $(if $(FORCE),--force)

# Benchmarks run with tcmalloc (Debian/Ubuntu: apt-get install libtcmalloc-minimal4) preloaded
# when it is installed, else with glibc tuned as the jaxformer command tunes it: XLA's CPU
# runtime allocates its temporary buffers on every call, and glibc's per-thread arenas
# would page-fault them in anew each time (see docs/performance.md).
TCMALLOC ?= $(firstword $(wildcard /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 /usr/lib/libtcmalloc_minimal.so.4))
GLIBC_TUNED := MALLOC_ARENA_MAX=1 MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824
BENCH_ENV := $(if $(TCMALLOC),LD_PRELOAD=$(TCMALLOC),$(GLIBC_TUNED))

# On the default line. The torch baseline runs in the interpreter that has torch: this one,
# else the first .venv*/bin/python beside it whose environment has it (`make PYTHON=python3.11
# test` makes .venv-3.11 with torch==2.13.0), or TORCH_PYTHON=path; jax-versions times
# every .venv* line's JAX in the same rounds.
TORCH_OPTION = $(if $(TORCH_PYTHON),--torch-python $(TORCH_PYTHON))
bench: $(DEV)
	$(BENCH_ENV) $(PY) -m jaxformer bench xla-vs-eager --quick $(TORCH_OPTION) $(LAB_OPTIONS)
	$(BENCH_ENV) $(PY) -m jaxformer bench attention --quick --out docs/results/cpu_attention.json
	$(BENCH_ENV) $(PY) -m jaxformer bench train-step --quick $(TORCH_OPTION) --out docs/results/cpu_train_step.json
	$(BENCH_ENV) $(PY) -m jaxformer bench jax-versions --quick --out docs/results/cpu_jax_versions.json
	$(PY) -m jaxformer docs

# The XLA-vs-eager lab at full size: results/xla_vs_eager/report.md, report.json, PNGs;
# LAB_OPTIONS passes its options (--allow-load on a busy machine, --parts, --time-limit).
bench-xla: $(DEV)
	$(BENCH_ENV) $(PY) -m jaxformer bench xla-vs-eager $(LAB_OPTIONS)

# The documentation site into site/; --strict makes every warning (a broken link or anchor,
# an unresolved cross-reference, a page left out of the navigation) an error.
docs: $(DEV)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

lint: $(DEV)
	$(PY) -m ruff check jaxformer lab experiments tests
	$(PY) -m ruff format --check jaxformer lab experiments tests

clean:
	rm -rf .venv .venv-* results runs site

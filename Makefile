# Two entry points on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.installed
STAMP := $(VENV)/.installed-test
SERVER_STAMP := $(VENV)/.installed-server-test
DOCS_STAMP := $(VENV)/.installed-docs
# pytest-xdist workers of `make test`: one per core of the 2-core CI machine. Files, not
# tests, are spread (--dist loadfile) so a module's expensive fixture is built once, in collection
# order (--no-loadscope-reorder), which tests/conftest.py sets longest files first.
TEST_WORKERS ?= 2
export HF_DATASETS_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Python writes a module's bytecode the first time it imports it (the installs below are
# --no-compile), so a PYTHONDONTWRITEBYTECODE in the caller's environment (set on the 2-core
# machines this project is measured on) would have every process compile every module it
# imports, every time: importing jax, flax, optax, datasets, dp_accounting, scipy and pandas
# took 10 s against 3.4 s with bytecode (docs/development.md, "Outside pytest").
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test suite test-accelerator device-wheels install assets lint bench docs clean

# `make demo` installs the package alone; `make test` installs it with the test and docs extras
# in one pip run (one resolve). --no-compile: Python writes a module's bytecode when it is first
# imported, rather than pip compiling every installed file up front (the suite imports a
# fraction of what is installed; times in docs/development.md, "Outside pytest").
$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(DEMO_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --no-compile -e .
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --no-compile -e '.[test,docs]'
	touch $(STAMP) $(DEMO_STAMP) $(DOCS_STAMP)

install: $(STAMP)

$(DOCS_STAMP): $(DEMO_STAMP)
	$(PY) -m pip install -q --no-compile -e '.[docs]'
	touch $(DOCS_STAMP)

# The real LM server of the server tests (llama-cpp-python[server], the server-test extra):
# built from source, 10-15 min on 2 cores the first time, then pip's wheel cache. Only
# `make test` needs it (not `make demo`). A failed build is not fatal: those tests then
# skip with the reason, and the next `make test` tries again.
# Built for a portable AVX2 x86-64, not -march=native: on a CPU with AMX (Sapphire Rapids and
# later) ggml's native build takes its AMX matmul path, which crashes (SIGSEGV in
# ggml_backend_amx_mul_mat, llama-cpp-python 0.3.36, seen on the CI-sized machine), and a
# native wheel in pip's cache would not run on an older CPU either.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
$(SERVER_STAMP): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install -q --no-compile -e '.[test,docs,server-test]' && \
	  touch $(SERVER_STAMP) || \
	  echo "warning: could not build llama-cpp-python[server]; the LM server tests will skip" >&2

assets: $(DEMO_STAMP)
	$(VENV)/bin/synthgen assets fetch --all

demo: assets
	$(VENV)/bin/synthgen pipeline --config demo

test: install $(SERVER_STAMP)
	$(VENV)/bin/synthgen assets fetch wiki-summaries-en chatterbot-corpus-en smollm2-135m-instruct all-minilm-l6-v2
	$(VENV)/bin/ruff check synthgen retriever dpsynth tests scripts
	$(VENV)/bin/lint-imports
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory suite

# The suite alone (`make test` builds the docs first: building them beside the suite gained
# nothing measurable, docs/development.md "Outside pytest").
suite: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# On a GPU or TPU machine: the tests marked `accelerator` and the DP core tests, at the
# device's own precision (docs/guides/gpu.md; scripts/device_check.sh runs them with the benches).
test-accelerator: install
	JAX_PLATFORMS=$${JAX_PLATFORMS:-cuda} $(PY) -m pytest -q -p no:cacheprovider \
	  tests/synthgen/test_ghost_clipping.py tests/synthgen/test_dp_train.py

# Pure-Python wheels that GPU images lack (dp-accounting, jax-privacy and their small
# dependencies), for the device's Python: scripts/device_check.sh installs them --no-deps.
DEVICE_PYTHON ?= 3.12
device-wheels:
	rm -rf .wheels
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d .wheels \
	  --python-version $(DEVICE_PYTHON) --platform manylinux2014_x86_64 \
	  dp-accounting==0.6.0 jax-privacy==2.0.0 mpmath dm-tree 'attrs<24' absl-py

# The documentation site, warnings as errors (a broken link or a renamed function fails).
docs: $(DOCS_STAMP)
	$(VENV)/bin/sphinx-build -E -W --keep-going -q -j auto -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

bench: install
	$(PY) scripts/bench_dp_step.py

lint: install
	$(VENV)/bin/ruff check synthgen retriever dpsynth tests scripts
	$(VENV)/bin/ruff format --check synthgen retriever dpsynth tests scripts
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache docs/_build

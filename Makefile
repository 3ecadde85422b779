# Two commands matter: `make demo` and `make test`. Both set everything up first.
VENV := .venv
export GLIBC_TUNABLES ?= glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736

.PHONY: setup demo test test-all lint bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/lmlab demo $(DEMO_ARGS)

# one pytest-xdist worker per core (a test file stays on one worker: its module fixtures are built
# once); TEST_WORKERS=0 runs the suite in this process
TEST_WORKERS ?= auto
PYTEST := $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# the kernels an AVX2-only host runs (torch, oneDNN, MKL, fbgemm, numba's loops), whatever this
# CPU has
AVX2_ONLY := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
	FBGEMM_ENABLE_INSTRUCTIONS=AVX2 NUMBA_CPU_NAME=haswell

# the suite, then its kernel-dependent tests again as an AVX2-only host runs them (docs/setup.md)
test: setup
	$(PYTEST) $(PYTEST_ARGS)
	$(AVX2_ONLY) $(PYTEST) -m "numerics and not slow" $(PYTEST_ARGS)

test-all: setup
	$(PYTEST) -m "" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check lmlab tests bench
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

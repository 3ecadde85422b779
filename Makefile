# Two commands matter: `make demo` and `make test`. Both set everything up first.
VENV := .venv
export GLIBC_TUNABLES ?= glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736

.PHONY: setup demo test test-all lint bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/lmlab demo $(DEMO_ARGS)

test: setup
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

test-all: setup
	$(VENV)/bin/python -m pytest -q -m "" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check lmlab tests bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

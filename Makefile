# The README's two commands: `make demo` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
JOBS ?= 2
SRC := $(wildcard ringattention models train tests benchmarks)
export PYTHONPATH := $(CURDIR)

.PHONY: demo demo-ring test test-all lint bench-work clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch (only for the Hugging Face parity tests); a local wheel is used where one exists.
	$(PIP) install -q torch==2.13.0 $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
	$(PIP) install -q -e ".[test]"
	touch $(STAMP)

# Trains the debug preset on the embedded corpus (8 virtual CPU devices: ring of 4 x fsdp 2), in a
# fresh run directory each time, then prints a sample.
demo: $(STAMP)
	$(PY) -m train --config configs/debug.yaml --run_dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

# Ring attention alone across 8 virtual CPU devices, checked against the reference.
demo-ring: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu $(PY) -m ringattention.demo

test: $(STAMP)
	$(VENV)/bin/ruff check $(SRC)
	$(PY) -m pytest -q -n $(JOBS) --durations=15 tests

test-all: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) -m "" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check $(SRC)
	$(VENV)/bin/ruff format --check $(SRC)

bench-work: $(STAMP)
	$(PY) benchmarks/work_counts.py > benchmarks/results/work_counts_n8.md

clean:
	rm -rf $(VENV) .pytest_cache

# The README's two commands: `make demo` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
JOBS ?= 2
SRC := $(wildcard ringattention models train tests benchmarks tools)
export PYTHONPATH := $(CURDIR)

.PHONY: demo demo-ring test test-all lint bench-work aot clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch (only for the Hugging Face parity tests); a local wheel is used where one exists.
	$(PIP) install -q torch==2.13.0 $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
	$(PIP) install -q -e ".[test]"
	# The TPU compiler (libtpu) matching the installed jax, for the TPU compile tests
	# (tests/test_contract.py); they skip, saying why, where no such libtpu exists.
	$(PIP) install -q "jax[tpu]==$$($(PY) -c 'import jax; print(jax.__version__)')" \
		|| echo "no libtpu for this jax on this platform: the TPU compile tests will skip"
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
	$(PY) -m pytest -q -rs -n $(JOBS) --durations=15 tests

test-all: $(STAMP)
	$(PY) -m pytest -q -rs -n $(JOBS) -m "" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check $(SRC)
	$(VENV)/bin/ruff format --check $(SRC)

bench-work: $(STAMP)
	$(PY) benchmarks/work_counts.py > benchmarks/results/work_counts_n8.md

# The Hopper kernels compiled for an H200 without a GPU (XLA's deviceless compile), with ptxas's
# registers and spills and the SASS of their hot loops (tools/hopper_aot.py):
# `make aot ARGS="--shape 32:8:128 --causal 0"`. Its own virtualenv: the GPU machine's jax (0.11.2,
# Python 3.12; AOT_PYTHON=/path/to/python3.12 where `python3.12` is not on PATH) with the CUDA 13
# plugin, ptxas 13.0 (the device's) and nvdisasm from PyPI. Not part of `make test`.
AOT_PYTHON ?= python3.12
AOT_VENV := .venv-aot
AOT_STAMP := $(AOT_VENV)/.installed

$(AOT_STAMP): Makefile
	$(AOT_PYTHON) -m venv $(AOT_VENV)
	$(AOT_VENV)/bin/pip install -q jax==0.11.2 jaxlib==0.11.2 jax-cuda13-plugin==0.11.2 \
		jax-cuda13-pjrt==0.11.2 absl-py einops "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-nvdisasm==13.*"
	touch $(AOT_STAMP)

aot: $(AOT_STAMP)
	$(AOT_VENV)/bin/python tools/hopper_aot.py $(ARGS)

clean:
	rm -rf $(VENV) $(AOT_VENV) .pytest_cache

# The README's two commands: `make demo` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
JOBS ?= 2
SRC := $(wildcard ringattention models train tests benchmarks tools)
export PYTHONPATH := $(CURDIR)

.PHONY: demo demo-ring test test-matrix test-all test-gpu lint bench-work aot clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch (only for the Hugging Face parity tests); a local wheel is used where one exists.
	$(PIP) install -q torch==2.13.0 $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
	$(PIP) install -q -e ".[test]"
	# XLA's GPU plugin, for the deviceless compiles for an H200 (tests/test_gpu_aot.py); nothing
	# runs on a GPU, and the tests set JAX_PLATFORMS=cpu.
	$(PIP) install -q "jax-cuda13-plugin==$$($(PY) -c 'import jax; print(jax.__version__)')" \
		"jax-cuda13-pjrt==$$($(PY) -c 'import jax; print(jax.__version__)')"
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
	$(VENV)/bin/ruff format --check $(SRC)
	$(PY) -m pytest -q -rs -n $(JOBS) --durations=15 $(MAIN_MARKS) tests
	$(MAKE) --no-print-directory test-matrix

# The jax matrix: what a GPU or TPU user's jax would see, on Python 3.12, each jax in a virtualenv
# of its own (.venv-jax<version>: jax, its CUDA plugin and libtpu, the model's dependencies; no
# torch, so the Hugging Face parity tests run on .venv's jax only). GPU_JAX (0.11.2, the jax of
# current CUDA images) runs the GPU kernels (Triton, Hopper) in interpret mode, the contract, the
# model and the deviceless H200 compiles; the newest jax (what TPU users install) runs the TPU
# kernel, the contract (every kernel once against float64), the model and the H200 compiles (every
# Hopper kernel lowered and compiled). Python 3.12 is found on PATH or under pyenv
# (MATRIX_PYTHON=/path/to/python3.12 to choose one); where none exists the matrix is skipped,
# saying so. Tests marked `once` (the float32 Triton compiles, the bfloat16 ring compiles at head
# dims 64 and 256, the Hopper options on a ring of 4, a benchmark script's table) run on .venv's
# jax only; with the matrix, .venv's jax (no CUDA image ships it) leaves the other H200 compiles
# (marked `gpu_jax`) to the legs. So make test keeps to 45 minutes on 2 cores.
MATRIX_JAX ?= 0.12.1 0.11.2
GPU_JAX ?= 0.11.2
MATRIX_PYTHON ?= $(shell for p in python3.12 $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo $$p; break; }; done)
MATRIX_COMMON := tests/test_contract.py tests/test_gpu_aot.py tests/test_model.py \
	tests/test_model_window.py tests/test_remat.py
MATRIX_TESTS_GPU := $(wildcard tests/test_pallas_gpu*.py tests/test_hopper_*.py) \
	$(MATRIX_COMMON)
MATRIX_TESTS_NEWEST := $(wildcard tests/test_pallas_tpu*.py) $(MATRIX_COMMON)
MAIN_MARKS = $(if $(and $(strip $(MATRIX_PYTHON)),$(strip $(MATRIX_JAX))),-m "not slow and (once or not gpu_jax)",)
MATRIX_DEPS := einops "flax>=0.10" "optax>=0.2" "safetensors>=0.4" numpy "orbax-checkpoint>=0.11" \
	"pyyaml>=6" fsspec tqdm "chex>=0.1.88" "pytest>=8" "pytest-xdist>=3"

.venv-jax%/.installed: Makefile
	$(MATRIX_PYTHON) -m venv .venv-jax$*
	.venv-jax$*/bin/pip install -q --upgrade pip
	.venv-jax$*/bin/pip install -q "jax==$*" "jaxlib==$*" "jax-cuda13-plugin==$*" \
		"jax-cuda13-pjrt==$*" $(MATRIX_DEPS)
	.venv-jax$*/bin/pip install -q "jax[tpu]==$*" \
		|| echo "no libtpu for jax $* on this platform: its TPU compile tests will skip"
	touch $@

test-matrix:
ifeq ($(strip $(MATRIX_PYTHON)),)
	@echo "jax matrix SKIPPED: no Python 3.12 found on PATH or under pyenv (set MATRIX_PYTHON=...);" \
		"only .venv's jax was tested"
else
	@for v in $(MATRIX_JAX); do \
		$(MAKE) --no-print-directory .venv-jax$$v/.installed || exit 1; \
		tests="$(MATRIX_TESTS_NEWEST)"; [ $$v = $(GPU_JAX) ] && tests="$(MATRIX_TESTS_GPU)"; \
		echo "== jax $$v (Python 3.12): $$tests"; \
		.venv-jax$$v/bin/python -m pytest -q -rs -n $(JOBS) -p no:cacheprovider -m "not slow and not once" \
			$$tests || exit 1; \
	done
endif

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

# What only a GPU shows (tests/test_gpu_suite.py), on the GPU machine's own Python and jax (no
# virtualenv: such machines often have no network): `make test-gpu` there, under 8 minutes on one
# H100 or H200. Writes benchmarks/results/gpu_suite.md (GPU_SUITE_MD=... to write elsewhere).
GPU_PYTHON ?= python3
GPU_SUITE_MD ?= benchmarks/results/gpu_suite.md
# GPU_JOBS pytest workers share the GPU (compiling is most of the suite's time; each worker, and
# the trainer the suite launches, allocates GPU memory as it goes); COMMIT= names the commit where
# the machine's copy of the tree has no .git.
GPU_JOBS ?= 4
test-gpu:
	JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false $(GPU_PYTHON) -m pytest -q -rs \
		-n $(GPU_JOBS) -p no:cacheprovider --durations=10 --junitxml=$(GPU_SUITE_MD:.md=.xml) \
		tests/test_gpu_suite.py; \
		rc=$$?; $(GPU_PYTHON) tools/gpu_suite_summary.py $(GPU_SUITE_MD:.md=.xml) $(GPU_SUITE_MD) \
		$(if $(COMMIT),--commit $(COMMIT),); exit $$rc

clean:
	rm -rf $(VENV) $(AOT_VENV) .venv-jax* .pytest_cache

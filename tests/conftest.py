"""Test setup: 8 virtual CPU devices, set before jax is imported anywhere (JAX_PLATFORMS=cpu unless
set otherwise: ``make test-gpu`` sets cuda and runs on the GPU it finds)."""

import importlib
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ["JAX_PLATFORMS"] == "cpu":
    # LLVM optimization level 0: the suite is dominated by compiling many small programs, which
    # this makes ~30% faster; HLO passes (collectives, buffer assignment, memory analysis) are
    # unchanged.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    ).strip()
# libtpu (installed by `make test` for the TPU compile tests) takes a lock per process otherwise, and
# the suite's parallel workers each load it to compile for a TPU topology.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")


@pytest.fixture(scope="module")
def bench():
    """A script of ``tools/`` as a module, by name (the test_tools_*.py files; the
    test_benchmarks_*.py files take bench_cases.py's, for ``benchmarks/``)."""
    sys.path.insert(0, TOOLS)
    yield lambda name: importlib.import_module(name)
    sys.path.remove(TOOLS)


@pytest.fixture
def forward_loops_used(monkeypatch):
    """Records (loop, ping-pong, compute warpgroups) for each Hopper forward traced: which of
    ``fwd_loops``' ``loops`` / ``overlap_loops`` it ran (they still run)."""
    from ringattention.kernels.hopper import fwd_loops as hfl

    used = []

    def recorded(name, loop):
        def run(w):
            used.append((name, w.cfg.pingpong, w.cfg.wgs))
            return loop(w)

        return run

    for name in ("loops", "overlap_loops"):
        monkeypatch.setattr(hfl, name, recorded(name, getattr(hfl, name)))
    return used


@pytest.fixture
def registered():
    """pallas_hopper claims every optional feature (implementations.py); for the tests of the
    features in the Hopper forward (test_hopper_features_fwd*.py)."""
    from ringattention import implementations

    assert implementations.resolve("pallas_hopper").features == frozenset(implementations.FEATURES)

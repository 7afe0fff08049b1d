"""What the tests of the benchmark scripts share: ``BENCH``, the benchmarks/ folder, and the ``bench``
fixture, a script of it as a module by name (in place of conftest's ``bench``, for ``tools/``; import
``bench_fixture`` to use it).

The tests: test_benchmarks_model.py (the model-level scripts), test_benchmarks_attention.py (the
attention-level ones), test_benchmarks_options.py (``options.py``) and test_benchmarks_results.py
(the committed results and charts).
"""

import importlib
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture(scope="module", name="bench")
def bench_fixture():
    sys.path.insert(0, BENCH)
    yield lambda name: importlib.import_module(name)
    sys.path.remove(BENCH)

"""Every relative link in the README, docs/, benchmarks/ and tools/ names a file that exists (results
the docs cite must be committed)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "benchmarks").glob("**/*.md")),
    *sorted((ROOT / "tools").glob("*.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(path: pathlib.Path) -> list[str]:
    links = [m.group(1).split("#")[0] for m in LINK.finditer(path.read_text())]
    return [x for x in links if x and not re.match(r"[a-z]+:", x)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_exist(doc):
    missing = [x for x in _relative_links(doc) if not (doc.parent / x).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


def test_tested_jax_versions_are_stated():
    """The jax matrix of ``make test`` (Makefile MATRIX_JAX) lies in pyproject's jax range, whose
    lower bound is tested too, and the README names every version."""
    make = (ROOT / "Makefile").read_text()
    matrix = re.search(r"^MATRIX_JAX \?= (.+)$", make, re.M).group(1).split()
    lo, hi = re.search(r'"jax>=([\d.]+),<([\d.]+)"', (ROOT / "pyproject.toml").read_text()).groups()
    key = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    readme = (ROOT / "README.md").read_text()
    for v in [lo, *matrix]:
        assert key(lo) <= key(v) < key(hi), (v, lo, hi)
        assert v in readme, f"README does not name the tested jax {v}"

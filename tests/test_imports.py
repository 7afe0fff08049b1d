"""Imports point one way: train -> models -> ringattention (checked on the source, every file); the
library never imports benchmarks/ (its cost model, ``ringattention.strategy``, stands alone); no
module of ringattention imports one that imports it back, however lazily; ``import ringattention``
registers every kernel without importing one."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORBIDDEN = {"ringattention": {"models", "train", "benchmarks"}, "models": {"train"}, "train": set()}


def imported_packages(path: pathlib.Path) -> set[str]:
    """Top-level names a file imports anywhere (module level or inside functions), including
    ``importlib.import_module("x.y")`` with a literal name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value).split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    bad = {str(f.relative_to(ROOT)): sorted(imported_packages(f) & FORBIDDEN[package]) for f in files}
    assert not {f: b for f, b in bad.items() if b}, f"{package} must not import {FORBIDDEN[package]}"


def test_the_checker_sees_nested_and_dynamic_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "import importlib\ndef g():\n    from train.x import y\n    importlib.import_module('models.z')\n"
    )
    assert imported_packages(f) >= {"train", "models", "importlib"}


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: pathlib.Path, name: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` (file ``path``) imports anywhere: at
    module level, inside functions or under ``if TYPE_CHECKING:``, ``from x import y`` counting
    as an import of ``x.y`` where that is a module, relative imports resolved, and
    ``importlib.import_module("x.y")`` with a literal name. Python running a package's
    ``__init__`` before its submodules is no edge (every package would be a circle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def add(target: str) -> None:  # the longest prefix of target that is one of ``modules``
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            for alias in node.names:
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            add(str(node.args[0].value))
    return found - {name}


def import_graph(package_dir: pathlib.Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (``module_imports``)."""
    root = package_dir.parent
    files = {_module_name(f, root): f for f in sorted(package_dir.rglob("*.py"))}
    return {name: module_imports(f, name, set(files)) for name, f in files.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The shortest circle through each module that is on one, as [a, b, ..., a] starting at its
    smallest module, each circle once (the strongly connected parts of ``graph``, Tarjan)."""
    index, low, stack, on, parts = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                parts.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for part in parts:
        for v in sorted(part):
            c = _circle_through(graph, part, v)[:-1]
            c = c[c.index(min(c)) :] + c[: c.index(min(c))]
            if [*c, c[0]] not in circles:
                circles.append([*c, c[0]])
    return circles


def _circle_through(graph, part: set[str], start: str) -> list[str]:
    """A shortest circle through ``start`` inside ``part`` (breadth first)."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & part):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError(part)


def test_no_import_circle_inside_ringattention():
    """No module of ringattention imports (at any depth, lazily or for type checking only) a module
    that imports it back: shared pieces live in modules of their own (``ring_step``, ``lap_plan``,
    ``kernels/common``, ``kernels/hopper/mosaic``)."""
    graph = import_graph(ROOT / "ringattention")
    assert "ringattention.kernels.hopper.pallas_hopper" in graph, sorted(graph)
    circles = import_circles(graph)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_circle_checker_sees_lazy_typing_and_from_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import X\n"
    )
    (pkg / "c.py").write_text("import importlib\nimportlib.import_module('pkg.a')\n")
    (pkg / "d.py").write_text("from pkg import a\n")  # into the circle, not part of it
    graph = import_graph(pkg)
    assert graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.d"] == {"pkg.a"}
    assert import_circles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]


def test_importing_ringattention_registers_every_kernel_without_importing_one():
    """``import ringattention`` registers every implementation (the backend packages of
    ``ringattention.kernels``, in the order of before) but imports no step module and no Pallas
    backend: Mosaic GPU, Triton and Mosaic TPU load with the step that uses them
    (``Implementation.load``, or "auto" asking whether a GPU kernel is available on a GPU mesh)."""
    code = (
        "import sys\n"
        "from ringattention import implementations\n"
        "print(implementations.names())\n"
        "print(sorted(m for m in sys.modules if m.startswith(('jax.experimental.pallas',\n"
        "             'jax._src.pallas', 'ringattention.kernels'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout.splitlines()
    assert out[0] == str(("auto", "xla", "pallas_tpu", "pallas_gpu", "pallas_hopper")), out
    packages = ["ringattention.kernels", *(f"ringattention.kernels.{p}" for p in ("hopper", "tpu", "triton"))]
    assert out[1] == str(packages), out

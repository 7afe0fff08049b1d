"""Imports point one way: train -> models -> ringattention (checked on the source, every file); the
library never imports benchmarks/ (its cost model, ``ringattention.strategy``, stands alone)."""

from __future__ import annotations

import ast
import pathlib

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
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
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
    f.write_text("import importlib\ndef g():\n    from train.x import y\n"
                 "    importlib.import_module('models.z')\n")
    assert imported_packages(f) >= {"train", "models", "importlib"}

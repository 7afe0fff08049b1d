"""Executes every notebook in notebooks/ top to bottom with small settings (RINGATTENTION_NB_SMALL=1).

The kernel is ipykernel in this interpreter ("python3" resolves to the running Python when ipykernel
is installed in it); it inherits this process's environment, so it sees 8 virtual CPU devices and the
repository on PYTHONPATH. A cell that raises fails the test with the cell's traceback.
"""

import os
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def _kernel_env(tmp_path) -> dict:
    env = dict(os.environ)
    env["RINGATTENTION_NB_SMALL"] = "1"
    env["RINGATTENTION_NB_WORKDIR"] = str(tmp_path)  # notebooks write run dirs / checkpoints here
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def test_notebooks_found():
    assert [p.name for p in NOTEBOOKS], "no notebooks under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{path.name} is committed with outputs; clear them"
    )
    for key, value in _kernel_env(tmp_path).items():
        monkeypatch.setenv(key, value)  # the kernel process inherits os.environ
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
    )
    try:
        client.execute()
    finally:
        nbformat.write(nb, tmp_path / path.name)  # the executed copy, for inspection on failure
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"
    ]
    assert not errors, errors
    images = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})
    ]
    assert images, f"{path.name} drew no figure"

"""The wheel as a user installs it: commands, presets and the corpus, away from the checkout."""

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

PROBE = """
import pathlib, sys
import train
from train import config, data
pkg = pathlib.Path(train.__file__).resolve()
assert str(pkg).startswith(sys.argv[1]), pkg  # the installed copy, not the checkout
cfg = config.load("debug", ["--steps=3"])
docs = data.read_documents(data.default_paths())
print(cfg.steps, len(docs), config.presets())
"""
# two steps of the debug preset, small, with one checkpoint and no sample, evaluation or TensorBoard
SHORT_RUN = [
    "--steps=2",
    "--data.seq_len=64",
    "--data.batch_size=4",
    "--sample.tokens=0",
    "--eval.every=0",
    "--log.progress=false",
    "--log.tensorboard=false",
    "--checkpoint.every=2",
    "--optim.warmup_steps=1",
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(prefix, site-packages) of the wheel built from this checkout and installed with --prefix."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy: setuptools builds in the source tree's build/
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "ringattention", "models", "train", "configs"):
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        elif (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(
        [*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist")],
        check=True,
        cwd=tmp,
    )
    wheel = next((tmp / "dist").glob("*.whl"))
    prefix = tmp / "prefix"
    # --ignore-installed: without it pip finds this checkout's editable install in the venv and
    # either skips the prefix ("already satisfied") or uninstalls the venv's copy
    subprocess.run(
        [*pip, "install", "--no-deps", "--ignore-installed", "--prefix", str(prefix), str(wheel)], check=True
    )
    site = next(prefix.glob("lib/python*/site-packages"))
    return wheel, prefix, site


def _env(site):
    # the installed copy only: not the checkout the Makefile puts on PYTHONPATH
    return {**os.environ, "PYTHONPATH": str(site)}


def test_the_wheel_holds_the_corpus_the_presets_and_the_commands(installed):
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "train/corpus/kjv.jsonl" in names
    # exactly three top-level packages: the library, the model, the trainer (no alias packages)
    top = {n.split("/")[0] for n in names if n.endswith(".py")}
    assert top == {"ringattention", "models", "train"}, top
    presets = {p.stem for p in (ROOT / "configs").glob("*.yaml")}
    shipped = {pathlib.Path(n).stem for n in names if "/share/ringattention/configs/" in n}
    assert presets and shipped == presets
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "ringattention-train = train.__main__:main" in text
    assert "ringattention-generate = train.generate:cli" in text


def test_the_commands_run_from_a_folder_of_a_users_own_models_py_and_train_py(installed, tmp_path):
    """A console script's own bin folder, not the working directory, is first on its import path,
    so the installed ``models`` and ``train`` win over a user's files of those names (which
    ``python -m train`` would import instead: the README sends such users to the commands)."""
    _, prefix, site = installed
    user = tmp_path / "project"
    user.mkdir()
    for name in ("models", "train", "data", "config"):  # a user's own files with generic names
        (user / f"{name}.py").write_text(f"raise SystemExit('the user {name}.py was imported')\n")
    probe = tmp_path / "bin" / "probe.py"  # like a console script: its folder, not cwd, is on the path
    probe.parent.mkdir()
    probe.write_text(PROBE)
    out = subprocess.run(
        [sys.executable, str(probe), str(site)], cwd=user, env=_env(site), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    steps, docs, presets = out.stdout.split(maxsplit=2)
    assert steps == "3" and int(docs) > 100 and "debug" in presets
    bin_ = prefix / "bin"
    help_ = subprocess.run(
        [str(bin_ / "ringattention-train"), "--help"],
        cwd=user,
        env=_env(site),
        capture_output=True,
        text=True,
    )
    assert help_.returncode == 0 and "usage:" in help_.stdout, help_.stderr
    # a short run of the preset on the shipped corpus, then a sample from its checkpoint
    run = subprocess.run(
        [str(bin_ / "ringattention-train"), "--config", "debug", *SHORT_RUN, "--run_dir=run"],
        cwd=user,
        env=_env(site),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "done: step 2, run_dir run" in run.stderr + run.stdout, run.stderr
    gen = subprocess.run(
        [
            str(bin_ / "ringattention-generate"),
            "--run_dir",
            "run",
            "--prompt",
            "And",
            "--max-new-tokens",
            "3",
        ],
        cwd=user,
        env=_env(site),
        capture_output=True,
        text=True,
    )
    assert gen.returncode == 0 and gen.stdout.endswith("\n"), gen.stderr  # the sampled text's line


def test_a_missing_config_names_the_presets(tmp_path):
    from train import config

    with pytest.raises(FileNotFoundError, match=r"'nope.yaml'.*presets: \[.*'debug'"):
        config.load("nope.yaml")
    assert config.preset_path("debug") == str(ROOT / "configs" / "debug.yaml")

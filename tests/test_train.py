"""End-to-end training on the debug preset (8 virtual CPU devices, ring of 4 x fsdp 2)."""

from __future__ import annotations

import os
import pathlib

import chex
import jax
import numpy as np
import pytest

from models import llama
from train import __main__ as cli
from train import config as config_lib
from train import generate as train_generate
from train import train
from train.checkpoint import Checkpointer, CheckpointError
from train.metrics import read_metrics

# Restoring the deliberately damaged checkpoint below makes orbax read arrays in parallel and raise
# one error; the other reads' futures are dropped and reported later, against whichever test runs.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
DEBUG = str(pathlib.Path(__file__).resolve().parent.parent / "configs" / "debug.yaml")
RESUME_RTOL = 1e-6  # same program, same data: only float reassociation may differ
SMALL = [
    "--data.seq_len=64",
    "--data.batch_size=4",
    "--log.every=1",
    "--sample.tokens=0",
    "--eval.every=0",
    "--eval.batches=1",
    "--log.progress=false",
    "--log.tensorboard=false",
    "--optim.warmup_steps=2",
    "--checkpoint.every=2",
    "--checkpoint.keep=2",
    "--steps=6",
]
# Every run below shares steps=6 (the schedule) and stops early with stop_at, so they share one
# compiled train step.


def small(run_dir, *extra: str) -> config_lib.TrainConfig:
    return config_lib.load(DEBUG, [*SMALL, f"--run_dir={run_dir}", *extra])


def _losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(str(run_dir)) if "loss" in r}


def test_loss_decreases_and_run_dir_is_complete(tmp_path):
    result = train.main(small(tmp_path, "--sample.tokens=4", "--log.tensorboard=true"))
    losses = [result.losses[s] for s in sorted(result.losses)]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    records = [r for r in read_metrics(str(tmp_path)) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, 7))
    for key in (
        "step",
        "loss",
        "lr",
        "grad_norm",
        "tokens_per_sec",
        "mfu",
        "seq_len",
        "flops_per_token",
        "model_flops",
        "peak_tflops",
        "peak_source",
    ):
        assert all(key in r for r in records)
    assert all(r["seq_len"] == 64 for r in records)
    # FLOPs counted from the packed documents (log.every=1: each record's window is its own step):
    # never more than one 64-token document per row (packing: tests/test_flops.py)
    model = llama.get_config("debug", **small(tmp_path).model.overrides)
    assert all(r["model_flops"] == r["flops_per_token"] * 4 * 64 for r in records)
    assert all(r["flops_per_token"] <= llama.flops_per_token(model, 64) for r in records)
    assert {(r["peak_tflops"], r["peak_source"]) for r in records} == {(0.1, "nominal")}  # CPU
    assert result.eval_loss is not None and np.isfinite(result.eval_loss)
    assert isinstance(result.sample, str)
    assert Checkpointer(str(tmp_path / "checkpoints"), keep=2, async_save=False).steps() == [4, 6]
    assert list((tmp_path / "tensorboard").iterdir())
    assert (tmp_path / "config.yaml").exists()
    # generation from the run directory (the training side's entry; models never imports train)
    config, params, tok = train_generate.load_run(str(tmp_path))
    assert config == llama.get_config("debug", **small(tmp_path).model.overrides)
    chex.assert_trees_all_equal(params, jax.device_get(result.params))
    texts = train_generate.main(["--run_dir", str(tmp_path), "--prompt", "And", "--max-new-tokens", "3"])
    assert len(texts) == 1 and isinstance(texts[0], str)


def test_resume_is_exact(tmp_path):
    one = train.main(small(tmp_path / "one"))
    two_dir = tmp_path / "two"
    first = train.main(small(two_dir, "--stop_at=3"))
    assert first.step == 3
    # a save that was interrupted (never renamed / never committed) must not be resumed
    (two_dir / "checkpoints" / "5.orbax-checkpoint-tmp-1").mkdir()
    (two_dir / "checkpoints" / "6").mkdir()  # no commit marker: an interrupted save
    (two_dir / "checkpoints" / "6" / "params").mkdir()
    second = train.main(small(two_dir))
    kept = list((two_dir / "checkpoints").glob("incomplete.6.*/params"))
    assert kept, "the interrupted save must be set aside, not deleted"
    losses_two = {**first.losses, **second.losses}
    assert sorted(second.losses) == [4, 5, 6]
    np.testing.assert_allclose(
        [losses_two[s] for s in range(1, 7)], [one.losses[s] for s in range(1, 7)], rtol=RESUME_RTOL
    )
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(second.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RESUME_RTOL, atol=RESUME_RTOL)


def test_ulysses_mesh_trains_and_resumes_exactly(tmp_path):
    # The sequence over sp=2 x usp=2 (heads exchanged over usp around a ring of 2): the loss goes
    # down and a resumed run equals an uninterrupted one. (That its gradients are the ring's:
    # tests/test_model.py::test_ring_gradients_equal_reference.)
    usp = ["--mesh.sp=2", "--mesh.usp=2"]
    first = train.main(small(tmp_path / "two", *usp, "--stop_at=3"))
    second = train.main(small(tmp_path / "two", *usp))
    whole = train.main(small(tmp_path / "whole", *usp))
    assert whole.losses[6] < whole.losses[1]
    resumed = {**first.losses, **second.losses}
    np.testing.assert_allclose(
        [resumed[s] for s in range(1, 7)], [whole.losses[s] for s in range(1, 7)], rtol=RESUME_RTOL
    )
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(second.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RESUME_RTOL, atol=RESUME_RTOL)


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    whole = train.main(small(tmp_path / "whole", "--stop_at=2"))
    accum = train.main(small(tmp_path / "accum", "--stop_at=2", "--optim.accum_steps=2"))
    np.testing.assert_allclose(
        [accum.losses[s] for s in (1, 2)], [whole.losses[s] for s in (1, 2)], rtol=1e-5
    )


def test_init_from_hugging_face_checkpoint(tmp_path):
    from models import llama

    trained = train.main(small(tmp_path / "trained"))
    model = llama.get_config("debug", **small(tmp_path).model.overrides)
    llama.save_hf(model, jax.device_get(trained.params), str(tmp_path / "hf"))
    tuned = train.main(small(tmp_path / "tuned", "--stop_at=1", f"--model.init_from={tmp_path}/hf"))
    assert tuned.losses[1] < trained.losses[1]  # starts from the trained weights
    with pytest.raises(ValueError, match="does not match"):
        train.main(
            small(
                tmp_path / "bad",
                "--stop_at=1",
                f"--model.init_from={tmp_path}/hf",
                "--model.overrides.intermediate_size=64",
            )
        )


def _snapshot(directory: pathlib.Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_checkpoint_errors_change_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    first = train.main(small(run, "--stop_at=4"))
    ckpts = run / "checkpoints"
    before = _snapshot(ckpts)
    with pytest.raises(CheckpointError, match="resume=never"):
        train.main(small(run, "--stop_at=4", "--checkpoint.resume=never"))
    assert _snapshot(ckpts) == before
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        train.main(small(tmp_path / "empty", "--stop_at=2", "--checkpoint.resume=required"))
    with pytest.raises(CheckpointError, match="resume=3: .* complete steps: \\[2, 4\\]"):
        train.main(small(run, "--stop_at=4", "--checkpoint.resume=3"))
    # corrupt the newest checkpoint's array data: a clear error naming the step and the older
    # complete ones, files untouched
    for p in (ckpts / "4" / "params").rglob("*"):
        if p.is_file() and "d" in p.parent.name:
            p.write_bytes(b"garbage")
    before = _snapshot(ckpts)
    with pytest.raises(CheckpointError, match="step=4 .* corrupt .* --checkpoint.resume=2"):
        train.main(small(run, "--stop_at=6"))
    assert _snapshot(ckpts) == before
    assert not (ckpts / "6").exists()
    # the command line says it in one line
    assert cli.main(["--config", DEBUG, *SMALL, f"--run_dir={run}", "--cpu_devices=0", "--stop_at=6"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("checkpoint error: checkpoint step=4") and "\n" not in err
    # resume the older step by number: the damaged one is set aside (kept), training goes on
    again = train.main(small(run, "--stop_at=4", "--checkpoint.resume=2"))
    assert list(ckpts.glob("superseded.4.*/params"))
    assert sorted(again.losses) == [3, 4]
    np.testing.assert_array_equal([again.losses[s] for s in (3, 4)], [first.losses[s] for s in (3, 4)])


@pytest.mark.parametrize(
    "bad, error",
    [
        (
            "--data.paths=[/nonexistent/*.jsonl]",
            "config error: data.paths entry '/nonexistent/*.jsonl' matches no file",
        ),
        ("--data.seq_len=60", "config error: data.seq_len=60 does not fit the ring"),
    ],
)
def test_setup_mistakes_are_one_config_error_line(tmp_path, capsys, bad, error):
    code = cli.main(["--config", DEBUG, *SMALL, f"--run_dir={tmp_path}", "--cpu_devices=0", bad])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(error) and "\n" not in err, err


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["--mesh.sp=4", "--mesh.fsdp=4"], "dp\\*fsdp\\*tp\\*sp\\*usp=16"),
        (["--mesh.fsdp=1", "--mesh.sp=2", "--mesh.usp=4", "--data.seq_len=36"], "mesh.sp\\*mesh.usp=8"),
        (["--data.seq_len=60"], "data.seq_len=60"),
        (["--data.seq_len=96", "--model.overrides.q_chunk=16"], "multiple of the attention block"),
        (["--data.batch_size=3", "--mesh.fsdp=2"], "batch_size=3"),
        (["--model.overrides.vocab_size=128"], "vocab_size"),
    ],
)
def test_bad_setup_is_a_clear_error(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        train.main(small(tmp_path, *overrides))
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_empty_data_is_an_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    with pytest.raises(ValueError, match="no non-empty documents"):
        train.main(small(tmp_path / "run", f"--data.paths=[{empty}]"))


@pytest.mark.slow
def test_progressive_stages_start_from_previous(tmp_path):
    config = small(
        tmp_path,
        "--stages=[{steps: 3, seq_len: 32, rope_theta: 1.0e4}, {steps: 3, seq_len: 64, rope_theta: 1.0e5}]",
    )
    result = train.main(config)
    assert result.run_dir.endswith("stage_1") and result.step == 3
    first = _losses(tmp_path / "stage_0")
    second = _losses(tmp_path / "stage_1")
    assert second[1] < first[1]  # started from trained weights, not from scratch
    assert {r["seq_len"] for r in read_metrics(str(tmp_path / "stage_1")) if "loss" in r} == {64}


def test_cpu_devices_must_match(tmp_path):
    with pytest.raises(ValueError, match="cpu_devices=4"):
        train.main(small(tmp_path, "--cpu_devices=4"))
    assert os.environ.get("JAX_PLATFORMS", "cpu") == "cpu"


def test_failed_restore_reports_are_dropped():
    # After a damaged checkpoint fails to restore, orbax's abandoned parallel reads each report an
    # unraisable exception (pages of "Event loop is closed" tracebacks around the one-line
    # `checkpoint error`); the hook drops those and passes any other report on.
    import types

    from train import checkpoint

    async def _read_array_index_and_device_put():  # named like orbax's coroutine
        pass

    orbax_coro = _read_array_index_and_device_put()
    orbax_coro.close()
    code = orbax_coro.cr_code.replace(co_filename="/x/orbax/checkpoint/serialization.py")
    passed = []
    hook = checkpoint._quiet_hook(passed.append)
    report = lambda exc, obj=None: types.SimpleNamespace(exc_value=exc, object=obj)  # noqa: E731
    hook(report(RuntimeError("Event loop is closed")))
    hook(report(Exception("Encountered error while reading"), types.SimpleNamespace(cr_code=code)))
    other = report(ValueError("a user's own bug"))
    hook(other)
    assert passed == [other]


def test_nonfinite_step_is_never_saved(tmp_path, capsys):
    # The run: a huge lr without clipping makes a step's gradient norm NaN.
    import re

    from train.guard import NonFiniteError

    bad = ["--optim.lr=1e6", "--optim.clip_norm=0", "--checkpoint.every=1", "--checkpoint.keep=1"]
    with pytest.raises(NonFiniteError) as info:
        train.main(small(tmp_path / "stop", *bad))
    step = int(
        re.match(
            r"step (\d+): loss=\S+ grad_norm=\S+ is not finite; no update from it was "
            r"saved\. The last good step is (\d+)",
            str(info.value),
        )[1]
    )
    assert (
        f"The last good step is {step - 1} and its newest checkpoint is step {step - 1} in "
        f"'{tmp_path / 'stop' / 'checkpoints'}': relaunch to resume from it" in str(info.value)
    )
    ckpt = Checkpointer(str(tmp_path / "stop" / "checkpoints"), keep=1, async_save=False)
    assert ckpt.steps() == [step - 1]  # keep=1 kept the newest finite one
    from models.sharding import MeshConfig, make_mesh
    from train.steps import abstract_params

    like = abstract_params(
        llama.get_config("debug", **small(tmp_path).model.overrides), make_mesh(MeshConfig(fsdp=2, sp=4))
    )
    saved = ckpt.restore(step - 1, like)["params"]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(saved))
    # the command line: one line, exit status 1
    assert (
        cli.main(["--config", DEBUG, *SMALL, f"--run_dir={tmp_path / 'cli'}", "--cpu_devices=0", *bad]) == 1
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"training stopped: step {step}: ") and "\n" not in err, err
    # skip_nonfinite=N: such steps' updates are skipped, the run goes on and saves finite states
    skipped = train.main(small(tmp_path / "skip", *bad, "--skip_nonfinite=10"))
    assert skipped.step == 6
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(skipped.params))
    assert f"step {step}: loss=" in capsys.readouterr().out
    # a stop after skipped steps: their checkpoints hold no update of theirs, and the line says so
    with pytest.raises(
        NonFiniteError,
        match=rf"steps {step}-{step + 1} had a non-finite .*; no "
        rf"update from them was saved\. The last good step is {step - 1} and its "
        rf"newest checkpoint is step {step} .* \(steps {step}-{step} were skipped",
    ):
        train.main(small(tmp_path / "skip1", *bad, "--skip_nonfinite=1"))


def test_resume_checks_steps_changes_eval_and_metrics(tmp_path):
    import json

    from train.config import ConfigError

    run = tmp_path / "run"
    train.main(small(run, "--stop_at=4"))
    config_yaml = (run / "config.yaml").read_text()
    with pytest.raises(
        ConfigError, match=f"stop_at=3 but run_dir '{run}' already holds step 4: nothing to train"
    ):
        train.main(small(run, "--stop_at=3"))
    with pytest.raises(ConfigError, match="stop_at=4 but .* already holds step 4"):
        train.main(small(run, "--stop_at=4"))  # its final evaluation is there: nothing to do
    with pytest.raises(
        ConfigError,
        match=r"holds step 4 of a run with other data or model options: "
        r"data.seed 0 -> 1, data.seq_len 64 -> 32 \(saved -> now\)"
        r".*--resume.allow_changes=true",
    ):
        train.main(small(run, "--data.seed=1", "--data.seq_len=32"))
    assert (run / "config.yaml").read_text() == config_yaml
    # killed after checkpoint 4, before its final evaluation, with step 5 already logged
    records = [r for r in read_metrics(str(run)) if "eval_loss" not in r]
    records.append({**records[-1], "step": 5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    final = train.main(small(run, "--stop_at=4"))
    assert final.losses == {} and final.eval_loss is not None  # the evaluation alone ran
    assert [r["step"] for r in read_metrics(str(run))] == [1, 2, 3, 4, 4]
    # a data change the user asks for, and a logging change: both recorded in config.yaml
    rest = train.main(small(run, "--data.seed=1", "--resume.allow_changes=true", "--log.every=2"))
    assert sorted(rest.losses) == [5, 6]  # the first resumed step is always logged
    steps = [(r["step"], "eval_loss" in r) for r in read_metrics(str(run))]
    assert len(steps) == len(set(steps)) and max(s for s, _ in steps) == 6
    header = (run / "config.yaml").read_text().splitlines()[0]
    assert header == "# resumed at step 4: data.seed 0 -> 1, log.every 1 -> 2"
    saved = config_lib.load(str(run / "config.yaml"))
    assert (saved.data.seed, saved.log.every) == (1, 2)


def test_resume_with_another_batch_split_or_a_change_the_checkpoint_cannot_take(tmp_path):
    import shutil

    run = tmp_path / "run"
    train.main(small(run, "--stop_at=2"))
    config_yaml = (run / "config.yaml").read_text()
    # an allowed change that the checkpoint cannot take fails, and records nothing
    with pytest.raises(CheckpointError, match="checkpoint step=2"):
        train.main(small(run, "--model.overrides.num_layers=1", "--resume.allow_changes=true"))
    assert (run / "config.yaml").read_text() == config_yaml
    for name in ("accum", "batch"):
        shutil.copytree(run, tmp_path / name)
    same = train.main(small(run, "--stop_at=3"))  # the unchanged config still resumes
    # another accumulation split of the same batch: the same sequences, the same loss
    accum = train.main(
        small(tmp_path / "accum", "--optim.accum_steps=2", "--resume.allow_changes=true", "--stop_at=3")
    )
    np.testing.assert_allclose(accum.losses[3], same.losses[3], rtol=1e-5)
    assert (
        (tmp_path / "accum" / "config.yaml")
        .read_text()
        .startswith("# resumed at step 2: optim.accum_steps 1 -> 2")
    )
    # another batch size: new streams of documents, from their first documents
    batch = train.main(
        small(tmp_path / "batch", "--data.batch_size=8", "--resume.allow_changes=true", "--stop_at=3")
    )
    assert sorted(batch.losses) == [3] and np.isfinite(batch.losses[3])


@pytest.mark.parametrize("config_json", [None, "{bad"])
def test_init_from_errors_are_one_line_naming_the_path(tmp_path, capsys, config_json):
    hf = tmp_path / "hf"
    if config_json is not None:
        hf.mkdir()
        (hf / "config.json").write_text(config_json)
    code = cli.main(
        [
            "--config",
            DEBUG,
            *SMALL,
            f"--run_dir={tmp_path / 'run'}",
            "--cpu_devices=0",
            f"--model.init_from={hf}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert err.startswith(f"config error: model.init_from='{hf}' cannot be loaded") and (
        str(hf / "config.json") in err
    ), err


def test_one_text_file_trains(tmp_path):
    from train import data

    corpus = tmp_path / "corpus.txt"  # the embedded corpus as one ~570 KB text file
    corpus.write_text("\n\n".join(data.read_documents(data.default_paths())))
    result = train.main(small(tmp_path / "run", f"--data.paths=[{corpus}]", "--stop_at=2"))
    assert sorted(result.losses) == [1, 2] and np.isfinite(result.eval_loss)

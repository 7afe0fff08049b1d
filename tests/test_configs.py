"""Every YAML in configs/ parses into a valid TrainConfig; the loader rejects bad keys and types."""

from __future__ import annotations

import dataclasses
import pathlib
import types

import pytest

from train import __main__ as cli
from train import config as config_lib

CONFIGS = sorted((pathlib.Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


def test_there_are_presets():
    names = {p.stem for p in CONFIGS}
    assert {"debug", "llama1b_long", "llama8b_long", "lwm_progressive"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_parses_and_fits(path):
    from models import llama
    from models.sharding import MeshConfig
    from train import steps

    config = config_lib.load(str(path))
    config_lib.check(config)
    for stage in config_lib.stage_configs(config):
        model = llama.get_config(stage.model.preset, **stage.model.overrides)
        devices = stage.cpu_devices or 8  # the GPU presets are for one 8-GPU host or one GPU
        mesh_cfg = MeshConfig(**dataclasses.asdict(stage.mesh))
        try:
            sizes = mesh_cfg.resolve(devices)
        except ValueError:
            sizes = mesh_cfg.resolve(1)
        steps.check_shapes(stage, model, types.SimpleNamespace(shape=sizes), 256)


def test_progressive_stages_chain():
    config = config_lib.load(str(CONFIGS[0].parent / "lwm_progressive.yaml"))
    stages = config_lib.stage_configs(config)
    assert len(stages) == len(config.stages) >= 2
    lengths = [s.data.seq_len for s in stages]
    thetas = [s.model.overrides["rope_theta"] for s in stages]
    assert lengths == sorted(lengths) and len(set(lengths)) == len(lengths)
    assert thetas == sorted(thetas)
    assert len({s.run_dir for s in stages}) == len(stages)
    remats = [s.model.overrides["remat"] for s in stages]  # a stage may change the remat policy
    assert remats[0] == config.model.overrides["remat"] == "save_attn" and remats[-1] == "full"


def test_overrides_are_typed():
    config = config_lib.load(
        None,
        [
            "--data.seq_len=128",
            "--optim.lr",
            "1e-3",
            "--model.overrides.rope_theta=1e6",
            "--data.paths=[a, b]",
        ],
    )
    assert config.data.seq_len == 128 and config.optim.lr == pytest.approx(1e-3)
    assert config.model.overrides == {"rope_theta": 1e6} and config.data.paths == ["a", "b"]


def test_unknown_key_lists_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="valid keys: .*data.seq_len"):
        config_lib.load(None, ["--data.seqlen=3"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim: {lr: 1.0, betas: 2}\n")
    with pytest.raises(ValueError, match=r"optim.betas.*valid keys: .*optim.b1"):
        config_lib.load(str(bad))


def test_wrong_type_and_range_are_errors():
    with pytest.raises(TypeError, match="data.seq_len"):
        config_lib.load(None, ["--data.seq_len=abc"])
    with pytest.raises(ValueError, match="data.batch_size"):
        config_lib.check(config_lib.load(None, ["--data.batch_size=0"]))
    with pytest.raises(ValueError, match="accum_steps"):
        config_lib.check(config_lib.load(None, ["--data.batch_size=6", "--optim.accum_steps=4"]))
    with pytest.raises(ValueError, match="checkpoint.resume"):
        config_lib.check(config_lib.load(None, ["--checkpoint.resume=sometimes"]))


def test_help_lists_every_option(capsys):
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for section in dataclasses.fields(config_lib.TrainConfig):
        tp = config_lib._hints(config_lib.TrainConfig)[section.name]
        if dataclasses.is_dataclass(tp):
            for f in dataclasses.fields(tp):
                assert f"--{section.name}.{f.name} (" in text
        else:
            assert f"--{section.name} (" in text
    for f in dataclasses.fields(config_lib.StageSection):
        assert f"--{f.name} (" in text


def test_cli_reports_config_errors(capsys):
    assert cli.main(["--config", str(CONFIGS[0].parent / "debug.yaml"), "--mesh.xp=2"]) == 2
    assert "valid keys" in capsys.readouterr().err


DEBUG = str(CONFIGS[0].parent / "debug.yaml")


def _one_line_error(capsys, argv: list[str]) -> str:
    code = cli.main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in captured.err, captured.err
    return err


def test_bare_command_prints_usage_and_exits_2(capsys):
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m train --config CONFIG.yaml") and "--help" in err


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--config", "{bad}"], "config error: {bad}:2:4: invalid YAML: expected ',' or ']'"),
        ([f"--config={DEBUG}", "--steps=[1"], "config error: --steps=[1 is not valid YAML (column 3)"),
        (
            ["--config", "/nonexistent/x.yaml"],
            "config error: config file '/nonexistent/x.yaml' does not exist",
        ),
        (["--config"], "config error: --config needs a path"),
        (
            [f"--config={DEBUG}", "--optim.min_lr_ratio=2"],
            "config error: optim.min_lr_ratio=2.0 must be in [0, 1]",
        ),
        ([f"--config={DEBUG}", "--optim.b2=1.5"], "config error: optim.b2=1.5 must be in [0, 1)"),
        ([f"--config={DEBUG}", "--optim.b1=-0.1"], "config error: optim.b1=-0.1 must be in [0, 1)"),
        ([f"--config={DEBUG}", "--optim.eps=0"], "config error: optim.eps=0.0 must be > 0"),
        (
            [f"--config={DEBUG}", "--sample.temperature=-1"],
            "config error: sample.temperature=-1.0 must be >= 0",
        ),
        ([f"--config={DEBUG}", "--steps=0"], "config error: steps=0 must be >= 1"),
        ([f"--config={DEBUG}", "--optim.lr=.nan"], "config error: optim.lr=nan must be a finite"),
    ],
)
def test_cli_mistakes_are_one_line(tmp_path, capsys, argv, error):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1\n  x: 2\n")
    argv = [a.replace("{bad}", str(bad)) for a in argv]
    assert _one_line_error(capsys, argv).startswith(error.replace("{bad}", str(bad)))


def test_ranges_accept_their_ends():
    config_lib.check(
        config_lib.load(
            None, ["--optim.min_lr_ratio=0", "--optim.b1=0", "--optim.b2=0", "--sample.temperature=0"]
        )
    )
    config_lib.check(config_lib.load(None, ["--optim.min_lr_ratio=1", "--steps=1"]))


@pytest.mark.parametrize(
    "override, error",
    [
        (
            "--model.overrides={attention: bogus}",
            "config error: attention='bogus' is not known; choose one of ('auto', 'xla'",
        ),
        (
            "--model.overrides={bogus: 1}",
            "config error: unknown LlamaConfig fields ['bogus']; known fields: vocab_size,",
        ),
        ("--model.preset=nope", "config error: config name='nope' is not a preset; choose one of"),
    ],
)
def test_unknown_model_names_list_the_known_ones(tmp_path, capsys, override, error):
    err = _one_line_error(capsys, ["--config", DEBUG, f"--run_dir={tmp_path}", "--cpu_devices=0", override])
    assert err.startswith(error), err

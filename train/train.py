"""Training main: read top to bottom, one stage at a time.

Trains a LLaMA whose attention is exact ring attention over the "sp" mesh axis (Ring Attention with
Blockwise Transformers, Liu, Zaharia & Abbeel 2023) on packed documents; a progressive context
schedule runs several stages, each starting from the last one's parameters (Large World Model, Liu
et al. 2024).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from models import llama
from models.sharding import MeshConfig, make_mesh
from models.tokenizer import get_tokenizer
from train import config as config_lib
from train import data as data_lib
from train import distributed, optim, resume, sample, steps
from train import metrics as metrics_lib
from train.checkpoint import Checkpointer, CheckpointError
from train.config import ConfigError
from train.guard import FiniteCheck
from train.metrics import MetricsWriter, mfu, peak_tflops


@dataclasses.dataclass
class Result:
    """What a stage leaves behind (tests and the next stage read it)."""

    run_dir: str
    step: int
    losses: dict[int, float]  # logged steps only
    eval_loss: float | None
    params: Any
    sample: str | None


def log0(*args: Any) -> None:
    if jax.process_index() == 0:
        print(*args, flush=True)


def main(config: config_lib.TrainConfig) -> Result:
    """Runs every stage of ``config`` in order; returns the last stage's result."""
    config_lib.check(config)
    distributed.initialize(config.distributed)
    result = None
    stages = config_lib.stage_configs(config)
    for i, stage in enumerate(stages):
        result = train_stage(stage, previous=result, done_ok=i < len(stages) - 1)
    return result


def _resume_step(ckpt: Checkpointer, mode: str | int) -> int | None:
    if isinstance(mode, int):  # a step chosen by number (e.g. the newest one is damaged)
        if mode not in ckpt.steps():
            raise CheckpointError(
                f"checkpoint.resume={mode}: {ckpt.directory!r} holds no complete "
                f"checkpoint for that step; complete steps: {ckpt.steps()}"
            )
        return mode  # newer checkpoints are set aside once the resume is checked (_set_aside)
    latest = ckpt.latest()
    if mode == "never" and latest is not None:
        raise CheckpointError(
            f"checkpoint.resume=never but {ckpt.directory!r} already holds "
            f"checkpoints {ckpt.steps()}; nothing was changed. Use a new "
            "run_dir or checkpoint.resume=auto"
        )
    if mode == "required" and latest is None:
        raise CheckpointError(
            f"checkpoint.resume=required but {ckpt.directory!r} holds no complete checkpoint"
        )
    return latest


def train_stage(
    config: config_lib.TrainConfig, previous: Result | None = None, *, done_ok: bool = False
) -> Result:
    """Trains one stage: ``config.steps`` steps in ``config.run_dir``. ``done_ok``: a run_dir that
    already holds the last step is passed on (a finished stage of a progressive schedule) instead
    of being an error."""
    # --- Devices, mesh, model, tokenizer; data: this host's streams of packed rows, the held-out
    # split. A setting that cannot work raises ConfigError.
    mesh, model_cfg, tokenizer, data = _setup(config)

    # --- Optimizer, shardings of the state, jitted steps (cached per model/mesh/optimizer).
    fns = steps.functions(model_cfg, mesh, config.optim, config.steps)

    # --- Checkpoints: resume the newest complete one (what may change: train.resume), else start
    # (from the previous stage).
    stop = min(config.steps, config.stop_at or config.steps)
    with Checkpointer(
        f"{config.run_dir.rstrip('/')}/checkpoints",
        keep=config.checkpoint.keep,
        async_save=config.checkpoint.async_save,
    ) as ckpt:
        start, state, final_eval = _resume_or_start(config, ckpt, fns, data, stop, previous, done_ok)

        # --- Train (the first step compiles), checkpoint, evaluate.
        log = _Logger(config, model_cfg, start, stop, data.maker.owned_rows())
        params, eval_loss = _train(config, fns, data, ckpt, log, state, start, stop, final_eval)
        log.close()

    # --- A short sample from the trained model (not from a finished stage passed on).
    text = None
    if config.sample.tokens and (start < stop or final_eval):
        text = _sample(config, model_cfg, params, mesh, tokenizer, jax.random.fold_in(state[2], stop))
    log0(
        f"done: step {stop}, run_dir {config.run_dir}"
        + (f", eval loss {eval_loss:.4f}" if eval_loss is not None else "")
    )
    return Result(config.run_dir, stop, log.losses, eval_loss, params, text)


def _resume_or_start(config, ckpt, fns, data, stop: int, previous: Result | None, done_ok: bool):
    """(start step, (params, opt_state, rng), final_eval): the newest complete checkpoint restored
    (what may change: train.resume; checkpoints after it set aside), else a new state (from the
    previous stage's params) and the config written. ``final_eval``: a resumed run that stopped
    after its last checkpoint, before its eval."""
    rng = jax.random.key(config.seed)
    start = _resume_step(ckpt, config.checkpoint.resume)
    if start is None:
        params = _initial_params(config, fns, rng, previous)
        opt_state = jax.jit(fns.tx.init, out_shardings=fns.opt_shardings)(params)
        resume.write_config(config)
        return 0, (params, opt_state, rng), False
    final_eval = (
        start == stop and data.eval_packer is not None and not metrics_lib.has_eval(config.run_dir, start)
    )
    resume.check_steps(config, start, stop, final_eval, done_ok)
    record_changes = resume.check_changes(config, start, log0)
    _set_aside(ckpt, start)
    params, opt_state, rng = _restore(ckpt, start, fns, data, rng)
    record_changes()
    _forget_after(config.run_dir, start, stop, final_eval)
    return start, (params, opt_state, rng), final_eval


def _sample(config, model_cfg, params, mesh, tokenizer, rng) -> str:
    """A short sample from the trained model, logged."""
    s = config.sample
    text = sample.generate(
        model_cfg,
        params,
        mesh,
        tokenizer,
        s.prompt,
        tokens=s.tokens,
        temperature=s.temperature,
        length=config.data.seq_len,
        rng=rng,
    )
    log0(f"sample: {s.prompt!r} -> {text!r}")
    return text


def _train(
    config,
    fns: steps.Functions,
    data: _Data,
    ckpt,
    log: _Logger,
    state,
    start: int,
    stop: int,
    final_eval: bool,
):
    """Steps ``start + 1 .. stop`` with checkpoints and evaluations (only the evaluation of
    ``stop`` when ``final_eval`` and there is nothing to train); returns (params, eval loss)."""
    params, opt_state, rng = state
    finite = FiniteCheck(config.skip_nonfinite, ckpt, log0)  # never saves a non-finite step
    eval_loss = None
    for step in range(start + 1, stop + 1):
        rows = data.packer.next_rows()  # this host's rows, natural order
        log.count(rows)
        batch = data.maker.batch(rows)
        params, opt_state, metrics = fns.train_step(params, opt_state, batch)
        finite.add(step, metrics)
        log.train(step, metrics)
        save = config.checkpoint.every and step % config.checkpoint.every == 0 or step == stop
        evaluate = data.eval_packer is not None and (
            config.eval.every and step % config.eval.every == 0 or step == stop
        )
        if save or evaluate:
            finite.settle()
        if save:
            data_state = data.maker.state(data.packer.get_state())
            _save(ckpt, step, params, opt_state, rng, data_state, config)
        if evaluate:
            eval_loss = _evaluate(config, fns.eval_step, params, data)
            log.eval(step, eval_loss)
    finite.settle()
    if final_eval:
        eval_loss = _evaluate(config, fns.eval_step, params, data)
        log.eval(stop, eval_loss)
    return params, eval_loss


def _set_aside(ckpt: Checkpointer, step: int) -> None:
    newer = ckpt.set_aside_after(step)  # checkpoint.resume=STEP: files kept, renamed
    if newer:
        log0(f"resuming step {step}: newer checkpoints {newer} set aside in {ckpt.directory}")


def _forget_after(run_dir: str, start: int, stop: int, final_eval: bool) -> None:
    """Says what the resumed run does; drops the metrics of steps after ``start`` (they run again)."""
    removed = metrics_lib.drop_after(run_dir, start) if jax.process_index() == 0 else 0
    what = (
        f"training steps {start + 1}-{stop}"
        if start < stop
        else "running its missing final evaluation"
        if final_eval
        else "finished: passed on"
    )
    log0(
        f"resumed step {start} in {run_dir}: {what}"
        + (f" ({removed} metrics records of later steps dropped)" if removed else "")
    )


def _setup(config: config_lib.TrainConfig):
    """(mesh, model config, tokenizer, data) of a stage, or ConfigError naming what cannot work."""
    if config.cpu_devices and jax.local_device_count() != config.cpu_devices:
        raise ConfigError(
            f"cpu_devices={config.cpu_devices} but this process has "
            f"{jax.local_device_count()} devices; launch through `python -m train` "
            "(it sets XLA_FLAGS before jax starts)"
        )
    xla_deterministic = config_lib.xla_deterministic(os.environ.get("XLA_FLAGS", ""))
    if config.deterministic and jax.default_backend() == "gpu" and not xla_deterministic:
        raise ConfigError(
            f"deterministic=true on GPU needs XLA_FLAGS={config_lib.XLA_DETERMINISTIC} "
            "before jax starts (python -m train sets it; in Python, set "
            "os.environ['XLA_FLAGS'] before the first jax call)"
        )
    try:
        mesh = make_mesh(MeshConfig(**dataclasses.asdict(config.mesh)))
        model_cfg = steps.model_config(config)
        tokenizer = get_tokenizer(config.data.tokenizer, config.data.tokenizer_path)
        steps.check_shapes(config, model_cfg, mesh, tokenizer.vocab_size)
        log0(
            f"mesh {dict(mesh.shape)} on {jax.device_count()} {jax.devices()[0].platform} "
            f"devices, {jax.process_count()} process(es); model {config.model.preset} "
            f"({llama.num_params(model_cfg) / 1e6:.2f}M params), layout {model_cfg.layout}"
            + (", deterministic" if model_cfg.deterministic else "")
            + (" (XLA deterministic ops)" if xla_deterministic else "")
        )
        return mesh, model_cfg, tokenizer, _data(config, mesh, model_cfg, tokenizer)
    except (ValueError, TypeError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from e


@dataclasses.dataclass
class _Data:
    packer: data_lib.Packer
    maker: steps.BatchMaker
    eval_packer: data_lib.Packer | None
    eval_maker: steps.BatchMaker


def _data(config, mesh, model_cfg, tokenizer) -> _Data:
    seq, batch = config.data.seq_len, config.data.batch_size
    micro = batch // config.optim.accum_steps
    docs = data_lib.read_documents(
        config.data.paths or data_lib.default_paths(),
        config.data.format,
        config.data.text_key,
        config.data.text_doc_chars,
    )
    train_ids, eval_ids = data_lib.split(len(docs), config.data.eval_fraction, config.data.seed)
    maker = steps.BatchMaker(mesh, config.optim.accum_steps, micro, seq, model_cfg.layout)
    common = dict(seq_len=seq, seed=config.data.seed, append_eos=config.data.append_eos)
    packer = data_lib.Packer(
        docs, train_ids, tokenizer, num_streams=batch, rows=maker.host_streams(), wrap=True, **common
    )
    eval_maker = steps.BatchMaker(mesh, 1, micro, seq, model_cfg.layout)
    eval_packer = None
    if len(eval_ids):
        eval_packer = data_lib.Packer(
            docs, eval_ids, tokenizer, num_streams=micro, rows=eval_maker.host_streams(), wrap=False, **common
        )
    return _Data(packer, maker, eval_packer, eval_maker)


def _restore(ckpt, step, fns: steps.Functions, data: _Data, rng):
    data_state = data.maker.state(data.packer.get_state())
    positions = _saved_positions(ckpt.meta(step).get("config", {}), data_state)
    train_like = {
        "opt_state": fns.opt_abstract,
        "data": positions,
        "rng": _replicated(jax.random.key_data(rng), data_state),
    }
    restored = ckpt.restore(step, fns.params_abstract, train_like)
    tr = restored["train"]
    if tr["data"].shape == data_state.shape:
        data.packer.set_state(data.maker.local_state(tr["data"]))
    else:
        _resplit_positions(data, np.asarray(tr["data"].addressable_shards[0].data))
    rng = jax.random.wrap_key_data(np.asarray(tr["rng"]))
    return restored["params"], tr["opt_state"], rng


def _saved_positions(saved: dict, data_state: jax.Array):
    """The checkpoint's data positions: like ``data_state``, or replicated in their own shape
    ``[accum, rows, 3]`` where data.batch_size or optim.accum_steps changed (resume.allow_changes)."""
    batch = saved.get("data", {}).get("batch_size")
    accum = saved.get("optim", {}).get("accum_steps")
    if not batch or not accum or (accum, batch // accum) == data_state.shape[:2]:
        return data_state
    return jax.ShapeDtypeStruct(
        (accum, batch // accum, data_state.shape[2]), data_state.dtype, sharding=_replicated_over(data_state)
    )


def _resplit_positions(data: _Data, saved: np.ndarray) -> None:
    """Sets the positions of a checkpoint with another accumulation split (the same streams: stream
    ``a * rows + r`` is ``saved[a, r]``); after a batch_size change, the streams start afresh."""
    flat = saved.reshape(-1, saved.shape[-1])
    if len(flat) == data.packer.num_streams:
        data.packer.set_state(flat[data.maker.host_streams()].astype(np.int64))
        return
    log0(
        f"data.batch_size {len(flat)} -> {data.packer.num_streams}: the checkpoint's data "
        "positions belong to its own streams of documents, so the new streams start from their "
        "first documents"
    )


class _Logger:
    """Metrics JSONL + TensorBoard + progress bar; throughput excludes compilation and eval.

    ``mfu`` and ``flops_per_token`` come from the FLOPs counted from every step's documents over
    the window since the last record (``count``); ``model_flops`` is the logged step's own count.
    """

    def __init__(self, config, model_cfg, start: int, stop: int, owned_rows: np.ndarray):
        self.config, self.seq, self.model_cfg = config, config.data.seq_len, model_cfg
        self.writer = MetricsWriter(
            config.run_dir, tensorboard=config.log.tensorboard, primary=jax.process_index() == 0
        )
        self.owned = owned_rows  # this host's rows that count towards the global FLOPs
        self.peak = peak_tflops(jax.devices()[0].device_kind, config.log.peak_tflops)
        self.lr_at = optim.schedule(config.optim, config.steps)
        self.start, self.stop, self.timer = start, stop, (time.perf_counter(), start)
        self.window_flops = self.step_flops = 0  # this process's share; summed when written
        self.losses: dict[int, float] = {}
        self.bar = _progress(config, start, stop)

    def count(self, rows: dict[str, np.ndarray]) -> None:
        """Adds the model FLOPs of one step's host rows (any order) to the current window."""
        self.step_flops = llama.batch_flops(self.model_cfg, rows["segment_ids"][self.owned])
        self.window_flops += self.step_flops

    def train(self, step: int, metrics) -> None:
        self.bar.update(1)
        if step % self.config.log.every and step not in (self.stop, self.start + 1):
            return
        m = jax.device_get(metrics)
        now = time.perf_counter()
        window, step_flops = distributed.sum_to_primary([self.window_flops, self.step_flops])
        tokens = (step - self.timer[1]) * self.config.data.batch_size * self.seq
        seconds = max(now - self.timer[0], 1e-9)
        first = step == self.start + 1  # includes compilation
        record = {
            "step": step,
            "loss": float(m["loss"]),
            "lr": float(self.lr_at(step - 1)),
            "grad_norm": float(m["grad_norm"]),
            "tokens_per_sec": float("nan") if first else tokens / seconds,
            "mfu": float("nan") if first else mfu(window, seconds, jax.device_count(), self.peak.tflops),
            "flops_per_token": window / tokens,
            "model_flops": step_flops,
            "peak_tflops": self.peak.tflops,
            "peak_source": self.peak.source,
            "seq_len": self.seq,
            "tokens": float(m["tokens"]),
        }
        self.writer.write(record)
        self.losses[step], self.timer, self.window_flops = record["loss"], (now, step), 0
        self.bar.set_postfix(loss=f"{record['loss']:.3f}")

    def eval(self, step: int, loss: float) -> None:
        self.writer.write(
            {"step": step, "eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0))}, prefix="eval"
        )
        if jax.process_index() == 0:
            self.bar.write(f"step {step}: eval loss {loss:.4f}")
        self.timer, self.window_flops = (time.perf_counter(), step), 0

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


def _initial_params(config, fns: steps.Functions, rng, previous: Result | None):
    if previous is not None:  # next stage: the last stage's final parameters
        return jax.device_put(previous.params, fns.param_shardings)
    if config.model.init_from:
        try:
            _, loaded = llama.load_hf(config.model.init_from, scan_layers=fns.scan_layers)
        except (OSError, ValueError) as e:
            raise ConfigError(f"model.init_from={config.model.init_from!r} cannot be loaded: {e}") from e
        want = jax.tree.map(lambda a: (a.shape, str(a.dtype)), fns.params_abstract)
        got = jax.tree.map(lambda a: (a.shape, str(a.dtype)), loaded)
        if want != got:
            raise ConfigError(
                f"model.init_from={config.model.init_from!r} does not match the model "
                f"config {config.model.preset!r} + overrides (shapes/dtypes differ)"
            )
        return jax.device_put(loaded, fns.param_shardings)
    return fns.init_params(rng)


def _save(ckpt, step, params, opt_state, rng, data_state, config) -> None:
    train = {
        "opt_state": opt_state,
        "rng": _replicated(jax.random.key_data(rng), data_state),
        "data": data_state,
    }
    ckpt.save(step, params, train, {"step": step, "config": config_lib.to_dict(config)})


def _replicated_over(like: jax.Array) -> NamedSharding:
    """Replication over ``like``'s mesh."""
    return NamedSharding(like.sharding.mesh, PartitionSpec())


def _replicated(x, like: jax.Array) -> jax.Array:
    """``x`` as a global array replicated over ``like``'s mesh (every process holds the value)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, _replicated_over(like), lambda idx: x[idx])


def _evaluate(config, eval_step, params, data: _Data) -> float:
    packer = data.eval_packer
    packer.set_state(np.zeros_like(packer.get_state()))  # the same held-out batches every time
    total, tokens = 0.0, 0.0
    for _ in range(config.eval.batches):
        loss_sum, n = eval_step(params, data.eval_maker.batch(packer.next_rows()))
        total, tokens = total + float(loss_sum), tokens + float(n)
    return total / max(tokens, 1.0)


def _progress(config, start: int, stop: int):
    from tqdm.auto import tqdm

    disable = not (config.log.progress and jax.process_index() == 0)
    return tqdm(total=stop, initial=start, disable=disable, desc="train", dynamic_ncols=True)

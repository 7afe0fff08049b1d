"""What only a GPU shows: ``make test-gpu`` on one H100 or H200 (skipped elsewhere).

Every implementation inside a user's ``shard_map`` under both ``check_vma`` settings, in float32 and
bfloat16, forward and gradients at head dims 64 and 128 with GQA and packed documents, against the
float32 reference computed on the GPU (:func:`check_ring`: the float64 numpy reference of the CPU
suite takes half a minute per case at these lengths); each optional feature on each kernel that
claims it; every strategy; the README's code blocks verbatim; three training steps of
``configs/llama1b_long.yaml`` at 16K tokens through the CLI with a checkpoint, a resume, and 32
tokens of ``generate`` from it. On one GPU the ring has one device: rings of 2 and more are
compiled for H200s in ``tests/test_gpu_aot.py``. The summary, ``benchmarks/results/gpu_suite.md``,
is written by ``tools/gpu_suite_summary.py``.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ringcheck import RTOL, Problem, make_extras, make_inputs, rel_err, run_ring

import ringattention as ra
from ringattention import implementations

if jax.default_backend() != "gpu":
    pytest.skip("needs a CUDA GPU (make test-gpu runs this on one)", allow_module_level=True)

ROOT = pathlib.Path(__file__).parents[1]
IMPLS = ("xla", "pallas_gpu", "pallas_hopper")
# The features of the step contract (implementations.FEATURES) and what every implementation has
FEATURE_PROBLEMS = {
    "softcap": dict(softcap=30.0, logit_scale=3.0),
    "prefix": dict(prefix=True, batch=3),
    "bidirectional": dict(segments=True, bidirectional=True),
    "v_head_dim": dict(head_dim=192, v_head_dim=128),
    "sinks": dict(sinks=True),
    "window": dict(window=300),
    "segments": dict(segments=True),
}
COMMON = ("sinks", "window", "segments")  # ring-level or in every kernel


def check_ring(pb: Problem, **kwargs) -> list[float]:
    """``ringcheck.check_ring`` with the reference on the GPU: the ring (``run_ring``, inside
    ``jax.shard_map``) against ``reference_attention`` and its ``jax.vjp`` in float32 at
    ``precision="highest"`` (conftest) on the same rounded inputs; relative errors within ringcheck's
    ``RTOL`` for the dtype."""
    q, k, v, do, seg = make_inputs(pb)
    extras = make_extras(pb)
    got = run_ring(pb, q, k, v, do, seg, extras=extras, **kwargs)
    sinks, prefix = extras.get("sinks"), extras.get("prefix")

    def ref(q, k, v, sinks):
        return ra.reference_attention(
            q,
            k,
            v,
            causal=pb.causal,
            segment_ids=seg,
            sliding_window=pb.window,
            sinks=sinks,
            logits_soft_cap=pb.softcap,
            prefix_length=prefix,
            bidirectional_segments=pb.bidirectional,
        )

    args = (q, k, v, None if sinks is None else jnp.asarray(sinks))
    o, vjp = jax.vjp(jax.jit(ref), *args)
    want = (o, *vjp(jnp.asarray(do)))
    want = want[:4] if sinks is None else want
    errs = [rel_err(g, w) for g, w in zip(got, want)]
    tol = RTOL[pb.dtype]
    assert max(errs) <= tol, f"{pb}: errors {errs} exceed {tol=}"
    return errs


def _needs_hopper(impl: str) -> None:
    if impl == "pallas_hopper" and not implementations.resolve(impl).available():
        pytest.skip(f"pallas_hopper needs an H100/H200; this is {jax.devices()[0].device_kind}")


# The slowest first, so that pytest-xdist's workers start them first.


def _cli(args: list[str], env_extra: dict | None = None, timeout: int = 400, stderr: bool = True) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JAX_COMPILATION_CACHE_DIR": "/tmp/ra-jax-cache",
        **(env_extra or {}),
    }
    out = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + (out.stderr if stderr else "")


def _metrics(run_dir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_llama1b_long_trains_checkpoints_resumes_and_generates(tmp_path):
    """configs/llama1b_long.yaml at 16K tokens: 3 steps stopping with a checkpoint at step 3, a
    relaunch that resumes it and runs step 4 (step 3 is not run again), then 32 tokens of
    ``python -m train.generate`` from the newest checkpoint."""
    run = tmp_path / "run"
    common = [
        "-m",
        "train",
        "--config",
        "configs/llama1b_long.yaml",
        f"--run_dir={run}",
        "--data.seq_len=16384",
        "--data.batch_size=1",
        "--optim.accum_steps=1",
        "--log.tensorboard=false",
        "--log.every=1",
        "--log.progress=false",
        "--data.eval_fraction=0",
        "--sample.tokens=0",
        "--checkpoint.every=3",
        "--checkpoint.async_save=false",
    ]
    _cli([*common, "--steps=4", "--stop_at=3"])  # one schedule for both launches
    first = _metrics(run)
    train_steps = [r["step"] for r in first if "loss" in r]
    assert train_steps[-1] == 3 and all(np.isfinite(r["loss"]) for r in first if "loss" in r)
    assert any((r.get("mfu") or 0) > 0.05 for r in first), first  # the GPU did the work (step 1: null)
    assert (run / "checkpoints").exists()
    log = _cli([*common, "--steps=4"])
    assert re.search(r"resum\w+ .*step 3", log, re.I), log[-2000:]
    steps = [r["step"] for r in _metrics(run) if "loss" in r]
    assert steps.count(4) == 1 and steps.count(3) == 1, steps
    text = _cli(
        [
            "-m",
            "train.generate",
            "--run_dir",
            str(run),
            "--prompt",
            "In the beginning",
            "--max-new-tokens",
            "32",
        ],
        stderr=False,
    )
    assert 0 < len(text.encode()) <= 4 * 32 + 1, text  # the continuation: 32 byte tokens


# Gemma 2- and DeepSeek-shaped attention through the model (2 layers, byte vocabulary), 32K tokens
GPU_TINY = dict(
    vocab_size=256,
    hidden_size=1024,
    intermediate_size=2048,
    num_layers=2,
    max_position_embeddings=32768,
    dtype="bfloat16",
    attention="auto",
)
MODEL_SHAPES = {
    "gemma2": dict(
        family="gemma2",
        num_heads=8,
        num_kv_heads=4,
        head_dim=256,
        query_pre_attn_scalar=256,
        attn_logit_softcap=50.0,
        final_logit_softcap=30.0,
        sliding_window=4096,
        layer_types=("sliding_attention", "full_attention"),
    ),
    "deepseek_mla": dict(num_heads=16, num_kv_heads=16, head_dim=192, v_head_dim=128),
}


@pytest.mark.parametrize("shape", list(MODEL_SHAPES))
def test_model_shapes_train_at_32k_on_pallas_hopper(shape):
    """A training step (loss and gradients) of the shape at 32K tokens with ``attention="auto"``:
    every attention call runs ``pallas_hopper`` (soft-capping, head dim 256, a value head dim of
    its own) and the loss and gradients are finite."""
    _needs_hopper("pallas_hopper")
    import dataclasses
    from unittest import mock

    from models import llama
    from models.config import LlamaConfig
    from models.sharding import MeshConfig, make_mesh

    config = LlamaConfig(**GPU_TINY, **MODEL_SHAPES[shape])
    mesh = make_mesh(MeshConfig(sp=1), jax.devices()[:1])
    params = llama.init_params(dataclasses.replace(config, attention="xla"), jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (1, 32768), 0, 256)
    batch = {"input_ids": ids, "targets": jnp.roll(ids, -1, axis=1)}
    loaded, load = set(), implementations.Implementation.load

    def recorded(impl):
        loaded.add(impl.name)
        return load(impl)

    with mock.patch.object(implementations.Implementation, "load", recorded):
        step = jax.jit(jax.value_and_grad(lambda p: llama.loss_fn(config, p, batch, mesh=mesh)[0]))
        loss, grads = step(params)
    assert loaded == {"pallas_hopper"}, loaded
    assert np.isfinite(float(loss)) and all(
        np.isfinite(np.asarray(g, np.float32)).all() for g in jax.tree.leaves(grads)
    )


def test_auto_picks_pallas_hopper_on_hopper():
    _needs_hopper("pallas_hopper")
    assert implementations.resolve("auto").name == "pallas_hopper"


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_forward_rescale_skip_is_bitwise(softcap, monkeypatch):
    """``warp_rescale`` skips the accumulator's rescale only in warps whose rows all kept their
    maximum (alpha == 1): the forward's output and lse are bitwise those of the unconditional
    rescale (causal, 8K tokens, GQA 8:2, random inputs, where the maxima settle after a few
    blocks)."""
    _needs_hopper("pallas_hopper")
    from ringattention.kernels.hopper import fwd_loops, warp_rescale
    from ringattention.kernels.hopper import pallas_hopper as ph

    kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(kq, (1, 8192, 8, 128), jnp.bfloat16)  # [batch, seq, heads, dim]
    k = jax.random.normal(kk, (1, 8192, 2, 128), jnp.bfloat16)
    v = jax.random.normal(kv, (1, 8192, 2, 128), jnp.bfloat16)
    pos = jnp.arange(8192, dtype=jnp.int32)

    def forward():
        jax.clear_caches()
        step = lambda q, k, v, p: ph.forward_step(  # noqa: E731
            q, k, v, p, p, None, None, causal=True, softmax_scale=128**-0.5, softcap=softcap
        )
        return [np.asarray(x) for x in jax.tree.leaves(jax.jit(step)(q, k, v, pos))]

    skipped = forward()
    # the unconditional rescale (``fwd_loops.rescale``, what the overlap schedule runs)
    monkeypatch.setattr(warp_rescale, "rescale", lambda acc, alpha, interpret: fwd_loops.rescale(acc, alpha))
    for got, want in zip(skipped, forward(), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dims", [(128, 128), (192, 128)], ids=["d128", "mla"])
def test_forward_writes_the_final_dtype_bitwise(dims):
    """A lone step's o written by the kernel in bfloat16 (``out_dtype``, what a ring of one device
    runs) is bitwise the float32 o converted by XLA (causal, 8K tokens, GQA 8:2, soft cap 30)."""
    _needs_hopper("pallas_hopper")
    from ringattention.kernels.hopper import pallas_hopper as ph

    d, dv = dims
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(kq, (1, 8192, 8, d), jnp.bfloat16)  # [batch, seq, heads, dim]
    k = jax.random.normal(kk, (1, 8192, 2, d), jnp.bfloat16)
    v = jax.random.normal(kv, (1, 8192, 2, dv), jnp.bfloat16)
    pos = jnp.arange(8192, dtype=jnp.int32)

    def forward(out_dtype):
        step = lambda q, k, v, p: ph.forward_step(  # noqa: E731
            q, k, v, p, p, None, None, causal=True, softmax_scale=d**-0.5, softcap=30.0, out_dtype=out_dtype
        )
        return jax.jit(step)(q, k, v, pos)

    (o16, lse16), (o32, lse32) = forward(jnp.bfloat16), forward(None)
    assert o16.dtype == jnp.bfloat16 and o32.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(o16), np.asarray(o32.astype(jnp.bfloat16)))
    np.testing.assert_array_equal(np.asarray(lse16), np.asarray(lse32))


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_three_warpgroups_are_bitwise_two(softcap):
    """The forward's three compute warpgroups (``schedule="pingpong3"``, the default at head dim
    128 with a causal mask) write the bits of the two-warpgroup ping-pong: causal, GQA 8:2, packed
    documents with boundaries off the 192-row CTAs, 8320 tokens (the last CTA overlaps the one
    before it)."""
    _needs_hopper("pallas_hopper")
    from ringattention.kernels.hopper import pallas_hopper as ph

    n = 8320
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(2), 3)
    q = jax.random.normal(kq, (1, n, 8, 128), jnp.bfloat16)  # [batch, seq, heads, dim]
    k = jax.random.normal(kk, (1, n, 2, 128), jnp.bfloat16)
    v = jax.random.normal(kv, (1, n, 2, 128), jnp.bfloat16)
    pos = jnp.arange(n, dtype=jnp.int32)
    seg = jnp.searchsorted(jnp.array([1000, 3100, 6000]), pos, side="right")[None].astype(jnp.int32)

    def forward(schedule):
        bs = ph.BlockSizes(schedule=schedule, backward="fused", registers=240)
        step = lambda q, k, v, p, s: ph.forward_step(  # noqa: E731
            q, k, v, p, p, s, s, causal=True, softmax_scale=128**-0.5, softcap=softcap, block_sizes=bs
        )
        return [np.asarray(x) for x in jax.jit(step)(q, k, v, pos, seg)]

    for got, want in zip(forward("pingpong3"), forward("pingpong"), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("check_vma", [True, False], ids=["vma", "novma"])
@pytest.mark.parametrize("impl", IMPLS)
def test_implementation_matches_reference(impl, check_vma, dtype, head_dim):
    """GQA 8:2, causal, packed documents with boundaries anywhere, 2048 tokens."""
    _needs_hopper(impl)
    pb = Problem(
        n=1,
        layout="zigzag",
        causal=True,
        segments=True,
        batch=1,
        shard=2048,
        heads=8,
        kv_heads=2,
        head_dim=head_dim,
        dtype=dtype,
    )
    check_ring(pb, check_vma=check_vma, implementation=impl)


def _claims(impl: str) -> list[str]:
    return sorted(implementations.resolve(impl).features) + list(COMMON)


@pytest.mark.parametrize("feature", list(FEATURE_PROBLEMS))
@pytest.mark.parametrize("impl", IMPLS)
def test_feature_matches_reference(impl, feature):
    """Each feature alone, bfloat16, on each implementation that claims it (causal, GQA 8:2)."""
    _needs_hopper(impl)
    if feature not in _claims(impl):
        pytest.skip(f"{impl} does not claim {feature} (implementations.py: 'auto' passes over it)")
    fields = dict(
        n=1,
        layout="zigzag",
        causal=True,
        batch=1,
        shard=1024,
        heads=8,
        kv_heads=2,
        head_dim=128,
        dtype="bfloat16",
    )
    fields.update(FEATURE_PROBLEMS[feature])
    check_ring(Problem(**fields), implementation=impl)


@pytest.mark.parametrize("strategy", ["ring", "all_gather", "ulysses", "auto"])
def test_strategy_matches_reference(strategy):
    pb = Problem(
        n=1,
        layout="contiguous",
        causal=True,
        segments=True,
        batch=1,
        shard=1024,
        heads=8,
        kv_heads=2,
        head_dim=128,
        dtype="bfloat16",
        strategy=strategy,
    )
    check_ring(pb)


def _readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_code_blocks_verbatim():
    """The README's Python blocks, run as written in one namespace (the GPU's mesh of one), and
    both outputs checked against the single-device reference."""
    blocks = _readme_python_blocks()
    assert len(blocks) == 2
    ns: dict = {}
    exec(compile(blocks[0], "README.md:block1", "exec"), ns)  # noqa: S102
    first = np.asarray(ns["out"])
    exec(compile(blocks[1], "README.md:block2", "exec"), ns)  # noqa: S102
    want = ra.reference_attention(ns["q"], ns["k"], ns["v"], causal=True)
    for got in (first, ns["out"]):
        assert rel_err(got, want) <= 1e-5

"""Deviceless compiles for H200s: what a GPU user's jit compiles, checked on a CPU host.

A green suite on one jax once hid a GPU failure at the first training step (the fused backward's dq
accumulator under ``shard_map(check_vma=True)`` on jax >= 0.11). These tests compile, with XLA's GPU
plugin and an H200's device description (``ringcheck.h200_devices``), the ring's forward and
gradients for each GPU implementation under both ``check_vma`` settings, in bfloat16 and float32
at head dims 64, 128 and 256, and the debug and 1b presets' training steps with
``attention="auto"``. ``make test`` runs them on the jax matrix (marked ``gpu_jax``: the jax of CUDA images
and the newest; on .venv's jax too where the matrix is skipped), but for the float32 compiles, the
bfloat16 ones at head dims 64 and 256 and the options on a ring of 4 (marked ``once``: .venv's jax
only; the float32 programs are lowered and checked on every jax). Nothing runs, so numbers come from
``make test-gpu`` on a device.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from ringcheck import h200_devices

import ringattention as ra
from ringattention import implementations

ROOT = pathlib.Path(__file__).parents[1]
SPEC = P(None, "sp")
MOSAIC, TRITON = "mosaic_gpu", "xla.gpu.triton"


def _ring_grads(mesh, check_vma: bool, **kw):
    """value_and_grad of a causal zigzag ring over ``mesh`` axis "sp": the forward and both laps."""

    def local(q, k, v):
        return ra.ring_attention(q, k, v, "sp", causal=True, layout="zigzag", **kw)

    ring = jax.shard_map(local, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=check_vma)
    loss = lambda q, k, v: jnp.sum(jnp.sin(ring(q, k, v).astype(jnp.float32)))  # noqa: E731
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _lower(mesh, check_vma, dtype, head_dim, shard=512, heads=4, kv_heads=2, **kw):
    """The ring's forward and gradients, lowered."""
    n = mesh.shape["sp"]
    sds = lambda h: jax.ShapeDtypeStruct(
        (1, n * shard, h, head_dim),
        dtype,  # noqa: E731
        sharding=NamedSharding(mesh, SPEC),
    )
    return _ring_grads(mesh, check_vma, **kw).trace(sds(heads), sds(kv_heads), sds(kv_heads)).lower()


def _compile(mesh, check_vma, dtype, head_dim, **kw):
    """Lowered text and compiled executable of the ring's forward and gradients."""
    lowered = _lower(mesh, check_vma, dtype, head_dim, **kw)
    return lowered.as_text(), lowered.compile()


def _program(text: str) -> str:
    """Lowered text without source locations: two programs equal here compile to the same code."""
    return "\n".join(
        line for line in re.sub(r"loc\([^)]*\)", "", text).splitlines() if not line.startswith("#loc")
    )


def _kernels(text: str) -> dict[str, int]:
    return {"mosaic": text.count(f"@{MOSAIC}"), "triton": text.count(TRITON)}


def _expected(impl: str, dtype) -> str:
    """The kernel family a step of ``impl`` runs in ``dtype`` on an H200 ("none": XLA ops)."""
    if impl == "xla":
        return "none"
    if impl == "pallas_hopper" and jnp.dtype(dtype) == jnp.bfloat16:
        return "mosaic"  # float32 is delegated to the Triton step (wgmma would compute in tf32)
    return "triton"


IMPLS = ("pallas_hopper", "pallas_gpu", "xla")


pytestmark = pytest.mark.gpu_jax

# float32: the Triton step alone, a minute or more per compile (three on jax 0.12) that the jax
# matrix skips (``once``): their lowering is checked on every jax by test_float32_ring_lowers_for_h200.
# bfloat16 compiles at head dim 128 on every jax, at 64 and 256 (30-40 s each) on .venv's: the
# Hopper options and backwards below compile pallas_hopper at head dims 64, 192 and 256 on every jax.
_ONCE = pytest.mark.once
RING_CASES = [
    pytest.param("bfloat16", 64, marks=_ONCE),
    ("bfloat16", 128),
    pytest.param("bfloat16", 256, marks=_ONCE),
    pytest.param("float32", 64, marks=_ONCE),
    pytest.param("float32", 128, marks=_ONCE),  # 50-60 s each on the jax matrix's legs
    pytest.param("float32", 256, marks=_ONCE),
]


def _ring_programs(dtype, head_dim: int) -> dict:
    """Ring of 2 H200s, causal zigzag, GQA 4:2: the forward and gradients of every GPU
    implementation under both ``check_vma`` settings, lowered and checked for the kernels of the
    implementation (Mosaic GPU, Triton or none). Returns {(impl, check_vma): (program, lowered)},
    the program being the text without source locations."""
    mesh = Mesh(np.array(h200_devices(2)), ("sp",))
    dtype = jnp.dtype(dtype)
    programs = {}
    for impl in IMPLS:
        for check_vma in (True, False):
            lowered = _lower(mesh, check_vma, dtype, head_dim, implementation=impl)
            text = lowered.as_text()
            found, want = _kernels(text), _expected(impl, dtype)
            if want == "none":
                assert found == {"mosaic": 0, "triton": 0}, (impl, check_vma, found)
            else:
                other = "triton" if want == "mosaic" else "mosaic"
                assert found[want] >= 2 and found[other] == 0, (impl, check_vma, found)  # fwd, bwd
            programs[impl, check_vma] = (_program(text), lowered)
    if dtype == jnp.float32:
        assert programs["pallas_hopper", True][0] == programs["pallas_gpu", True][0]
    return programs


@pytest.mark.parametrize("dtype,head_dim", RING_CASES)
def test_ring_compiles_for_h200(dtype, head_dim):
    """Every program of ``_ring_programs`` compiles. Programs that lower to the same text (source
    locations aside) compile to the same code and are compiled once: check_vma True and False
    mostly do, and float32 ``pallas_hopper`` is ``pallas_gpu``'s Triton step (a float32 Triton
    backward takes a minute or more to compile here)."""
    compiled = {}
    for (impl, check_vma), (key, lowered) in _ring_programs(dtype, head_dim).items():
        if key not in compiled:
            compiled[key] = lowered.compile()
        assert compiled[key].memory_analysis().temp_size_in_bytes > 0, (impl, check_vma)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_float32_ring_lowers_for_h200(head_dim):
    """On every jax, the float32 programs whose compiles are ``once``: each implementation lowers
    under both ``check_vma`` settings with its kernels, float32 ``pallas_hopper`` as the Triton step."""
    programs = _ring_programs("float32", head_dim)
    assert len(programs) == 2 * len(IMPLS)


@pytest.mark.parametrize("check_vma", [True, False], ids=["vma", "novma"])
@pytest.mark.parametrize(
    "variant",
    [
        dict(deterministic=True, head_dim=64),  # the two-kernel "mosaic" backward
        dict(deterministic=True, head_dim=128),
        dict(head_dim=128, sliding_window=700, strategy="all_gather"),
        dict(head_dim=64, sinks=True, strategy="auto"),
        dict(head_dim=128, n=4),
    ],
    ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()),
)
def test_hopper_backwards_compile_for_h200(variant, check_vma):
    """``implementation="auto"`` (pallas_hopper on an H200) in bfloat16 with what the GPU users of
    issue 58 ran: ``deterministic=True``, sinks, windows, the all-gather and "auto" strategies and a
    ring of 4. Every one compiles its Mosaic GPU kernels."""
    variant = dict(variant)
    n, head_dim = variant.pop("n", 2), variant.pop("head_dim")
    if variant.pop("sinks", False):
        variant["sinks"] = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
    mesh = Mesh(np.array(h200_devices(n)), ("sp",))
    assert implementations.resolve("auto", mesh).name == "pallas_hopper"
    text, compiled = _compile(mesh, check_vma, jnp.bfloat16, head_dim, **variant)
    assert _kernels(text)["mosaic"] >= 2 and _kernels(text)["triton"] == 0
    assert compiled.memory_analysis().temp_size_in_bytes > 0


# issue 59's options of pallas_hopper, alone and together (with a window and segment ids)
OPTIONS = {
    "softcap": dict(logits_soft_cap=30.0),
    "prefix": dict(prefix_length=True),
    "bidirectional": dict(bidirectional_segments=True),
    "mla_192_128": dict(head_dim=192, v_head_dim=128),
    "gemma2_256_softcap": dict(head_dim=256, logits_soft_cap=50.0),
    "all": dict(
        head_dim=192,
        v_head_dim=128,
        logits_soft_cap=30.0,
        prefix_length=True,
        bidirectional_segments=True,
        sliding_window=300,
    ),
}


# a ring of 4 runs the kernels of a ring of 2 with more steps: compiled on .venv's jax (``once``)
@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.once)])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_hopper_options_compile_for_h200(option, n):
    """Each option of ``pallas_hopper`` alone and all together, causal zigzag with packed
    documents, bf16, in a user's ``shard_map(check_vma=True)`` on rings of 2 and 4 H200s: "auto"
    runs them on the Mosaic GPU kernels (no Triton), forward and gradients compile."""
    kw = dict(OPTIONS[option])
    head_dim, dv = kw.pop("head_dim", 128), kw.pop("v_head_dim", None)
    mesh = Mesh(np.array(h200_devices(n)), ("sp",))
    L = n * 512
    sh = NamedSharding(mesh, SPEC)
    seg = jnp.asarray(np.repeat(np.arange(1, 5), L // 4)[None], jnp.int32)
    if kw.pop("bidirectional_segments", False):
        kw["bidirectional_segments"], seg = True, jnp.where(seg % 2 == 0, -seg, seg)
    if kw.pop("prefix_length", False):
        kw["prefix_length"] = jnp.full((1,), L // 3, jnp.int32)

    def local(q, k, v, s):
        return ra.ring_attention(q, k, v, "sp", causal=True, layout="zigzag", segment_ids=s, **kw)

    ring = jax.shard_map(local, mesh=mesh, in_specs=(SPEC,) * 4, out_specs=SPEC)
    loss = lambda q, k, v: jnp.sum(jnp.sin(ring(q, k, v, seg).astype(jnp.float32)))  # noqa: E731
    sds = lambda h, d: jax.ShapeDtypeStruct((1, L, h, d), jnp.bfloat16, sharding=sh)  # noqa: E731
    args = (sds(4, head_dim), sds(2, head_dim), sds(2, dv or head_dim))
    lowered = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).trace(*args).lower()
    found = _kernels(lowered.as_text())
    assert found["mosaic"] >= 2 and found["triton"] == 0, found
    assert lowered.compile().memory_analysis().temp_size_in_bytes > 0


def _train_step(preset_yaml: str, n: int, overrides: list[str]):
    """The preset's training step (forward, backward, optimizer) with ``attention="auto"`` on ``n``
    H200s, compiled."""
    from models.sharding import BATCH, MeshConfig, make_mesh
    from train import config as config_lib
    from train import steps

    config = config_lib.load(str(ROOT / "configs" / preset_yaml), ["--cpu_devices=0", *overrides])
    model_cfg = dataclasses.replace(steps.model_config(config), attention="auto")
    m = config.mesh
    mesh = make_mesh(MeshConfig(dp=m.dp, fsdp=m.fsdp, tp=m.tp, sp=m.sp), h200_devices(n))
    fns = steps.functions(model_cfg, mesh, config.optim, config.steps)
    rows, L = config.data.batch_size, config.data.seq_len
    accum = config.optim.accum_steps
    sh = NamedSharding(mesh, P(None, BATCH, "sp"))
    batch = {
        k: jax.ShapeDtypeStruct((accum, rows // accum, L), jnp.int32, sharding=sh)
        for k in ("input_ids", "targets")
    }
    batch["loss_mask"] = jax.ShapeDtypeStruct((accum, rows // accum, L), jnp.float32, sharding=sh)
    assert implementations.resolve("auto", mesh).name == "pallas_hopper"
    lowered = fns.train_step.trace(fns.params_abstract, fns.opt_abstract, batch).lower()
    return lowered.as_text(), lowered.compile()


@pytest.mark.parametrize(
    "preset,n,overrides,want",
    [
        # debug.yaml: float32 on a ring of 4 x fsdp 2 (pallas_hopper delegates float32 to Triton)
        ("debug.yaml", 8, [], "triton"),
        # llama1b_long.yaml: bf16, save_attn, zigzag; 4K tokens on a ring of 2 (the kernels do not
        # depend on the length) and at the preset's 32K on one H200
        (
            "llama1b_long.yaml",
            2,
            ["--data.seq_len=4096", "--data.batch_size=1", "--optim.accum_steps=1"],
            "mosaic",
        ),
        ("llama1b_long.yaml", 1, ["--data.batch_size=1", "--optim.accum_steps=1"], "mosaic"),
    ],
    ids=["debug-8", "1b-4K-ring2", "1b-32K-1gpu"],
)
def test_preset_training_step_compiles_for_h200(preset, n, overrides, want):
    text, compiled = _train_step(preset, n, overrides)
    found = _kernels(text)
    assert found[want] >= 2, found  # the ring's forward and backward kernels
    assert compiled.memory_analysis().temp_size_in_bytes > 0

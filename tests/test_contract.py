"""One contract for every implementation (issue: the library where users run it).

``ring_attention`` runs inside the user's own ``jax.shard_map`` with ``check_vma`` left at its default
(True) as well as False: kernel outputs vary over the manual axes their inputs vary over. "auto" and
the platform check read the platform of the mesh being traced, not the host's backend, so a CPU host
lowers the ring for a TPU slice (compiled here by the TPU compiler, from libtpu) or a GPU mesh.
"""

from __future__ import annotations

import collections
import importlib
import os
import pathlib
import re
import subprocess
import sys
import types
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from ringcheck import (
    F32_RTOL,
    Problem,
    check_ring,
    h200_devices,
    mosaic_modules,
    reference64,
    rel_err,
    tpu_devices,
)

import ringattention as ra
from ringattention import implementations

SPEC = P("dp", "sp")
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ring_fn(mesh, check_vma: bool, **kw):
    def local(q, k, v):
        return ra.ring_attention(q, k, v, "sp", causal=True, **kw)

    return jax.shard_map(local, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC, check_vma=check_vma)


def _abstract(B=1, L=4 * 512, H=4, K=2, D=128, dtype=jnp.bfloat16):
    sd = lambda *s: jax.ShapeDtypeStruct(s, dtype)  # noqa: E731
    return sd(B, L, H, D), sd(B, L, K, D), sd(B, L, K, D)


def _grad_of(fn):
    return jax.grad(lambda q, k, v: fn(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))


@pytest.mark.parametrize("check_vma", [True, False])
def test_auto_picks_pallas_tpu_for_a_tpu_mesh_and_the_tpu_compiler_compiles_it(check_vma):
    mesh = Mesh(np.array(tpu_devices()).reshape(1, 4), ("dp", "sp"))
    assert implementations.resolve("auto", mesh).name == "pallas_tpu"
    picked = []
    fn = _ring_fn(mesh, check_vma, layout="zigzag")
    with mock.patch.object(implementations, "resolve", wraps=implementations.resolve) as spy:
        fwd = jax.jit(fn).trace(*_abstract()).lower().compile()
        picked = {c.args[0] if c.args else None for c in spy.call_args_list}
    assert "auto" in picked
    text = jax.jit(fn).trace(*_abstract()).lower().as_text()
    assert "tpu_custom_call" in text  # the Mosaic TPU kernel, not the XLA fallback
    assert fwd.memory_analysis().temp_size_in_bytes > 0
    grads = jax.jit(_grad_of(fn)).trace(*_abstract()).lower().compile()
    assert grads.cost_analysis() is not None


def test_kernel_not_for_the_mesh_platform_names_it():
    mesh = Mesh(np.array(tpu_devices()).reshape(1, 4), ("dp", "sp"))
    fn = _ring_fn(mesh, True, implementation="pallas_gpu")
    with pytest.raises(ValueError, match=r"pallas_gpu.*platform='tpu'"):
        jax.jit(fn).trace(*_abstract())


def test_sharded_attention_resolves_for_its_mesh():
    mesh = Mesh(np.array(tpu_devices()).reshape(1, 4), ("dp", "sp"))
    fn = lambda q, k, v: ra.sharded_attention(q, k, v, mesh, causal=True)  # noqa: E731
    text = jax.jit(fn).trace(*_abstract()).lower().as_text()
    assert "tpu_custom_call" in text


def _h200_mesh_device(mesh=None):
    return types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")


@pytest.mark.parametrize(
    "kind,today", [("NVIDIA A100-SXM4-80GB", "pallas_gpu"), ("NVIDIA H200", "pallas_hopper")]
)
def test_auto_runs_xla_where_the_pallas_kernels_cannot_be_imported(kind, today):
    """Where the kernel modules fail to import (pallas_gpu is Pallas Triton, deprecated since jax
    0.11; pallas_hopper is Mosaic GPU), "auto" passes over them: every NVIDIA GPU then runs the XLA
    step instead of failing at the first call (docs/kernels.md)."""
    device = types.SimpleNamespace(platform="gpu", device_kind=kind)
    real = importlib.import_module

    def gone(name, *args, **kw):
        if name.rpartition(".")[2].startswith("pallas_"):
            raise ImportError(f"{name}: no such Pallas backend in this jax")
        return real(name, *args, **kw)

    with mock.patch.object(implementations, "mesh_device", lambda mesh=None: device):
        assert implementations.resolve("auto").name == today
        with mock.patch.object(importlib, "import_module", gone):
            assert implementations.resolve("auto").name == "xla"


# A fresh interpreter in which Pallas Triton does not import (as when jax removes it): the Hopper
# step on a ring of 2 H200s, lowered (tests/test_contract.py::test_hopper_needs_no_pallas_triton).
_NO_TRITON = """
import importlib.abc, sys
BLOCKED = ("jax.experimental.pallas.triton", "jax._src.pallas.triton")

class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED or name.startswith(tuple(b + "." for b in BLOCKED)):
            raise ImportError(f"{name}: no Pallas Triton in this jax")

sys.meta_path.insert(0, NoTriton())
sys.path.insert(0, "tests")
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from ringcheck import _h200_topology
import ringattention as ra
from ringattention import implementations

mesh = Mesh(np.array(_h200_topology(2)), ("sp",))
print("auto:", implementations.resolve("auto", mesh).name)
print("pallas_gpu available:", implementations.resolve("pallas_gpu").available(mesh))
ph = implementations.resolve("pallas_hopper").load()
try:
    ph.BlockSizes(backward="triton")
except ValueError as e:
    print("backward=triton:", type(e).__name__, e)

def lowered(dtype, head_dim, **kw):
    def local(q, k, v):
        return ra.ring_attention(q, k, v, "sp", causal=True, layout="zigzag", **kw)
    ring = jax.shard_map(local, mesh=mesh, in_specs=(P(None, "sp"),) * 3, out_specs=P(None, "sp"))
    loss = lambda q, k, v: jnp.sum(ring(q, k, v).astype(jnp.float32))
    sds = lambda h: jax.ShapeDtypeStruct((1, 1024, h, head_dim), dtype,
                                         sharding=NamedSharding(mesh, P(None, "sp")))
    text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).trace(sds(4), sds(2), sds(2))
    text = text.lower().as_text()
    return text.count("@mosaic_gpu"), text.count("xla.gpu.triton")

for head_dim in (64, 128, 256):
    print(f"bf16 {head_dim}:", *lowered(jnp.bfloat16, head_dim))
print("bf16 deterministic:", *lowered(jnp.bfloat16, 128, deterministic=True))
print("f32:", *lowered(jnp.float32, 64, implementation="pallas_hopper"))
jax.config.update("jax_default_matmul_precision", "highest")  # as tests/conftest.py
from ringcheck import Problem, check_ring  # float32 on this CPU host: the XLA step, exact
pb = Problem(n=2, segments=True, softcap=5.0, prefix=True, bidirectional=True, v_head_dim=24)
print("f32 errors:", max(check_ring(pb, implementation="pallas_hopper", interpret=True)))
triton = BLOCKED + ("ringattention.kernels.triton.",)
print("modules:", sorted(m for m in sys.modules if m.startswith(triton)))
"""


def test_hopper_needs_no_pallas_triton():
    """Issue 59: on Hopper nothing depends on Pallas Triton. In a process where it cannot be
    imported, "auto" on H200s still picks pallas_hopper (and passes over pallas_gpu), its bf16
    forward and gradients lower to Mosaic GPU kernels only (the fused, two-kernel and
    head-dim-split backwards), float32 runs the XLA step instead of the Triton one (within
    F32_RTOL of float64, every feature on), and
    ``BlockSizes(backward="triton")`` is a ValueError saying why; no Triton module was imported."""
    h200_devices()  # skips where this jax has no CUDA plugin
    out = subprocess.run(
        [sys.executable, "-c", _NO_TRITON],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert got["auto"] == "pallas_hopper" and got["pallas_gpu available"] == "False", got
    assert got["backward=triton"].startswith("ValueError") and "Pallas Triton" in got["backward=triton"], got
    for key in ("bf16 64", "bf16 128", "bf16 256", "bf16 deterministic"):
        mosaic, triton = map(int, got[key].split())
        assert mosaic >= 2 and triton == 0, (key, got[key])  # a forward and a backward kernel
    assert got["f32"] == "0 0", got  # XLA ops only
    assert float(got["f32 errors"]) <= F32_RTOL, got  # against float64 (ringcheck.check_ring)
    assert got["modules"] == "[]", got


def test_pallas_gpu_lowers_for_cuda_under_check_vma():
    """The compiled Triton kernels type-check inside shard_map(check_vma=True) over a 2-D mesh
    whose batch axis the ring does not use, forward and gradients, lowered for CUDA."""
    mesh = Mesh(np.array(h200_devices(4)).reshape(2, 2), ("dp", "sp"))
    fn = _ring_fn(mesh, True, implementation="pallas_gpu")
    assert implementations.resolve("auto", mesh).name == "pallas_hopper"  # "auto" on an H200
    args = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, SPEC))
        for a in _abstract(B=2, L=2 * 256, H=4, K=2, D=64)
    ]
    text = jax.jit(_grad_of(fn)).trace(*args).lower().as_text()
    assert text.count("triton") >= 3  # forward, dq and dk/dv kernels


def _mosaic_kernel_ops(fn, *args) -> list[collections.Counter]:
    """Per Mosaic GPU kernel of ``fn`` lowered for CUDA: its MLIR operations, counted by name."""
    jax.clear_caches()
    with mosaic_modules() as texts:
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    return [collections.Counter(re.findall(r"= ([a-z_]+\.[a-z_.]+)", text)) for text in texts]


def test_pallas_hopper_under_check_vma_lowers_the_same_kernels():
    """pallas_hopper in a user's shard_map(check_vma=True) on a ring of 2 H200s, forward and
    gradients lowered for CUDA: the same Mosaic GPU kernels as under check_vma=False, but (jax 0.10)
    for one ``+ 0`` per loop bound read (``mosaic.bound``, folded by the compiler); "auto"
    picks it. The fused backward's dq accumulator is a Ref, which jax >= 0.11's mpmd_map refuses
    where it varies over manual axes (the step-1 failure of a GPU training run)."""
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "sp"))
    args = _abstract(B=2, L=2 * 256, H=4, K=2, D=64)
    with mock.patch.object(implementations, "mesh_device", _h200_mesh_device):
        assert implementations.resolve("auto").name == "pallas_hopper"
        checked, unchecked = (
            _mosaic_kernel_ops(_grad_of(_ring_fn(mesh, vma, implementation="auto")), *args)
            for vma in (True, False)
        )
    assert len(checked) == len(unchecked) >= 2  # forward and backward kernels
    for a, b in zip(checked, unchecked):
        extra = a - b
        assert not b - a and set(extra) <= {"arith.addi", "arith.constant"}, (extra, b - a)
        # lo, mid, hi (and a window's edge) under jax 0.10; jax >= 0.11 lowers identical kernels
        assert extra["arith.addi"] <= 4


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_xla_in_a_user_shard_map_matches_float64(n, check_vma):
    mesh = Mesh(np.array(jax.devices()[: 2 * n]).reshape(2, n), ("dp", "sp"))
    rng = np.random.default_rng(n)
    q, k, v, do = (
        rng.standard_normal(s).astype(np.float32)
        for s in [(2, 16 * n, 4, 16), (2, 16 * n, 2, 16), (2, 16 * n, 2, 16), (2, 16 * n, 4, 16)]
    )
    fn = _ring_fn(mesh, check_vma, implementation="auto")
    o, vjp = jax.vjp(jax.jit(fn), q, k, v)
    got = (o, *vjp(jnp.asarray(do)))
    want = reference64(q, k, v, do, causal=True, seg=None)
    errs = [rel_err(g, w) for g, w in zip(got, want)]
    assert max(errs) <= F32_RTOL, errs


# Each kernel at the smallest shapes its tiling takes (pallas_tpu: 128-row blocks; pallas_hopper:
# 64-row tiles, one interpreted GPU), causal zigzag with packed documents and GQA.
INTERPRET_CASES = {
    "xla": dict(shard=16, head_dim=16),
    "pallas_gpu": dict(shard=32, head_dim=16),
    "pallas_tpu": dict(shard=128, head_dim=128),
    "pallas_hopper": dict(shard=96, head_dim=32, dtype="bfloat16"),
}


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("impl", list(INTERPRET_CASES))
def test_every_kernel_in_a_user_shard_map_matches_float64(impl, n, check_vma):
    """The contract, in interpret mode on CPU: each implementation inside a user's shard_map under
    both check_vma settings, forward and gradients against the float64 global reference."""
    if impl == "pallas_hopper" and n > 1:
        pytest.skip("Mosaic GPU's interpreter simulates one GPU (rings over several: pallas_gpu)")
    pb = Problem(
        n=n,
        layout="zigzag",
        causal=True,
        segments=True,
        batch=1,
        heads=4,
        kv_heads=2,
        **INTERPRET_CASES[impl],
    )
    check_ring(pb, check_vma=check_vma, implementation=impl, interpret=impl != "xla")


def test_debug_model_training_step_compiles_for_tpu_with_auto_attention():
    """The debug preset's step (forward, backward, AdamW) on a ring of 4 TPU v5e chips, attention
    "auto" (pallas_tpu there), compiled by the TPU compiler on this CPU host."""
    import optax

    from models import llama
    from models.sharding import MeshConfig, make_mesh

    mesh = make_mesh(MeshConfig(sp=4), tpu_devices())
    config = llama.get_config("debug", attention="auto")
    opt = optax.adamw(1e-3)

    def step(params, state, batch):
        grads = jax.grad(lambda p: llama.loss_fn(config, p, batch, mesh=mesh)[0])(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params = llama.abstract_params(config)
    state = jax.eval_shape(opt.init, params)
    ids = jax.ShapeDtypeStruct((1, 4 * 128), jnp.int32)
    lowered = jax.jit(step).trace(params, state, {"input_ids": ids, "targets": ids}).lower()
    assert "tpu_custom_call" in lowered.as_text()  # the ring ran pallas_tpu, not the XLA fallback
    assert lowered.compile().memory_analysis().temp_size_in_bytes > 0


@pytest.mark.once  # the script's table; the TPU compiles it runs are the other tests' on every jax
def test_tpu_compile_benchmark_writes_its_table(tmp_path):
    """benchmarks/tpu_compile.py's smallest run: two ring rows and the debug step on v5e:2x2."""
    tpu_devices()
    import importlib.util
    import json
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "benchmarks" / "tpu_compile.py"
    spec = importlib.util.spec_from_file_location("tpu_compile", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = str(tmp_path / "tc")
    mod.main(
        [
            "--slices",
            "v5e:2x2",
            "--impls",
            "auto",
            "--head-dims",
            "128",
            "--plan",
            "debug@v5e:2x2",
            "--seqs",
            "1024,2048",
            "--out",
            out,
        ]
    )
    saved = json.loads(pathlib.Path(out + ".json").read_text())
    ring, train = saved["ring"], saved["train"]
    assert [r["segments"] for r in ring] == [False, True]
    assert all(
        r["compiles"] and r["impl"] == "pallas_tpu" and r["blocks"].startswith("512x1024") for r in ring
    )  # v5e's blocks, not the CPU host's
    assert [r["seq"] for r in train] == [1024, 2048] and all(r["fits"] for r in train)
    assert all(0 < r["peak_gib"] < r["hbm_gib"] and r["kernel"] for r in train)
    assert "| debug | v5e:2x2 | 4 | 4 x 1 | 2K |" in pathlib.Path(out + ".md").read_text()


def _sds(mesh, shape, dtype, spec=None):
    spec = P() if spec is None else spec
    return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.NamedSharding(mesh, spec))


def test_notebook_02_functions_compile_for_tpu():
    """What notebook 02 runs on a TPU runtime (debug.yaml with every chip on the ring): the training
    and eval steps, the sampler's next-token step and the ring-vs-plain forward, compiled for
    v5e:2x2 by the TPU compiler."""
    import pathlib

    from models import llama
    from models.sharding import BATCH, MeshConfig, make_mesh
    from train import config as config_lib
    from train import sample, steps

    root = pathlib.Path(__file__).parents[1]
    config = config_lib.load(
        str(root / "configs" / "debug.yaml"), ["--cpu_devices=0", "--mesh={dp: 1, fsdp: 1, tp: 1, sp: -1}"]
    )
    mesh = make_mesh(MeshConfig(sp=-1), tpu_devices())
    model_cfg = steps.model_config(config)
    fns = steps.functions(model_cfg, mesh, config.optim, config.steps)
    L, rows = config.data.seq_len, config.data.batch_size
    bspec = P(None, BATCH, "sp")
    batch = {k: _sds(mesh, (1, rows, L), jnp.int32, bspec) for k in ("input_ids", "targets")}
    batch["loss_mask"] = _sds(mesh, (1, rows, L), jnp.float32, bspec)
    compiled = [
        fns.train_step.trace(fns.params_abstract, fns.opt_abstract, batch).lower().compile(),
        fns.eval_step.trace(fns.params_abstract, batch).lower().compile(),
    ]
    buf = _sds(mesh, (1, L), jnp.int32, P(BATCH, "sp"))
    key = jax.eval_shape(lambda: jax.random.key(0))
    step = sample._next_token_fn(model_cfg, mesh, config.sample.temperature)
    compiled.append(step.trace(fns.params_abstract, buf, jnp.int32(1), key).lower().compile())
    fwd = jax.jit(lambda p, ids: llama.forward(model_cfg, p, ids, mesh=mesh))
    compiled.append(fwd.trace(fns.params_abstract, buf).lower().compile())
    assert all(c.memory_analysis().temp_size_in_bytes > 0 for c in compiled)


def test_notebook_03_functions_compile_for_tpu():
    """Notebook 03 on a TPU runtime: the needle prompts' prefill (ring attention "auto", which is
    pallas_tpu at these lengths) and the decoder's cache extension, compiled for v5e:2x2."""
    from models import decode, kvcache, llama
    from models import generate as gen
    from models.sharding import MeshConfig, make_mesh

    mesh = make_mesh(MeshConfig(sp=-1), tpu_devices())
    config = llama.get_config("debug", max_position_embeddings=4096, layout="zigzag", attention="auto")
    params = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        llama.abstract_params(config),
        llama.param_shardings(config, mesh),
    )
    T = gen.cache_length(2048 + 8, config.layout, mesh.shape["sp"])
    prefill = (
        decode._prefill_fn(config, mesh)
        .trace(params, _sds(mesh, (1, T), jnp.int32), _sds(mesh, (1,), jnp.int32))
        .lower()
    )
    assert "tpu_custom_call" in prefill.as_text()  # the ring ran the Mosaic TPU kernel
    logits, cache = prefill.out_info
    sh = kvcache.cache_sharding(mesh)
    cache = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=sh if a.ndim == 5 else jax.sharding.NamedSharding(mesh, P())
        ),
        cache,
    )
    extend = (
        decode._extend_fn(config, mesh, "allreduce")
        .trace(params, cache, _sds(mesh, (1, 8), jnp.int32), _sds(mesh, (1,), jnp.int32))
        .lower()
    )
    for lowered in (prefill, extend):
        assert lowered.compile().memory_analysis().temp_size_in_bytes > 0


def test_notebook_01_functions_compile_for_tpu():
    """Notebook 01 at its accelerator sizes on a TPU runtime of 8 cores (Colab's v2-8, 7.5 GiB
    each): the ring (sharded_attention, float32, packed documents) forward and gradients on all 8,
    and the naive reference it is checked against on one core, whose L x L scores must fit."""
    import json
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "notebooks" / "01_ring_attention_from_scratch.ipynb"
    source = "".join(line for c in json.loads(path.read_text())["cells"] for line in c["source"])
    S, H, K, D = map(int, re.findall(r"S, H, K, D = (\d+), (\d+), (\d+), (\d+)", source)[-1])
    devices = tpu_devices("v2:2x2")
    N = len(devices)
    L = N * S
    mesh, one = Mesh(np.array(devices), ("sp",)), Mesh(np.array(devices[:1]), ("sp",))
    seg = jnp.asarray(np.minimum(np.arange(L) // (L // 4), 3)[None], jnp.int32)
    loss_of = lambda attn: lambda q, k, v: jnp.sum(jnp.sin(attn(q, k, v)))  # noqa: E731
    ring = lambda q, k, v: ra.sharded_attention(
        q,
        k,
        v,
        mesh,
        causal=True,  # noqa: E731
        segment_ids=seg,
        layout="zigzag",
    )
    ref = lambda q, k, v: ra.reference_attention(
        q,
        k,
        v,
        causal=True,  # noqa: E731
        segment_ids=seg,
    )
    for fn, m in ((ring, mesh), (ref, one)):
        args = [_sds(m, (1, L, h, D), jnp.float32) for h in (H, K, K)]
        lowered = jax.jit(jax.grad(loss_of(fn), argnums=(0, 1, 2))).trace(*args).lower()
        assert ("tpu_custom_call" in lowered.as_text()) == (fn is ring)
        assert lowered.compile().memory_analysis().temp_size_in_bytes > 0

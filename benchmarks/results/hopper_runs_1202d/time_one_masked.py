"""Quick same-run timing (32:32:128, 32K, causal, bare backward step): the default two-loop causal
backward against one masked loop (loops_variant's one_masked) and cuDNN's gradient; medians of 5
per round, 3 interleaved rounds; grads of the two compared."""

import functools
import sys
import time

sys.path.insert(0, "benchmarks")
import hopper_profile as hp
import jax
import jax.numpy as jnp
from jax import lax

from ringattention.kernels import hopper_bwd_kernels as hbk

L, H, D = 32768, 32, 128
ks = jax.random.split(jax.random.key(0), 4)
q, k, v, do = (jax.random.normal(x, (1, L, H, D), jnp.bfloat16) for x in ks)
bs = hp.block_sizes(D, "default", True)
fwd, bwd_default = hp.pallas_fns(True, bs, False)
o, lse = jax.block_until_ready(fwd(q, k, v))
orig = hbk.block_loops


def one_masked(body, bounds, masked, carry):
    lo, hi = bounds[0], bounds[2]
    return lax.fori_loop(lo, hi, functools.partial(body, masked=masked), carry)


hbk.block_loops = one_masked
_, bwd_one = hp.pallas_fns(True, bs, False)
g_one = jax.block_until_ready(bwd_one(q, k, v, do, o, lse))
hbk.block_loops = orig
g_def = jax.block_until_ready(bwd_default(q, k, v, do, o, lse))
print(
    "max|diff| dq dk dv:",
    [float(jnp.max(jnp.abs(a - b))) for a, b in zip(g_def, g_one)],
    "max|dq|",
    float(jnp.max(jnp.abs(g_def[0]))),
    flush=True,
)
_, cg = hp.cudnn_fns(True)
args = {
    "default": (bwd_default, (q, k, v, do, o, lse)),
    "one_masked": (bwd_one, (q, k, v, do, o, lse)),
    "cudnn_grad": (cg, (q, k, v, do)),
}
for f, a in args.values():
    jax.block_until_ready(f(*a))
res = {n: [] for n in args}
for r in range(3):
    for n, (f, a) in args.items():
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            jax.block_until_ready(f(*a))
            ts.append(time.perf_counter() - t)
        res[n].append(sorted(ts)[2] * 1e3)
    print("round", r, {n: round(x[-1], 2) for n, x in res.items()}, flush=True)

"""Text generation with a sequence-sharded KV cache: ring-attention prefill, all-reduce decode.

Ring Attention with Blockwise Transformers (Liu, Zaharia & Abbeel 2023) for the prefill of prompts
longer than one device holds; the decode keeps every device's cache shard in place and merges
per-device partial attention with one small all-reduce instead of rotating the cache around the
ring for every token as Large World Model (Liu et al. 2024) does (``models.decode``).

API: :func:`prefill`, :func:`extend` (decode = extend by one token per sequence; from
``models.decode``), :func:`sample_logits`, :func:`generate` (batches of prompts of different
lengths, shared-prefix reuse, stop tokens, streaming). CLI: ``python -m models.generate --help``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh

from models import kvcache
from models.config import LlamaConfig
from models.decode import CACHE_MODES, extend, prefill
from models.kvcache import KVCache
from models.sharding import axis_size

if TYPE_CHECKING:
    import argparse

    from models.tokenizer import Tokenizer

__all__ = [  # prefill, extend and CACHE_MODES are models.decode's
    "CACHE_MODES",
    "Generation",
    "RunLoader",
    "Sampling",
    "add_source_args",
    "cache_length",
    "extend",
    "generate",
    "load_from_args",
    "load_model",
    "main",
    "prefill",
    "sample_logits",
]

F32 = jnp.float32
MAX_SHARED_SUFFIX = 2048  # longer suffixes after a shared prefix: a plain prefill (extend is dense)


@functools.partial(jax.jit, static_argnames=("temperature", "top_k", "top_p"))
def sample_logits(
    logits: jax.Array, key: jax.Array, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0
) -> jax.Array:
    """Next tokens int32 [B] from float32 logits [B, V]: greedy when ``temperature`` <= 0, else
    softmax(logits / temperature) restricted to the ``top_k`` largest and the smallest set of
    tokens whose probability reaches ``top_p`` (nucleus)."""
    if temperature <= 0:
        return jnp.argmax(logits, -1).astype(jnp.int32)
    x = logits.astype(F32) / temperature
    if top_k > 0:
        kth = lax.top_k(x, top_k)[0][:, -1:]  # [B, 1]
        x = jnp.where(x < kth, -jnp.inf, x)
    if top_p < 1.0:
        srt = jnp.sort(x, -1)[:, ::-1]  # [B, V] descending
        p = jax.nn.softmax(srt, -1)
        keep = (jnp.cumsum(p, -1) - p) < top_p  # the first token is always kept
        thr = jnp.min(jnp.where(keep, srt, jnp.inf), -1, keepdims=True)
        x = jnp.where(x < thr, -jnp.inf, x)
    return jax.random.categorical(key, x).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How next tokens are picked (see :func:`sample_logits`)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"bad sampling: {self.temperature=} (>= 0), {self.top_k=} (>= 0), {self.top_p=} (in (0, 1])"
            )


@dataclasses.dataclass
class Generation:
    """Generated tokens per prompt (stop tokens excluded), why each row ended ("stop" | "length"),
    the per-step float32 logits [steps, B, V] when asked for, and the cache length used."""

    tokens: list[list[int]]
    finish: list[str]
    logits: np.ndarray | None
    cache_len: int
    shared_prefix: int


def cache_length(needed: int, layout: str, ring: int) -> int:
    """The default cache length: ``needed`` rounded up to whole blocks of every shard."""
    parts = kvcache.granularity(layout, ring)
    block = 1024 if needed >= 16384 * parts else (128 if needed >= 128 * parts else 8)
    return -(-needed // (parts * block)) * parts * block


def _check_prompts(config: LlamaConfig, prompts) -> list[list[int]]:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError(
            f"prompts must be a non-empty list of non-empty token lists; got lengths "
            f"{[len(p) for p in prompts] if prompts else prompts}"
        )
    out = [[int(t) for t in p] for p in prompts]
    bad = [t for p in out for t in p if not 0 <= t < config.vocab_size]
    if bad:
        raise ValueError(f"prompt tokens {bad[:5]} are outside [0, vocab_size={config.vocab_size})")
    return out


def _common_prefix(prompts: list[list[int]]) -> int:
    n = min(len(p) for p in prompts) - 1  # every row keeps >= 1 token for its suffix
    i = 0
    while i < n and all(p[i] == prompts[0][i] for p in prompts):
        i += 1
    return i


def _start(config, params, prompts, T, mesh, share_prefix, min_prefix):
    """Prefills all prompts (the common prefix once when shared). Returns (logits, cache, p)."""
    B = len(prompts)
    p = _common_prefix(prompts) if share_prefix and B > 1 else 0
    if p < min_prefix or max(len(r) for r in prompts) - p > MAX_SHARED_SUFFIX:
        buf = np.zeros((B, T), np.int32)
        for i, row in enumerate(prompts):
            buf[i, : len(row)] = row
        logits, cache = prefill(config, params, buf, [len(r) for r in prompts], mesh=mesh)
        return logits, cache, 0
    nb = axis_size(mesh, "dp") * axis_size(mesh, "fsdp")
    one = np.zeros((nb, T), np.int32)  # the prefix once per data-parallel group
    one[:, :p] = prompts[0][:p]
    _, c1 = prefill(config, params, one, [p] * nb, mesh=mesh)
    rep = lambda x: jnp.repeat(x[:, :1], B, axis=1)  # noqa: E731  copy the prefix cache to every row
    k, v = rep(c1.k), rep(c1.v)
    sh = kvcache.cache_sharding(mesh)
    if sh is not None:
        k, v = jax.device_put(k, sh), jax.device_put(v, sh)
    cache = KVCache(k, v, jnp.full((B,), p, jnp.int32), c1.layout, c1.ring)
    suffix = [r[p:] for r in prompts]
    C = -(-max(len(s) for s in suffix) // 8) * 8  # chunk padded to a multiple of 8: fewer shapes
    buf = np.zeros((B, C), np.int32)
    for i, s in enumerate(suffix):
        buf[i, : len(s)] = s
    logits, cache = extend(config, params, cache, buf, [len(s) for s in suffix], mesh=mesh)
    return logits, cache, p


def _accept(tok, out, done, finish, stops, stream, stop_check) -> None:
    """Each running row's sampled token: a stop id ends the row (not kept); otherwise it is kept
    (and streamed), and ``stop_check`` may end the row after it. Updates out, done, finish."""
    for i in np.flatnonzero(~done):
        t = int(tok[i])
        if t in stops:
            done[i], finish[i] = True, "stop"
            continue
        out[i].append(t)
        if stream is not None:
            stream(int(i), t)
        if stop_check is not None and stop_check(int(i), out[i]):
            done[i], finish[i] = True, "stop"


def generate(
    config: LlamaConfig,
    params: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    mesh: Mesh | None = None,
    sampling: Sampling = Sampling(),
    stop_ids: Sequence[int] = (),
    stop_check: Callable[[int, list[int]], bool] | None = None,
    stream: Callable[[int, int], None] | None = None,
    share_prefix: bool = True,
    min_shared_prefix: int = 1,
    cache_len: int | None = None,
    return_logits: bool = False,
    mode: str = "allreduce",
) -> Generation:
    """Continues every prompt (a list of token ids) by up to ``max_new_tokens`` tokens.

    Prompts of different lengths share one right-padded batch with per-row lengths. Rows whose
    prompts share a prefix of >= ``min_shared_prefix`` tokens prefill it once and copy its cache.
    A row ends at a token in ``stop_ids``, when ``stop_check(row, generated)`` is true, or after
    ``max_new_tokens``. ``stream(row, token)`` is called for every kept token as it is produced.
    """
    prompts = _check_prompts(config, prompts)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a positive int")
    rows = len(prompts)
    nb = axis_size(mesh, "dp") * axis_size(mesh, "fsdp")
    prompts = prompts + [prompts[0]] * (-rows % nb)  # pad the batch to the data-parallel size
    n = axis_size(mesh, "sp")
    needed = max(len(p) for p in prompts) + max_new_tokens
    T = cache_length(needed, config.layout, n) if cache_len is None else cache_len
    if T < needed:
        raise ValueError(f"cache_len={T} < longest prompt + max_new_tokens = {needed}")
    logits, cache, shared = _start(config, params, prompts, T, mesh, share_prefix, max(1, min_shared_prefix))
    key = jax.random.key(sampling.seed)
    out: list[list[int]] = [[] for _ in prompts]
    done = np.zeros(len(prompts), bool)
    done[rows:] = True
    finish = ["length"] * rows
    kept = []
    stops = {int(s) for s in stop_ids}
    for step in range(max_new_tokens):
        if return_logits:
            kept.append(np.asarray(logits[:rows]))
        knobs = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
        tok = np.asarray(sample_logits(logits, jax.random.fold_in(key, step), **knobs))
        _accept(tok, out, done, finish, stops, stream, stop_check)
        if done.all() or step == max_new_tokens - 1:
            break
        logits, cache = extend(
            config, params, cache, tok[:, None], (~done).astype(np.int32), mesh=mesh, mode=mode
        )
    return Generation(out[:rows], finish, np.stack(kept) if return_logits else None, T, shared)


def load_model(
    *, hf: str | None = None, preset: str | None = None, mesh: Mesh | None = None, **overrides: Any
) -> tuple[LlamaConfig, Any, Tokenizer]:
    """(config, params, tokenizer) from a Hugging Face directory or a preset with random weights.

    A training run directory is read on the training side: ``train.generate.load_run`` (CLI:
    ``python -m train.generate --run_dir DIR``), so that this package never imports ``train``.
    """
    import os

    from models import llama
    from models.tokenizer import ByteTokenizer, HFTokenizer

    if (hf is None) == (preset is None):
        raise ValueError(f"give exactly one of hf / preset; got {hf=} {preset=}")
    if hf is not None:
        config, params = llama.load_hf(hf, **overrides)
        tok_file = f"{hf.rstrip('/')}/tokenizer.json"
        tok = HFTokenizer(tok_file) if os.path.exists(tok_file) else ByteTokenizer()
    else:
        config = llama.get_config(preset, **overrides)
        params = llama.init_params(config, jax.random.key(0), mesh)
        tok = ByteTokenizer()
    if mesh is not None:
        params = jax.device_put(params, llama.param_shardings(config, mesh))
    if config.vocab_size < tok.vocab_size:
        raise ValueError(f"tokenizer vocab {tok.vocab_size} > model vocab {config.vocab_size}")
    return config, params, tok


# (run_dir, mesh, **LlamaConfig overrides) -> (config, params, tokenizer); see train.generate
RunLoader = Callable[..., tuple]


def add_source_args(ap: argparse.ArgumentParser, load_run: RunLoader | None) -> None:
    """The model source options of the CLIs here: --hf, --preset (and --run_dir with a loader)."""
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf", help="Hugging Face LLaMA directory (config.json, safetensors)")
    src.add_argument("--preset", help="a models.PRESETS name with random weights (smoke tests)")
    if load_run is not None:
        src.add_argument("--run_dir", help="training run directory (config.yaml + checkpoints/)")


def load_from_args(
    args: argparse.Namespace, mesh: Mesh | None, load_run: RunLoader | None, **overrides: Any
) -> tuple[LlamaConfig, Any, Tokenizer]:
    """(config, params, tokenizer) from the options of :func:`add_source_args`."""
    if getattr(args, "run_dir", None):
        return load_run(args.run_dir, mesh=mesh, **overrides)
    return load_model(hf=args.hf, preset=args.preset, mesh=mesh, **overrides)


def _parser(prog: str, load_run: RunLoader | None):
    from models.cli import Parser

    ap = Parser(prog=prog, description=__doc__.split("\n")[0])
    add_source_args(ap, load_run)
    ap.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    ap.add_argument("--prompt-file", action="append", default=[], help="a file holding a prompt")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--top-k", type=int, default=0, help="0: off")
    ap.add_argument("--top-p", type=float, default=1.0, help="1: off")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    ap.add_argument("--stop-id", action="append", type=int, default=[], help="a stop token id")
    ap.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    ap.add_argument("--sp", type=int, default=1, help="sequence-parallel ring size (-1: all devices)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    ap.add_argument("--cache-len", type=int, default=None, help="KV cache length (default: fit)")
    ap.add_argument("--no-share-prefix", action="store_true")
    ap.add_argument("--dtype", default=None, help="compute dtype override, e.g. bfloat16")
    ap.add_argument("--layout", default=None, help="ring layout override")
    ap.add_argument("--attention", default=None, help="prefill attention implementation override")
    return ap


def _read_prompts(parser, args) -> list[str]:
    """The --prompt texts and the --prompt-file contents; a usage error if there are none."""
    prompts = list(args.prompt)
    for path in args.prompt_file:
        try:
            with open(path, encoding="utf-8") as f:
                prompts.append(f.read())
        except (OSError, UnicodeDecodeError) as e:
            parser.error(f"--prompt-file {path!r} cannot be read: {e}")
    if not prompts:
        parser.error("give at least one --prompt or --prompt-file")
    return prompts


def _streamer(tok, rows: int) -> Callable[[int, int], None]:
    """``stream(row, token)`` for ``generate``: writes each row's new text as its tokens arrive
    (decoded whole, so multi-token characters print once complete; rows prefixed [i] where
    several)."""
    import sys

    printed = [0] * rows
    partial: list[list[int]] = [[] for _ in range(rows)]

    def stream_fn(row: int, token: int) -> None:
        partial[row].append(token)
        text = tok.decode(partial[row])
        delta, printed[row] = text[printed[row] :], len(text)
        prefix = "" if rows == 1 else f"[{row}] "
        sys.stdout.write(prefix + delta + ("" if rows == 1 else "\n"))
        sys.stdout.flush()

    return stream_fn


def _cut(text: str, stops: Sequence[str]) -> str:
    """The text before the first of ``stops`` (each in turn)."""
    for s in stops:
        text = text.split(s)[0] if s in text else text
    return text


def main(
    argv: Sequence[str] | None = None,
    *,
    load_run: RunLoader | None = None,
    prog: str = "python -m models.generate",
) -> list[str]:
    """The CLI; returns the generated texts (stop strings cut off). ``load_run`` adds ``--run_dir``
    (``python -m train.generate`` passes the training side's loader)."""
    import sys

    from models.sharding import MeshConfig, make_mesh

    parser = _parser(prog, load_run)
    args = parser.parse_args(argv)
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens={args.max_new_tokens} must be >= 1")
    prompts = _read_prompts(parser, args)
    mesh = None
    if args.sp != 1 or args.tp != 1:
        devices = jax.devices() if args.sp == -1 else jax.devices()[: args.sp * args.tp]
        mesh = make_mesh(MeshConfig(dp=1, fsdp=1, tp=args.tp, sp=args.sp), devices)
    overrides = {
        k: getattr(args, k) for k in ("dtype", "layout", "attention") if getattr(args, k) is not None
    }
    config, params, tok = load_from_args(args, mesh, load_run, **overrides)
    stop_ids = list(args.stop_id) + ([tok.eos_id] if tok.eos_id is not None else [])
    stop_check = None
    if args.stop:
        stop_check = lambda row, ids: any(s in tok.decode(ids) for s in args.stop)  # noqa: E731
    gen = generate(
        config,
        params,
        [tok.encode(p) for p in prompts],
        max_new_tokens=args.max_new_tokens,
        mesh=mesh,
        sampling=sampling,
        stop_ids=stop_ids,
        stop_check=stop_check,
        stream=_streamer(tok, len(prompts)) if args.stream else None,
        share_prefix=not args.no_share_prefix,
        cache_len=args.cache_len,
    )
    texts = [_cut(tok.decode(ids), args.stop) for ids in gen.tokens]
    if args.stream:
        sys.stdout.write("\n")
    else:
        for i, text in enumerate(texts):
            print(text if len(texts) == 1 else f"[{i}] {text}")
    return texts


if __name__ == "__main__":
    import sys

    from models.cli import run

    sys.exit(run(main, "python -m models.generate"))

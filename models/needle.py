"""Needle-in-a-haystack retrieval: facts hidden at chosen depths of long filler contexts.

The long-context test of Large World Model (Liu, Yan, Zaharia & Abbeel 2024; after Kamradt's
"needle in a haystack"): a context of a chosen length holds one or more "needles" (the magic number
of a named city) at chosen depths; the model is asked for the numbers and scored on how many it
reproduces. The result is an accuracy grid (context length x depth), saved as JSON and a heatmap PNG.
Generation runs through ``models.generate`` (ring-attention prefill, sharded KV cache).

CLI: ``python -m models.needle --preset debug --lengths 256,512 --depths 0,0.5,1 --out DIR``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from jax.sharding import Mesh

from models import generate as gen
from models.config import LlamaConfig

if TYPE_CHECKING:
    from models.tokenizer import Tokenizer

FILLER = (
    "The river bends twice before it reaches the old mill.",
    "Most of the town wakes early on market days.",
    "A light rain fell over the hills for most of the afternoon.",
    "The library keeps its maps in long wooden drawers.",
    "Nobody remembered who had planted the row of pear trees.",
    "Trains to the coast leave from the second platform.",
    "The baker sets aside the last loaf for the night watchman.",
    "In winter the lake freezes from the edges inward.",
)
CITIES = ("Lisbon", "Osaka", "Quito", "Tallinn", "Nairobi", "Hobart", "Oslo", "Lima")


@dataclasses.dataclass(frozen=True)
class Case:
    """One prompt: its context length, depth, needles (city, number) and where they were put."""

    length: int
    depth: float
    needles: tuple[tuple[str, int], ...]
    prompt: tuple[int, ...]


def _needle_text(city: str, number: int) -> str:
    return f" The special magic number for {city} is {number}. "


def _question(needles) -> str:
    cities = ", ".join(c for c, _ in needles)
    return (
        f"\nWhat is the special magic number for {cities}? Answer with the number"
        f"{'s' if len(needles) > 1 else ''} only.\nAnswer:"
    )


def make_case(
    tokenizer: Tokenizer, length: int, depth: float, num_needles: int, rng: np.random.Generator
) -> Case:
    """A prompt of exactly ``length`` tokens with needles from ``depth`` (0: start, 1: end of the
    haystack) on, spread evenly over the rest of it when there are several."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth} must be in [0, 1]")
    if not 1 <= num_needles <= len(CITIES):
        raise ValueError(f"num_needles={num_needles} must be in [1, {len(CITIES)}]")
    cities = rng.choice(len(CITIES), num_needles, replace=False)
    needles = tuple((CITIES[i], int(rng.integers(1000, 10000))) for i in cities)
    pieces = [tokenizer.encode(_needle_text(c, n)) for c, n in needles]
    question = tokenizer.encode(_question(needles))
    room = length - len(question) - sum(len(p) for p in pieces)
    if room < 1:
        raise ValueError(
            f"length={length} is too short for {num_needles} needle(s) and the "
            f"question ({length - room + 1} tokens needed)"
        )
    hay: list[int] = []
    while len(hay) < room:
        hay += tokenizer.encode(" " + FILLER[int(rng.integers(len(FILLER)))])
    hay = hay[:room]
    cuts = [round(room * (depth + (1 - depth) * i / num_needles)) for i in range(num_needles)]
    ids, last = [], 0
    for cut, piece in zip(cuts, pieces, strict=True):
        ids += hay[last:cut] + piece
        last = cut
    ids += hay[last:] + question
    assert len(ids) == length
    return Case(length, float(depth), needles, tuple(ids))


def score(needles: Sequence[tuple[str, int]], text: str) -> float:
    """The fraction of needle numbers that appear in the answer ``text``."""
    return sum(str(n) in text for _, n in needles) / len(needles)


def run(
    config: LlamaConfig,
    params: Any,
    tokenizer: Tokenizer,
    *,
    lengths: Sequence[int],
    depths: Sequence[float],
    num_needles: int = 1,
    trials: int = 1,
    max_new_tokens: int = 12,
    mesh: Mesh | None = None,
    seed: int = 0,
) -> dict:
    """Scores every (length, depth) over ``trials`` random needle sets, one batch per length.

    Returns a JSON-ready dict: "lengths", "depths", "num_needles", "trials", "accuracy" [lengths]
    [depths] (mean score), and "cases" (one record per prompt: length, depth, needles, answer,
    score).
    """
    if not lengths or not depths or trials < 1:
        raise ValueError(f"need lengths, depths and trials >= 1; got {lengths=} {depths=} {trials=}")
    rng = np.random.default_rng(seed)
    acc = np.zeros((len(lengths), len(depths)))
    records = []
    for i, length in enumerate(lengths):
        cases = [
            make_case(tokenizer, int(length), float(d), num_needles, rng)
            for d in depths
            for _ in range(trials)
        ]
        out = gen.generate(
            config,
            params,
            [list(c.prompt) for c in cases],
            max_new_tokens=max_new_tokens,
            mesh=mesh,
            share_prefix=False,
        )
        for j, (case, toks) in enumerate(zip(cases, out.tokens, strict=True)):
            answer = tokenizer.decode(toks)
            s = score(case.needles, answer)
            acc[i, j // trials] += s / trials
            records.append(
                {
                    "length": case.length,
                    "depth": case.depth,
                    "needles": [list(n) for n in case.needles],
                    "answer": answer,
                    "score": s,
                }
            )
    return {
        "lengths": [int(x) for x in lengths],
        "depths": [float(d) for d in depths],
        "num_needles": num_needles,
        "trials": trials,
        "accuracy": acc.tolist(),
        "cases": records,
    }


def plot_heatmap(result: dict, path: str, title: str = "") -> None:
    """Writes the accuracy grid as a PNG: context length (x) by needle depth (y)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = np.asarray(result["accuracy"]).T  # [depths, lengths]
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * acc.shape[1], 1.0 + 0.5 * acc.shape[0]))
    im = ax.imshow(acc, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(acc.shape[1]), [str(x) for x in result["lengths"]])
    ax.set_yticks(range(acc.shape[0]), [f"{d:.0%}" for d in result["depths"]])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    for (r, c), v in np.ndenumerate(acc):
        ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=8)
    ax.set_title(title or f"needle in a haystack ({result['num_needles']} needle(s))")
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(
    argv: Sequence[str] | None = None,
    *,
    load_run: gen.RunLoader | None = None,
    prog: str = "python -m models.needle",
) -> dict:
    """CLI: writes ``needle.json`` and ``needle.png`` into ``--out``; returns the result.
    ``load_run`` adds ``--run_dir`` (``python -m train.generate needle`` passes it)."""
    import jax

    from models.cli import Parser
    from models.sharding import MeshConfig, make_mesh

    ap = Parser(prog=prog, description=__doc__.split("\n")[0])
    gen.add_source_args(ap, load_run)
    ap.add_argument("--lengths", default="1024,2048,4096", help="context lengths in tokens")
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="needle depths in [0, 1]")
    ap.add_argument("--needles", type=int, default=1, help="needles per prompt (multi-needle > 1)")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--sp", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--out", required=True, help="output directory")
    args = ap.parse_args(argv)
    mesh = None
    if args.sp != 1:
        devices = jax.devices() if args.sp == -1 else jax.devices()[: args.sp]
        mesh = make_mesh(MeshConfig(sp=args.sp), devices)
    overrides = {} if args.dtype is None else {"dtype": args.dtype}
    config, params, tok = gen.load_from_args(args, mesh, load_run, **overrides)
    result = run(
        config,
        params,
        tok,
        lengths=[int(x) for x in _floats(args.lengths)],
        depths=_floats(args.depths),
        num_needles=args.needles,
        trials=args.trials,
        max_new_tokens=args.max_new_tokens,
        mesh=mesh,
        seed=args.seed,
    )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "needle.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot_heatmap(result, os.path.join(args.out, "needle.png"))
    grid = np.asarray(result["accuracy"])
    print("depth \\ length " + " ".join(f"{n:>8d}" for n in result["lengths"]))
    for j, d in enumerate(result["depths"]):
        print(f"{d:>14.2f} " + " ".join(f"{grid[i, j]:>8.2f}" for i in range(grid.shape[0])))
    return result


if __name__ == "__main__":
    import sys

    from models.cli import run

    sys.exit(run(main, "python -m models.needle"))

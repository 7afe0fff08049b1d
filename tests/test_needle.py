"""The needle-in-a-haystack harness end to end on the tiny debug model (random weights)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from models import needle
from models.tokenizer import ByteTokenizer


@pytest.mark.parametrize("num_needles", [1, 3])
def test_cases_hold_needles_at_depth(num_needles):
    tok, rng = ByteTokenizer(), np.random.default_rng(0)
    for depth in (0.0, 0.5, 1.0):
        case = needle.make_case(tok, 400, depth, num_needles, rng)
        text = tok.decode(case.prompt)
        assert len(case.prompt) == 400 and len(case.needles) == num_needles
        spots = [text.index(f"magic number for {c} is {n}.") for c, n in case.needles]
        assert spots == sorted(spots)
        pieces = [needle._needle_text(c, n) for c, n in case.needles]
        room = 400 - len(needle._question(case.needles)) - sum(map(len, pieces))
        assert text.index(pieces[0]) == round(room * depth)  # bytes: one token per character
        assert text.endswith("Answer:")
        full = " ".join(str(n) for _, n in case.needles)
        assert needle.score(case.needles, full) == 1.0 and needle.score(case.needles, "") == 0.0
    with pytest.raises(ValueError, match="too short"):
        needle.make_case(tok, 40, 0.5, num_needles, rng)


def test_harness_writes_grid_json_and_heatmap(tmp_path):
    out = str(tmp_path / "nh")
    result = needle.main(
        [
            "--preset",
            "debug",
            "--lengths",
            "256,320",
            "--depths",
            "0,0.5,1",
            "--needles",
            "2",
            "--max-new-tokens",
            "4",
            "--sp",
            "2",
            "--out",
            out,
        ]
    )
    grid = np.asarray(result["accuracy"])
    assert grid.shape == (2, 3) and np.all((grid >= 0) & (grid <= 1))
    assert len(result["cases"]) == 6
    assert {(c["length"], c["depth"]) for c in result["cases"]} == {
        (n, d) for n in (256, 320) for d in (0.0, 0.5, 1.0)
    }
    for c in result["cases"]:
        assert c["score"] == needle.score([tuple(n) for n in c["needles"]], c["answer"])
    with open(os.path.join(out, "needle.json")) as f:
        assert json.load(f)["accuracy"] == result["accuracy"]
    with open(os.path.join(out, "needle.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"

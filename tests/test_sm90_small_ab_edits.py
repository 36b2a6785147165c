"""The small-batch A/B experiment's text edits still apply to the product Hopper kernel (optional: needs the
repository's experiments folder, which the installed package does not ship). CPU only, no compilation.

experiments/sm90_small_ab.py builds its variants by editing the product kernel's program source; each edit must
match an exact number of times, so a change of the kernel that breaks an edit raises instead of timing a kernel
that is not the one described.
"""

from __future__ import annotations

import pytest
import torch

from sglang_fp4_indexer.ops import sm90

ab = pytest.importorskip("experiments.sm90_small_ab", reason="the repository's experiments/ folder")

_CONFIG = sm90.Config.of_call(1, 64, torch.float32, False)


@pytest.mark.parametrize("variant", sorted(ab.VARIANT_EDITS))
def test_every_variant_applies(variant):
    text = ab.source(_CONFIG, variant)
    product = sm90._source_text(64)
    assert (text == product) == (variant == "product")


def test_table_all_holds_the_product_rows_and_the_formula_rows():
    # Rows A = KEYFOLD_LOW .. 0 are the product's table; rows A = 1 .. 3 the product decode's formula
    # (A * 0x08080800 + 0x0C080000, A * 0x08080808 + 0x1C181410); then zeros.
    text = ab.source(_CONFIG, "table_all")
    rows = sm90.keyfold_table()[:-1] + [((a * 0x08080800 + 0x0C080000) & 0xFFFFFFFF,
                                          (a * 0x08080808 + 0x1C181410) & 0xFFFFFFFF) for a in (1, 2, 3)] + [(0, 0)]
    want = ", ".join(f"{{0x{lo:08X}u, 0x{hi:08X}u}}" for lo, hi in rows)
    assert f"KF_ALL[11] = {{{want}}};" in text


def test_an_edit_that_no_longer_matches_raises(monkeypatch):
    monkeypatch.setitem(ab.VARIANT_EDITS, "broken", [("text the kernel does not hold", "x", 1)])
    with pytest.raises(RuntimeError, match="no longer matches"):
        ab.source(_CONFIG, "broken")

"""The f16-accumulator experiment's text edits still apply to the product Hopper kernel (optional: needs the
repository's experiments folder, which the installed package does not ship).

experiments/sm90_f16acc.py builds its kernels by editing the product kernel's source; each edit must match an
exact number of times, so a change of the product kernel that breaks an edit raises instead of timing a kernel
that is not the one described. This checks every edit set against the current product source and that what
they produce differs from it where it should (CPU only, no compilation).
"""

from __future__ import annotations

import pytest
import torch

from sglang_fp4_indexer.ops import sm90

f16acc = pytest.importorskip("experiments.sm90_f16acc", reason="the repository's experiments/ folder")


@pytest.mark.parametrize("pairs, variant", [(False, None), (True, None), (False, "warpmax"), (False, "noshift"),
                                           (False, "intshift"), (False, "keyfold")])
def test_edits_apply_to_the_product_kernel(pairs, variant):
    text = f16acc.source(64, pairs, variant)
    product = sm90._source_text(64)
    assert text != product
    assert "wgmma.mma_async.sync.aligned.m64n64k32.f16.e4m3.e4m3" in text
    assert "static_cast<int>(s_max) + 12;" not in text
    assert ("static_cast<int>(s_max) + 3;" if variant == "keyfold" else "static_cast<int>(s_max) + 9;") in text
    assert ("issue_pair" in text) == pairs
    if variant == "warpmax":
        assert "__reduce_max_sync" in text
    if variant in ("noshift", "keyfold"):
        assert "const int pq = 0 * static_cast<int>(mb);" in text
    if variant == "keyfold":
        assert "keyfold_lut[threadIdx.x] = KEYFOLD_TABLE[threadIdx.x];" in text and "* 0.0078125f;" not in text


def _nearest_e4m3_ties_even(x: float) -> int:
    """Independent oracle: the e4m3 byte nearest to ``x >= 0`` by enumerating every finite non-negative e4m3
    value (bytes 0 .. 0x7E: subnormals m 2**-9, normals (1 + m/8) 2**(e - 7)), ties to the even byte."""
    values = [(b & 7) * 2.0**-9 if b < 8 else (1 + (b & 7) / 8) * 2.0 ** ((b >> 3) - 7) for b in range(0x7F)]
    best = min(range(0x7F), key=lambda b: (abs(values[b] - x), b & 1))
    return best


@pytest.mark.parametrize("a", range(-9, 4))
def test_keyfold_table_is_the_nearest_e4m3(a):
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert f16acc.keyfold_bytes(a) == [_nearest_e4m3_ties_even(m * 2.0 ** (a - 6)) for m in mags]


@pytest.mark.parametrize("a", range(1, 4))
def test_keyfold_table_agrees_with_the_product_formula_where_it_holds(a):
    # the product decode's LUT for A >= 1: LUT[0] = 0, LUT[1] = A << 3, LUT[x >= 2] = (x << 2) + (A << 3)
    assert f16acc.keyfold_bytes(a) == [0, a << 3] + [(x << 2) + (a << 3) for x in range(2, 8)]


def test_keyfold_source_holds_the_table_of_every_low_exponent():
    text = f16acc.source(64, False, "keyfold")
    for a in range(f16acc.KEYFOLD_LOW, 1):
        b = f16acc.keyfold_bytes(a)
        lo, hi = int.from_bytes(bytes(b[:4]), "little"), int.from_bytes(bytes(b[4:]), "little")
        assert f"{{0x{lo:08X}u, 0x{hi:08X}u}}" in text
    assert f16acc.keyfold_bytes(f16acc.KEYFOLD_LOW - 1) == [0] * 8  # the table's last row, zeros


def test_an_edit_that_no_longer_matches_raises(monkeypatch):
    monkeypatch.setattr(f16acc, "EDITS", f16acc.EDITS + [("text the kernel does not hold", "x", 1)])
    with pytest.raises(RuntimeError, match="no longer matches"):
        f16acc.source(64)


def test_pairs_refuse_several_rows_per_wgmma():
    config = sm90.Config(2, 32, 0, False, 2)
    with pytest.raises(ValueError, match="mma_rows 1"):
        f16acc.spec(config, True)


def test_the_product_variant_is_the_product_spec():
    config = sm90.Config.of_call(1, 64, torch.float32, False)
    assert f16acc.spec(config, False, "product") == sm90._spec(config)

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
                                           (False, "intshift")])
def test_edits_apply_to_the_product_kernel(pairs, variant):
    text = f16acc.source(64, pairs, variant)
    product = sm90._source_text(64)
    assert text != product
    assert "wgmma.mma_async.sync.aligned.m64n64k32.f16.e4m3.e4m3" in text
    assert "static_cast<int>(s_max) + 9;" in text and "static_cast<int>(s_max) + 12;" not in text
    assert ("issue_pair" in text) == pairs
    if variant == "warpmax":
        assert "__reduce_max_sync" in text
    if variant == "noshift":
        assert "const int pq = 0 * static_cast<int>(mb);" in text


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

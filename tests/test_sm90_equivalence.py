"""The product Hopper kernel is the full-variant kernel of experiments/ at its production settings (optional: needs
gcc, and the repository's experiments folder, which the installed package does not ship).

experiments/sm90_equivalence.py preprocesses both for a served configuration and compares the token streams
(its docstring lists the normalisations); this runs it for one configuration of every (next_n, heads) pair, and
checks that the experiments' copy is the kernel of commit 1e88a43 byte for byte.
"""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch

from sglang_fp4_indexer.ops import sm90

equivalence = pytest.importorskip("experiments.sm90_equivalence", reason="the repository's experiments/ folder")
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (its preprocessor)")

#: SHA-256 of sglang_fp4_indexer/ops/cuda/paged_logits_sm90.cu at commit 1e88a43 (git tag sm90-experiments-2026-12).
VARIANTS_SHA256 = "7bc332e39d14901edae9844919bb1497a1275e4c73d4b9401b4d4d58b3d4114c"


def test_the_variants_file_is_the_kernel_of_1e88a43():
    assert hashlib.sha256(equivalence.sm90_variants.SOURCE.read_bytes()).hexdigest() == VARIANTS_SHA256


_CONFIGS = {}
for _c in sm90.served_configs():
    _CONFIGS.setdefault((_c.next_n, _c.heads), []).append(_c)


@pytest.mark.parametrize("key", sorted(_CONFIGS))
def test_product_kernel_is_the_variants_kernel_at_production_settings(key):
    configs = _CONFIGS[key]
    config = configs[(key[0] + key[1]) % len(configs)]  # a different logits dtype / lengths form per pair
    assert equivalence.compare(config) is None


def test_a_changed_kernel_is_caught(monkeypatch):
    # The comparison is not vacuous: one operator changed in the product's program text is a difference.
    config = sm90.Config.of_call(1, 64, torch.float32, True)
    text = equivalence.new_text(config)
    assert "max(1, (len + block_kv - 1) / block_kv)" in text
    monkeypatch.setattr(equivalence, "new_text", lambda c: text.replace("(len + block_kv - 1) / block_kv",
                                                                         "(len + block_kv) / block_kv"))
    why = equivalence.compare(config)
    assert why is not None and "block_kv - 1" in why

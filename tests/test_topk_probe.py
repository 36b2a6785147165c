"""scripts/sglang_topk_probe.py's comparison on the CPU (the probe itself needs SGLang's GPU kernels)."""

import importlib.util
from pathlib import Path

import torch

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "sglang_topk_probe.py"
_spec = importlib.util.spec_from_file_location("sglang_topk_probe", _PATH)
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def test_the_exact_top_k_passes_and_a_swapped_entry_is_counted():
    g = torch.Generator().manual_seed(0)
    lens = [3000, 1500]
    scores = torch.randn(2, 3008, generator=g)
    exact = probe.exact_sets(scores, lens)
    assert [len(s) for s in exact] == [2048, 1500]
    served = torch.full((2, probe.TOPK), -1, dtype=torch.int32)
    for r, s in enumerate(exact):
        served[r, : len(s)] = torch.tensor(sorted(s), dtype=torch.int32)
    assert probe.compare(served, lens, exact) == {"rows": 2, "rows_differ": 0, "entries_differ": 0}
    # Row 0 keeps the lowest-scoring position in place of one of its own: one row, one entry differ.
    low = int(torch.argmin(scores[0, :3000]))
    served[0, 0] = low
    assert probe.compare(served, lens, exact) == {"rows": 2, "rows_differ": 1, "entries_differ": 1}

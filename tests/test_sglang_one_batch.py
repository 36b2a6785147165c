"""The tool that runs the plugin inside SGLang's model runner (scripts/sglang_one_batch.py), on the CPU.

Its GPU stages run on a GPU machine (docs/sglang-seams.md); here: the top-k row
checks it applies to SGLang's captured rows (against planted faults), and that
its tiny DeepSeek-V3.2 is a model the plugin serves, by SGLang's own
classification through ``check``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "sglang_one_batch.py"
_spec = importlib.util.spec_from_file_location("sglang_one_batch", _PATH)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def _rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(20000, generator=g)[:3000]  # a request's KV slots by position
    lens = torch.tensor([100, 2500, 3000])
    rows = torch.full((3, tool.TOPK), -1, dtype=torch.int32)
    rows[0, :100] = slots[:100].int()
    rows[1] = slots[torch.randperm(2500, generator=g)[: tool.TOPK]].int()
    rows[2] = slots[torch.randperm(3000, generator=g)[: tool.TOPK]].int()
    return rows, lens, slots


def test_valid_rows_pass_as_slots():
    rows, lens, slots = _rows()
    got = tool.check_topk_rows(rows, lens, slots)
    assert got == {"rows": 3, "count": 0, "duplicate": 0, "out_of_range": 0, "slot": 3, "position": 0}


def test_each_planted_fault_is_counted():
    rows, lens, slots = _rows()
    rows[2, 5] = rows[2, 6]                   # a duplicate
    rows[1, 0] = 19999 if 19999 not in slots else 20001  # not one of the request's slots
    rows[0, 100] = slots[0]                   # 101 entries for a row that sees 100 keys (and a duplicate)
    got = tool.check_topk_rows(rows, lens, slots)
    assert got["count"] == 1 and got["duplicate"] == 2 and got["out_of_range"] == 1


def test_a_slot_beyond_the_rows_length_is_out_of_range():
    rows, lens, slots = _rows()
    rows[0, 0] = slots[150]  # the request's slot, but at position 150 >= len 100
    assert tool.check_topk_rows(rows, lens, slots)["out_of_range"] == 1


def test_positions_are_recognised_when_rows_hold_positions():
    lens = torch.tensor([4096])
    rows = torch.randperm(4096)[: tool.TOPK].int()[None]
    slots = torch.arange(10000, 14096)  # slots that the positions are not
    got = tool.check_topk_rows(rows, lens, slots)
    assert got["position"] == 1 and got["out_of_range"] == 0


@pytest.mark.sglang
def test_tiny_model_is_served_by_the_plugin(tmp_path, capsys):
    from sglang_fp4_indexer.cli import main

    tool.make_model(str(tmp_path / "tiny"))
    rc = main(["check", str(tmp_path / "tiny"), "--capability", "9.0"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "FP4 indexer: ENABLED" in out and "64 index heads x 128" in out

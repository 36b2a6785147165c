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


PROMPT, NEW, LAYERS = 3, 2, 2  # SGLang returns (PROMPT + NEW - 1, LAYERS, TOPK) per request


def _topk_rows(replace_last=False):
    """Rows as SGLang returns them: token t holds t + 1 distinct entries, -1 pads (FP4: the last one differs)."""
    a = -torch.ones(PROMPT + NEW - 1, LAYERS, tool.TOPK, dtype=torch.int64)
    for t in range(a.shape[0]):
        a[t, :, : t + 1] = torch.arange(t + 1)
        if replace_last:
            a[t, :, t] = 10**6
    return a


def _engine_result(path, fp4, topk, speculative="eagle"):
    import json

    reqs = [{"prompt_len": PROMPT, "output_ids": [5] * NEW, "spec_verify_ct": 1, "completion_tokens": NEW,
             "indexer_topk": None if topk is None else topk.flatten().tolist()}]
    path.write_text(json.dumps({"fp4": fp4, "speculative": speculative, "wall_s": 1.0, "requests": reqs}))
    return str(path)


def test_compare_checks_engine_and_server_results_without_the_runner_files(tmp_path, capsys):
    """``compare`` with only the Engine (MTP) and server results: each check passes or fails on what they hold."""
    import json

    fp8 = _engine_result(tmp_path / "e8.json", False, _topk_rows())
    fp4 = _engine_result(tmp_path / "e4.json", True, _topk_rows(replace_last=True))
    server = tmp_path / "server.json"
    server.write_text(json.dumps({"completion_tokens": 8, "ready_s": 40.0,
                                  "plugin_log": ["FP4 indexer active: MXFP4 index-key cache"]}))
    out_json = tmp_path / "summary.json"
    rc = tool.compare(["--engine", fp8, fp4, "--server", str(server), "--json", str(out_json)])
    summary = json.loads(out_json.read_text())
    checks = {c["check"]: c for c in summary["checks"]}
    assert rc == 0 and all(c["ok"] for c in checks.values())
    overlap = next(c for name, c in checks.items() if "returned top-k overlap" in name)
    rows = [t / (t + 1) for t in range(PROMPT + NEW - 1)]  # |FP4 & FP8| / |FP8| for row t
    assert f"{sum(rows) / len(rows):.4f}" in overlap["detail"]
    valid = [c for name, c in checks.items() if "every returned top-k row valid" in name]
    assert len(valid) == 2 and all(f"{(PROMPT + NEW - 1) * LAYERS} rows" in c["detail"] for c in valid)
    # no top-k returned by the FP4 engine, no tokens from the server: both fail
    _engine_result(tmp_path / "e4.json", True, None)
    server.write_text(json.dumps({"completion_tokens": 0, "plugin_log": []}))
    assert tool.compare(["--engine", fp8, fp4, "--server", str(server)]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("fault", ["duplicate", "missing", "extra"])
def test_an_engine_row_with_a_planted_fault_fails_its_check(tmp_path, fault):
    import json

    a = _topk_rows()
    if fault == "duplicate":
        a[2, 1, 1] = a[2, 1, 0]
    elif fault == "missing":
        a[3, 0, 3] = -1
    else:
        a[1, 0, 2] = 7
    fp8 = _engine_result(tmp_path / "e8.json", False, _topk_rows())
    fp4 = _engine_result(tmp_path / "e4.json", True, a)
    out_json = tmp_path / "summary.json"
    assert tool.compare(["--engine", fp8, fp4, "--json", str(out_json)]) == 1
    checks = {c["check"]: c for c in json.loads(out_json.read_text())["checks"]}
    bad = [c for name, c in checks.items() if not c["ok"]]
    assert len(bad) == 1 and "Engine FP4" in json.dumps(bad) and "1 failures" in bad[0]["detail"]


def test_compare_refuses_engine_runs_of_different_decoding(tmp_path):
    fp8 = _engine_result(tmp_path / "e8.json", False, _topk_rows(), speculative="none")
    fp4 = _engine_result(tmp_path / "e4.json", True, _topk_rows())
    with pytest.raises(SystemExit):
        tool.compare(["--engine", fp8, fp4])


def test_plain_engine_runs_are_labelled_as_such(tmp_path, capsys):
    fp8 = _engine_result(tmp_path / "e8.json", False, _topk_rows(), speculative="none")
    fp4 = _engine_result(tmp_path / "e4.json", True, _topk_rows(), speculative="none")
    assert tool.compare(["--engine", fp8, fp4]) == 0
    out = capsys.readouterr().out
    assert "plain decode" in out and "MTP" not in out


def test_compare_takes_three_runs_or_none(tmp_path):
    with pytest.raises(SystemExit):
        tool.compare([str(tmp_path / "a.pt")])

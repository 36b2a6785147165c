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


@pytest.mark.sglang
def test_tiny_interleaved_model_runs_sglangs_fused_indexer_with_the_plugins_rotation(tmp_path, capsys):
    """The GPU check's GLM-5.x stand-in: the tiny model with interleaved indexer RoPE, served with fusion on."""
    import json

    from sglang_fp4_indexer.cli import main

    tool.make_model(str(tmp_path / "m"), "tiny-interleaved")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["indexer_rope_interleave"] is True
    assert {k: v for k, v in cfg.items() if k != "indexer_rope_interleave"} == tool.TINY_CONFIG
    rc = main(["check", str(tmp_path / "m"), "--capability", "9.0"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0, out
    assert "FP4 indexer: ENABLED" in out
    assert ("SGLang's fused indexer skips the Hadamard rotation; with the FP4 cache the plugin applies SGLang's "
            "rotation to the index queries and keys") in out


@pytest.mark.sglang
def test_glm5_layers_have_glm5s_sizes_and_are_served_by_the_plugin(tmp_path, capsys):
    """The GLM-5-size layers for the profile: every field the packaged GLM-5 config gives, but its depth and expert
    count, is GLM-5's own; 3 layers of one EP8 rank's experts; the plugin serves it with 32 index heads and the
    rotation inside SGLang's fused indexer."""
    import json
    from importlib import resources

    from sglang_fp4_indexer.cli import main

    tool.make_model(str(tmp_path / "g"), "glm5-layers")
    cfg = json.loads((tmp_path / "g" / "config.json").read_text())
    glm5 = json.loads(resources.files("sglang_fp4_indexer").joinpath("data", "models", "glm-5", "config.json").read_text())
    differ = {k for k in glm5 if cfg.get(k) != glm5[k]}
    assert differ == {"num_hidden_layers", "n_routed_experts", "first_k_dense_replace"}
    assert (cfg["num_hidden_layers"], cfg["n_routed_experts"], cfg["first_k_dense_replace"]) == (3, 32, 1)
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    rs = cfg["rope_scaling"]  # YaRN's cached positions cover GLM-5's context
    assert rs["original_max_position_embeddings"] * rs["factor"] >= glm5["max_position_embeddings"]
    tool.make_model(str(tmp_path / "g78"), "glm5-layers", layers=78)
    assert json.loads((tmp_path / "g78" / "config.json").read_text())["num_hidden_layers"] == 78
    with pytest.raises(ValueError, match=r"layers: expected 1..78"):
        tool.make_model(str(tmp_path / "bad"), "glm5-layers", layers=79)
    rc = main(["check", str(tmp_path / "g"), "--capability", "9.0"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0, out
    assert "FP4 indexer: ENABLED" in out and "32 index heads x 128" in out and "GlmMoeDsaForCausalLM" in out
    assert "with the FP4 cache the plugin applies SGLang's rotation to the index queries and keys" in out


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


# --- EAGLE (MTP) top-k traces: scripts/topk_trace and ``trace-check`` ---------------------------------------

_TRACE_DIR = Path(__file__).resolve().parents[1] / "scripts" / "topk_trace"


def _request_rows(slots, positions, g):
    """Valid top-k rows of one request: row at position p holds min(p + 1, TOPK) of its slots at positions <= p."""
    out = torch.full((len(positions), tool.TOPK), -1, dtype=torch.int32)
    for r, p in enumerate(positions):
        k = min(p + 1, tool.TOPK)
        out[r, :k] = slots[torch.randperm(p + 1, generator=g)[:k]].int()
    return out


def _verify_record(seed=0, pad_rows=4):
    """One scheduled batch of two requests in target verify (2 draft tokens), as the trace plugin saves it."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens, req_lens = [2890, 2390], [2900, 2400]
    slots = [torch.randperm(30000, generator=g)[:2920], torch.randperm(30000, generator=g)[:2420] + 30000]
    pos = [[2900, 2901], [2400, 2401]]
    topk = torch.cat([_request_rows(slots[0], pos[0], g), _request_rows(slots[1], pos[1], g),
                      torch.full((pad_rows, tool.TOPK), -1, dtype=torch.int32)])  # a CUDA graph's padding rows
    p = torch.tensor(pos[0] + pos[1] + [0] * pad_rows)
    call = {"layer": 0, "mode": "TARGET_VERIFY", "rows": topk.shape[0], "graph": True, "topk": topk, "pos": p}
    return {"batch_size": 2, "prompt_lens": prompt_lens, "req_lens": req_lens, "req_slots": slots, "calls": [call]}


def test_trace_check_passes_valid_verify_rows_and_skips_the_padding():
    got = tool.check_trace([_verify_record()], draft_tokens=2)["modes"]["TARGET_VERIFY"]
    assert (got["rows"], got["calls"], got["graph_calls"], got["stale"]) == (4, 1, 1, 0)
    assert got["count"] == got["duplicate"] == got["out_of_range"] == got["missing_rows"] == 0


@pytest.mark.parametrize("fault", ["duplicate", "beyond_position", "other_request", "missing_entry"])
def test_trace_check_counts_each_planted_fault(fault):
    rec = _verify_record()
    call, slots = rec["calls"][0], rec["req_slots"]
    if fault == "duplicate":
        call["topk"][0, 5] = call["topk"][0, 6]
    elif fault == "beyond_position":  # the request's own slot, at a position the row does not see
        call["topk"][1, 0] = int(slots[0][2910])
    elif fault == "other_request":
        call["topk"][2, 0] = int(slots[0][3])
    else:
        call["topk"][3, 100] = -1
    got = tool.check_trace([rec], draft_tokens=2)["modes"]["TARGET_VERIFY"]
    kind = {"duplicate": "duplicate", "beyond_position": "out_of_range", "other_request": "out_of_range",
            "missing_entry": "count"}[fault]
    assert got[kind] >= 1 and got["rows"] == 4


def _draft_decode_record(seq_lens=(1000, 3000), step=1, entries=None, seed=1):
    """One scheduled batch of two requests in a draft decode step (``step`` 0 or 1 of EAGLE's 3), as SGLang 0.5.23
    serves it: the query at position ``L + step`` and the indexer over the ``L`` keys of the batch's sequence length
    (one metadata for every draft step). ``entries``: the keys a short request's (``L < TOPK``) top-k holds, drawn
    from its positions up to ``L + step`` (default: ``L``, from its first ``L``)."""
    g = torch.Generator().manual_seed(seed)
    slots = [torch.randperm(30000, generator=g)[:L + 16] + 30000 * i for i, L in enumerate(seq_lens)]
    topk = torch.full((len(seq_lens), tool.TOPK), -1, dtype=torch.int32)
    for i, L in enumerate(seq_lens):
        short = entries is not None and L < tool.TOPK  # ``entries`` changes the short requests' rows only
        n = entries if short else min(L, tool.TOPK)
        topk[i, :n] = slots[i][torch.randperm(L + step + 1 if short else L, generator=g)[:n]].int()
    pos = torch.tensor([L + step for L in seq_lens])
    call = {"layer": 0, "mode": "DECODE", "rows": len(seq_lens), "graph": True, "topk": topk, "pos": pos,
            "seq_lens": torch.tensor(seq_lens)}
    return {"batch_size": len(seq_lens), "prompt_lens": [L - 10 for L in seq_lens], "req_lens": list(seq_lens),
            "req_slots": slots, "calls": [call]}


def test_trace_check_holds_a_draft_decode_row_to_the_batchs_sequence_length():
    """A draft step's row sees the batch's ``seq_lens`` keys (not its position + 1): a short request's row with
    ``L`` entries passes, one with ``L + step + 1`` (its own draft keys too) fails on count and range; without
    ``seq_lens`` in the record (an older trace) the row is held to position + 1 as before."""
    got = tool.check_trace([_draft_decode_record()], draft_tokens=4)["modes"]["DECODE"]
    assert (got["rows"], got["count"], got["duplicate"], got["out_of_range"]) == (2, 0, 0, 0)
    bad = tool.check_trace([_draft_decode_record(entries=1002)], draft_tokens=4)["modes"]["DECODE"]
    assert bad["count"] == 1 and bad["out_of_range"] == 1  # only the short request: the long one has TOPK either way
    ex = bad["examples"][0]
    assert (ex["position"], ex["keys"], ex["entries"], ex["seq_len"]) == (1001, 1000, 1002, 1000)
    old = _draft_decode_record()
    del old["calls"][0]["seq_lens"]
    assert tool.check_trace([old], draft_tokens=4)["modes"]["DECODE"]["count"] == 1


def test_a_stale_slot_repeated_past_the_rows_keys_does_not_move_an_entry_out_of_range():
    """``req_to_token``'s entries past a request's length are stale and can repeat one of its slots: the entry
    keeps the position the row sees (the first), as ``slot_positions`` reads it."""
    rec = _verify_record(pad_rows=0)
    slots = rec["req_slots"][0]
    slots[2915] = slots[10]  # stale tail: position 2915 is past every row of request 0 (positions 2900, 2901)
    rec["calls"][0]["topk"][0, 0] = int(slots[10])
    got = tool.check_trace([rec], draft_tokens=2)["modes"]["TARGET_VERIFY"]
    assert (got["rows"], got["out_of_range"], got["count"]) == (4, 0, 0)


def test_trace_check_does_not_check_calls_away_from_the_batch_positions():
    """A capture's warm-up run (positions 0) and a slot this step did not write are counted as stale, not checked."""
    rec = _verify_record()
    warm = dict(rec["calls"][0], graph=False, pos=torch.zeros(8, dtype=torch.int64),
                topk=torch.full((8, tool.TOPK), 7, dtype=torch.int32))
    rec["calls"].append(warm)
    got = tool.check_trace([rec], draft_tokens=2)["modes"]["TARGET_VERIFY"]
    assert got["stale"] == 1 and got["rows"] == 4 and got["duplicate"] == 0


def test_trace_overlap_compares_valid_rows_scored_with_the_same_tokens():
    a, b = tool.check_trace([_verify_record(0)], 2), tool.check_trace([_verify_record(0)], 2)
    same = tool.trace_overlap(a, b, {2890: 10**6, 2390: 10**6})["TARGET_VERIFY"]
    assert same == {"rows": 4, "mean": 1.0, "min": 1.0}
    # rows at or after the first differing token are left out
    assert tool.trace_overlap(a, b, {2890: 2901, 2390: 0})["TARGET_VERIFY"]["rows"] == 1
    # a different selection at one row: the overlap is |A & B| / |B| over that row's 2048 positions
    rec = _verify_record(0)
    rec["calls"][0]["topk"][0] = _request_rows(rec["req_slots"][0], [2900], torch.Generator().manual_seed(9))[0]
    c = tool.check_trace([rec], 2)
    row0 = len(c["rows"][("TARGET_VERIFY", 0, 2890, 2900, 0)] & a["rows"][("TARGET_VERIFY", 0, 2890, 2900, 0)])
    got = tool.trace_overlap(a, c, {2890: 10**6, 2390: 10**6})["TARGET_VERIFY"]
    assert got["min"] == row0 / tool.TOPK < 1.0 and got["mean"] == pytest.approx((3 + row0 / tool.TOPK) / 4)


def _traced_run(tmp_path, name, rec):
    """An Engine result JSON and its trace directory, as ``engine --trace DIR`` writes them (one record)."""
    d = tmp_path / f"trace_{name}"
    d.mkdir()
    rec["calls"].append(dict(rec["calls"][0], mode="DRAFT_EXTEND_V2"))  # EAGLE's draft extend sees the same rows
    torch.save(rec, d / "100_0.pt")
    reqs = [{"prompt_len": p, "completion_tokens": 20, "spec_verify_ct": 10, "output_ids": list(range(20))}
            for p in rec["prompt_lens"]]
    out = tmp_path / f"{name}.json"
    out.write_text(__import__("json").dumps({"trace": str(d), "spec_steps": 1, "draft_tokens": 2, "requests": reqs}))
    return str(out)


def test_trace_check_command_with_and_without_the_fp8_run(tmp_path, capsys):
    """With both runs: validity rows for each and the overlap; with the FP4 run alone: its validity rows only."""
    fp8, fp4 = _traced_run(tmp_path, "fp8", _verify_record(0)), _traced_run(tmp_path, "fp4", _verify_record(0))
    assert tool.trace_check(["--fp8", fp8, "--fp4", fp4]) == 0
    both = capsys.readouterr().out
    assert "FP8: every target verify top-k row valid" in both and "FP4 vs FP8 target verify" in both
    assert "target verify top-k overlap (reported) PASS mean 1.0000, lowest row 1.0000 over 4 rows" in both
    assert tool.trace_check(["--fp4", fp4]) == 0
    alone = capsys.readouterr().out
    assert "FP4: every target verify top-k row valid" in alone and "PASS 4 rows" in alone
    assert "FP8" not in alone
    bad = _verify_record(0)
    bad["calls"][0]["topk"][0, 5] = bad["calls"][0]["topk"][0, 6]
    assert tool.trace_check(["--fp4", _traced_run(tmp_path, "bad", bad)]) == 1


def test_rows_per_request_by_mode():
    assert [tool.rows_per_request(m, 4) for m in ("TARGET_VERIFY", "DRAFT_EXTEND_V2", "DECODE")] == [4, 4, 1]
    with pytest.raises(ValueError, match="mode"):
        tool.rows_per_request("EXTEND", 4)


@pytest.mark.sglang
def test_trace_plugin_registers_nothing_unless_asked(monkeypatch):
    """With FP4_INDEXER_TOPK_TRACE_DIR unset the test-only plugin leaves SGLang's hook registry untouched."""
    import sys

    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.syspath_prepend(str(_TRACE_DIR))
    sys.modules.pop("fp4_indexer_topk_trace", None)
    import fp4_indexer_topk_trace as trace

    monkeypatch.delenv(trace.ENV, raising=False)
    before = {k: list(v) for k, v in HookRegistry._hooks.items()}
    trace.register()
    assert {k: list(v) for k, v in HookRegistry._hooks.items()} == before
    monkeypatch.setenv(trace.ENV, "/tmp/unused")
    try:
        trace.register()
        targets = set(HookRegistry._hooks) - set(before)
        assert targets == {"sglang.srt.layers.attention.dsa.dsa_indexer.Indexer.forward_cuda",
                           "sglang.srt.managers.scheduler.Scheduler.run_batch"}
    finally:
        for t in set(HookRegistry._hooks) - set(before):
            del HookRegistry._hooks[t]


@pytest.mark.sglang
def test_trace_plugin_registers_the_index_scale_hook_only_when_asked(monkeypatch):
    """``FP4_INDEXER_TOPK_TRACE_INDEX_SCALE=real`` adds one AFTER hook on SGLang's dummy loader (nothing else without
    the trace folder); another value is named."""
    import sys

    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.syspath_prepend(str(_TRACE_DIR))
    sys.modules.pop("fp4_indexer_topk_trace", None)
    import fp4_indexer_topk_trace as trace

    monkeypatch.delenv(trace.ENV, raising=False)
    before = {k: list(v) for k, v in HookRegistry._hooks.items()}
    monkeypatch.setenv(trace.SCALE_ENV, "real")
    try:
        trace.register()
        assert set(HookRegistry._hooks) - set(before) == {"sglang.srt.model_loader.loader.DummyModelLoader.load_model"}
    finally:
        for t in set(HookRegistry._hooks) - set(before):
            del HookRegistry._hooks[t]
    monkeypatch.setenv(trace.SCALE_ENV, "large")
    with pytest.raises(ValueError, match="FP4_INDEXER_TOPK_TRACE_INDEX_SCALE: expected 'real' or unset"):
        trace.register()


def test_the_index_scale_hook_gives_index_logits_of_order_one(monkeypatch):
    """``_after_dummy_load`` on a stand-in of one layer's modules (classes named as SGLang's: ``RMSNorm``,
    ``LayerNorm``, ``Indexer``; the hook reads names and weights only): with SGLang's dummy weights (uniform
    +-1e-3) the layer's index logits are about 1e-16, after it of order 1; other weights keep their values; a
    quantized indexer weight is refused."""
    import sys

    from torch import nn

    monkeypatch.syspath_prepend(str(_TRACE_DIR))
    sys.modules.pop("fp4_indexer_topk_trace", None)
    import fp4_indexer_topk_trace as trace

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(n))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class LayerNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.empty(n)), nn.Parameter(torch.empty(n))

        def forward(self, x):
            return nn.functional.layer_norm(x, x.shape[-1:], self.weight, self.bias)

    class Indexer(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq_b, self.wk = nn.Linear(512, 64 * 128, bias=False), nn.Linear(1024, 128, bias=False)
            self.weights_proj, self.k_norm = nn.Linear(1024, 64, bias=False), LayerNorm(128)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.q_a_layernorm = RMSNorm(1024), RMSNorm(512)
            self.q_a_proj, self.indexer = nn.Linear(1024, 512, bias=False), Indexer()

        def index_logits(self, h):  # as SGLang's indexer scores: sum_h w_h relu(q_h . k), w scaled by H^-0.5 D^-0.5
            x = self.input_layernorm(h)
            q = self.indexer.wq_b(self.q_a_layernorm(self.q_a_proj(x))).view(-1, 64, 128)
            k = self.indexer.k_norm(self.indexer.wk(x))
            w = self.indexer.weights_proj(x) * 64 ** -0.5 * 128 ** -0.5
            return (w[:, None, :] * torch.relu(torch.einsum("qhd,kd->qkh", q, k))).sum(-1)

    g = torch.Generator().manual_seed(0)
    layer = Layer()
    with torch.no_grad():
        for p_ in layer.parameters():
            p_.copy_(torch.rand(p_.shape, generator=g) * 2e-3 - 1e-3)  # SGLang's initialize_dummy_weights
    h = torch.rand(8, 1024, generator=g) * 2e-3 - 1e-3  # an embedding row of dummy weights
    with torch.no_grad():
        dummy = layer.index_logits(h).abs().max()
    q_a = layer.q_a_proj.weight.clone()
    assert trace._after_dummy_load(layer, None, model_config=None, device_config=None) is None
    with torch.no_grad():
        real = layer.index_logits(h).abs().max()
    assert dummy < 1e-12 and 0.05 < real < 50, (float(dummy), float(real))
    assert torch.equal(layer.q_a_proj.weight, q_a)
    assert torch.all(layer.indexer.k_norm.bias == 0) and torch.all(layer.q_a_layernorm.weight == 1)
    std = float(layer.indexer.wq_b.weight.detach().std())
    assert abs(std * 512 ** 0.5 - 1) < 0.05
    layer.indexer.wk.weight.data = layer.indexer.wk.weight.data.to(torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="takes unquantized indexer weights only"):
        trace._after_dummy_load(layer, None)


@pytest.mark.sglang
def test_trace_plugin_records_eager_calls_and_reads_them_back(tmp_path, monkeypatch):
    """The hooks' eager path on the CPU: what ``_after_indexer`` keeps, ``_after_run_batch`` saves and ``read_trace`` returns.

    ``SimpleNamespace`` objects stand for SGLang's ForwardBatch, Req, ScheduleBatch and Scheduler (a GPU
    forward pass cannot run here); the hooks read only the attributes given.
    """
    import sys
    from types import SimpleNamespace as NS

    monkeypatch.syspath_prepend(str(_TRACE_DIR))
    sys.modules.pop("fp4_indexer_topk_trace", None)
    import fp4_indexer_topk_trace as trace

    monkeypatch.setenv(trace.ENV, str(tmp_path))
    rec = _verify_record(pad_rows=0)
    call = rec["calls"][0]
    fb = NS(forward_mode=NS(name="TARGET_VERIFY"), seq_lens=torch.tensor(rec["req_lens"]))
    assert trace._after_indexer(call["topk"], None, None, None, call["pos"], fb, 3) is None
    big = torch.zeros(trace.MAX_ROWS + 1, tool.TOPK, dtype=torch.int32)  # a prefill chunk: not recorded
    trace._after_indexer(big, None, None, None, torch.arange(trace.MAX_ROWS + 1), fb, 3)
    table = torch.zeros(4, 3000, dtype=torch.int32)
    reqs = []
    for i, (plen, rlen, slots) in enumerate(zip(rec["prompt_lens"], rec["req_lens"], rec["req_slots"])):
        table[i + 1, : slots.numel()] = slots.int()
        reqs.append(NS(origin_input_ids=[0] * plen, output_ids=[0] * (rlen - plen), kv=NS(req_pool_idx=i + 1)))
    sched = NS(req_to_token_pool=NS(req_to_token=table))
    trace._after_run_batch(None, sched, NS(reqs=reqs, forward_mode=NS(name="DECODE")))
    (saved,) = trace.read_trace(str(tmp_path))
    assert [c["layer"] for c in saved["calls"]] == [3] and torch.equal(saved["calls"][0]["topk"], call["topk"])
    assert saved["calls"][0]["seq_lens"].tolist() == rec["req_lens"]
    got = tool.check_trace([saved], draft_tokens=2)["modes"]["TARGET_VERIFY"]
    assert got["rows"] == 4 and got["count"] + got["duplicate"] + got["out_of_range"] == 0


def test_make_model_cuts_a_v32_rank_to_the_layers_asked_and_keeps_the_dense_ones_first(tmp_path):
    import json

    tool.make_model(str(tmp_path / "r20"), "v32-rank", layers=20)
    cfg = json.loads((tmp_path / "r20" / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["first_k_dense_replace"]) == (20, 3)
    assert {k: v for k, v in cfg.items() if k not in ("num_hidden_layers",)} == {
        k: v for k, v in tool.V32_RANK_CONFIG.items() if k != "num_hidden_layers"}
    # V3.2's own sizes per layer: one EP8 rank's 32 routed experts, 128 attention heads, 64 x 128 index heads.
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["num_attention_heads"]) == (32, 8, 128)
    assert (cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]) == (64, 128, 2048)
    tool.make_model(str(tmp_path / "r2"), "v32-rank", layers=2)
    cfg = json.loads((tmp_path / "r2" / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["first_k_dense_replace"]) == (2, 2)
    tool.make_model(str(tmp_path / "full"), "v32-rank")
    assert json.loads((tmp_path / "full" / "config.json").read_text())["num_hidden_layers"] == 61
    with pytest.raises(ValueError, match="layers: expected 1..61"):
        tool.make_model(str(tmp_path / "bad"), "v32-rank", layers=62)


def test_make_model_ep_gives_the_rank_its_share_of_the_256_routed_experts(tmp_path):
    import json

    for ep, experts in ((8, 32), (16, 16), (32, 8)):
        tool.make_model(str(tmp_path / f"ep{ep}"), "v32-rank", ep=ep)
        cfg = json.loads((tmp_path / f"ep{ep}" / "config.json").read_text())
        assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_shared_experts"]) == (experts, 8, 1)
        assert cfg["num_hidden_layers"] == 61
    with pytest.raises(ValueError, match="ep: expected 8, 16 or 32"):
        tool.make_model(str(tmp_path / "bad"), "v32-rank", ep=64)
    with pytest.raises(ValueError, match="ep: only the v32 sizes"):
        tool.make_model(str(tmp_path / "bad"), "tiny", ep=16)


# --- the oracle on the pages the server held: ``oracle_row`` / ``oracle_check`` ------------------------------

def _oracle_request(n=2902, heads=64, seed=0):
    """A request's keys in FP4 pages (valid MXFP4, never zeros), its shuffled page-table row among other pages,
    a second request's pages, and one row's e4m3 index queries and weights."""
    from sglang_fp4_indexer.bench.inputs import random_index_k_cache

    g = torch.Generator().manual_seed(seed)
    npages = -(-n // 64)
    cache = random_index_k_cache(2 * npages + 3, torch.device("cpu"), g)
    order = torch.randperm(cache.shape[0], generator=g)
    rows = [order[:npages], order[npages: 2 * npages]]  # request 0's and request 1's pages
    q = (2 * torch.randn(heads, 128, generator=g)).to(torch.float8_e4m3fn)
    w = torch.rand(heads, generator=g) * heads ** -0.5
    return cache, rows, q, w


def _served(cache, page_row, q, w, n, k=2048):
    """The exact top-k of a row as KV slots (what a correct scorer and SGLang's page-table transform return)."""
    from sglang_fp4_indexer import reference

    keys, _ = tool.page_keys(cache[page_row], n)
    ref = reference.logits_from_keys(q, w, keys)
    pos = torch.topk(ref, min(k, n)).indices
    return (page_row[pos // 64] * 64 + pos % 64).to(torch.int32)


def test_page_keys_reads_the_fp4_and_sglangs_fp8_page_alike():
    from sglang_fp4_indexer.bench.scorers import fp8_index_cache_from_fp4

    cache, rows, _, _ = _oracle_request(n=300)
    fp4, scales = tool.page_keys(cache[rows[0]], 300)
    fp8, none = tool.page_keys(fp8_index_cache_from_fp4(cache)[rows[0]], 300)
    assert fp4.shape == (300, 128) and scales.shape == (300, 4) and none is None
    assert torch.equal(fp4, fp8) and bool(fp4.abs().sum(1).gt(0).all())
    with pytest.raises(ValueError, match="neither the FP4"):
        tool.page_keys(torch.zeros(5, 100, dtype=torch.uint8), 300)
    with pytest.raises(ValueError, match="pages"):
        tool.page_keys(cache[rows[0][:2]], 300)


def test_oracle_row_passes_the_exact_top_k_and_fails_each_planted_fault():
    n = 2902
    cache, rows, q, w = _oracle_request(n)
    keys, scales = tool.page_keys(cache[rows[0]], n)
    good = _served(cache, rows[0], q, w, n)
    got = tool.oracle_row(q, w, keys, scales, good, rows[0])
    assert got["ok"] and got["count"] == got["expected"] == 2048 and got["outside"] == 0 and got["margin"] >= 0
    # An off-by-one page-table row: the scorer read the next request's pages. Returned as that row's slots, they
    # are no position of this request; mapped through this request's row, they are the wrong keys' top-k.
    other = _served(cache, rows[1], q, w, n)
    assert tool.oracle_row(q, w, keys, scales, other, rows[0])["outside"] == 2048
    wrong_keys = (rows[0][(other.long() // 64).apply_(lambda p: int((rows[1] == p).nonzero()))] * 64
                  + other.long() % 64).to(torch.int32)
    bad = tool.oracle_row(q, w, keys, scales, wrong_keys, rows[0])
    assert not bad["ok"] and bad["outside"] == 0 and bad["margin"] < 0
    # One selected key swapped for the lowest-scoring one.
    from sglang_fp4_indexer import reference

    ref = reference.logits_from_keys(q, w, keys)
    low = int(torch.argmin(ref))
    swapped = good.clone()
    swapped[-1] = int(rows[0][low // 64] * 64 + low % 64)
    assert not tool.oracle_row(q, w, keys, scales, swapped, rows[0])["ok"]
    # A missing entry.
    short = good.clone()
    short[5] = -1
    assert tool.oracle_row(q, w, keys, scales, short, rows[0])["count"] == 2047
    assert not tool.oracle_row(q, w, keys, scales, short, rows[0])["ok"]


def _oracle_record(fault=None):
    """One target-verify batch of two requests (2 draft tokens) with its oracle call, as the trace plugin saves it:
    request 0's rows at positions 2900 and 2901 see 2901 and 2902 keys."""
    cache, rows, q, w = _oracle_request(2902)
    row_pages = rows[1] if fault == "off_by_one_row" else rows[0]
    served = torch.full((4, tool.TOPK), -1, dtype=torch.int32)
    for r, n in enumerate((2901, 2902)):
        s = _served(cache, row_pages, q, w, n)
        if fault == "off_by_one_row":  # the next request's top-k, through request 0's page-table row
            s = (rows[0][(s.long() // 64).apply_(lambda p: int((rows[1] == p).nonzero()))] * 64 + s.long() % 64).int()
        served[r, : s.numel()] = s
    bt = torch.full((2, 64), -1, dtype=torch.int32)  # one page-table row per request
    bt[0, : rows[0].numel()] = rows[0].int()
    bt[1, : rows[1].numel()] = rows[1].int()
    heads = q.shape[0]
    call = {"layer": 0, "mode": "TARGET_VERIFY", "rows": 4, "graph": True,
            "q": q.view(torch.uint8).reshape(1, -1).repeat(4, 1), "weights": w.reshape(1, -1).repeat(4, 1),
            "block_table": bt, "lens": torch.tensor([2901, 2902, 2401, 2402], dtype=torch.int32), "topk": served,
            "pos": torch.tensor([2900, 2901, 2400, 2401]), "pages": cache[rows[0]], "page_bytes": 64 * 68,
            "forced": {"init": 0, "local": 0}}
    assert call["q"].shape == (4, heads * 128)
    return {"batch_size": 2, "prompt_lens": [2890, 2390], "req_lens": [2900, 2400], "req_slots": [None, None],
            "calls": [], "oracle_calls": [call]}


@pytest.mark.parametrize("fault", [None, "off_by_one_row"])
def test_oracle_check_passes_served_rows_and_fails_an_off_by_one_page_table_row(fault):
    got = tool.oracle_check([_oracle_record(fault)], draft_tokens=2)["TARGET_VERIFY"]
    assert (got["calls"], got["rows"], got["stale"], got["layers"]) == (1, 2, 0, [0])
    if fault is None:
        assert got["failed"] == 0 and got["worst_margin"] >= 0 and got["examples"] == []
    else:
        assert got["failed"] == 2 and got["worst_margin"] < 0
        # Each failing row comes with what binds: the lowest chosen key sits below the highest key left out.
        ex = got["examples"][0]
        assert (ex["position"], ex["keys"], ex["outside"]) == (2900, 2901, 0)
        lo, hi = ex["lowest_chosen"], ex["highest_unchosen"]
        assert lo["ref"] + lo["bound"] - (hi["ref"] - hi["bound"]) == pytest.approx(ex["margin"])
        assert hi["ref"] > lo["ref"] and 0 <= lo["position"] < 2901 and 0 <= hi["position"] < 2901


def test_a_row_scored_over_more_keys_than_recorded_fails_and_its_example_names_the_key_count_that_passes():
    """A scorer that saw 2 keys more than the row's recorded count: the row fails, and its example says that it
    passes when held to 2 more keys (a diagnosis of an off-by-N key count, kept beside the failure)."""
    rec = _oracle_record()
    call = rec["oracle_calls"][0]
    cache, rows, q, w = _oracle_request(2902)
    extra = _served(cache, rows[0], q, w, 2903)  # row 0 records 2901 keys; the scorer saw 2903
    served = torch.full((tool.TOPK,), -1, dtype=torch.int32)
    served[: extra.numel()] = extra
    call["topk"][0] = served
    got = tool.oracle_check([rec], draft_tokens=2)["TARGET_VERIFY"]
    assert got["failed"] == 1
    ex = got["examples"][0]
    assert ex["position"] == 2900 and ex["keys"] == 2901 and ex["outside"] >= 1
    assert 2 in ex["passes_with_keys_off_by"] and 0 not in ex["passes_with_keys_off_by"]
    assert all(p >= 2901 for p in ex["outside_positions"])


def test_oracle_row_reads_a_page_repeated_in_the_stale_tail_of_the_page_table_row_at_its_first_place():
    """The page-table row's columns past the request's pages are stale and may repeat one of its pages: the served
    slots in that page keep the positions the row's keys fill."""
    rec = _oracle_record()
    call = rec["oracle_calls"][0]
    pages = -(-2902 // 64)
    call["block_table"][0, pages + 2] = call["block_table"][0, 3]
    got = tool.oracle_check([rec], draft_tokens=2)["TARGET_VERIFY"]
    assert got["failed"] == 0 and got["worst_margin"] >= 0


def test_oracle_check_skips_a_call_away_from_the_batch_positions():
    rec = _oracle_record()
    rec["oracle_calls"][0]["pos"] = torch.zeros(4, dtype=torch.int64)  # a capture's warm-up run
    got = tool.oracle_check([rec], draft_tokens=2)["TARGET_VERIFY"]
    assert got["stale"] == 1 and got["rows"] == 0


@pytest.mark.sglang
def test_trace_plugin_records_the_oracles_inputs_and_pages_and_the_check_reads_them(tmp_path, monkeypatch):
    """The oracle hook's eager path on the CPU: ``_after_paged`` keeps the scorer's inputs and top-k for the layers
    asked, ``_after_run_batch`` saves them with the first request's pages from the pool the call read, and
    ``oracle_check`` passes the rows; a layer not asked is not recorded.

    ``SimpleNamespace`` objects stand for SGLang's ForwardBatch, its DSA metadata, the KV pool, Req,
    ScheduleBatch and Scheduler (a GPU forward pass cannot run here); the hooks read only the attributes given.
    """
    import sys
    from types import SimpleNamespace as NS

    from sglang.srt.model_executor import forward_context

    monkeypatch.syspath_prepend(str(_TRACE_DIR))
    sys.modules.pop("fp4_indexer_topk_trace", None)
    import fp4_indexer_topk_trace as trace

    monkeypatch.setenv(trace.ENV, str(tmp_path))
    monkeypatch.setenv(trace.ORACLE_ENV, "0, 5")
    assert trace.oracle_layers() == {0, 5}
    want = _oracle_record()["oracle_calls"][0]
    cache, _, _, _ = _oracle_request(2902)
    pool = NS(get_index_k_with_scale_buffer=lambda layer_id: cache)
    monkeypatch.setattr(forward_context, "get_token_to_kv_pool", lambda: pool)
    q = want["q"].view(torch.float8_e4m3fn).reshape(4, -1, 128)
    meta = NS(get_page_table_64=lambda: want["block_table"], get_seqlens_expanded=lambda: want["lens"],
              get_seqlens_int32=lambda: torch.tensor([2900, 2400], dtype=torch.int32))
    fb = NS(forward_mode=NS(name="TARGET_VERIFY"), positions=want["pos"])
    for layer in (0, 3):
        assert trace._after_paged(want["topk"], NS(num_init_tokens=0, num_local_tokens=0), fb, layer, q,
                                  want["weights"][:, :, None], meta) is None
    table = torch.zeros(4, 3000, dtype=torch.int32)
    reqs = [NS(origin_input_ids=[0] * 2890, output_ids=[0] * 10, kv=NS(req_pool_idx=1)),
            NS(origin_input_ids=[0] * 2390, output_ids=[0] * 10, kv=NS(req_pool_idx=2))]
    trace._after_run_batch(None, NS(req_to_token_pool=NS(req_to_token=table)), NS(reqs=reqs, forward_mode=NS(name="DECODE")))
    (saved,) = trace.read_trace(str(tmp_path))
    (call,) = saved["oracle_calls"]
    assert call["layer"] == 0 and call["page_bytes"] == 64 * 68 and call["forced"] == {"init": 0, "local": 0}
    assert torch.equal(call["pages"], want["pages"]) and torch.equal(call["topk"], want["topk"])
    assert torch.equal(call["lens"], want["lens"]) and torch.equal(call["block_table"], want["block_table"])
    got = tool.oracle_check([saved], draft_tokens=2)["TARGET_VERIFY"]
    assert (got["rows"], got["failed"]) == (2, 0)
    monkeypatch.setenv(trace.ORACLE_ENV, "0,x")
    with pytest.raises(ValueError, match="comma-separated layer ids"):
        trace.oracle_layers()


def test_oracle_row_counts_the_init_and_local_tokens_sglang_forces_as_chosen():
    from sglang_fp4_indexer import reference

    n = 2500
    cache, rows, q, w = _oracle_request(n)
    keys, scales = tool.page_keys(cache[rows[0]], n)
    ref = reference.logits_from_keys(q, w, keys)
    forced = {"init": 3, "local": 2}
    pin = [0, 1, 2, n - 2, n - 1]
    rest = ref.clone()
    rest[pin] = float("-inf")
    pos = torch.cat([torch.tensor(pin), torch.topk(rest, 2048 - len(pin)).indices])
    slots = (rows[0][pos // 64] * 64 + pos % 64).int()
    assert tool.oracle_row(q, w, keys, scales, slots, rows[0], forced=forced)["ok"]
    exact = _served(cache, rows[0], q, w, n)
    assert not tool.oracle_row(q, w, keys, scales, exact, rows[0], forced=forced)["ok"]


def test_trace_plugin_saves_every_nth_batch_and_names_a_bad_every(tmp_path, monkeypatch):
    """``FP4_INDEXER_TOPK_TRACE_EVERY=2``: of three batches with an eager top-k call each, the first and the third
    are saved and every batch's calls are taken (none is carried into the next); a value below 1 is named."""
    import sys
    from types import SimpleNamespace as NS

    monkeypatch.syspath_prepend(str(_TRACE_DIR))
    sys.modules.pop("fp4_indexer_topk_trace", None)
    import fp4_indexer_topk_trace as trace

    monkeypatch.setenv(trace.ENV, str(tmp_path))
    monkeypatch.setenv(trace.EVERY_ENV, "2")
    assert trace.every() == 2
    table = torch.zeros(2, 64, dtype=torch.int32)
    batch = NS(reqs=[NS(origin_input_ids=[0] * 20, output_ids=[0] * 3, kv=NS(req_pool_idx=1))],
               forward_mode=NS(name="DECODE"))
    for step in range(3):
        trace._state["eager"].append({"layer": 0, "mode": "DECODE", "rows": 1, "graph": False,
                                      "topk": torch.full((1, 4), step, dtype=torch.int32),
                                      "pos": torch.tensor([22 + step]), "seq_lens": torch.tensor([23])})
        trace._after_run_batch(None, NS(req_to_token_pool=NS(req_to_token=table)), batch)
        assert trace._state["eager"] == []
    saved = trace.read_trace(str(tmp_path))
    assert [int(r["calls"][0]["topk"][0, 0]) for r in saved] == [0, 2]
    for bad in ("0", "x"):
        monkeypatch.setenv(trace.EVERY_ENV, bad)
        with pytest.raises(ValueError, match="FP4_INDEXER_TOPK_TRACE_EVERY: expected an int >= 1"):
            trace.every()


@pytest.mark.sglang
def test_trace_plugins_oracle_hook_wraps_an_around_hook_registered_after_it(monkeypatch):
    """SGLang's real HookRegistry: an AROUND hook that never calls the function it wraps (as sglang-fp4-indexer's on
    ``Indexer._get_topk_paged``) registered after the trace plugin's ``register_last`` still has the trace's AFTER
    hook around it once ``apply_hooks`` runs; a plain AFTER registration before it would never run."""
    import sys
    import types

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    monkeypatch.syspath_prepend(str(_TRACE_DIR))
    sys.modules.pop("fp4_indexer_topk_trace", None)
    import fp4_indexer_topk_trace as trace

    mod = types.ModuleType("_trace_order_target")

    class Indexer:
        def paged(self, x):
            return ("sglang", x)

    mod.Indexer = Indexer
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setattr(HookRegistry, "_hooks", type(HookRegistry._hooks)(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    monkeypatch.setattr(HookRegistry, "apply_hooks", HookRegistry.__dict__["apply_hooks"])
    seen, inner_seen = [], []
    target = f"{mod.__name__}.Indexer.paged"
    HookRegistry.register(target, lambda result, *a, **k: inner_seen.append(result), HookType.AFTER)  # the old way
    trace.register_last(target, lambda result, *a, **k: seen.append(result))
    HookRegistry.register(target, lambda original, self, x: ("fp4", x), HookType.AROUND)  # never calls original
    HookRegistry.apply_hooks()
    assert Indexer().paged(3) == ("fp4", 3)
    assert seen == [("fp4", 3)] and inner_seen == []
    assert HookRegistry.__dict__["apply_hooks"].__func__.__qualname__ == "HookRegistry.apply_hooks"  # restored


def test_oracle_row_lets_only_the_unstable_newest_keys_differ():
    """A draft decode row scored before draft extend rewrote its newest keys: the served top-k (exact on the keys the
    scorer read) fails against the rewritten pages unless those keys are ``unstable``; an older key rewritten
    still fails."""
    from sglang_fp4_indexer import reference

    n = 2902
    cache, rows, q, w = _oracle_request(n)
    keys, scales = tool.page_keys(cache[rows[0]], n)
    ref = reference.logits_from_keys(q, w, keys)
    served = _served(cache, rows[0], q, w, n)
    # Draft extend rewrote the newest key (on its page, in place) with the bytes of the lowest-scoring key when the
    # served row chose it, else of the highest-scoring one: either way the served row is wrong on those pages.
    new = n - 1
    chosen_newest = bool(ref[new] >= ref.kthvalue(n - 2048 + 1).values)
    low = int(torch.argmin(ref)) if chosen_newest else int(torch.argmax(ref))
    pages = cache[rows[0]].clone()
    for plane, width in ((0, 64), (64 * 64, 4)):  # payload plane, then scale plane
        src = pages[low // 64, plane + (low % 64) * width: plane + (low % 64 + 1) * width].clone()
        pages[new // 64, plane + (new % 64) * width: plane + (new % 64 + 1) * width] = src
    rewritten, rs = tool.page_keys(pages, n)
    assert not tool.oracle_row(q, w, rewritten, rs, served, rows[0])["ok"]
    assert tool.oracle_row(q, w, rewritten, rs, served, rows[0], unstable=4)["ok"]
    old = int(ref[: n - 4].argmax())  # an older key of the top-k, rewritten with the lowest-scoring key's bytes
    low = int(torch.argmin(ref))
    pages2 = cache[rows[0]].clone()
    for plane, width in ((0, 64), (64 * 64, 4)):
        src = pages2[low // 64, plane + (low % 64) * width: plane + (low % 64 + 1) * width].clone()
        pages2[old // 64, plane + (old % 64) * width: plane + (old % 64 + 1) * width] = src
    k2, s2 = tool.page_keys(pages2, n)
    assert not tool.oracle_row(q, w, k2, s2, served, rows[0], unstable=4)["ok"]

"""scripts/pd_gpu.py on the CPU: its server command lines parse with SGLang 0.5.23's own parser (plugins loaded),
the PD request carries the fields SGLang's ``GenerateReqInput`` takes, one body goes to both servers, the trace
reader maps KV slots to positions, and the checks pass and fail where they should. What needs a GPU (the servers,
Mooncake moving GPU memory) is not run here."""

from __future__ import annotations

import importlib.util
import inspect
import json
import threading
from pathlib import Path

import pytest
import torch

from plugin_support import load

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "pd_gpu.py"
_spec = importlib.util.spec_from_file_location("pd_gpu", _PATH)
pd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pd)


@pytest.mark.sglang
@pytest.mark.parametrize("role, fp4", [("prefill", True), ("decode", True), ("prefill", False), (None, True)])
def test_server_commands_parse_with_sglangs_parser(role, fp4):
    load()
    from sglang.srt.server_args import prepare_server_args

    from sglang_fp4_indexer.sglang_plugin.facts import requested

    cmd = pd.server_cmd("/tmp/tiny", 30741, fp4=fp4, role=role, bootstrap_port=30751 if role else None)
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    args = prepare_server_args(cmd[3:])
    assert args.model_path == "/tmp/tiny" and args.port == 30741
    assert requested(args) is fp4
    assert args.disaggregation_mode == (role or "null")
    if role:
        assert args.disaggregation_bootstrap_port == 30751
        assert args.disaggregation_transfer_backend in ("mooncake_tcp", "mooncake")


@pytest.mark.sglang
def test_mooncake_tcp_is_sglangs_mooncake_with_tcp_forced():
    """The backend name the script passes is resolved by SGLang to Mooncake with MC_FORCE_TCP (no RDMA device)."""
    from sglang.srt.arg_groups import pd_disaggregation_hook

    src = inspect.getsource(pd_disaggregation_hook.handle_pd_disaggregation)
    assert '"mooncake_tcp"' in src and 'os.environ.setdefault("MC_FORCE_TCP", "1")' in src


@pytest.mark.sglang
def test_bootstrap_fields_are_sglangs_request_fields():
    from sglang.srt.managers.io_struct import GenerateReqInput

    body = pd.pd_body(pd.generate_body([5, 6, 7], 4), "127.0.0.1", 30751, 12345)
    req = GenerateReqInput(**body)
    assert (req.bootstrap_host, req.bootstrap_port, req.bootstrap_room) == ("127.0.0.1", 30751, 12345)
    assert req.sampling_params == {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}


@pytest.mark.sglang
def test_mismatch_text_is_sglangs_and_the_note_is_the_plugins():
    from sglang.srt.disaggregation.common import conn

    from sglang_fp4_indexer.sglang_plugin.disaggregation import INDEX_KEYS_NOTE

    assert pd.INDEX_KEYS_NOTE == INDEX_KEYS_NOTE
    assert pd.MISMATCH_PREFIX.replace("kv_cache_dtype=", "") in inspect.getsource(conn)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="role"):
        pd.server_cmd("m", 1, fp4=True, role="both", bootstrap_port=2)
    with pytest.raises(ValueError, match="bootstrap_port"):
        pd.server_cmd("m", 1, fp4=True, role="decode")
    with pytest.raises(ValueError, match="port"):
        pd.server_cmd("m", 70000, fp4=True)
    with pytest.raises(ValueError, match="room"):
        pd.pd_body({}, "h", 1, -1)
    with pytest.raises(ValueError, match="input_ids"):
        pd.generate_body([], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        pd.generate_body([3], 0)
    with pytest.raises(ValueError, match="pd / plain"):
        pd.checks([{"prompt_len": 1}], [], None, None, None)


def test_send_pd_posts_one_body_to_both_servers_at_once():
    seen, both_in = [], threading.Barrier(2, timeout=5)

    def post(url, body, timeout):
        seen.append((url, json.dumps(body, sort_keys=True)))
        both_in.wait()  # fails unless the two requests are in flight together
        return {"output_ids": [9]} if "decode" in url else {"meta_info": {}}

    body = pd.pd_body(pd.generate_body([3, 4], 2), "127.0.0.1", 9, 77)
    got = pd.send_pd("http://prefill", "http://decode", body, post=post)
    assert got["decode"] == {"output_ids": [9]}
    assert sorted(u for u, _ in seen) == ["http://decode/generate", "http://prefill/generate"]
    assert seen[0][1] == seen[1][1]


def _record(mode, plen, rlen, slots, calls, bs=1):
    return {"forward_mode": mode, "batch_size": bs, "prompt_lens": [plen], "req_lens": [rlen],
            "req_slots": [torch.tensor(slots)], "calls": calls}


def _call(layer, values, pos, mode="DECODE"):
    return {"layer": layer, "mode": mode, "topk": torch.tensor([values + [-1, -1]], dtype=torch.int32),
            "pos": torch.tensor([pos])}


def test_decode_topk_maps_slots_to_positions_and_keys_rows_by_query_position():
    slots = [40, 41, 42, 43, 90]  # positions 0..4 in slots; a plain server would hold other slots
    recs = [_record("EXTEND", 4, 4, slots, [_call(0, [40], 3, mode="EXTEND")]),
            _record("DECODE", 4, 5, slots, [_call(0, [43, 40, 90], 4), _call(1, [41], 4)]),
            _record("DECODE", 4, 5, slots, [_call(0, [42], 4)]),  # the same query again: the first record wins
            _record("DECODE", 4, 6, slots + [91], [_call(0, [91, 7], 5)]),  # slot 7 is not the request's
            _record("DECODE", 9, 10, slots, [_call(0, [40], 9)]),  # a prompt not sent (a warm-up request)
            _record("DECODE", 4, 8, slots, [_call(0, [40], 6)], bs=2),
            _record("DECODE", 4, 7, slots + [92, 40], [_call(0, [92, 40], 6)])]  # a stale slot 40 past the request
    assert pd.decode_topk(recs, [4]) == {(4, 0, 4): [0, 3, 4], (4, 1, 4): [1], (4, 0, 5): [-8, 5], (4, 0, 6): [0, 5]}


def test_topk_check_pairs_rows_by_position_and_needs_every_prompt():
    a = {(100, 0, 100): [1, 2], (100, 0, 101): [1, 3], (101, 0, 101): [4]}  # PD: one step more on prompt 100
    b = {(100, 0, 100): [1, 2], (101, 0, 101): [4]}
    row = pd.topk_check(a, b, [100, 101])
    assert row["ok"] and row["detail"].startswith("2/2 (prompt, layer, position) rows identical"), row
    assert not pd.topk_check({**a, (101, 0, 101): [5]}, b, [100, 101])["ok"]
    row = pd.topk_check(a, {**b, (101, 1, 101): [4]}, [100, 101])  # a layer the PD server's trace lacks
    assert not row["ok"] and "1 rows of the plain server not in the PD decode server's" in row["detail"]
    row = pd.topk_check(a, b, [100, 101, 102])
    assert not row["ok"] and "no common row for prompt 102" in row["detail"]
    assert not pd.topk_check({}, {}, [100])["ok"]


def test_recheck_topk_replaces_the_row_from_kept_traces(tmp_path):
    slots = [40, 41, 42, 43, 90]
    for name, sl in (("decode", slots), ("plain", [s + 7 for s in slots])):
        d = tmp_path / name
        d.mkdir()
        rec = _record("DECODE", 4, 5, sl, [_call(0, [sl[3], sl[0]], 4)])
        torch.save(rec, d / "1_00000.pt")
    old = {"pd": [{"prompt_len": 4, "output_ids": [1]}],
           "checks": [{"check": "a", "ok": True, "detail": ""}, {"check": "b", "ok": True, "detail": ""},
                      {"check": "PD first decode step's top-k = plain FP4 server's", "ok": False, "detail": "x"},
                      {"check": "c", "ok": True, "detail": ""}]}
    (tmp_path / "pd.json").write_text(json.dumps(old))
    rc = pd.main(["topk", "--pd-json", str(tmp_path / "pd.json"), "--decode-trace", str(tmp_path / "decode"),
                  "--plain-trace", str(tmp_path / "plain"), "--out-dir", str(tmp_path / "new")])
    new = json.loads((tmp_path / "new" / "pd.json").read_text())
    assert rc == 0 and [r["check"] for r in new["checks"]] == [
        "a", "b", "PD decode top-k = plain FP4 server's (same query positions)", "c"]
    assert new["checks"][2]["detail"].startswith("1/1 (prompt, layer, position) rows identical")
    assert "PASS" in (tmp_path / "new" / "pd_table.txt").read_text().splitlines()[2]


def _res(*outs):
    return [{"prompt_len": 100 + k, "output_ids": o} for k, o in enumerate(outs)]


MISMATCH = {"lines": ["KV cache dtype mismatch: prefill server has kv_cache_dtype=fp8_e4m3, but decode server has "
                      "kv_cache_dtype=fp8_e4m3" + pd.INDEX_KEYS_NOTE + ". Both servers must use the same "
                      "--kv-cache-dtype value."], "answer": {"error": "HTTP 500"}}


def test_checks_pass_when_pd_equals_plain_and_the_mismatch_is_refused():
    log = "[2026] ERROR " + MISMATCH["lines"][0] + "\nother line\n"
    assert pd.mismatch_lines(log) == MISMATCH["lines"]
    topk = {(100, 0, 100): [1, 2], (100, 1, 100): [3], (101, 0, 101): [4]}
    rows = pd.checks(_res([5, 6], [7, 8]), _res([5, 6], [7, 8]), topk, dict(topk), MISMATCH)
    assert [r["ok"] for r in rows] == [True] * 4, rows
    assert "fp8_e4m3, but decode" in rows[3]["detail"]
    assert pd.table(rows).splitlines()[1].split()[-4:] == ["PASS", "2/2", "requests", "identical"]


@pytest.mark.parametrize("fault", ["output", "missing", "topk", "no-line", "decode-generated", "fp8-both"])
def test_each_fault_fails_its_check(fault):
    pd_res, plain = _res([5, 6], [7, 8]), _res([5, 6], [7, 8])
    t_pd, t_plain = {(100, 0, 100): [1, 2], (101, 0, 101): [3]}, {(100, 0, 100): [1, 2], (101, 0, 101): [3]}
    mm = json.loads(json.dumps(MISMATCH))
    expect = {"output": 1, "missing": 0, "topk": 2, "no-line": 3, "decode-generated": 3, "fp8-both": 3}[fault]
    if fault == "output":
        pd_res[1]["output_ids"] = [7, 9]
    elif fault == "missing":
        pd_res[0] = {"prompt_len": 100, "output_ids": None, "error": "timeout"}
    elif fault == "topk":
        t_pd = {(100, 0, 100): [1, 3], (101, 0, 101): [3]}
    elif fault == "no-line":
        mm["lines"] = []
    elif fault == "decode-generated":
        mm["answer"] = {"output_ids": [4]}
    else:  # a line that does not name the FP4 side (both servers FP8)
        mm["lines"] = [mm["lines"][0].replace(pd.INDEX_KEYS_NOTE, "")]
    rows = pd.checks(pd_res, plain, t_pd, t_plain, mm)
    assert [k for k, r in enumerate(rows) if not r["ok"]] == ([0, 1] if fault == "missing" else [expect]), rows
    assert pd.table(rows).count("FAIL") == (2 if fault == "missing" else 1)

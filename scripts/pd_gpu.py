"""PD disaggregation with the FP4 index-key cache on one GPU: a prefill and a decode ``launch_server`` over Mooncake.

Run on one H100 (docs/user-guide.md, "PD disaggregation"); the command lines are parsed by SGLang's own argument
parser and the request pairing, the trace reading and the table are tested on the CPU (tests/test_pd_gpu.py).

``python scripts/pd_gpu.py --model DIR --out-dir OUT --log-dir LOGS`` (``scripts/sglang_gpu_check.sh pd``) runs,
on the tiny model of ``scripts/sglang_one_batch.py make-model``:

1. FP4 prefill -> FP4 decode (``--disaggregation-transfer-backend mooncake_tcp``: SGLang's Mooncake backend with
   Mooncake's TCP transport, peers found by P2P handshake, no metadata server), greedy requests sent the way SGLang's
   PD router sends them: the same body to both servers with ``bootstrap_host``, ``bootstrap_port`` (the prefill's
   ``--disaggregation-bootstrap-port``) and a random ``bootstrap_room``; the decode server's answer is the result.
2. One FP4 server without PD, the same requests.
3. Checks: PD generated; its output ids equal the plain server's; every decode row's top-k of every indexer layer
   (read by the test-only trace plugin, ``scripts/topk_trace``, as token positions, rows paired by query position)
   equal.
4. FP8 prefill (no ``--enable-fp4-indexer``) -> FP4 decode: the decode server must refuse the prefill at the
   bootstrap with SGLang's one-line dtype mismatch naming both formats (the plugin's ``INDEX_KEYS_NOTE`` on the
   decode side), and generate nothing.

Output: ``OUT/pd.json`` (checks and per-request results) and ``OUT/pd_table.txt`` (one line per check); the
servers' logs and traces under ``--log-dir``.

``python scripts/pd_gpu.py topk --pd-json OUT/pd.json --decode-trace DIR --plain-trace DIR --out-dir NEW`` computes
the top-k check again from kept traces (``trace_decode_fp4``, ``trace_plain_fp4``), on any machine with torch, and
writes ``NEW/pd.json`` and ``NEW/pd_table.txt`` with that row replaced (``topk_recomputed`` names the traces).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "topk_trace"))
from fp4_indexer_topk_trace import decode_rows, read_trace  # noqa: E402 (the test-only trace plugin's reader)
from sglang_one_batch import check_table, first_difference, launched_server, post_json, seeded_prompts  # noqa: E402

#: What the plugin appends to the KV cache dtype a server holding FP4 index keys publishes (its
#: ``disaggregation.INDEX_KEYS_NOTE``, repeated here so that this script runs without importing the plugin).
INDEX_KEYS_NOTE = " with MXFP4 index keys (--enable-fp4-indexer)"
#: The start of SGLang's line when a decode server meets a prefill of another KV cache dtype (common/conn.py).
MISMATCH_PREFIX = "KV cache dtype mismatch: prefill server has kv_cache_dtype="
#: Arguments both PD servers and the plain server take (as ``sglang_one_batch.py server``; dummy weights are
#: seeded by SGLang's loader, so every server holds the same weights). Two servers share one GPU: SGLang sizes
#: each pool from the memory free when that server starts, so they start one after the other.
COMMON_ARGS = ("--load-format", "dummy", "--kv-cache-dtype", "fp8_e4m3", "--mem-fraction-static", "0.006",
               "--disable-prefill-cuda-graph", "--max-running-requests", "8", "--cuda-graph-max-bs-decode", "4",
               "--disable-radix-cache", "--random-seed", "0")
#: Environment of the PD servers: Mooncake on localhost over TCP (SGLang's ``mooncake_tcp`` sets MC_FORCE_TCP;
#: MOONCAKE_PROTOCOL names the same transport for SGLang's own initialize call) and SGLang's advertised address.
PD_ENV = {"MC_FORCE_TCP": "1", "MOONCAKE_PROTOCOL": "tcp", "SGLANG_HOST_IP": "127.0.0.1"}
ROLES = ("prefill", "decode")


def server_cmd(model: str, port: int, *, fp4: bool, role: str | None = None, bootstrap_port: int | None = None,
               python: str = sys.executable) -> list[str]:
    """The ``launch_server`` command line of one server: a PD ``role`` (``prefill`` / ``decode``) or none (plain).

    Raises:
        ValueError: ``role`` is not ``None``, ``prefill`` or ``decode``; a PD role without ``bootstrap_port``;
            ``port`` or ``bootstrap_port`` not in 1..65535.
    """
    if role is not None and role not in ROLES:
        raise ValueError(f"role: expected None or one of {ROLES}, got {role!r}")
    for name, value in (("port", port), ("bootstrap_port", bootstrap_port)):
        if value is not None and not (isinstance(value, int) and 0 < value < 65536):
            raise ValueError(f"{name}: expected a port number in 1..65535, got {value!r}")
    if role is not None and bootstrap_port is None:
        raise ValueError("bootstrap_port: required for a PD server (the prefill's --disaggregation-bootstrap-port)")
    cmd = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
           "--port", str(port), *COMMON_ARGS]
    if role is not None:
        # On the decode server the bootstrap port names the prefill's bootstrap server.
        cmd += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "mooncake_tcp",
                "--disaggregation-bootstrap-port", str(bootstrap_port)]
    if fp4:
        cmd.append("--enable-fp4-indexer")
    return cmd


def generate_body(input_ids: list[int], max_new_tokens: int) -> dict:
    """A greedy ``/generate`` body (temperature 0, EOS ignored, so every server generates ``max_new_tokens``).

    Raises:
        ValueError: ``input_ids`` empty or ``max_new_tokens`` < 1.
    """
    if not input_ids:
        raise ValueError("input_ids: expected at least one token id")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    return {"input_ids": list(input_ids),
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}


def pd_body(body: dict, bootstrap_host: str, bootstrap_port: int, room: int) -> dict:
    """``body`` with the bootstrap fields SGLang's PD router adds (``GenerateReqInput.bootstrap_host`` / ``_port`` /
    ``_room``): the same dict goes to the prefill and the decode server, which pair the request by its room.

    Raises:
        ValueError: ``room`` not in 0 .. 2**63 - 1, or ``bootstrap_host`` empty.
    """
    if not (isinstance(room, int) and 0 <= room < 2 ** 63):
        raise ValueError(f"room: expected an int in 0 .. 2**63 - 1, got {room!r}")
    if not bootstrap_host:
        raise ValueError("bootstrap_host: expected the prefill server's host")
    return dict(body, bootstrap_host=bootstrap_host, bootstrap_port=bootstrap_port, bootstrap_room=room)


def send_pd(prefill_url: str, decode_url: str, body: dict, timeout: float = 120.0, post=post_json) -> dict:
    """Send one PD request as SGLang's router does: ``body`` (with bootstrap fields) to both servers at once.

    Returns:
        dict: ``decode`` (the decode server's answer: the result) and ``prefill`` (the prefill server's).
    """
    answers = {}

    def one(name, url):
        answers[name] = post(url + "/generate", body, timeout)

    threads = [threading.Thread(target=one, args=(n, u)) for n, u in (("prefill", prefill_url), ("decode", decode_url))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def decode_topk(records: list[dict], prompt_lens) -> dict[tuple[int, int, int], list[int]]:
    """Every decode row's top-k of the requests sent, keyed by (prompt length, layer, query position), as sorted
    token positions (``fp4_indexer_topk_trace.decode_rows``).

    Rows are keyed by the query position the trace plugin records with each row (``pos``), not by the order of
    decode steps or by the request's length when the batch ran: a PD decode server runs its first decode step's
    batch with one more output token counted than a plain server does, and may run one step more.

    Args:
        records: ``fp4_indexer_topk_trace.read_trace`` of one server (one request per batch: the requests are sent
            one after another).
        prompt_lens: the prompt lengths of the requests sent (others, such as the server's warm-up request, are
            left out).

    Returns:
        ``{(prompt_len, layer, position): sorted positions}``; the first row of a key wins.
    """
    wanted = set(prompt_lens)
    out: dict[tuple[int, int, int], list[int]] = {}
    for plen, layer, pos, positions in decode_rows(records):
        if plen in wanted:
            out.setdefault((plen, layer, pos), positions)
    return out


def topk_check(topk_pd: dict, topk_plain: dict, prompt_lens) -> dict:
    """The check row comparing two servers' ``decode_topk``: every row the plain server computed must be among the PD
    decode server's with the same positions (the PD server may run one step more), and every prompt must have rows."""
    both = sorted(set(topk_pd) & set(topk_plain))
    eq = sum(topk_pd[k] == topk_plain[k] for k in both)
    bad = [f"prompt {k[0]} layer {k[1]} position {k[2]}: overlap "
           f"{len(set(topk_pd[k]) & set(topk_plain[k])) / max(len(topk_plain[k]), 1):.4f}"
           for k in both if topk_pd[k] != topk_plain[k]]
    absent = sorted(set(topk_plain) - set(topk_pd))
    missing = sorted(set(prompt_lens) - {k[0] for k in both})
    spans = []
    for plen in sorted({k[0] for k in both}):
        pos = [k[2] for k in both if k[0] == plen]
        spans.append(f"prompt {plen}: positions {min(pos)}-{max(pos)}")
    detail = (f"{eq}/{len(both)} (prompt, layer, position) rows identical ({'; '.join(spans) or 'none in common'})"
              + (f"; {len(absent)} rows of the plain server not in the PD decode server's, first "
                 f"{absent[0]}" if absent else "")
              + (f"; no common row for prompt {', '.join(map(str, missing))}" if missing else "")
              + ("; " + "; ".join(bad[:4]) if bad else ""))
    return {"check": "PD decode top-k = plain FP4 server's (same query positions)",
            "ok": bool(both) and eq == len(both) and not missing and not absent, "detail": detail}


def mismatch_lines(log_text: str) -> list[str]:
    """SGLang's dtype-mismatch lines in a server log (the part from ``MISMATCH_PREFIX`` on, one per line)."""
    return [ln[ln.index(MISMATCH_PREFIX):].strip() for ln in log_text.splitlines() if MISMATCH_PREFIX in ln]


def checks(pd: list[dict], plain: list[dict], topk_pd: dict | None, topk_plain: dict | None,
           mismatch: dict | None) -> list[dict]:
    """The checks as rows ``{check, ok, detail}``.

    Args:
        pd, plain: per request, ``prompt_len`` and ``output_ids`` (or ``error``) of the PD pair and the plain
            server, in the same order.
        topk_pd, topk_plain: ``decode_topk`` of each run's trace, or ``None`` when not traced.
        mismatch: the FP8-prefill / FP4-decode run: ``lines`` (``mismatch_lines`` of both logs), ``answer`` (the
            decode server's answer), or ``None`` when it did not run.

    Raises:
        ValueError: ``pd`` and ``plain`` hold different numbers of requests.
    """
    if len(pd) != len(plain):
        raise ValueError(f"pd / plain: {len(pd)} and {len(plain)} requests, expected the same number")
    rows = []
    gen = [r for r in pd if r.get("output_ids")]
    rows.append({"check": "FP4 prefill -> FP4 decode (Mooncake TCP) generates", "ok": bool(pd) and len(gen) == len(pd),
                 "detail": "; ".join(f"prompt {r['prompt_len']}: " + (f"{len(r['output_ids'])} tokens"
                                     if r.get("output_ids") else f"failed ({r.get('error', 'no output')})")
                                     for r in pd) or "no request"})
    same, diffs = 0, []
    for a, b in zip(pd, plain):
        x, y = a.get("output_ids") or [], b.get("output_ids") or []
        if x and x == y:
            same += 1
        else:
            diffs.append(f"prompt {a['prompt_len']}: first difference at output {first_difference(x, y)} "
                         f"({len(x)} PD / {len(y)} plain tokens)")
    rows.append({"check": "PD greedy output ids = plain FP4 server's", "ok": bool(pd) and same == len(pd),
                 "detail": f"{same}/{len(pd)} requests identical" + ("; " + "; ".join(diffs) if diffs else "")})
    if topk_pd is not None and topk_plain is not None:
        rows.append(topk_check(topk_pd, topk_plain, [r["prompt_len"] for r in pd]))
    if mismatch is not None:
        lines = mismatch.get("lines") or []
        named = [ln for ln in lines if "fp8_e4m3" in ln and INDEX_KEYS_NOTE.strip() in ln]
        answer = mismatch.get("answer") or {}
        rows.append({"check": "FP8 prefill -> FP4 decode refused at bootstrap, both formats named",
                     "ok": bool(named) and not answer.get("output_ids"),
                     "detail": (named or lines or ["no mismatch line in the servers' logs"])[0]
                     + ("; the decode server generated" if answer.get("output_ids") else "")})
    return rows


def table(rows: list[dict]) -> str:
    """The rows as text, one line per check: ``check  PASS|FAIL  detail`` (``sglang_one_batch.check_table``)."""
    return check_table(rows)


@contextlib.contextmanager
def _env(extra: dict):
    """``os.environ`` with ``extra`` set for the block (the servers inherit it)."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _results(answers: list[dict], prompts: list[list[int]]) -> list[dict]:
    """Per request: prompt length, output ids (or the error)."""
    return [{"prompt_len": len(p), "output_ids": a.get("output_ids"), "error": a.get("error"),
             "completion_tokens": (a.get("meta_info") or {}).get("completion_tokens")}
            for a, p in zip(answers, prompts)]


def recheck_topk(argv: list[str]) -> int:
    """``topk``: the top-k check computed again from kept traces (see the module docstring); 0 when every check
    passes."""
    p = argparse.ArgumentParser(prog="pd_gpu.py topk")
    p.add_argument("--pd-json", required=True, help="the run's pd.json")
    p.add_argument("--decode-trace", required=True, help="the PD decode server's trace folder")
    p.add_argument("--plain-trace", required=True, help="the plain server's trace folder")
    p.add_argument("--out-dir", required=True)
    opts = p.parse_args(argv)
    with open(opts.pd_json) as f:
        res = json.load(f)
    lens = [r["prompt_len"] for r in res["pd"]]
    row = topk_check(decode_topk(read_trace(opts.decode_trace), lens), decode_topk(read_trace(opts.plain_trace), lens),
                     lens)
    rows = [r for r in res["checks"] if not r["check"].startswith("PD first decode step's top-k")
            and r["check"] != row["check"]]
    rows.insert(min(2, len(rows)), row)
    res.update(checks=rows, topk_recomputed={"decode": opts.decode_trace, "plain": opts.plain_trace})
    os.makedirs(opts.out_dir, exist_ok=True)
    return _write(opts.out_dir, res, rows)


def _write(out_dir: str, res: dict, rows: list[dict]) -> int:
    """Write ``pd.json`` and ``pd_table.txt``, print the table; 0 when every check passed."""
    with open(os.path.join(out_dir, "pd.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(os.path.join(out_dir, "pd_table.txt"), "w") as f:
        f.write(table(rows) + "\n")
    print(table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    """Run the PD checks on a GPU machine (see the module docstring), or ``topk`` on kept traces; 0 when every
    check passes."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["topk"]:
        return recheck_topk(argv[1:])
    p = argparse.ArgumentParser(prog="pd_gpu.py")
    p.add_argument("--model", required=True, help="the tiny model (sglang_one_batch.py make-model)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--log-dir", required=True)
    p.add_argument("--prompts", type=int, default=3, help="how many of the seeded prompts (3K-7K tokens)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--ready-timeout", type=float, default=450.0)
    p.add_argument("--no-trace", action="store_true", help="do not read the top-k (no trace plugin installed)")
    p.add_argument("--ports", type=int, nargs=4, default=(30741, 30742, 30743, 30751),
                   metavar=("PREFILL", "DECODE", "PLAIN", "BOOTSTRAP"))
    opts = p.parse_args(argv)
    if not 1 <= opts.prompts <= 4:
        p.error(f"--prompts: expected 1..4, got {opts.prompts}")
    pre_port, dec_port, plain_port, boot = opts.ports
    os.makedirs(opts.out_dir, exist_ok=True)
    os.makedirs(opts.log_dir, exist_ok=True)
    prompts = seeded_prompts()[:opts.prompts]
    bodies = [generate_body(x, opts.max_new_tokens) for x in prompts]
    rng = random.Random(0)
    res = {"cmds": {}}

    def trace_dir(name):
        return None if opts.no_trace else os.path.join(opts.log_dir, f"trace_{name}")

    def launch(name, cmd, trace=None):
        res["cmds"][name] = " ".join(cmd)
        env = dict(PD_ENV, **({"FP4_INDEXER_TOPK_TRACE_DIR": trace} if trace else {}))
        port = int(cmd[cmd.index("--port") + 1])
        stack.enter_context(_env(env))
        return stack.enter_context(launched_server(cmd, port, os.path.join(opts.log_dir, f"pd_{name}.log"),
                                                   opts.ready_timeout))

    pd_ans, plain_ans, mismatch = [], [], None
    t0 = time.time()
    try:  # 1. FP4 -> FP4
        with contextlib.ExitStack() as stack:
            pre = launch("prefill_fp4", server_cmd(opts.model, pre_port, fp4=True, role="prefill", bootstrap_port=boot))
            dec = launch("decode_fp4", server_cmd(opts.model, dec_port, fp4=True, role="decode", bootstrap_port=boot),
                         trace_dir("decode_fp4"))
            for body in bodies:
                a = send_pd(pre, dec, pd_body(body, "127.0.0.1", boot, rng.randrange(2 ** 63)))
                pd_ans.append(dict(a["decode"], prefill_error=a["prefill"].get("error")))
    except RuntimeError as e:
        res["pd_error"] = str(e)
    res["pd_s"] = time.time() - t0
    try:  # 2. plain FP4
        with contextlib.ExitStack() as stack:
            base = launch("plain_fp4", server_cmd(opts.model, plain_port, fp4=True), trace_dir("plain_fp4"))
            plain_ans = [post_json(base + "/generate", b, 120.0) for b in bodies]
    except RuntimeError as e:
        res["plain_error"] = str(e)
    try:  # 4. FP8 prefill -> FP4 decode: expected to stop at the bootstrap
        answer = None
        with contextlib.ExitStack() as stack:
            pre = launch("prefill_fp8", server_cmd(opts.model, pre_port, fp4=False, role="prefill", bootstrap_port=boot))
            dec = launch("decode_fp4_vs_fp8", server_cmd(opts.model, dec_port, fp4=True, role="decode",
                                                        bootstrap_port=boot))
            answer = send_pd(pre, dec, pd_body(bodies[0], "127.0.0.1", boot, rng.randrange(2 ** 63)),
                             timeout=90.0)["decode"]
    except RuntimeError as e:
        res["mismatch_error"] = str(e)
    text = "".join(open(os.path.join(opts.log_dir, f"pd_{n}.log"), errors="replace").read()
                   for n in ("prefill_fp8", "decode_fp4_vs_fp8") if os.path.exists(os.path.join(opts.log_dir, f"pd_{n}.log")))
    mismatch = {"lines": mismatch_lines(text), "answer": answer or {}}
    pd_res = _results(pd_ans or [{"error": res.get("pd_error")}] * len(prompts), prompts)
    plain_res = _results(plain_ans or [{"error": res.get("plain_error")}] * len(prompts), prompts)
    topk_pd = topk_plain = None
    if not opts.no_trace:
        try:
            lens = [len(x) for x in prompts]
            topk_pd = decode_topk(read_trace(trace_dir("decode_fp4")), lens)
            topk_plain = decode_topk(read_trace(trace_dir("plain_fp4")), lens)
        except (FileNotFoundError, OSError) as e:
            res["trace_error"] = str(e)
            topk_pd, topk_plain = {}, {}
    rows = checks(pd_res, plain_res, topk_pd, topk_plain, mismatch)
    res.update(checks=rows, pd=pd_res, plain=plain_res, mismatch=mismatch)
    return _write(opts.out_dir, res, rows)


if __name__ == "__main__":
    sys.exit(main())

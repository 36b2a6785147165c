"""``sglang-fp4-indexer ab`` on the CPU: options, the report from recorded server outputs, refusal, resume, the
binomial errors, and the two-server mode against a local stand-in server (an SGLang server needs a GPU).

The recorded outputs are under ``tests/fixtures/ab/`` (its README says where each comes from).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fp4_indexer.ab import binomial_se, build_report, paired_difference, plot_report
from sglang_fp4_indexer.ab import quality
from sglang_fp4_indexer.ab import command as command_module
from sglang_fp4_indexer.ab.command import dummy_weights
from sglang_fp4_indexer.cli import main as cli_main
from sglang_fp4_indexer.serving import bench_serving_command, kv_pool_tokens, launch_command, read_jsonl

FIX = Path(__file__).resolve().parent / "fixtures" / "ab"


# -- statistics, against values worked out by hand ------------------------------------------------------------

def test_binomial_se_matches_hand_values():
    assert binomial_se(3, 4) == pytest.approx(math.sqrt(0.75 * 0.25 / 4))  # 0.2165...
    assert binomial_se(3, 4) == pytest.approx(0.21650635)
    assert binomial_se(0, 10) == 0.0 and binomial_se(10, 10) == 0.0
    assert binomial_se(50, 100) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="n: expected >= 1"):
        binomial_se(0, 0)
    with pytest.raises(ValueError, match="correct: expected 0..4"):
        binomial_se(5, 4)


def test_paired_difference_matches_hand_values():
    # d = fp4 - fp8 = [0, -1, 1, 0, -1]: mean -0.2; sum of squared deviations 2.8; 2.8 / 4 / 5 = 0.14
    d = paired_difference([1, 1, 0, 0, 1], [1, 0, 1, 0, 0])
    assert d["n"] == 5 and d["diff"] == pytest.approx(-0.2)
    assert d["se"] == pytest.approx(math.sqrt(0.14)) and d["se"] == pytest.approx(0.3741657)
    assert d["fp4_only"] == 1 and d["fp8_only"] == 2
    assert paired_difference([1], [0])["se"] is None
    with pytest.raises(ValueError, match="the same items"):
        paired_difference([1, 0], [1])
    with pytest.raises(ValueError, match="fp4: outcomes must be 0 or 1"):
        paired_difference([1, 0], [1, 2])


# -- recorded server outputs ----------------------------------------------------------------------------------

def test_kv_pool_tokens_from_real_server_logs():
    fp8 = kv_pool_tokens((FIX / "server_fp8.log").read_text())
    fp4 = kv_pool_tokens((FIX / "server_fp4.log").read_text())
    assert fp8 == {"kv_cache_tokens": 379968, "kv_cache_dtype": "torch.float8_e4m3fn",
                   "max_total_num_tokens": 379968, "fp4_indexer_active": None}
    assert fp4["kv_cache_tokens"] == 413568 and fp4["max_total_num_tokens"] == 413568
    assert fp4["fp4_indexer_active"].startswith("MXFP4 index-key cache, 68 B/token/layer instead of 132")
    assert kv_pool_tokens("no pool here")["max_total_num_tokens"] is None


def test_gsm8k_outcomes_from_sglangs_dump_format():
    from sglang_fp4_indexer.sglang_plugin.check_facts import gsm8k_answer_value  # SGLang's reader, via the adapter

    data = str(FIX / "gsm8k.jsonl")
    assert quality.gsm8k_outcomes(data, (FIX / "gsm8k_dump_fp8.txt").read_text(), 4,
                                  answer_value=gsm8k_answer_value) == [1, 1, 0, 1]
    assert quality.gsm8k_outcomes(data, (FIX / "gsm8k_dump_fp4.txt").read_text(), 4,
                                  answer_value=gsm8k_answer_value) == [1, 0, 1, 1]
    with pytest.raises(ValueError, match="expected blocks 0..3"):
        quality.gsm8k_outcomes(data, "nothing", 4, answer_value=gsm8k_answer_value)


def test_gsm8k_command_is_sglangs_own_on_the_local_file():
    cmd = quality.gsm8k_command("http://127.0.0.1:30741", "data.jsonl", 200, python="py")
    assert cmd[:3] == ["py", "-m", "sglang.test.few_shot_gsm8k"]
    assert cmd[cmd.index("--data-path") + 1] == os.path.abspath("data.jsonl")
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "30741"
    assert cmd[cmd.index("--num-questions") + 1] == "200"
    with pytest.raises(ValueError, match="server URL"):
        quality.gsm8k_command("localhost:30741", "d", 1)


def _recorded_arm(fmt: str, gsm8k: list[int], passkey: list[int]) -> dict:
    return {"kv": kv_pool_tokens((FIX / f"server_{fmt}.log").read_text()),
            "bench": read_jsonl(str(FIX / f"bench_{fmt}.jsonl")), "gsm8k": {"outcomes": gsm8k},
            "passkey": [{"length": 4096 if i < 2 else 16384, "depth": 0.5, "trial": i, "correct": c}
                        for i, c in enumerate(passkey)], "server_info": {}}


def test_report_from_recorded_outputs(tmp_path):
    arms = {"fp8-first": {"fp8": _recorded_arm("fp8", [1, 1, 0, 1], [1, 1, 1, 1]),
                          "fp4": _recorded_arm("fp4", [1, 0, 1, 1], [1, 1, 1, 0])}}
    r = build_report(arms, meta={"dummy_weights": True})
    cap = r["capacity"]["fp8-first"]
    assert (cap["fp8"], cap["fp4"]) == (379968, 413568)
    assert cap["fp4_gain"] == pytest.approx(413568 / 379968 - 1)  # +8.84 %
    (row,) = r["speed"]["fp8-first"]
    assert (row["input_len"], row["output_len"], row["concurrency"]) == (100000, 256, 8)
    assert row["output_throughput"]["fp8"] == pytest.approx(155.3011448083243)
    assert row["output_ratio"] == pytest.approx(170.2097414054131 / 155.3011448083243)
    assert row["p99_tpot_ms"]["fp8"] == pytest.approx(13.979421718823863)
    assert row["max_concurrent_requests"]["fp8"] == 11
    g = r["quality"]["gsm8k"]
    assert g["fp8"]["accuracy"] == 0.75 and g["fp8"]["se"] == pytest.approx(binomial_se(3, 4))
    assert g["fp4_minus_fp8"]["diff"] == 0.0 and g["fp4_minus_fp8"]["se"] == pytest.approx(math.sqrt(2 / 12))
    p = r["quality"]["passkey"]
    assert p["fp4_minus_fp8"]["diff"] == pytest.approx(-0.25)
    assert p["by_length"]["16384"]["fp4"]["correct"] == 1 and p["by_length"]["4096"]["fp4"]["correct"] == 2
    assert "meaningless" in r["quality"]["note"]
    text = "\n".join(r["verdict"])
    assert "379968 with FP8 (+8.8 %)" in text and "FP4 / FP8 1.096" in text
    assert "GSM8K few-shot (4 items): FP8 75.0 ± 21.7 %, FP4 75.0 ± 21.7 %; FP4 - FP8 +0.0 ± 40.8 points" in text
    assert "quality: the servers load dummy weights" in text
    assert all(ln.endswith(" (dummy weights: meaningless)") for ln in r["verdict"] if ln.startswith(("GSM8K", "passkey")))
    real = build_report(arms, meta={})
    assert not any("meaningless" in ln for ln in real["verdict"])
    assert r["missing"] == []
    # The most requests each server ran (its log), and under DP attention whose figure it is.
    for fmt, peak in (("fp8", 21), ("fp4", 23)):
        arms["fp8-first"][fmt]["kv"].update(running_peak=peak, running_ranks=None)
    assert "; at most 23 requests ran at once with FP4, 21 with FP8 (server logs)" in "\n".join(
        build_report(arms, meta={})["verdict"])
    arms["fp8-first"]["fp4"]["kv"]["running_ranks"] = 4
    assert "; at most 23 requests ran at once on the busiest of 4 DP ranks with FP4, 21 with FP8 (server logs)" in \
        "\n".join(build_report(arms, meta={})["verdict"])
    png = plot_report(r, str(tmp_path / "r.png"))
    assert Path(png).read_bytes()[:4] == b"\x89PNG"


def test_report_says_which_arms_are_missing():
    r = build_report({"fp8-first": {"fp8": _recorded_arm("fp8", [1], [1])}}, meta={})
    assert r["missing"] == ["fp8-first/fp4"] and r["speed"] == {} and r["quality"]["gsm8k"] is None
    assert "note" not in r["quality"] and r["verdict"][-1].startswith("not finished: fp8-first/fp4")


def test_dummy_weights_read_from_flags_and_config():
    assert dummy_weights(["--tp-size", "8", "--load-format", "dummy"], {})
    assert dummy_weights(["--load-format=dummy"], {})
    assert dummy_weights([], {"load-format": "dummy"})
    assert not dummy_weights(["--load-format", "auto"], {"tp-size": 8})


def test_launch_command_adds_the_switch_to_the_fp4_arm_only():
    fp8 = launch_command("/m", 30741, ["--tp-size", "8"], fp4=False, python="py")
    fp4 = launch_command("/m", 30741, ["--tp-size", "8"], fp4=True, python="py")
    assert fp8 == ["py", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "127.0.0.1", "--port",
                   "30741", "--tp-size", "8"]
    assert fp4 == fp8 + ["--enable-fp4-indexer"]
    with pytest.raises(ValueError, match="--enable-fp4-indexer is the A/B's own switch"):
        launch_command("/m", 1, ["--enable-fp4-indexer"], fp4=True)
    with pytest.raises(ValueError, match="--port is set by the command"):
        launch_command("/m", 1, ["--port=5"], fp4=False)


@pytest.mark.parametrize("extra, warmup, flush", [({}, 1, False),  # SGLang's own defaults
                                                   ({"warmup_requests": 6, "flush_cache": True}, 6, True)])
def test_bench_serving_command_is_what_sglangs_own_parser_reads(monkeypatch, extra, warmup, flush):
    """The serving benchmark's command line parsed by SGLang's own ``cli_main``, stopped where it would run."""
    import sglang.benchmark.serving as serving

    cmd = bench_serving_command("http://127.0.0.1:30741", input_len=2048, output_len=256, prompts=24, concurrency=6,
                                output_file="bench.jsonl", seed=3, tokenizer="/tok", python="py", **extra)
    assert cmd[:3] == ["py", "-m", "sglang.benchmark.serving"]
    parsed = []
    monkeypatch.setattr(sys, "argv", ["serving.py", *cmd[3:]])
    monkeypatch.setattr(serving, "run_benchmark", parsed.append)
    serving.cli_main()
    (args,) = parsed
    assert (args.backend, args.base_url, args.dataset_name, args.tokenizer) == (
        "sglang", "http://127.0.0.1:30741", "random-ids", "/tok")
    assert (args.random_input_len, args.random_output_len, args.random_range_ratio) == (2048, 256, 1.0)
    assert (args.num_prompts, args.max_concurrency, args.seed, args.output_file) == (24, 6, 3, "bench.jsonl")
    assert args.disable_tqdm is True
    assert (args.warmup_requests, args.flush_cache) == (warmup, flush)


def test_bench_serving_command_refuses_a_negative_warmup():
    with pytest.raises(ValueError, match="warmup_requests: expected >= 0, got -1"):
        bench_serving_command("http://h:1", input_len=1, output_len=1, prompts=1, concurrency=1, output_file="o",
                              warmup_requests=-1)
    assert "--warmup-requests" in bench_serving_command("http://h:1", input_len=1, output_len=1, prompts=1,
                                                        concurrency=1, output_file="o", warmup_requests=0)


def test_passkey_prompts_place_the_key_at_each_depth():
    ps = quality.passkey_prompts([1000, 4000], [0.0, 0.5, 1.0], 2, per_filler=20.0)
    assert len(ps) == 12 and len({p["key"] for p in ps}) > 1
    for p in ps:
        at = p["text"].index(f"The pass key is {p['key']}.") / len(p["text"])
        assert abs(at - p["depth"]) < 0.1
    assert ps == quality.passkey_prompts([1000, 4000], [0.0, 0.5, 1.0], 2, per_filler=20.0)  # seeded
    assert quality.passkey_outcome({"text": " 12345."}, "12345") == 1
    assert quality.passkey_outcome({"error": "HTTP 400"}, "12345") == 0


# -- the command line -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--out", "d", "--orders", "fp8-first,fp8-first"], "argument --orders: expected a comma-separated list"),
    (["--out", "d", "--input-lens", "0"], "argument --input-lens"),
    (["--out", "d", "--passkey-depths", "0.5,1.5"], "argument --passkey-depths: expected comma-separated fractions"),
    (["--out", "d", "--fp8-url", "http://127.0.0.1:1"], "--fp8-url: give both --fp8-url and --fp4-url"),
    (["--out", "d", "--fp8-url", "127.0.0.1:1", "--fp4-url", "http://127.0.0.1:2"], "--fp8-url: expected http://"),
    (["--out", "d"], "model: give the model path"),
    (["/m", "--out", "d", "--gsm8k-data", "/nonexistent.jsonl"], "--gsm8k-data: cannot read /nonexistent.jsonl"),
    (["--out", "d", "--config", "/nonexistent.yaml"], "--config: cannot read"),
    (["/m", "--out", "d", "--concurrency", "8", "--kv-limited-concurrency", "8"],
     "--kv-limited-concurrency: 8 is --concurrency too; give another value"),
    (["--out", "d", "--fp8-url", "http://h:1/v1", "--fp4-url", "http://h:2"], "--fp8-url: expected http://HOST:PORT (no path)"),
    (["--out", "d", "--fp8-url", "https://h:1", "--fp4-url", "http://h:2"], "--fp8-url: expected http://HOST:PORT (no path)"),
    (["--out", "d", "--fp8-url", "http://h:1", "--fp4-url", "http://h:2", "--port", "1234"],
     "--port: sets the launched servers' port; with --fp8-url/--fp4-url the URLs name the servers' ports"),
    (["/no/such/DeepSeek-V3.2", "--out", "d"], "model: no folder /no/such/DeepSeek-V3.2 on this machine"),
    (["/m", "--out", "d", "--", "--no-enable-fp4-indexer"],
     "server flags: --no-enable-fp4-indexer would turn FP4 off in the FP4 arm too"),
    (["/m", "--out", "d", "--tokenizer", "/no/such/tok"], "--tokenizer: no folder /no/such/tok on this machine"),
])
def test_bad_options_name_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["ab", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_server_flags_after_dashes_reach_the_command(monkeypatch):
    from sglang_fp4_indexer.ab import command

    seen = {}

    def fake_main(args, read_sglang=None, answer_value=None):
        seen.update(model=args.model, flags=args.server_flags, out=args.out)
        return 0

    monkeypatch.setattr(command, "main", fake_main)
    monkeypatch.setattr("sglang_fp4_indexer.ab.main", fake_main, raising=False)
    assert cli_main(["ab", "/m", "--out", "d", "--", "--tp-size", "8", "--load-format", "dummy"]) == 0
    assert seen == {"model": "/m", "flags": ["--tp-size", "8", "--load-format", "dummy"], "out": "d"}


def test_a_server_that_does_not_start_stops_the_run_in_one_line(monkeypatch, capsys):
    """``ab``'s RuntimeError (here: what ``launched_server`` raises when launch_server exits) reaches the user as
    one line naming it and where the finished arms are, exit 1; any other command's RuntimeError is not caught."""
    from sglang_fp4_indexer.ab import command

    def fake_main(args, read_sglang=None, answer_value=None):
        raise RuntimeError("launch_server exited with 1 (log: d/fp8-first/fp8/server.log)")

    monkeypatch.setattr(command, "main", fake_main)
    monkeypatch.setattr("sglang_fp4_indexer.ab.main", fake_main, raising=False)
    with pytest.raises(SystemExit) as e:
        cli_main(["ab", "/m", "--out", "d", "--", "--tp-size", "8"])
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sglang-fp4-indexer ab: stopped: launch_server exited with 1 (log: d/fp8-first/fp8/server.log)",
                   "(the arms finished so far are kept in d; the same command resumes there)"]


def test_ctrl_c_during_an_ab_is_one_line_saying_the_run_resumes(monkeypatch, capsys, tmp_path):
    """Ctrl-C (KeyboardInterrupt) in ``ab``: one line, exit 130, no traceback: where the finished arms are kept, or,
    before any arm finished, that nothing is kept."""
    from sglang_fp4_indexer.ab import command

    def interrupted(args, read_sglang=None, answer_value=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "main", interrupted)
    monkeypatch.setattr("sglang_fp4_indexer.ab.main", interrupted, raising=False)
    out = tmp_path / "d"
    with pytest.raises(SystemExit) as e:
        cli_main(["ab", "/m", "--out", str(out), "--", "--tp-size", "8"])
    assert e.value.code == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        "sglang-fp4-indexer ab: interrupted (before any arm finished: nothing kept)"]
    (out / "fp8-first" / "fp8").mkdir(parents=True)
    (out / "fp8-first" / "fp8" / "result.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        cli_main(["ab", "/m", "--out", str(out), "--", "--tp-size", "8"])
    assert e.value.code == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        f"sglang-fp4-indexer ab: interrupted (the arms finished so far are kept in {out}; the same command resumes "
        "there)"]


def test_refuses_a_model_fp4_would_not_serve_before_anything_runs(tmp_path):
    """A Llama config: the plugin's own check (through SGLang's classifier) says no DSA indexer; one line, exit 1,
    no output folder."""
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100, "intermediate_size": 128,
        "max_position_embeddings": 4096}))
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "sglang_fp4_indexer.cli", "ab", str(model), "--out", str(out),
                        "--", "--tp-size", "1"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert p.returncode == 1, p.stderr
    refusal = [ln for ln in p.stderr.splitlines() if ln.startswith("sglang-fp4-indexer ab:")]
    assert len(refusal) == 1 and "FP4 would not serve this deployment" in refusal[0]
    assert "is not a DeepSeek Sparse Attention model" in refusal[0]
    assert not out.exists()


# -- two running servers: a local stand-in --------------------------------------------------------------------

def _standin_server(state, *, pool: int, wrong_depth: float | None, fp4: bool | None = None, info: dict | None = None):
    """A small local HTTP server standing in for a running SGLang server (which needs a GPU): ``/server_info``, ``/v1/models`` (unless ``state["models"]`` is false)
    (the keys the command reads; ``enable_fp4_indexer`` when ``fp4`` is given), and ``/generate`` answering the passkey prompts -- with the key, except at
    ``wrong_depth`` -- and counting the prompt's words as its ``prompt_tokens``."""
    import re
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/server_info":
                said = dict({"model_path": "/models/v32", "load_format": "auto", "max_total_num_tokens": pool},
                            **(info or {}))
                self._send(said if fp4 is None else dict(said, enable_fp4_indexer=fp4))
            elif self.path == "/v1/models" and state.get("models", True):
                self._send({"object": "list", "data": [{"id": "/models/v32", "object": "model"}]})
            else:
                self.send_error(404)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["generate"] += 1
            text = body["text"]
            m = re.search(r"The pass key is (\d+)\.", text)
            answer = "."
            if m:
                depth = text.index(m.group(0)) / len(text)
                answer = " 0." if wrong_depth is not None and abs(depth - wrong_depth) < 0.1 else f" {m.group(1)}."
            self._send({"text": answer, "meta_info": {"prompt_tokens": len(text.split())}})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _recorded_bench_client(calls):
    """Stands in for SGLang's benchmark client subprocess (it needs a server with a tokenizer and streaming):
    appends the recorded result line of the format the command's ``--base-url`` belongs to, as
    ``--output-file`` would get it."""
    def run(cmd, **kwargs):
        if cmd[1] == "-c":  # the command's checks that SGLang's clients import and load the tokenizer: they do here
            assert cmd[2] in ("import sglang.benchmark.serving", command_module._TOKENIZER_CHECK), cmd
            return subprocess.CompletedProcess(cmd, 0, "", "")
        assert cmd[1:3] == ["-m", "sglang.benchmark.serving"]
        calls.append(cmd)
        fmt = "fp8" if cmd[cmd.index("--base-url") + 1] == calls_urls["fp8"] else "fp4"
        line = read_jsonl(str(FIX / f"bench_{fmt}.jsonl"))[0]
        line.update(random_input_len=int(cmd[cmd.index("--random-input-len") + 1]),
                    max_concurrency=int(cmd[cmd.index("--max-concurrency") + 1]),
                    completed=int(cmd[cmd.index("--num-prompts") + 1]))  # every request sent completed
        with open(cmd[cmd.index("--output-file") + 1], "a") as f:
            f.write(json.dumps(line) + "\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    calls_urls = {}
    run.urls = calls_urls
    return run


def _warmed_at_load_concurrency(calls) -> bool:
    """Every recorded benchmark command warms up with as many requests as its load runs at once, then flushes
    the prefix cache."""
    return bool(calls) and all(c[c.index("--warmup-requests") + 1] == c[c.index("--max-concurrency") + 1]
                               and "--flush-cache" in c for c in calls)


def test_two_running_servers_and_resume(tmp_path, capsys):
    from sglang_fp4_indexer.ab import command
    from sglang_fp4_indexer.cli import build_parser

    s8, s4 = {"generate": 0}, {"generate": 0}
    srv8 = _standin_server(s8, pool=379968, wrong_depth=None)
    srv4 = _standin_server(s4, pool=413568, wrong_depth=0.5)
    out = tmp_path / "ab"
    try:
        u8, u4 = (f"http://127.0.0.1:{s.server_port}" for s in (srv8, srv4))
        # The stand-ins' model path (/models/v32) is not on this machine: without MODEL or --tokenizer the serving
        # benchmark could not load the tokenizer, and the command says so before anything runs.
        argv = ["ab", "--out", str(out), "--fp8-url", u8, "--fp4-url", u4]
        assert command.main(build_parser().parse_args(argv), run=_recorded_bench_client([])) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "sglang-fp4-indexer ab: not run: --tokenizer: SGLang's serving benchmark loads the tokenizer from the "
            "servers' model path /models/v32, which this machine does not have; give MODEL or --tokenizer (a folder "
            "with the checkpoint's tokenizer files)")
        assert not out.exists()
        tok = tmp_path / "tok"
        tok.mkdir()
        argv = ["ab", "--out", str(out), "--fp8-url", u8, "--fp4-url", u4, "--tokenizer", str(tok)]
        with pytest.raises(SystemExit):  # a folder without tokenizer files: named before anything runs
            cli_main(argv)
        assert capsys.readouterr().err.strip().endswith(
            f"--tokenizer: {tok} holds none of tokenizer.json, tokenizer_config.json, tokenizer.model, which SGLang's "
            "serving benchmark loads; give a folder with the checkpoint's tokenizer files")
        (tok / "tokenizer_config.json").write_text("{}")
        argv = ["ab", "--out", str(out), "--fp8-url", u8, "--fp4-url", u4, "--tokenizer", str(tok), "--input-lens", "2048",
                "--output-len", "256", "--concurrency", "4", "--passkey-lengths", "1000,3000",
                "--passkey-depths", "0.1,0.5,0.9", "--passkey-trials", "2"]
        calls = []
        run = _recorded_bench_client(calls)
        run.urls["fp8"] = u8
        args = build_parser().parse_args(argv)
        assert command.main(args, run=run) == 0
        # per arm: 2 calibration requests (fp8 only: the prompts are kept for fp4) + 12 passkey prompts
        assert (s8["generate"], s4["generate"]) == (14, 12)
        # the deployer's shape, then the KV-limited load: twice what FP8's pool holds at 2048 + 256 tokens
        assert [c[c.index("--max-concurrency") + 1] for c in calls] == ["4", str(2 * (379968 // 2304))] * 2
        assert all(c[c.index("--tokenizer") + 1] == str(tok) for c in calls)
        assert _warmed_at_load_concurrency(calls)
        report = json.loads((out / "report.json").read_text())
        assert report["capacity"]["fp8-first"] == {"fp8": 379968, "fp4": 413568,
                                                   "fp4_gain": pytest.approx(413568 / 379968 - 1)}
        pk = report["quality"]["passkey"]
        assert (pk["fp8"]["correct"], pk["fp4"]["correct"], pk["fp8"]["n"]) == (12, 8, 12)
        assert pk["fp4_minus_fp8"]["diff"] == pytest.approx(-4 / 12)
        assert report["meta"]["environment"]["where"].startswith("the machine that ran the command")
        # the environment each arm ran in is kept with it, and the report's is theirs
        kept = json.loads((out / "fp8-first" / "fp4" / "result.json").read_text())["environment"]
        assert {k: report["meta"]["environment"][k] for k in kept} == kept and "note" not in report["meta"]["environment"]
        assert "note" not in report["quality"]  # load_format auto: real weights
        assert (out / "report.png").exists()
        printed = capsys.readouterr().out
        assert f"2048 in / 256 out, {2 * (379968 // 2304)} at a time, the KV-limited load" in printed
        assert "passkey retrieval (12 items): FP8 100.0 ± 0.0 %, FP4 66.7 ± 13.6 %" in printed
        assert printed.startswith("environment of this client (the servers given by URL may run elsewhere): ")

        # Resume: both arms kept, nothing is asked again.
        calls.clear()
        assert command.main(build_parser().parse_args(argv), run=run) == 0
        assert (s8["generate"], s4["generate"], calls) == (14, 12, [])
        # An interrupted FP4 arm (no result.json) runs again, alone, with the kept prompts.
        (out / "fp8-first" / "fp4" / "result.json").unlink()
        assert command.main(build_parser().parse_args(argv), run=run) == 0
        assert (s8["generate"], s4["generate"], len(calls)) == (14, 24, 2)
        # Other settings in the same folder: refused, naming --out.
        with pytest.raises(ValueError, match="--out: .* holds a run with other settings \\(concurrency, prompts\\)"):
            command.main(build_parser().parse_args(argv + ["--concurrency", "2"]), run=run)
    finally:
        srv8.shutdown()
        srv4.shutdown()


# -- what is refused before a server starts, and kept files that are not what the run wrote -------------------

def _v32_folder(tmp_path) -> str:
    """A model folder holding DeepSeek-V3.2's config.json (the packaged copy): what launch mode takes as MODEL."""
    folder = tmp_path / "DeepSeek-V3.2"
    folder.mkdir(exist_ok=True)
    src = Path(__file__).resolve().parents[1] / "sglang_fp4_indexer" / "data" / "models" / "deepseek-v3.2"
    (folder / "config.json").write_text((src / "config.json").read_text())
    return str(folder)


def _ab_args(*argv):
    from sglang_fp4_indexer.cli import build_parser

    argv = list(argv)
    tail = []
    if "--" in argv:
        at = argv.index("--")
        argv, tail = argv[:at], argv[at + 1:]
    args = build_parser().parse_args(["ab", *argv])
    args.server_flags = tail
    return args


@pytest.mark.parametrize("argv, message", [
    (["/m", "--out", "d", "--passkey-lengths", "10"],
     "--passkey-lengths: expected 0 (no passkey check) or >= 64 tokens, got 10"),
    (["--out", "d", "--fp8-url", "http://127.0.0.1:5", "--fp4-url", "http://127.0.0.1:5/"],
     "--fp4-url: http://127.0.0.1:5/ is --fp8-url's server too"),
    (["/m", "--out", "d", "--", "--port", "30000"], "server flags: --port is set by the command"),
    (["/m", "--out", "d", "--", "--enable-fp4-indexer"], "server flags: --enable-fp4-indexer is the A/B's own switch"),
    # SGLang's parser takes a flag's unique prefix: --enable-fp4 would turn FP4 on in the FP8 arm
    (["/m", "--out", "d", "--", "--enable-fp4"], "server flags: --enable-fp4 abbreviates --enable-fp4-indexer"),
    (["/m", "--out", "d", "--", "--por", "30000"], "server flags: --por abbreviates --port"),
    (["/m", "--out", "d", "--", "--model-path", "/x"], "server flags: --model-path: give the model as ab's MODEL"),
    (["deepseek-v3.2", "--out", "d"], "model: expected the checkpoint's folder or its Hugging Face name"),
    (["--out", "", "--fp8-url", "http://127.0.0.1:5", "--fp4-url", "http://127.0.0.1:6"], "--out: expected a folder"),
])
def test_options_refused_before_the_check(argv, message):
    """Told from the options alone: refused before the plugin's check and before any folder is written."""
    from sglang_fp4_indexer.ab import command

    with pytest.raises(ValueError, match=None) as e:
        command.main(_ab_args(*argv), read_sglang=None, gpus=lambda: pytest.fail("no GPU asked for"))
    assert message in str(e.value)
    assert not os.path.exists("d")


def test_config_naming_another_model_is_refused_in_abs_terms(tmp_path):
    """The ready-made config's model-path (a Hugging Face name) beside a local copy of the same model is fine (the
    command's model path wins, as in SGLang); a file naming another model is refused in ab's terms, through SGLang's
    own parser of the file."""
    from sglang_fp4_indexer.ab import command
    from sglang_fp4_indexer.sglang_plugin.check_facts import read_sglang_facts

    from sglang_fp4_indexer.guide import config_path

    shipped = str(config_path("deepseek-v3.2"))  # model-path deepseek-ai/DeepSeek-V3.2
    model = _v32_folder(tmp_path)
    assert command.main(_ab_args(model, "--out", str(tmp_path / "o"), "--config", shipped),
                        read_sglang=read_sglang_facts, gpus=lambda: {"error": "none here"}) == 1  # past the check
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("model-path: zai-org/GLM-5\ntp-size: 8\n")
    with pytest.raises(ValueError) as e:
        command.main(_ab_args(model, "--out", str(tmp_path / "o"), "--config", str(cfg)),
                     read_sglang=read_sglang_facts)
    msg = str(e.value)
    assert msg.startswith("--config: the file names model-path zai-org/GLM-5, another "
                          f"model than {model} (") and msg.endswith("; ab checks the model it is given: give "
                                                                         "zai-org/GLM-5 as the model, or the same "
                                                                         "model in both")


def test_a_load_longer_than_the_context_is_refused_before_any_server(tmp_path):
    """DeepSeek-V3.2's packaged config serves 163840 positions: 163840 in + 256 out is one too many."""
    from sglang_fp4_indexer.ab import command

    out, model = tmp_path / "o", _v32_folder(tmp_path)
    for argv, message in ((["--input-lens", "163840"], "--input-lens: 163840 tokens in and --output-len 256 out make "
                                                       "164096, more than the 163840 the model serves"),
                          (["--passkey-lengths", "200000"], "--passkey-lengths: 200000 tokens, more than the 163840")):
        with pytest.raises(ValueError) as e:
            command.main(_ab_args(model, "--out", str(out), *argv), read_sglang=None,
                         gpus=lambda: pytest.fail("no GPU asked for"))
        assert message in str(e.value)
    assert not out.exists()


def test_no_gpu_and_no_server_are_one_line_before_anything_is_written(tmp_path, capsys):
    from sglang_fp4_indexer.ab import command

    out = tmp_path / "o"
    assert command.main(_ab_args(_v32_folder(tmp_path), "--out", str(out)), read_sglang=None,
                        gpus=lambda: {"error": "nvidia-smi: FileNotFoundError: no such file"}) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "sglang-fp4-indexer ab: not run: no GPU found on this machine (nvidia-smi: FileNotFoundError: no such file)")
    # Another --device than CUDA is SGLang's to start: no GPU asked for (refused later by the check's device rule
    # or served by SGLang; here only that the GPU question is not asked).
    assert command._no_gpu(["--device", "cpu"], lambda: pytest.fail("no GPU asked for")) is None
    assert command._no_gpu(["--device=cuda:1"], lambda: {"error": "x"}) == "no GPU found on this machine (x)"

    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = _standin_server({"generate": 0}, pool=1000, wrong_depth=None)
    try:
        argv = ["--out", str(out), "--fp8-url", f"http://127.0.0.1:{srv.server_port}",
                "--fp4-url", f"http://127.0.0.1:{port}"]
        assert command.main(_ab_args(*argv), read_sglang=None) == 1
    finally:
        srv.shutdown()
    err = capsys.readouterr().err.strip().splitlines()
    # No MODEL: one warning that the plugin's check is not run, then the one line that says why nothing runs.
    assert len(err) == 2 and err[0].startswith("sglang-fp4-indexer ab: warning: no MODEL given, so the plugin's check")
    assert err[1].startswith(f"sglang-fp4-indexer ab: not run: --fp4-url: no SGLang server "
                             f"answers at http://127.0.0.1:{port} (/server_info: ")
    assert not out.exists()


def test_clients_that_do_not_import_are_one_line_before_anything_is_written(tmp_path, capsys):
    """SGLang's benchmark (and, with --gsm8k-data, GSM8K) client is imported by this Python before any server
    starts: where one fails (a slimmed SGLang without its tests, no Hugging Face datasets), one line, exit 1,
    nothing written; the check itself runs a real interpreter (here: a module that does not exist fails, the
    real clients of the installed SGLang import)."""
    from sglang_fp4_indexer.ab import command

    asked = []

    def run(cmd, **kwargs):
        asked.append(cmd)
        assert cmd[:2] == [sys.executable, "-c"] and kwargs.get("capture_output")
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback (most recent call last):\n  ...\n"
                                           "ModuleNotFoundError: No module named 'datasets'\n")

    out = tmp_path / "o"
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(5)))
    assert command.main(_ab_args(_v32_folder(tmp_path), "--out", str(out), "--gsm8k-data", str(data),
                                 "--gsm8k-questions", "5"),
                        read_sglang=None, gpus=lambda: {"name": "GPU", "count": 1}, run=run) == 1
    assert asked == [[sys.executable, "-c", "import sglang.benchmark.serving; import sglang.test.few_shot_gsm8k"]]
    assert capsys.readouterr().err.strip().splitlines() == [
        f"sglang-fp4-indexer ab: not run: SGLang's clients (sglang.benchmark.serving, sglang.test.few_shot_gsm8k) do "
        f"not import with {sys.executable} (ModuleNotFoundError: No module named 'datasets'); install what it names "
        "in this environment"]
    assert not out.exists()
    # The real check: a module that is not there is named; the installed SGLang's clients import.
    assert command._clients_problem(("sglang_fp4_indexer_no_such_client",), subprocess.run).endswith(
        "(ModuleNotFoundError: No module named 'sglang_fp4_indexer_no_such_client'); install what it names in this "
        "environment")
    assert command._clients_problem(command._CLIENTS, subprocess.run) is None


def test_kept_files_that_are_not_results_are_named(tmp_path):
    from sglang_fp4_indexer.ab.command import _load_plan, read_result

    good = dict(_recorded_arm("fp8", [1, 0], [1, 1]), commands=[])
    path = tmp_path / "result.json"
    for content, why in (("[1, 2]", "a JSON list, not an object"), ("{}", "no server_info, kv, bench, commands"),
                         ('{"kv": {', "Expecting"),
                         (json.dumps(dict(good, gsm8k={"outcomes": []})), "a GSM8K record without outcomes"),
                         (json.dumps(dict(good, passkey=[])), "a passkey record without prompts")):
        path.write_text(content)
        with pytest.raises(ValueError) as e:
            read_result(str(path))
        assert str(e.value).startswith(f"--out: {path} is not a finished arm's result (") and why in str(e.value)
        assert str(e.value).endswith("delete it to run that arm again")
    path.write_text(json.dumps(good))
    assert read_result(str(path)) == good

    # This command's plan without a finished arm is replaced (nothing to resume); with one, other settings are
    # refused and a plan.json that is not JSON is named. A plan.json or passkey prompts this command did not write
    # are named and kept, never replaced.
    plan = {"mode": "launch", "input_lens": [4096], "kv_limited_concurrency": None}
    out = tmp_path / "o"
    out.mkdir()
    (out / "plan.json").write_text(json.dumps(dict(plan, concurrency=2)))
    (out / "passkey_prompts.json").write_text("[]")
    assert _load_plan(str(out), dict(plan, concurrency=8)) == dict(plan, concurrency=8)
    assert not (out / "passkey_prompts.json").exists()
    (out / "fp8-first" / "fp8").mkdir(parents=True)
    (out / "fp8-first" / "fp8" / "result.json").write_text(json.dumps(good))
    with pytest.raises(ValueError, match=r"holds a run with other settings \(concurrency\)"):
        _load_plan(str(out), dict(plan, concurrency=4))
    (out / "plan.json").write_text("{")
    with pytest.raises(ValueError, match=r"--out: .*plan.json is not the plan of an A/B run \(Expecting"):
        _load_plan(str(out), dict(plan, concurrency=8))
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "plan.json").write_text('{"experiment": "my own notes"}')
    with pytest.raises(ValueError, match=r"plan.json is not the plan of an A/B run \(this command's plan.json\)"):
        _load_plan(str(foreign), dict(plan, concurrency=8))
    assert json.loads((foreign / "plan.json").read_text()) == {"experiment": "my own notes"}
    (foreign / "plan.json").unlink()
    (foreign / "passkey_prompts.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"passkey_prompts.json is there without the run's plan.json"):
        _load_plan(str(foreign), dict(plan, concurrency=8))
    assert (foreign / "passkey_prompts.json").read_text() == "[1, 2]" and not (foreign / "plan.json").exists()


def test_quality_from_arms_that_answered_different_items_is_refused():
    arms = {"fp8-first": {"fp8": _recorded_arm("fp8", [1, 1, 0, 1], [1, 1, 1, 1]),
                          "fp4": _recorded_arm("fp4", [1, 0], [1, 1, 1, 0])}}
    with pytest.raises(ValueError, match="gsm8k: the FP8 arm answered 4 items and the FP4 arm 2"):
        build_report(arms, meta={})


def test_a_failing_benchmark_client_is_one_line_with_its_log(tmp_path):
    from sglang_fp4_indexer.ab.command import _measure

    def run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "Traceback (most recent call last):\n  File x\n",
                                           "ValueError: http://127.0.0.1:1/v1/models is not ready. Exiting.\n")

    srv = _standin_server({"generate": 0}, pool=1000, wrong_depth=None)
    plan = {"input_lens": [256], "output_len": 8, "concurrency": 1, "prompts": 1, "kv_limited_concurrency": 0,
            "gsm8k_data": None, "passkey_lengths": [0]}
    try:
        with pytest.raises(RuntimeError) as e:
            _measure(f"http://127.0.0.1:{srv.server_port}", str(tmp_path), plan, with_quality=True,
                     out=str(tmp_path), progress=lambda step: None, answer_value=None, run=run)
    finally:
        srv.shutdown()
    assert str(e.value) == ("bench_serving exited with 1: ValueError: http://127.0.0.1:1/v1/models is not ready. "
                            f"Exiting. (log: {tmp_path / 'bench_stdout.txt'})")


def test_a_failing_gsm8k_client_is_one_line_with_its_log(tmp_path):
    """GSM8K's client failing as it did on the GPU when SGLang's tests were not installed: the line that says why
    and the log's path; client_error's fallbacks: the last line, or "no output"."""
    from sglang_fp4_indexer.serving import client_error

    def run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "/usr/bin/python3: Error while finding module specification "
                                           "for 'sglang.test.few_shot_gsm8k' (ModuleNotFoundError: No module named "
                                           "'sglang.test')\n")

    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    with pytest.raises(RuntimeError) as e:
        quality.run_gsm8k("http://127.0.0.1:1", str(data), 1, str(tmp_path), answer_value=None, run=run)
    assert str(e.value) == ("few_shot_gsm8k exited with 1: /usr/bin/python3: Error while finding module specification "
                            "for 'sglang.test.few_shot_gsm8k' (ModuleNotFoundError: No module named 'sglang.test') "
                            f"(log: {tmp_path / 'gsm8k_stdout.txt'})")
    assert client_error("first\nKilled\n") == "Killed" and client_error(" \n") == "no output"
    assert client_error("x" * 400) == "x" * 300


def test_a_config_among_the_server_flags_that_turns_fp4_on_is_overridden_in_the_fp8_arm(tmp_path):
    from sglang_fp4_indexer.ab import command

    on = tmp_path / "on.yaml"
    on.write_text("enable-fp4-indexer: true\ntp-size: 8\n")
    off = tmp_path / "off.yaml"
    off.write_text("tp-size: 8\n")
    for argv, paths, enables in (([f"--config={on}"], [str(on)], True), (["--config", str(off)], [str(off)], False)):
        args = _ab_args("/m", "--out", "d", "--", *argv)
        assert command._config_paths(args) == paths and command._config_enables_fp4(paths) is enables
    args = _ab_args("/m", "--out", "d", "--config", str(off), "--", "--config", str(on))
    assert command._config_paths(args) == [str(off), str(on)] and command._config_enables_fp4([str(off), str(on)])
    with pytest.raises(ValueError, match="--config: cannot read /nonexistent.yaml"):
        command.main(_ab_args("/m", "--out", str(tmp_path / "o"), "--", "--config", "/nonexistent.yaml"))


def test_servers_whose_switch_contradicts_their_arm_are_refused(tmp_path, capsys):
    """Where /server_info reports the plugin's switch, the FP8 URL must not have it on nor the FP4 URL off."""
    from sglang_fp4_indexer.ab import command

    srv = _standin_server({"generate": 0}, pool=1000, wrong_depth=None, fp4=False)
    try:
        url = f"http://127.0.0.1:{srv.server_port}"  # the same FP8 server under two names
        args = _ab_args("--out", str(tmp_path / "o"), "--fp8-url", url, "--fp4-url", url.replace("127.0.0.1",
                                                                                                 "localhost"))
        assert command.main(args, read_sglang=None) == 1
    finally:
        srv.shutdown()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"sglang-fp4-indexer ab: not run: --fp4-url: the server at {args.fp4_url} runs with "
                   "enable_fp4_indexer False (its /server_info); expected a server launched with --enable-fp4-indexer")
    assert not (tmp_path / "o").exists()


def test_kept_results_with_wrong_values_are_named(tmp_path):
    from sglang_fp4_indexer.ab.command import read_result

    good = dict(_recorded_arm("fp8", [1, 0], [1, 1]), commands=[])
    path = tmp_path / "result.json"
    for change, why in (({"passkey": [1]}, "passkey records without an integer length"),
                        ({"passkey": [{"foo": 1}]}, "passkey records without an integer length"),
                        ({"gsm8k": {"outcomes": [1, "x", 0]}}, "GSM8K outcomes other than 0 and 1"),
                        ({"gsm8k": {"outcomes": "101"}}, "GSM8K outcomes other than 0 and 1"),
                        ({"bench": [1, 2]}, "serving benchmark lines that are not objects of numbers"),
                        ({"bench": [{"output_throughput": "fast"}]}, "serving benchmark lines"),
                        ({"kv": {"max_total_num_tokens": "abc"}}, "KV pool sizes that are not numbers")):
        path.write_text(json.dumps(dict(good, **change)))
        with pytest.raises(ValueError, match=f"is not a finished arm's result \\({why}"):
            read_result(str(path))


def test_a_gsm8k_file_that_is_not_gsm8k_is_named_before_any_server(tmp_path, capsys):
    """--gsm8k-data is read before anything starts: a line that is not a question-and-answer object, or fewer
    lines than the questions asked (or than SGLang's 5 few-shot examples), is one line naming the option (exit 2)."""
    good = "".join(json.dumps({"question": f"{i}?", "answer": f"#### {i}"}) + "\n" for i in range(6))
    cases = [(good + "not json\n", "7", "--gsm8k-data: line 7 of"),
             (good + "\n", "3", "is blank; SGLang's few-shot GSM8K reads every line as JSON"),  # its reader's way
             ("# a comment SGLang skips\n" + good.replace("#### 2", "two"), "3",
              "has an answer without a number SGLang can read as its label"),
             (good.replace('"answer"', '"solution"', 1), "3", "--gsm8k-data: line 1 of"),
             ("# a comment SGLang skips\n" + good, "200", "holds 6 questions; --gsm8k-questions 200 (and SGLang's 5 few-shot examples) need 200"),
             (good.splitlines(keepends=True)[0], "1", "holds 1 questions; --gsm8k-questions 1 (and SGLang's 5 "
                                                       "few-shot examples) need 5")]
    for i, (text, questions, message) in enumerate(cases):
        data = tmp_path / f"g{i}.jsonl"
        data.write_text(text)
        with pytest.raises(SystemExit) as e:
            cli_main(["ab", _v32_folder(tmp_path), "--out", str(tmp_path / "o"), "--gsm8k-data", str(data),
                      "--gsm8k-questions", questions])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and message in err[0], (i, err)
    assert not (tmp_path / "o").exists()


def test_fewer_gpus_than_the_flags_take_is_one_line(tmp_path, capsys):
    """--tp-size x --pp-size (or the config's tp-size) GPUs per server, against what nvidia-smi lists."""
    from sglang_fp4_indexer.ab import command

    one = lambda: {"name": "NVIDIA H100 80GB HBM3", "driver": "580", "count": 1}  # noqa: E731
    assert command._no_gpu(["--tp-size", "8"], one) == (
        "a server takes 8 GPUs (--tp-size 8); nvidia-smi lists 1 on this machine (NVIDIA H100 80GB HBM3)")
    assert command._no_gpu(["--tp-size=4", "--pp-size", "2"], one).startswith("a server takes 8 GPUs (--tp-size 4 x --pp-size 2);")
    assert command._no_gpu([], one, {"tp-size": 8}).startswith("a server takes 8 GPUs (tp-size 8 in --config);")
    assert command._no_gpu(["--tp-size", "1"], one, {"tp-size": 8}) is None  # the flags win
    assert command._no_gpu(["--tp-size", "8"], lambda: {"name": "H200", "count": 8}) is None
    from sglang_fp4_indexer.sglang_plugin.check_facts import read_sglang_facts

    out = tmp_path / "o"
    assert command.main(_ab_args(_v32_folder(tmp_path), "--out", str(out), "--", "--tp-size", "8"),
                        read_sglang=read_sglang_facts, gpus=one) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "sglang-fp4-indexer ab: not run: a server takes 8 GPUs (--tp-size 8); nvidia-smi lists 1 on this machine "
        "(NVIDIA H100 80GB HBM3)")
    assert not out.exists()
    # SGLang's parser takes an unambiguous prefix of an option (argparse's abbreviations): --tp 8 is --tp-size 8,
    # and data-parallel replicas (--dp-size without DP attention) are whole servers of --tp-size GPUs each.
    for given, need in ((["--tp", "8"], 8), (["--tp-size", "2", "--dp-size", "2"], 4)):
        assert command.main(_ab_args(_v32_folder(tmp_path), "--out", str(out), "--", *given),
                            read_sglang=read_sglang_facts, gpus=one) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"sglang-fp4-indexer ab: not run: a server takes {need} GPUs (tensor x pipeline parallel x data-parallel "
            "replicas, as SGLang's parser reads the server flags); nvidia-smi lists 1 on this machine "
            "(NVIDIA H100 80GB HBM3)"), given
        assert not out.exists()
    # The GPU indices a server takes (SGLang: --base-gpu-id + rank x --gpu-id-step), and a server over nodes.
    four = lambda: {"name": "NVIDIA H100 80GB HBM3", "driver": "580", "count": 4}  # noqa: E731
    for given, line in ((["--tp-size", "4", "--base-gpu-id", "2"],
                         "a server takes 4 GPUs (--tp-size 4), up to GPU index 5 (--base-gpu-id 2, --gpu-id-step 1); "
                         "nvidia-smi lists 4 on this machine (NVIDIA H100 80GB HBM3)"),
                        (["--tp-size", "2", "--gpu-id-step", "4"],
                         "a server takes 2 GPUs (--tp-size 2), up to GPU index 4 (--base-gpu-id 0, --gpu-id-step 4); "
                         "nvidia-smi lists 4 on this machine (NVIDIA H100 80GB HBM3)"),
                        (["--base-gpu-id", "4"],
                         "a server takes 1 GPU, up to GPU index 4 (--base-gpu-id 4, --gpu-id-step 1); nvidia-smi lists "
                         "4 on this machine (NVIDIA H100 80GB HBM3)"),
                        (["--tp-size", "8", "--nnodes", "2"],
                         "--nnodes 2: ab launches both servers on this machine only; launch them on your nodes and "
                         "give their URLs as --fp8-url and --fp4-url")):
        assert command.main(_ab_args(_v32_folder(tmp_path), "--out", str(out), "--", *given),
                            read_sglang=read_sglang_facts, gpus=four) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"sglang-fp4-indexer ab: not run: {line}", given
        assert not out.exists()
    layout = {"gpus": 2, "nnodes": 1, "base_gpu_id": 2, "gpu_id_step": 1}
    assert command._no_gpu(["--tp-size", "2", "--base-gpu-id", "2"], four, None, layout) is None  # GPUs 2 and 3


def test_a_server_that_exits_at_start_is_named_with_its_error_line(tmp_path):
    """launched_server quotes the last error line of the server's log (a real child process that exits)."""
    from sglang_fp4_indexer.serving import gpu_description, launched_server

    cmd = [sys.executable, "-c", "import sys; print('loading ...'); print('RuntimeError: CUDA out of memory'); "
                                 "print('done'); sys.exit(3)"]
    log = tmp_path / "server.log"
    with pytest.raises(RuntimeError) as e:
        with launched_server(cmd, 9, str(log), 30):
            pytest.fail("the server never answered")
    assert str(e.value) == f"launch_server exited with 3: RuntimeError: CUDA out of memory (log: {log})"

    def no_smi(cmd, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "nvidia-smi")

    assert gpu_description(run=no_smi) == {"error": "nvidia-smi not found: no NVIDIA driver on this machine"}


def test_the_user_guides_ab_commands_parse_as_written():
    """Every `sglang-fp4-indexer ab` command of the user guide's "Validate on your deployment" parses with the
    command's own parser (the config path command substituted by what it prints)."""
    import re
    import shlex

    from sglang_fp4_indexer.cli import build_parser

    guide = (Path(__file__).resolve().parents[1] / "docs" / "user-guide.md").read_text()
    section = guide.split("## Validate on your deployment", 1)[1].split("\n## ", 1)[0]
    blocks = [b.replace("\\\n", " ") for b in re.findall(r"```bash\n(.*?)```", section, re.S)]
    commands = [ln for b in blocks for ln in b.splitlines() if ln.startswith("sglang-fp4-indexer ab ")]
    commands += re.findall(r"`(sglang-fp4-indexer ab [^`]*)`", section)
    assert len(commands) >= 2
    for line in commands:
        line = line.replace('"$(sglang-fp4-indexer docs --config deepseek-v3.2)"', "configs/deepseek-v3.2.yaml")
        argv = shlex.split(line)[1:]
        tail = argv[argv.index("--") + 1:] if "--" in argv else []
        args = build_parser().parse_args(argv[:len(argv) - len(tail) - (1 if tail else 0)])
        assert args.command == "ab" and args.out, line


def test_the_verdict_line_says_turn_fp4_on_or_keep_fp8_and_why():
    """The report's first line: FP4's KV gain, its output tokens/s against FP8's, the quality checks, and the
    advice, from recorded arms (turned slower or worse by hand where the case needs it)."""
    import copy

    def arms(gsm8k_fp4=(1, 1, 1, 1), fp4_speed=1.0):
        a = {"fp8-first": {"fp8": _recorded_arm("fp8", [1, 1, 1, 1], [1, 1, 1, 1]),
                           "fp4": _recorded_arm("fp4", list(gsm8k_fp4), [1, 1, 1, 1])}}
        a = copy.deepcopy(a)
        for line in a["fp8-first"]["fp4"]["bench"]:
            line["output_throughput"] = a["fp8-first"]["fp8"]["bench"][0]["output_throughput"] * fp4_speed
        return a

    gain = f"{(413568 / 379968 - 1) * 100:+.1f} % KV tokens"
    one = "over 1 load in one server order (fp8-first; a speed gain counts only over both orders)"
    assert build_report(arms(), meta={})["verdict"][0] == (
        f"verdict: turn FP4 on: {gain}, output tok/s FP4 / FP8 1.000 {one}, quality: no difference resolved")
    # Both orders: no one-order caveat.
    both = dict(arms(), **{"fp4-first": arms()["fp8-first"]})
    assert build_report(both, meta={})["verdict"][0] == (
        f"verdict: turn FP4 on: {gain}, output tok/s FP4 / FP8 1.000 over 2 loads, quality: no difference resolved")
    # The same KV pool in both arms: faster beyond 2 % in both server orders is a gain; in one order it is not (the
    # first server on a fresh machine also pays its compiles); level is none.
    same = arms(fp4_speed=1.5)
    same["fp8-first"]["fp4"]["kv"] = dict(same["fp8-first"]["fp8"]["kv"], fp4_indexer_active="MXFP4 ...")
    assert build_report(same, meta={})["verdict"][0].startswith(
        "verdict: nothing counted yet: FP4 was faster in one server order only; run both orders: +0.0 % KV tokens, "
        "output tok/s FP4 / FP8 1.500 over 1 load in one server order")
    same["fp4-first"] = same["fp8-first"]
    assert build_report(same, meta={})["verdict"][0].startswith("verdict: turn FP4 on: +0.0 % KV tokens, output "
                                                                 "tok/s FP4 / FP8 1.500 over 2 loads, ")
    assert build_report(same, meta={"dummy_weights": True})["verdict"][0].startswith(
        "verdict: FP4 was faster, but turn it on only after a run with the real weights: +0.0 % KV tokens")
    # Two servers given by URL were running before the run (no first-start compiles in it): their one measurement
    # counts, a gain as a loss.
    assert build_report(same, meta={"mode": "urls"})["verdict"][0].startswith(
        "verdict: turn FP4 on: +0.0 % KV tokens, output tok/s FP4 / FP8 1.500 over 2 loads, ")
    one_url = arms(fp4_speed=1.5)
    one_url["fp8-first"]["fp4"]["kv"] = dict(one_url["fp8-first"]["fp8"]["kv"], fp4_indexer_active="MXFP4 ...")
    assert build_report(one_url, meta={"mode": "urls"})["verdict"][0].startswith(
        "verdict: turn FP4 on: +0.0 % KV tokens, output tok/s FP4 / FP8 1.500 over 1 load, ")
    slow_url = arms(fp4_speed=0.9)
    slow_url["fp8-first"]["fp4"]["kv"] = dict(slow_url["fp8-first"]["fp8"]["kv"], fp4_indexer_active="MXFP4 ...")
    assert build_report(slow_url, meta={"mode": "urls"})["verdict"][0].startswith(
        "verdict: keep FP8 (FP4 slower at ")
    # An FP8 server whose log says FP4 was active (the environment switched it on): no verdict.
    on8 = arms()
    on8["fp8-first"]["fp8"]["kv"] = dict(on8["fp8-first"]["fp8"]["kv"], fp4_indexer_active="MXFP4 ...")
    assert build_report(on8, meta={})["problems"] == [
        "the FP8 server of fp8-first used FP4 (its log has an \"FP4 indexer active\" line: is SGLANG_ENABLE_FP4_INDEXER "
        "set where the servers run?)"]
    # Servers given by URL (no log read: no fp4_indexer_active key) with the same pool: nothing shows FP4 in use.
    urls = arms(fp4_speed=1.5)
    for arm in ("fp8", "fp4"):
        urls["fp8-first"][arm]["kv"] = {"max_total_num_tokens": 379968}
    assert build_report(urls, meta={})["verdict"][0].startswith(
        "verdict: no verdict (the FP4 server of fp8-first holds no more KV tokens than the FP8 server, and its log is "
        "not read for servers given by URL: nothing shows that it uses FP4")
    urls["fp8-first"]["fp4"]["kv"] = {"max_total_num_tokens": 413568}  # a larger pool: FP4's
    assert build_report(urls, meta={})["verdict"][0].startswith("verdict: turn FP4 on: ")
    # A load of the plan that one server has no result for, or no completed count: no verdict.
    plan = {"prompts": 12, "input_lens": [100000, 4096], "output_len": 256, "concurrency": 8,
            "kv_limited_concurrency": 0}
    r = build_report(arms(), meta={"plan": plan})
    assert r["problems"] == ["no result from both servers of fp8-first for the load at 4096 in / 256 out, 8 at a time"]
    nocount = arms()
    del nocount["fp8-first"]["fp4"]["bench"][0]["completed"]
    assert build_report(nocount, meta={"plan": dict(plan, input_lens=[100000])})["problems"] == [
        "the FP4 server's result of fp8-first at 100000 in / 256 out, 8 at a time has no completed count"]
    level = arms(fp4_speed=1.01)
    level["fp8-first"]["fp4"]["kv"] = dict(level["fp8-first"]["fp8"]["kv"], fp4_indexer_active="MXFP4 ...")
    assert build_report(level, meta={})["verdict"][0].startswith("verdict: FP4 gains nothing measured here: keep FP8")
    # An FP4 server whose log has no "FP4 indexer active" line (the plugin fell back): no verdict.
    fell = arms(fp4_speed=1.5)
    fell["fp8-first"]["fp4"]["kv"] = dict(fell["fp8-first"]["fp4"]["kv"], fp4_indexer_active=None)
    r = build_report(fell, meta={})
    assert r["verdict"][0].startswith("verdict: no verdict (the FP4 server of fp8-first did not use FP4 (its log has "
                                      "no \"FP4 indexer active\" line; its warning says why)): ")
    assert r["problems"] and "turn" not in r["verdict"][0]
    # A load where an arm completed fewer requests than the command sent: no verdict, and which.
    lost = arms(fp4_speed=1.5)
    lost["fp8-first"]["fp4"]["bench"][0]["completed"] = 3
    sent = lost["fp8-first"]["fp8"]["bench"][0]["completed"]
    r = build_report(lost, meta={"plan": {"prompts": sent, "input_lens": [100000], "kv_limited_concurrency": 0}})
    assert r["problems"] == [f"the FP4 server of fp8-first completed 3 of {sent} requests at 100000 in / 256 out, "
                             "8 at a time"]
    assert r["verdict"][0].startswith("verdict: no verdict (the FP4 server of fp8-first completed 3 of ")
    assert build_report(arms(fp4_speed=0.95), meta={})["verdict"][0].startswith(
        "verdict: keep FP8 (FP4 slower at 100000 in / 256 out, 8 at a time): ")
    assert build_report(arms(fp4_speed=0.99), meta={})["verdict"][0].startswith("verdict: turn FP4 on: ")
    # 40 GSM8K questions, FP8 all right, FP4 half: resolved worse beyond 2 standard errors.
    worse = build_report({"fp8-first": {"fp8": _recorded_arm("fp8", [1] * 40, [1]),
                                        "fp4": _recorded_arm("fp4", [1, 0] * 20, [1])}}, meta={})
    assert worse["verdict"][0].startswith("verdict: keep FP8 (FP4 worse on gsm8k): ")
    assert worse["verdict"][0].endswith("quality: FP4 worse on gsm8k")
    assert build_report(arms(), meta={"dummy_weights": True})["verdict"][0] == (
        "verdict: FP4 holds more KV tokens and was not slower, but turn it on only after a run with the real weights: "
        f"{gain}, output tok/s FP4 / FP8 1.000 {one}, quality not measured (dummy weights)")
    assert build_report({"fp8-first": {"fp8": _recorded_arm("fp8", [1], [1])}}, meta={})["verdict"][0].startswith(
        "not finished")


def test_a_config_model_path_or_a_server_without_v1_models_is_named(tmp_path, capsys):
    """A --config whose model-path is not on this machine names --config; a server that answers /server_info but
    not /v1/models (what SGLang's serving benchmark waits on: a gateway in front, say) is one line before anything
    runs."""
    from sglang_fp4_indexer.ab import command

    cfg = tmp_path / "serve.yaml"
    cfg.write_text("model-path: /srv/nothere/DeepSeek-V3.2\ntp-size: 8\n")
    with pytest.raises(SystemExit) as e:
        cli_main(["ab", "--out", str(tmp_path / "o"), "--config", str(cfg)])
    assert e.value.code == 2 and capsys.readouterr().err.strip().endswith(
        "--config: its model-path /srv/nothere/DeepSeek-V3.2 is no folder on this machine; give the checkpoint's "
        "folder as MODEL or in the file")
    s8, s4 = {"generate": 0, "models": False}, {"generate": 0}
    srv8, srv4 = _standin_server(s8, pool=1000, wrong_depth=None), _standin_server(s4, pool=1000, wrong_depth=None)
    try:
        u8, u4 = (f"http://127.0.0.1:{s.server_port}" for s in (srv8, srv4))
        argv = ["--out", str(tmp_path / "o"), "--fp8-url", u8, "--fp4-url", u4, "--tokenizer", "org/name"]
        assert command.main(_ab_args(*argv), read_sglang=None) == 1
    finally:
        srv8.shutdown()
        srv4.shutdown()
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"sglang-fp4-indexer ab: not run: --fp8-url: the server at {u8} answers /server_info but not /v1/models (")
    assert not (tmp_path / "o").exists()


def test_two_servers_that_differ_in_model_or_flags_are_refused(tmp_path, capsys):
    """Two servers given by URL must serve the same model the same way (their /server_info), FP4's switch apart."""
    from sglang_fp4_indexer.ab import command

    srv8 = _standin_server({"generate": 0}, pool=1000, wrong_depth=None, fp4=False)
    srv4 = _standin_server({"generate": 0}, pool=1100, wrong_depth=None, fp4=True, info={"load_format": "dummy"})
    try:
        u8, u4 = (f"http://127.0.0.1:{s.server_port}" for s in (srv8, srv4))
        args = _ab_args("--out", str(tmp_path / "o"), "--fp8-url", u8, "--fp4-url", u4)
        assert command.main(args, read_sglang=None) == 1
    finally:
        srv8.shutdown()
        srv4.shutdown()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "sglang-fp4-indexer ab: not run: --fp4-url: the two servers differ in load_format (FP8 server auto, FP4 "
        "server dummy, their /server_info): an A/B needs the same model and flags on both, FP4's switch apart")
    assert not (tmp_path / "o").exists()


class _Bar:
    def set_postfix_str(self, text):
        pass


def _launch_args(tmp_path, port):
    import argparse

    return argparse.Namespace(server_flags=["--tp-size", "1"], config=None, model=str(tmp_path), port=port,
                              ready_timeout=30, orders=["fp8-first"])


def test_launch_mode_refuses_a_port_something_already_answers_on(tmp_path):
    """A server left on the port (an interrupted run's, say) would be measured in place of the one launched: the
    arm stops before launching anything, naming --port."""
    from sglang_fp4_indexer.ab import command

    srv = _standin_server({"generate": 0}, pool=1000, wrong_depth=None)
    launched = []
    try:
        with pytest.raises(RuntimeError) as e:
            command._run_arm(_launch_args(tmp_path, srv.server_port), {}, "launch", str(tmp_path / "o"), "fp8-first",
                             "fp8", _Bar(), answer_value=None, run=lambda *a, **k: launched.append(a))
    finally:
        srv.shutdown()
    assert str(e.value) == (f"--port: something already answers on 127.0.0.1:{srv.server_port} (a server left from an "
                            "interrupted run?): stop it or give another --port; nothing was measured")
    assert not launched and not (tmp_path / "o" / "fp8-first" / "fp8" / "result.json").exists()


@pytest.mark.parametrize("arm, line, why", [
    ("fp4", "", "has no \"FP4 indexer active\" line: the plugin kept FP8 (its warning in the log says why)"),
    ("fp8", "FP4 indexer active: MXFP4 index-key cache, 68 B/token/layer instead of 132",
     "has an \"FP4 indexer active\" line: FP4 is on for it (is SGLANG_ENABLE_FP4_INDEXER set in this environment?)"),
])
def test_launch_mode_refuses_a_server_whose_log_contradicts_its_arm(tmp_path, monkeypatch, arm, line, why):
    """Once the launched server answers /health its log must show the arm's indexer: the plugin's "FP4 indexer
    active" line in the FP4 server's, none in the FP8 server's; else the arm stops before measuring. A real child
    process stands in for launch_server (SGLang's needs a GPU): it prints ``line`` to its log, then answers."""
    import socket

    from sglang_fp4_indexer.ab import command

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = (
        "import json, sys\n"
        "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
        f"print({line!r}, flush=True)\n"
        "class H(BaseHTTPRequestHandler):\n"
        "    def log_message(self, *a): pass\n"
        "    def do_GET(self):\n"
        "        body = b'{}'\n"
        "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
        "        self.wfile.write(body)\n"
        f"HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    monkeypatch.setattr(command, "launch_command", lambda model, port, flags, fp4: [sys.executable, "-c", child])
    with pytest.raises(RuntimeError) as e:
        command._run_arm(_launch_args(tmp_path, port), {}, "launch", str(tmp_path / "o"), "fp8-first", arm, _Bar(),
                         answer_value=None, run=None)
    log = tmp_path / "o" / "fp8-first" / arm / "server.log"
    assert str(e.value) == f"the {arm.upper()} server's log {why}; nothing was measured (log: {log})"
    assert not (log.parent / "result.json").exists()


def test_peak_running_requests_from_a_real_server_log():
    """The most requests running at once: the largest #running-req of SGLang's batch lines (a real log's lines)."""
    from sglang_fp4_indexer.serving import peak_running_requests

    text = (FIX / "server_fp8.log").read_text()
    assert text.count("#running-req: 0,") == 2 and peak_running_requests(text) == 0  # the fixture's two batch lines
    line = ("[2026-12-07 16:05:01] Decode batch, #running-req: 40, #token: 131000, token usage: 0.99, accept len: 3.1, "
            "#queue-req: 24, cuda graph: True\n")
    assert peak_running_requests(text + line) == 40
    assert peak_running_requests("no batch lines") is None
    # Under DP attention each scheduler's lines open with its ranks (SGLang's " DP{n} TP{m}" prefix): per rank.
    from sglang_fp4_indexer.serving import running_peaks

    dp = "".join(line.replace("16:05:01]", f"16:05:0{i} DP{rank} TP{rank}]").replace(": 40,", f": {n},")
                 for i, (rank, n) in enumerate([(0, 7), (1, 12), (0, 9), (1, 3)]))
    assert running_peaks(dp) == {0: 9, 1: 12} and peak_running_requests(dp) == 12
    assert running_peaks(text + line) == {None: 40}


def test_the_kv_limited_load_counts_every_dp_attention_ranks_pool(tmp_path):
    """With DP attention SGLang reports one rank's pool: the default KV-limited load is twice what all
    attention-DP ranks hold at the longest input length, not one rank's."""
    from sglang_fp4_indexer.ab import command
    from sglang_fp4_indexer.cli import build_parser

    dp = {"dp_size": 1, "attn_dp_size": 8, "enable_dp_attention": True}  # SGLang 0.5.23's /server_info for
    # --dp-size 8 --enable-dp-attention (its parallel_hook moves the width to attn_dp_size)
    srv8 = _standin_server({"generate": 0}, pool=100000, wrong_depth=None, info=dp)
    srv4 = _standin_server({"generate": 0}, pool=110000, wrong_depth=None, info=dp)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer_config.json").write_text("{}")
    try:
        u8, u4 = (f"http://127.0.0.1:{s.server_port}" for s in (srv8, srv4))
        calls = []
        run = _recorded_bench_client(calls)
        run.urls["fp8"] = u8
        argv = ["ab", "--out", str(tmp_path / "ab"), "--fp8-url", u8, "--fp4-url", u4, "--tokenizer", str(tok),
                "--input-lens", "2048", "--output-len", "256", "--concurrency", "4", "--passkey-lengths", "0"]
        assert command.main(build_parser().parse_args(argv), run=run) == 0
    finally:
        srv8.shutdown()
        srv4.shutdown()
    assert [c[c.index("--max-concurrency") + 1] for c in calls] == ["4", str(2 * 8 * (100000 // 2304))] * 2
    assert _warmed_at_load_concurrency(calls)


def test_the_plugin_check_says_when_its_gpu_is_assumed(tmp_path, monkeypatch):
    """On a machine without a GPU (a client of two servers given by URL) the check's CUDA 9.0 is assumed, and the
    report's check line says so; with a local Hopper GPU (its facts stood in for: none here) it does not."""
    from sglang_fp4_indexer.ab import command
    from sglang_fp4_indexer.check import budget

    args = _ab_args(_v32_folder(tmp_path), "--out", str(tmp_path / "o"))
    monkeypatch.setattr(budget, "local_gpu", lambda: None)
    refusal, text, _ = command._refusal(args, [], {}, None)
    assert refusal is None and text.startswith("FP4 enabled: ") and text.endswith(
        " (CUDA 9.0 assumed: no GPU on this machine, and the servers' GPUs are not read)")
    from sglang_fp4_indexer.check import findings

    local = findings.DeviceFacts("cuda", (9, 0), "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(findings, "_device", lambda capability, gpu: (local, "NVIDIA H100 80GB HBM3, CUDA 9.0 (local)"))
    refusal, text, _ = command._refusal(args, [], {}, None)
    assert refusal is None and text.startswith("FP4 enabled: ") and "assumed" not in text


def test_sigterm_stops_the_launched_server_and_ends_in_one_line(tmp_path):
    """A time limit's SIGTERM to a running ``sglang-fp4-indexer ab`` (a real signal to a real child process) ends it
    as Ctrl-C does: the server it launched is terminated and the command prints one line and exits 130. The arm
    is a stand-in for what cannot run here (SGLang's server needs a GPU): ``launched_server`` with a child that
    never answers /health, as a server still starting."""
    import signal
    import subprocess
    import time

    log, out = tmp_path / "server.log", tmp_path / "o"
    script = f"""
import sys
from sglang_fp4_indexer import cli
from sglang_fp4_indexer.serving import launched_server

def run(sub, args):  # ab waiting for its launched server to answer
    cmd = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"]
    with launched_server(cmd, 9, {str(log)!r}, 600):
        raise AssertionError("the stand-in server never answers /health")

cli._run = run
sys.exit(cli.main(["ab", "/nonexistent/model", "--out", {str(out)!r}]))
"""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.time() + 120
        while not (log.exists() and log.read_text().strip()) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        if not (log.exists() and log.read_text().strip()):
            proc.kill()
            pytest.fail(f"the stand-in server never started (rc {proc.poll()}): {proc.communicate()[1][-2000:]}")
        server_pid = int(log.read_text().split()[0])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert err.strip().splitlines() == ["sglang-fp4-indexer ab: interrupted (before any arm finished: nothing "
                                            "kept)"]
        with pytest.raises(ProcessLookupError):  # terminated and reaped by launched_server on the way out
            os.kill(server_pid, 0)
    finally:  # nothing left running when the test fails (after the checks above: they see what the command left)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if log.exists() and log.read_text().strip():
            try:
                os.kill(int(log.read_text().split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_config_and_model_errors_are_one_line_in_abs_terms(tmp_path, capsys):
    """A --config file that is not YAML, one naming another model, one whose flag takes no value, and a short name
    of check's packaged configs as MODEL: each one line (exit 2) saying it in ab's terms, before any server."""
    model = _v32_folder(tmp_path)
    files = {"bad.yaml": "model-path: [unclosed\n", "glm.yaml": "model-path: zai-org/GLM-5\n",
             "maybe.yaml": "enable-fp4-indexer: maybe\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cases = [([model, "--config", str(tmp_path / "bad.yaml")],
              f"--config: {tmp_path / 'bad.yaml'} is not YAML (while parsing a flow sequence in "),
             ([model, "--config", str(tmp_path / "glm.yaml")],
              f"--config: the file names model-path zai-org/GLM-5, another model than {model} (architectures "),
             ([model, "--config", str(tmp_path / "maybe.yaml")],
              "server flags: SGLang does not know 'maybe' after --enable-fp4-indexer, which takes no value (in a "
              "--config file: true or false)"),
             (["deepseek-v3.2"], "model: expected the checkpoint's folder or its Hugging Face name (ORG/NAME), as "
              "launch_server's --model-path takes it, got 'deepseek-v3.2' (deepseek-v3.2 names a config packaged "
              "for check, without weights: give deepseek-ai/DeepSeek-V3.2 or its folder)")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as e:
            cli_main(["ab", *argv, "--out", str(tmp_path / "o")])
        err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("loading SGLang")]
        assert e.value.code == 2 and len(err) == 1 and err[0].startswith("sglang-fp4-indexer ab: error: " + message), (
            argv, err)
        assert "check describes" not in err[0] and "--sglang-args" not in err[0]
    assert not (tmp_path / "o").exists()


def test_a_plugin_whitelist_without_the_plugin_refuses_a_launch_but_not_servers_by_url(tmp_path, capsys, monkeypatch):
    """SGLANG_PLUGINS here without fp4_indexer: the FP4 server ab would launch stops at --enable-fp4-indexer, so ab
    refuses in one line before anything starts; servers given by URL run in their own environment: not read."""
    from sglang_fp4_indexer.ab import command
    from sglang_fp4_indexer.sglang_plugin.check_facts import read_sglang_facts

    monkeypatch.setenv("SGLANG_PLUGINS", "other")
    model, out = _v32_folder(tmp_path), tmp_path / "o"
    assert command.main(_ab_args(model, "--out", str(out)), read_sglang=read_sglang_facts,
                        gpus=lambda: {"name": "NVIDIA H100 80GB HBM3", "count": 8}) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "sglang-fp4-indexer ab: not run: FP4 would not serve this deployment (SGLANG_PLUGINS='other' does not list "
        "fp4_indexer, so SGLang does not load the plugin and launch_server stops at --enable-fp4-indexer "
        "(unrecognized arguments))")
    assert not out.exists()
    by_url = _ab_args(model, "--out", str(out), "--fp8-url", "http://127.0.0.1:1", "--fp4-url", "http://127.0.0.1:2")
    refusal, text, _ = command._refusal(by_url, [], {}, read_sglang_facts)
    assert refusal is None and text.startswith("FP4 enabled: "), text


def test_a_value_after_a_flag_that_takes_none_names_that_flag_wherever_it_repeats(tmp_path):
    """SGLang leaves a value after a flag that takes none unparsed: the error names that flag, even where the same
    word is also a valid value of an earlier flag (which argparse consumed)."""
    from sglang_fp4_indexer.sglang_plugin.server_args import server_args_from_flags

    with pytest.raises(ValueError) as e:
        server_args_from_flags(_v32_folder(tmp_path), ["--served-model-name", "maybe", "--enable-dp-lm-head", "maybe"])
    assert str(e.value) == ("server flags: SGLang does not know 'maybe' after --enable-dp-lm-head, which takes no "
                            "value (in a --config file: true or false)")
    with pytest.raises(ValueError) as e:
        server_args_from_flags(_v32_folder(tmp_path), ["--bogus", "3"])
    assert str(e.value) == "server flags: SGLang does not know '--bogus', '3'"


def test_options_a_deployer_gets_wrong_are_named_before_any_gpu_is_asked_for(tmp_path):
    """Repeated --input-lens (each would be reported against one FP4 row), --gsm8k-questions without the data it
    counts, and a --tokenizer folder without tokenizer files in launch mode (the benchmark loads it after the
    servers start): one line naming the option, before the GPU question."""
    from sglang_fp4_indexer.ab import command

    out, model = tmp_path / "o", _v32_folder(tmp_path)
    empty = tmp_path / "tok"
    empty.mkdir()
    for argv, message in ((["--input-lens", "256,256"], "--input-lens: each length once, got 256,256"),
                          (["--gsm8k-questions", "20"], "--gsm8k-questions: GSM8K runs only with --gsm8k-data"),
                          (["--tokenizer", str(empty)], f"--tokenizer: {empty} holds none of ")):
        with pytest.raises(ValueError) as e:
            command.main(_ab_args(model, "--out", str(out), *argv), read_sglang=None,
                         gpus=lambda: pytest.fail("no GPU asked for"))
        assert str(e.value).startswith(message), e.value
    assert not out.exists()
    args = _ab_args(model, "--out", str(out))
    command._validate(args)
    assert args.gsm8k_questions == command.GSM8K_QUESTIONS == 200


def test_a_tokenizer_the_benchmark_cannot_load_stops_the_run_before_any_arm(tmp_path, capsys, monkeypatch):
    """Servers given by URL whose tokenizer this machine cannot load (a Hugging Face name, offline): SGLang's own
    tokenizer loader, run as the benchmark would run it, fails before any GSM8K or load; one line, exit 1, nothing
    written. A folder with the tokenizer files loads."""
    from sglang_fp4_indexer.ab import command

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    srv8 = _standin_server({"generate": 0}, pool=1000, wrong_depth=None)
    srv4 = _standin_server({"generate": 0}, pool=1100, wrong_depth=None)
    asked = []

    def run(cmd, **kwargs):  # the real checks: the clients' import, then SGLang's tokenizer loader
        asked.append(cmd[2])
        return subprocess.run(cmd, **kwargs)

    out = tmp_path / "o"
    try:
        urls = ["--fp8-url", f"http://127.0.0.1:{srv8.server_port}", "--fp4-url", f"http://127.0.0.1:{srv4.server_port}"]
        assert command.main(_ab_args("--out", str(out), *urls, "--tokenizer", "no-such-org/no-such-tokenizer"),
                            read_sglang=None, run=run) == 1
        err = [ln for ln in capsys.readouterr().err.strip().splitlines() if "warning: no MODEL given" not in ln]
        assert asked[-1] == command._TOKENIZER_CHECK
        assert len(err) == 1 and err[0].startswith(
            "sglang-fp4-indexer ab: not run: SGLang's serving benchmark cannot load the tokenizer "
            "no-such-org/no-such-tokenizer here ("), err
        assert err[0].endswith("); give --tokenizer, a folder with the checkpoint's tokenizer files")
        assert not out.exists()
        tok = tmp_path / "tiny"
        subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "sglang_one_batch.py"),
                        "make-model", str(tok), "--size", "tiny"], check=True, capture_output=True, timeout=300)
        ok = subprocess.run([sys.executable, "-c", command._TOKENIZER_CHECK, str(tok)], capture_output=True, text=True,
                            timeout=300)
        assert ok.returncode == 0, ok.stderr
    finally:
        srv8.shutdown()
        srv4.shutdown()


def test_a_server_answering_html_is_one_line(tmp_path, capsys):
    """A URL where a web server answers /server_info with an HTML page: the refusal stays one line."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from sglang_fp4_indexer.ab import command

    class Html(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<!DOCTYPE HTML>\n<html>\n<head><title>Error</title></head>\n<body>\n<p>404</p>\n</body>\n</html>\n"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    html = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=html.serve_forever, daemon=True).start()
    srv4 = _standin_server({"generate": 0}, pool=1100, wrong_depth=None)
    try:
        urls = ["--fp8-url", f"http://127.0.0.1:{html.server_port}", "--fp4-url", f"http://127.0.0.1:{srv4.server_port}"]
        assert command.main(_ab_args("--out", str(tmp_path / "o"), *urls), read_sglang=None) == 1
        err = [ln for ln in capsys.readouterr().err.strip().splitlines() if "warning: no MODEL given" not in ln]
        assert len(err) == 1 and err[0].startswith(
            f"sglang-fp4-indexer ab: not run: --fp8-url: no SGLang server answers at http://127.0.0.1:"
            f"{html.server_port} (/server_info: "), err
        assert "<!DOCTYPE HTML> <html>" in err[0]
    finally:
        html.shutdown()
        srv4.shutdown()


def test_flags_given_for_servers_by_url_must_be_what_they_run_with(tmp_path, capsys):
    """With servers given by URL, the flags after -- feed the plugin's check: one that differs from what both
    servers report in /server_info (here an FP8 KV cache and 8 GPUs given, servers on auto and 1) stops the run
    in one line; the same flags the servers report pass that check (and the run goes on to the next one)."""
    from sglang_fp4_indexer.ab import command

    info = {"kv_cache_dtype": "auto", "tp_size": 1, "speculative_algorithm": "EAGLE"}
    srv8 = _standin_server({"generate": 0}, pool=1000, wrong_depth=None, info=info)
    srv4 = _standin_server({"generate": 0}, pool=1100, wrong_depth=None, info=info)
    try:
        urls = ["--fp8-url", f"http://127.0.0.1:{srv8.server_port}", "--fp4-url", f"http://127.0.0.1:{srv4.server_port}"]
        for flags, line in ((["--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype fp8_e4m3, but the servers run with "
                                                                "kv_cache_dtype auto"),
                            (["--tp-size=8"], "--tp-size 8, but the servers run with tp_size 1"),
                            (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2, but the servers run with "
                                                              "tp_size 1")):
            args = _ab_args("--out", str(tmp_path / "o"), *urls, "--", *flags)
            assert command._servers_problem(args) == (
                f"server flags: {line} (their /server_info): the plugin's check would describe another deployment "
                "than the one measured; give after -- the flags the servers run with")
        # The same values (any case, NEXTN for EAGLE), "auto" and a flag SGLang resolves itself are not a difference.
        ok = _ab_args("--out", str(tmp_path / "o"), *urls, "--", "--kv-cache-dtype", "AUTO", "--tp-size", "1",
                      "--speculative-algorithm", "NEXTN", "--page-size", "1")
        assert command._flags_problem(list(ok.server_flags), info) is None
        assert command._servers_problem(ok).startswith("--tokenizer: ")  # past the flags, to the next check
    finally:
        srv8.shutdown()
        srv4.shutdown()
    assert command._flags_problem(["--tp-size", "x"], {"tp_size": 1}).startswith("server flags: --tp-size x, but")
    assert command._flags_problem(["--kv-cache-dtype", "auto"], {"kv_cache_dtype": "fp8_e4m3"}) is None
    assert command._flags_problem(["--speculative-algorithm", "NGRAM"], {"speculative_algorithm": "EAGLE"}) \
        .startswith("server flags: --speculative-algorithm NGRAM, but the servers run with speculative_algorithm EAGLE")


def test_a_hub_name_without_a_packaged_config_says_how_to_give_the_checkpoint(tmp_path):
    """A Hugging Face name whose config this package does not carry: ab's own words (download the checkpoint, give
    its folder as MODEL), not check's."""
    from sglang_fp4_indexer.ab import command

    with pytest.raises(ValueError) as e:
        command.main(_ab_args("foo-org/not-a-model", "--out", str(tmp_path / "o")), read_sglang=None,
                     gpus=lambda: pytest.fail("no GPU asked for"))
    assert str(e.value).endswith(
        "ab reads the model's config.json from its local folder, not from the hub: download the checkpoint with: "
        "hf download foo-org/not-a-model --local-dir DIR, then give DIR as MODEL"), e.value
    assert "run check" not in str(e.value)

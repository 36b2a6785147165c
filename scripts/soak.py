"""A soak of a running SGLang server: thousands of requests that disconnect, abort and retract, then checks.

Run on a GPU machine by ``scripts/sglang_gpu_check.sh soak`` (a server with MTP, the radix cache and CUDA graphs
on, a KV pool small enough that SGLang retracts decode requests), FP4 and FP8 one after the other; this script
is the client and the checks, and talks to the server over HTTP only (it imports no SGLang):

* ``load --url URL --out OUT.json [options]``: the load. Before it and after it, the same probe prompts
  (greedy, sent together so that they decode in one batch) and SGLang's ``/get_server_info``; then
  ``--requests`` requests of random token ids, ``--min-len`` to ``--max-len`` tokens (log-uniform), a third
  of them (``--shared-frac``) behind one of a few shared prefixes (the radix cache's reuse and eviction),
  streamed (``/generate`` with ``stream``), ``--concurrency`` at a time. A fraction of the clients
  disconnect at a random point (``--disconnect-frac``: after 0 to 8 streamed chunks, 0 = while the
  prompt is prefilled), a fraction are aborted through SGLang's ``/abort_request`` by their ``rid`` after a
  random delay (``--abort-frac``), a fraction ask for log-probabilities with the top 5
  (``--logprob-frac``), which must all be finite, a fraction are sampled (``--sampled-frac``: temperature 0.8,
  through SGLang's speculative sampling kernel instead of its greedy verify; no top-p or top-k of its own, but in a
  batch that also holds greedy requests, which SGLang samples as top-k 1, SGLang renormalizes with FlashInfer's
  top_k_renorm_prob from FlashInfer's Python package, which a ``pip install`` of SGLang brings; the slimmed runtime
  of this repository's own GPU runs has only FlashInfer's headers, so ``scripts/sglang_gpu_check.sh soak`` passes
  ``--sampled-frac 0`` unless SOAK_SAMPLED_FRAC says otherwise) and a fraction ask for
  ``--long-output-len`` new tokens (``--long-frac``). The load's requests do not set ``ignore_eos`` (for such a
  request SGLang reserves pool room for all of its ``max_new_tokens`` at admission, and never has to retract it):
  SGLang reserves a fraction of the output (``SGLANG_INIT_NEW_TOKEN_RATIO``), decode outgrows it, and SGLang
  retracts decode requests when the pool is full. Then the bad inputs a deployer sends (a prompt longer than the
  context, ``max_new_tokens`` 0, top-5 log-probabilities, an empty prompt). The load is bounded in requests and in
  time (``--time-limit``: no request is sent after it; those in flight finish, each within 900 s) and talks only
  to ``--url``. Before anything is sent it checks that ``--out``'s folder exists, that the server answers
  ``/health`` with 200, and that ``--max-len`` fits the server's longest prompt (``max_req_input_len``).
* ``table LABEL=RUN.json,CHECKS.json,SERVER.log ...``: the docs' table, one column per run.
* ``check OUT.json [--log SERVER.log] [--trace DIR --draft-tokens N [--no-oracle]] [--expect-hicache]
  [--json CHECKS.json]``: the checks, as a table; exit 1 when one fails. ``--trace``: the test-only top-k trace
  plugin's records of the run (``scripts/topk_trace``, a sample of batches with ``FP4_INDEXER_TOPK_TRACE_EVERY``,
  layer 0's scorer inputs and pages with ``FP4_INDEXER_TOPK_TRACE_ORACLE_LAYERS=0``), checked by
  ``scripts/sglang_one_batch.py``'s ``check_trace`` and ``oracle_check``; ``--no-oracle`` leaves the oracle's row
  out, saying so (a server at SGLang's dummy-weight logit scale, at which its top-k kernels differ from the exact
  top-k on long rows).
  ``--expect-hicache``: the HiCache row is checked whatever the server's info says.

What the checks hold a server to: the load completed requests, and some of its clients disconnected and some
of its aborts took effect (the paths a soak exists to exercise); no request failed with a server error (HTTP 5xx,
SGLang's error chunk or no answer) and none was refused (HTTP 4xx: the load sends only valid requests); every
finished request's log-probabilities are finite; the probes gave the same tokens before
and after the load; the server answered ``/health`` after the load and after each bad input, and each bad
input got an answer (SGLang's error for what it refuses); the KV pool, read from SGLang's ``/v1/loads`` after
``/flush_cache`` before the load and again after it has drained, has as many free tokens afterwards as before and
none in use (the FP4 pool's payload and scale planes live in the same pages, allocated by the same allocator, so
one count covers both); from the server's log, no traceback and no pool leak SGLang's own invariant checker
reports (``memory leak detected``; it checks available + evictable + protected = total each time the scheduler
goes idle), with the retractions SGLang logged counted (``retract``); on a server with SGLang's hierarchical cache
(HiCache), some prompt's prefix loaded back from host memory (SGLang's ``cached_tokens_details`` on the finished
requests: tokens there were evicted from the device pool first; with ``--expect-hicache`` whatever the server's
info says); and, with ``--trace``, every sampled top-k
row valid (``min(top-k, keys)`` distinct entries, each a key the row may see) and the oracle layer's sampled rows
equal to an fp64 oracle's top-k within the scorer's error bound, on the cache pages the server held then.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

#: Probe prompts: lengths in tokens (seeded ids), greedy, 32 new tokens each, sent together.
PROBE_LENS = (777, 3001, 9000, 17)
#: How many distinct shared prefixes the requests that share one draw from.
SHARED_PREFIXES = 4
#: The token ids every prompt draws from, ``[low, high)``: valid in any vocabulary of at least 16 000 tokens (the
#: tiny model's has 16 384, DeepSeek-V3.2's 129 280). SGLang 0.5.23 does not check ids against the vocabulary: an id
#: past it fails the embedding's gather on the GPU and stops the server, FP8 and FP4 alike.
TOKEN_IDS = (1000, 16000)


def _post(url: str, body: dict, timeout: float) -> tuple[int, bytes]:
    """POST ``body`` as JSON; ``(status, body bytes)``, HTTP errors included (never raises for a status);
    ``(0, b"")`` when the server does not answer."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def _get(url: str, timeout: float = 30.0) -> tuple[int, bytes]:
    """GET; ``(status, body)``, ``(0, b"")`` when the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def _finite_logprobs(meta: dict) -> bool:
    """Whether every log-probability in SGLang's ``meta_info`` (``output_token_logprobs`` and
    ``output_top_logprobs``: lists of ``[logprob, token id, text]``) is a finite number."""
    vals = [e[0] for e in meta.get("output_token_logprobs") or []]
    for top in meta.get("output_top_logprobs") or []:
        vals.extend(e[0] for e in top or [])
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals)


def stream_one(base: str, body: dict, *, disconnect_after: int | None, timeout: float) -> dict:
    """One streamed ``/generate`` request; what became of it.

    Args:
        disconnect_after: close the connection after this many streamed chunks (0: right after sending, while
            the prompt is prefilled); ``None``: read to the end.

    Returns:
        dict: ``outcome`` (``completed``, ``aborted`` when SGLang finished it with an abort, ``disconnected``,
        ``refused`` (HTTP 4xx), ``error`` (HTTP 5xx, SGLang's error chunk, or no answer)), ``chunks``, ``finite`` (its log-probabilities, when it asked for them and finished),
        ``tokens`` (new tokens received, from the last chunk's ``meta_info.completion_tokens`` or its cumulative
        ``output_ids``), ``asked`` (``max_new_tokens``), ``finish`` (SGLang's finish reason type: ``length``,
        ``stop``, ``abort``) and ``matched`` (what a ``stop`` matched: a stop token's id, or SGLang's text such as
        ``NaN happened``) when it finished, ``detail`` for errors.
    """
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks, last = 0, None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if disconnect_after == 0:
                return {"outcome": "disconnected", "chunks": 0}
            for line in r:
                if not line.startswith(b"data:"):
                    continue
                if b"[DONE]" in line:
                    break
                chunk = json.loads(line[len(b"data:"):])
                if isinstance(chunk, dict) and "error" in chunk:
                    return {"outcome": "error", "chunks": chunks, "detail": json.dumps(chunk["error"])[:300]}
                chunks += 1
                last = chunk
                if disconnect_after is not None and chunks >= disconnect_after:
                    return {"outcome": "disconnected", "chunks": chunks}
    except urllib.error.HTTPError as e:
        # 4xx: the server refused the request (a prompt past its limit, say): not a server error, counted apart.
        return {"outcome": "refused" if 400 <= e.code < 500 else "error", "chunks": chunks,
                "detail": f"HTTP {e.code}: {e.read()[:300]!r}"}
    except OSError as e:
        return {"outcome": "error", "chunks": chunks, "detail": f"{type(e).__name__}: {e}"}
    meta = (last or {}).get("meta_info", {})
    finish = meta.get("finish_reason") or {}
    outcome = "aborted" if isinstance(finish, dict) and finish.get("type") == "abort" else "completed"
    tokens = meta.get("completion_tokens")
    out = {"outcome": outcome, "chunks": chunks,
           "tokens": int(tokens) if tokens is not None else len((last or {}).get("output_ids") or []),
           "asked": body.get("sampling_params", {}).get("max_new_tokens"),
           "finish": finish.get("type") if isinstance(finish, dict) else None,
           "matched": finish.get("matched") if isinstance(finish, dict) else None}
    # Where its prompt's cached prefix came from (SGLang's meta_info on the finished output: ``cached_tokens``, and
    # ``cached_tokens_details`` {"device", "host"} where HiCache loaded part of it back from host memory) and how often
    # SGLang retracted it (``num_retractions``).
    details = meta.get("cached_tokens_details") or {}
    out.update(cached=int(meta.get("cached_tokens") or 0), cached_host=int(details.get("host") or 0),
               retractions=int(meta.get("num_retractions") or 0))
    if body.get("return_logprob") and outcome == "completed":
        out["finite"] = _finite_logprobs(meta)
    return out


def probes(base: str, output_len: int = 32, timeout: float = 600.0) -> list[list[int]]:
    """The probe prompts' greedy output ids (``PROBE_LENS``, seeded ids), the prompts sent together.

    Raises:
        RuntimeError: a probe got no answer or an error.
    """
    rng = random.Random(12345)
    bodies = [{"input_ids": [rng.randrange(*TOKEN_IDS) for _ in range(n)],
               "sampling_params": {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True}}
              for n in PROBE_LENS]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: _post(base + "/generate", b, timeout), bodies))
    out = []
    for (status, raw), n in zip(answers, PROBE_LENS):
        if status != 200:
            raise RuntimeError(f"probe of {n} tokens: HTTP {status}: {raw[:300]!r}")
        out.append(list(json.loads(raw).get("output_ids") or []))
    return out


def bad_inputs(base: str, context_len: int, timeout: float = 120.0) -> list[dict]:
    """The bad inputs a deployer's clients send, one by one, each followed by ``/health``: a prompt longer than
    the context, ``max_new_tokens`` 0, log-probabilities with the top 5 of a short prompt, and an empty text (last:
    with a tokenizer that adds no BOS it is a prompt of zero tokens, on which SGLang 0.5.23's scheduler stops, FP8
    and FP4 alike; the models' own tokenizers and the tiny model's add one).

    Returns:
        list of dicts: ``input``, ``status`` (HTTP), ``answer`` (its first bytes), ``healthy`` (``/health`` 200
        afterwards), ``finite`` (for the log-probability request).
    """
    rng = random.Random(7)
    cases = [
        ("prompt longer than the context", {"input_ids": [rng.randrange(*TOKEN_IDS) for _ in range(context_len + 64)],
                                            "sampling_params": {"max_new_tokens": 8}}),
        ("max_new_tokens 0", {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 0}}),
        ("log-probabilities with the top 5", {"input_ids": [rng.randrange(*TOKEN_IDS) for _ in range(300)],
                                              "sampling_params": {"max_new_tokens": 8}, "return_logprob": True,
                                              "top_logprobs_num": 5}),
        ("empty prompt", {"text": "", "sampling_params": {"max_new_tokens": 8}}),
    ]
    out = []
    for name, body in cases:
        status, raw = _post(base + "/generate", body, timeout)
        row = {"input": name, "status": status, "answer": raw[:200].decode(errors="replace")}
        if body.get("return_logprob") and status == 200:
            row["finite"] = _finite_logprobs(json.loads(raw).get("meta_info", {}))
        row["healthy"] = _get(base + "/health")[0] == 200
        out.append(row)
    return out


def load_args_problem(**args) -> str | None:
    """What is wrong with ``load``'s arguments (``None``: nothing), each named as its option (``--abort-frac``)
    and as its argument (``abort_frac``): fractions in 0..1, ``1 <= min_len <= max_len``, counts and lengths >= 1."""
    def opt(name: str) -> str:
        return f"--{name.replace('_', '-')} ({name})"

    for name in ("shared_frac", "disconnect_frac", "abort_frac", "logprob_frac", "sampled_frac", "long_frac"):
        if name in args and not 0.0 <= args[name] <= 1.0:
            return f"{opt(name)}: expected a fraction in 0..1, got {args[name]}"
    for name in ("requests", "concurrency", "min_len", "output_len", "long_output_len"):
        if name in args and args[name] < 1:
            return f"{opt(name)}: expected at least 1, got {args[name]}"
    if args.get("min_len", 1) > args.get("max_len", args.get("min_len", 1)):
        return (f"{opt('max_len')}: expected at least {opt('min_len')} = {args['min_len']}, got {args['max_len']}")
    return None


def load(base: str, *, requests: int, concurrency: int, min_len: int, max_len: int, output_len: int,
         shared_frac: float, disconnect_frac: float, abort_frac: float, logprob_frac: float, seed: int,
         time_limit: float, timeout: float = 900.0, vocab: tuple[int, int] = TOKEN_IDS,
         abort_within_s: float = 5.0, sampled_frac: float = 0.0, long_frac: float = 0.0,
         long_output_len: int = 2048) -> dict:
    """The load (module docstring); returns the counts and every request's result. An aborted request's
    ``/abort_request`` goes out at a uniform random time within ``abort_within_s`` seconds of its start. A
    request asks for 1 to ``output_len`` new tokens (uniform), or, with probability ``long_frac``, for
    ``long_output_len``; with probability ``sampled_frac`` it is sampled (temperature 0.8), else greedy.

    Returns:
        dict: ``counts`` (requests by outcome), ``kinds`` (how many were planned sampled, long, with
        log-probabilities, behind a shared prefix), ``seconds``, ``results`` (one per request), ``cache`` (over the
        finished requests, from SGLang's meta_info: ``prefix_tokens`` served from the prefix cache, ``from_host``
        of them loaded back from HiCache's host memory, ``requests_from_host``, ``requests_retracted``),
        ``nonfinite_logprobs``, ``errors`` (the first 20 server errors), ``refusals`` (the first 20 HTTP 4xx answers).

    Raises:
        ValueError: a fraction outside 0..1, ``min_len`` > ``max_len``, or a count or length below 1.
    """
    problem = load_args_problem(requests=requests, concurrency=concurrency, min_len=min_len, max_len=max_len,
                                output_len=output_len, long_output_len=long_output_len, shared_frac=shared_frac,
                                disconnect_frac=disconnect_frac, abort_frac=abort_frac, logprob_frac=logprob_frac,
                                sampled_frac=sampled_frac, long_frac=long_frac)
    if problem:
        raise ValueError(problem)
    rng = random.Random(seed)
    lo, hi = vocab
    prefixes = [[rng.randrange(lo, hi) for _ in range(rng.randint(min_len, max(min_len, max_len // 2)))]
                for _ in range(SHARED_PREFIXES)]
    plans = []
    for i in range(requests):
        n = int(round(math.exp(rng.uniform(math.log(min_len), math.log(max_len)))))
        ids = [rng.randrange(lo, hi) for _ in range(n)]
        shared = rng.random() < shared_frac
        if shared:
            ids = prefixes[rng.randrange(SHARED_PREFIXES)] + ids[: max(1, n // 4)]
        # Every rid of the load the same length: SGLang 0.5.23's scheduler aborts every request whose rid STARTS
        # with the one /abort_request names, so "soak-0-2" would also abort "soak-0-21" (a first run did).
        body = {"rid": f"soak-{seed}-{i:0{len(str(requests - 1))}d}", "input_ids": ids[:max_len], "stream": True,
                "sampling_params": {"max_new_tokens": rng.randint(1, output_len), "temperature": 0.0}}
        if rng.random() < logprob_frac:
            body.update(return_logprob=True, top_logprobs_num=5)
        r = rng.random()
        plan = {"body": body, "disconnect_after": rng.randint(0, 8) if r < disconnect_frac else None,
                "abort_after_s": rng.uniform(0.0, abort_within_s) if disconnect_frac <= r < disconnect_frac + abort_frac
                else None, "shared": shared, "long": rng.random() < long_frac, "sampled": rng.random() < sampled_frac}
        if plan["long"]:
            body["sampling_params"]["max_new_tokens"] = long_output_len
        if plan["sampled"]:
            body["sampling_params"].update(temperature=0.8)
        plans.append(plan)
    start = time.time()
    results: list[dict | None] = [None] * requests
    timers: list[threading.Timer] = []

    def one(i: int) -> None:
        plan = plans[i]
        if time.time() - start > time_limit:
            results[i] = {"outcome": "not sent (time limit)", "chunks": 0}
            return
        if plan["abort_after_s"] is not None:
            t = threading.Timer(plan["abort_after_s"], _post,
                                args=(base + "/abort_request", {"rid": plan["body"]["rid"]}, 60.0))
            t.start()
            timers.append(t)
        res = stream_one(base, plan["body"], disconnect_after=plan["disconnect_after"], timeout=timeout)
        res.update(prompt_len=len(plan["body"]["input_ids"]), abort_asked=plan["abort_after_s"] is not None)
        results[i] = res

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(requests)))
    for t in timers:
        t.cancel()
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    sent = [p for p, r in zip(plans, results) if r["outcome"] != "not sent (time limit)"]
    kinds = {"sampled": sum(p["sampled"] for p in sent), "long": sum(p["long"] for p in sent),
             "logprob": sum(bool(p["body"].get("return_logprob")) for p in sent),
             "shared_prefix": sum(p["shared"] for p in sent)}
    # A completed request gets exactly what it asked for when it finished by length, at most that when it stopped at
    # a stop token (``matched`` a token id), retracted and re-admitted or not; any other finish of a completed request
    # is wrong, SGLang's "NaN happened" stop (a ``stop`` matching text) included.
    short = [i for i, r in enumerate(results) if r["outcome"] == "completed" and r.get("asked") is not None
             and not ((r.get("finish") == "length" and r.get("tokens") == r["asked"])
                      or (r.get("finish") == "stop" and type(r.get("matched")) is int
                          and r.get("tokens", 0) <= r["asked"]))]
    unasked = [i for i, r in enumerate(results) if r["outcome"] == "aborted" and not r.get("abort_asked")]
    cache = {"prefix_tokens": sum(r.get("cached", 0) for r in results),
             "from_host": sum(r.get("cached_host", 0) for r in results),
             "requests_from_host": sum(1 for r in results if r.get("cached_host", 0) > 0),
             "requests_retracted": sum(1 for r in results if r.get("retractions", 0) > 0)}
    return {"counts": counts, "kinds": kinds, "seconds": time.time() - start, "results": results, "cache": cache,
            "short_outputs": len(short), "short_examples": [results[i] | {"request": i} for i in short[:5]],
            "unasked_aborts": len(unasked), "unasked_abort_examples": [results[i] | {"request": i} for i in unasked[:5]],
            "nonfinite_logprobs": sum(1 for r in results if r.get("finite") is False),
            "errors": [r["detail"] for r in results if r["outcome"] == "error"][:20],
            "refusals": [r["detail"] for r in results if r["outcome"] == "refused"][:20]}


def pool_state(base: str, settle_s: float = 20.0) -> dict:
    """The KV pool once nothing runs: ``/flush_cache`` (the radix cache's pages back to the free list), then
    SGLang's ``/v1/loads`` polled until it reports no running or waiting request and no token in use, or
    ``settle_s`` seconds pass.

    Returns:
        dict: ``max_total_num_tokens``, ``num_used_tokens``, ``free_tokens`` (their difference),
        ``num_running_reqs``, ``num_waiting_reqs``, ``flushed`` (``/flush_cache`` answered 200); ``{"error": ...}``
        when ``/v1/loads`` does not answer with a load.
    """
    flushed = _post(base + "/flush_cache", {}, 60.0)[0] == 200
    deadline = time.time() + settle_s
    while True:
        status, raw = _get(base + "/v1/loads")
        try:
            load = (json.loads(raw).get("loads") or [None])[0] if status == 200 else None
        except ValueError:
            load = None
        if not isinstance(load, dict):
            out = {"error": f"/v1/loads: HTTP {status}: {raw[:200]!r}"}
        else:
            out = {k: int(load.get(k) or 0) for k in ("max_total_num_tokens", "num_used_tokens", "num_running_reqs",
                                                      "num_waiting_reqs")}
            out["free_tokens"] = out["max_total_num_tokens"] - out["num_used_tokens"]
        out["flushed"] = flushed
        idle = "error" not in out and out["num_used_tokens"] == 0 and out["num_running_reqs"] == 0 \
            and out["num_waiting_reqs"] == 0
        if idle or time.time() > deadline:
            return out
        time.sleep(1.0)


def trace_summary(trace_dir: str, draft_tokens: int) -> dict:
    """The sampled top-k rows of a soak (the trace plugin's records under ``trace_dir``) through
    ``scripts/sglang_one_batch.py``'s ``check_trace`` (each row's count, range and duplicates) and ``oracle_check``
    (the oracle layer's rows against the fp64 oracle on the pages the server held).

    Returns:
        dict: ``records``, ``valid`` (per mode: calls, rows, stale, count / duplicate / out_of_range /
        missing_rows failures) and ``oracle`` (per mode: calls, rows, failed, stale, worst_margin).

    Raises:
        FileNotFoundError: ``trace_dir`` holds no record.
    """
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    for d in (here, os.path.join(here, "topk_trace")):
        if d not in sys.path:
            sys.path.insert(0, d)
    import sglang_one_batch as tool
    from fp4_indexer_topk_trace import read_trace

    records = read_trace(trace_dir)
    valid = tool.check_trace(records, draft_tokens)["modes"]
    return {"records": len(records), "valid": valid, "oracle": tool.oracle_check(records, draft_tokens)}


def log_counts(text: str) -> dict:
    """What a server's log says about the run: tracebacks, SGLang's pool-leak reports (its invariant checker's
    ``memory leak detected``), retractions (SGLang 0.5.23's scheduler logs each as ``KV cache pool is full.
    Retract requests. #retracted_reqs: N, ...``, or ``Testing retraction. #retracted_reqs: N`` under its own
    ``SGLANG_TEST_RETRACT``: ``retractions`` such lines, ``retracted_requests`` the sum of their N), and HiCache's
    eviction to and loads from host memory (lines naming hicache with evict or load; the start-up
    ``server_args=`` line, which names every option, is not one)."""
    low = text.lower()
    lines = [ln for ln in text.splitlines() if "server_args=" not in ln]
    retract = [int(m.group(1)) for m in (re.search(r"#retracted_reqs: (\d+)", ln) for ln in lines) if m]
    return {"tracebacks": text.count("Traceback"), "leaks": low.count("memory leak detected"),
            "retractions": len(retract), "retracted_requests": sum(retract),
            "hicache_lines": sum(1 for ln in lines if "hicache" in ln.lower()
                                 and ("evict" in ln.lower() or "load" in ln.lower()))}


def hicache_on(info: dict) -> bool:
    """Whether a server's ``/get_server_info`` answer says it runs SGLang's hierarchical cache: an
    ``enable_hierarchical_cache`` field set at any depth (SGLang 0.5.23 nests its server arguments by group), or
    ``--enable-hierarchical-cache`` in its ``launch_command``."""
    def walk(x) -> bool:
        if isinstance(x, dict):
            return bool(x.get("enable_hierarchical_cache")) or any(walk(v) for v in x.values())
        return isinstance(x, list) and any(walk(v) for v in x)
    return walk(info) or "--enable-hierarchical-cache" in str(info.get("launch_command") or "")


def checks(run: dict, log_text: str | None = None, trace: dict | None = None, with_oracle: bool = True,
           expect_hicache: bool = False) -> list[dict]:
    """The soak's checks (module docstring) on ``load``'s JSON (and the server log's text, and ``trace_summary``'s
    result, when given): rows of ``check``, ``ok``, ``detail``. A run without a pool reading (``pool_before`` /
    ``pool_after``) fails the pool row, and one that stopped before its readings after the load (no
    ``probes_after`` or ``healthy_after``: a load cut by a time limit) fails the probe and health rows: nothing
    passes unread. ``with_oracle=False`` leaves out the fp64 oracle's row (a server whose logits keep SGLang's
    dummy-weight scale, at which its top-k kernels differ from the exact top-k on long rows); ``expect_hicache``
    adds the HiCache row even where the server's info does not say HiCache is on (the caller started it so)."""
    c = run["load"]["counts"]
    probes_before, probes_after = run.get("probes_before") or [], run.get("probes_after")
    rows = [
        {"check": "the load ran: requests sent and completed", "ok": c.get("completed", 0) > 0,
         "detail": f"{c.get('completed', 0)} completed of {sum(c.values())} planned"},
        {"check": "no request failed with a server error", "ok": c.get("error", 0) == 0,
         "detail": f"{c} in {run['load']['seconds']:.0f} s; first errors: {run['load']['errors'][:3]}"},
        {"check": "no request of the load refused (HTTP 4xx)", "ok": c.get("refused", 0) == 0,
         "detail": f"{c.get('refused', 0)} refused; first: {run['load'].get('refusals', [])[:2]}"},
        {"check": "clients disconnected and requests aborted during the load", "ok": c.get("disconnected", 0) > 0
         and c.get("aborted", 0) > 0,
         "detail": f"{c.get('disconnected', 0)} disconnected, {c.get('aborted', 0)} aborted through /abort_request "
                   "(an abort that reaches a finished request aborts nothing)"},
        {"check": "no request aborted by the server that its client did not abort",
         "ok": run["load"].get("unasked_aborts") == 0,  # a run that did not count them fails
         "detail": f"{run['load'].get('unasked_aborts', 'not counted')} aborted unasked"
                   + (f"; e.g. {run['load']['unasked_abort_examples'][:2]}"
                      if run["load"].get("unasked_abort_examples") else "")},
        {"check": "every completed request got the tokens it asked for (fewer only at end of sequence)",
         "ok": run["load"].get("short_outputs") == 0,
         "detail": f"{run['load'].get('short_outputs', 'not counted')} completed with fewer or more"
                   + (f"; e.g. {run['load']['short_examples'][:2]}" if run["load"].get("short_examples") else "")},
        {"check": "every log-probability finite", "ok": run["load"]["nonfinite_logprobs"] == 0,
         "detail": f"{run['load']['nonfinite_logprobs']} requests with a NaN or infinite one"},
        {"check": "probes give the same tokens before and after the load",
         "ok": bool(probes_before) and probes_before == probes_after and all(probes_before),
         "detail": f"{len(probes_before)} probes of {list(PROBE_LENS)} tokens"
                   + ("" if probes_after is not None else "; not read after the load (the run stopped before)")},
        {"check": "healthy after the load", "ok": run.get("healthy_after") is True,
         "detail": "" if "healthy_after" in run else "not read (the run stopped before)"},
        {"check": "a sampled request before the load answered", "ok": run.get("warm_up") == 200,
         "detail": f"HTTP {run.get('warm_up', 'not sent')}"},
    ]
    if run.get("bad_inputs") is None:  # the server stopped before them (soak_run's errors_after says how)
        rows.append({"check": "bad inputs: each answered, server healthy", "ok": False,
                     "detail": f"not sent: {(run.get('errors_after') or {}).get('bad_inputs', 'no reading')}"})
    for b in run.get("bad_inputs") or []:
        ok = b["healthy"] and 0 < b["status"] < 500 and b.get("finite", True)
        rows.append({"check": f"bad input, {b['input']}: an answer, server healthy", "ok": ok,
                     "detail": f"HTTP {b['status']}: {b['answer'][:80]}"})
    before, after = run.get("pool_before") or {}, run.get("pool_after") or {}
    read = "error" not in before and "error" not in after and before.get("max_total_num_tokens", 0) > 0
    rows.append({"check": "KV pool: as many free tokens after the load as before, none in use",
                 "ok": read and after.get("free_tokens") == before.get("free_tokens")
                 and after.get("num_used_tokens") == 0 and after.get("max_total_num_tokens")
                 == before.get("max_total_num_tokens"),
                 "detail": f"before {before}, after {after}" if read else f"not read: before {before}, after {after}"})
    if trace is not None:
        valid, oracle = trace.get("valid") or {}, trace.get("oracle") or {}
        rows_seen = sum(m["rows"] for m in valid.values())
        bad = {mode: {k: m[k] for k in ("count", "duplicate", "out_of_range", "missing_rows") if m.get(k)}
               for mode, m in valid.items()}
        bad = {mode: v for mode, v in bad.items() if v}
        rows.append({"check": "sampled top-k rows valid (count, range, no duplicates)", "ok": rows_seen > 0 and not bad,
                     "detail": (f"{trace['error']}; " if trace.get("error") else "")
                     + f"{trace.get('records', 0)} batches sampled, " + ", ".join(
                         f"{mode}: {m['rows']} rows in {m['calls']} calls ({m['stale']} stale)"
                         for mode, m in valid.items()) + (f"; failures {bad}" if bad else ""),
                     "examples": {mode: m.get("examples", []) for mode, m in valid.items() if m.get("examples")}})
        o_rows = sum(m["rows"] for m in oracle.values())
        o_failed = sum(m["failed"] for m in oracle.values())
        worst = min((m["worst_margin"] for m in oracle.values() if m["rows"]), default=float("nan"))
        scale = max((m.get("ref_max") or 0.0 for m in oracle.values()), default=0.0)  # the logits' scale
        if with_oracle:
            rows.append({"check": "sampled rows = fp64 oracle top-k on the server's pages (within the bound)",
                         "ok": o_rows > 0 and o_failed == 0,
                         "detail": ", ".join(f"{mode}: {m['rows']} rows, {m['failed']} failed"
                                             for mode, m in oracle.items())
                         + f"; worst margin {worst:.4g}; largest |logit| {scale:.3g}",
                         "examples": {mode: m.get("examples", []) for mode, m in oracle.items() if m.get("examples")}})
    if expect_hicache or hicache_on(run.get("info_before") or {}):
        # A prefix served from host memory was evicted from the device pool first: eviction and reload both ran.
        cache = run["load"].get("cache") or {}
        rows.append({"check": "HiCache exercised: prefix tokens evicted to host memory and loaded back",
                     "ok": cache.get("from_host", 0) > 0,
                     "detail": f"{cache.get('from_host', 'not counted')} tokens loaded back for "
                               f"{cache.get('requests_from_host', 'not counted')} requests"})
    if log_text is not None:
        lc = log_counts(log_text)
        rows.append({"check": "server log: no traceback, no pool leak SGLang reports", "ok": lc["tracebacks"] == 0
                     and lc["leaks"] == 0, "detail": str(lc)})
        rows.append({"check": "retraction exercised: SGLang retracted decode requests", "ok": lc["retracted_requests"] > 0,
                     "detail": f"{lc['retracted_requests']} requests in {lc['retractions']} retractions"})
    return rows


def soak_run(base: str, load_args: dict, context_len: int, probe_output_len: int = 32, settle_s: float = 20.0,
             on_step=None) -> dict:
    """The whole soak against ``base``, in order: server info, one sampled warm-up request (SGLang compiles its
    speculative sampling kernel at the first sampled request: before the load, not inside it), probes, the pool
    (``pool_state``), ``load(**load_args)``, ``/health``, the probes again, the pool again and the server info, then
    the bad inputs, so that a bad input that stops the server leaves every other reading taken, and the pool once
    more. ``on_step(run)``, when given, is called after the load and after each later reading (to write what has
    been read so far, so that a soak stopped from outside keeps its load).

    Returns:
        dict: ``url``, ``info_before``, ``warm_up`` (the sampled request's HTTP status), ``probes_before``,
        ``pool_before``, ``load``, ``healthy_after``, ``probes_after``, ``pool_after``, ``info_after``, ``bad_inputs``,
        ``pool_after_bad_inputs`` as ``checks`` reads them; a reading after the load that failed is ``None`` and its
        error is in ``errors_after``.

    Raises:
        ValueError: from ``load`` (its arguments), before any request of the load is sent.
        RuntimeError: a probe before the load not answered with HTTP 200 (``probes``): the server was not serving.
    """
    run = {"url": base, "info_before": json.loads(_get(base + "/get_server_info")[1] or b"{}")}
    run["warm_up"] = _post(base + "/generate", {"input_ids": list(range(TOKEN_IDS[0], TOKEN_IDS[0] + 300)),
                                                 "sampling_params": {"max_new_tokens": 8, "temperature": 0.8}}, 600.0)[0]
    run["probes_before"] = probes(base, output_len=probe_output_len)
    run["pool_before"] = pool_state(base, settle_s=settle_s)
    run["load"] = load(base, **load_args)
    step = on_step or (lambda _run: None)
    step(run)
    # From here on the server may have stopped (what a soak exists to find): every reading is taken, what fails
    # is kept as an error, and the run is returned so that its load and the failed readings reach the checks.
    run["errors_after"] = {}
    run["healthy_after"] = _get(base + "/health")[0] == 200
    for key, read in (("probes_after", lambda: probes(base, output_len=probe_output_len)),
                      ("pool_after", lambda: pool_state(base, settle_s=settle_s)),
                      ("info_after", lambda: json.loads(_get(base + "/get_server_info")[1] or b"{}")),
                      ("bad_inputs", lambda: bad_inputs(base, context_len)),
                      # After the bad inputs too: a leak one of them caused shows here (reported, not a check).
                      ("pool_after_bad_inputs", lambda: pool_state(base, settle_s=settle_s))):
        try:
            run[key] = read()
        except (RuntimeError, ValueError, OSError) as e:
            run[key] = None
            run["errors_after"][key] = f"{type(e).__name__}: {e}"
        step(run)
    return run


def preflight(base: str, out: str, max_len: int, time_limit: float, load_args: dict | None = None) -> dict:
    """What ``load`` checks before it sends anything: ``out`` is a file in a folder that exists, ``load_args``
    (``load``'s keyword arguments) are valid (``load_args_problem``), ``time_limit`` is positive, the server
    answers ``/health`` with 200, and ``max_len`` fits its longest prompt (``max_req_input_len`` in
    ``/get_server_info``, where it says). Returns the server info (``{}`` where it gave none).

    Raises:
        ValueError: naming the option (``--out``, ``--time-limit``, ``--url``, ``--max-len``, ...) and what was
        expected.
    """
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise ValueError(f"--out: the folder {folder} does not exist")
    if os.path.isdir(out):
        raise ValueError(f"--out: {out} is a folder; give the JSON file to write, e.g. {os.path.join(out, 'soak.json')}")
    problem = load_args_problem(**(load_args or {}))
    if problem:
        raise ValueError(problem)
    if not time_limit > 0:
        raise ValueError(f"--time-limit: expected seconds > 0, got {time_limit}")
    status = _get(base + "/health", timeout=30.0)[0]
    if status == 0:
        raise ValueError(f"--url: no answer from {base} (is the server running and reachable from here?)")
    if status != 200:
        raise ValueError(f"--url: {base}/health answered HTTP {status}, not 200: SGLang answers 503 until its "
                         f"warm-up request has finished; wait until it answers 200")
    info = json.loads(_get(base + "/get_server_info")[1] or b"{}")
    limit = info.get("max_req_input_len") if isinstance(info, dict) else None
    if isinstance(limit, int) and max_len > limit:
        raise ValueError(f"--max-len: {max_len} tokens, but the server takes prompts of at most {limit} "
                         f"(max_req_input_len); lower --max-len")
    return info if isinstance(info, dict) else {}


def _load_cmd(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="soak.py load", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                description="The load against a running SGLang server, then the readings the checks "
                                            "need (probes, KV pool, bad inputs); writes them to --out.")
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000 (only it is sent to)")
    p.add_argument("--out", required=True, help="the JSON file the run is written to (its folder must exist)")
    p.add_argument("--requests", type=int, default=3000, help="requests planned (those after --time-limit are not sent)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight at once")
    p.add_argument("--min-len", type=int, default=100, help="shortest prompt, in tokens")
    p.add_argument("--max-len", type=int, default=60000,
                   help="longest prompt, in tokens (lengths log-uniform in between); at most the server's longest")
    p.add_argument("--output-len", type=int, default=256, help="most new tokens a request asks for (uniform from 1)")
    p.add_argument("--shared-frac", type=float, default=1 / 3, help="fraction behind one of a few shared prefixes")
    p.add_argument("--disconnect-frac", type=float, default=0.1,
                   help="fraction whose client disconnects after 0 to 8 streamed chunks")
    p.add_argument("--abort-frac", type=float, default=0.05, help="fraction aborted through /abort_request")
    p.add_argument("--logprob-frac", type=float, default=0.05, help="fraction asking for the top-5 log-probabilities")
    p.add_argument("--sampled-frac", type=float, default=0.2,
                   help="fraction sampled at temperature 0.8 (the rest greedy)")
    p.add_argument("--long-frac", type=float, default=0.05,
                   help="fraction asking for --long-output-len new tokens, so that decode outgrows the pool")
    p.add_argument("--long-output-len", type=int, default=2048, help="new tokens a long-output request asks for")
    p.add_argument("--abort-within", type=float, default=5.0, help="seconds after its start an abort goes out, at most")
    p.add_argument("--context-len", type=int, default=None,
                   help="the server's context length, for the bad input longer than it; None: the server's "
                        "max_req_input_len, else 163840")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and of every client's choices")
    p.add_argument("--time-limit", type=float, default=1800.0, help="seconds after which no request is sent")
    o = p.parse_args(argv)
    base = o.url.rstrip("/")
    load_args = dict(
        requests=o.requests, concurrency=o.concurrency, min_len=o.min_len, max_len=o.max_len,
        output_len=o.output_len, shared_frac=o.shared_frac, disconnect_frac=o.disconnect_frac,
        abort_frac=o.abort_frac, logprob_frac=o.logprob_frac, seed=o.seed, time_limit=o.time_limit,
        abort_within_s=o.abort_within, sampled_frac=o.sampled_frac, long_frac=o.long_frac,
        long_output_len=o.long_output_len)
    try:
        info = preflight(base, o.out, o.max_len, o.time_limit, {k: v for k, v in load_args.items()
                                                                 if k not in ("seed", "time_limit", "abort_within_s")})
    except ValueError as e:
        p.error(str(e))
    context_len = o.context_len or info.get("max_req_input_len") or 163840

    def write(run: dict) -> None:
        with open(o.out, "w") as f:
            json.dump(run, f, indent=1, default=str)

    try:
        run = soak_run(base, load_args, context_len, on_step=write)
    except RuntimeError as e:  # a probe before the load not answered: the server was not serving
        print(f"soak.py load: {e}; nothing of the load was sent", file=sys.stderr)
        return 1
    write(run)
    print(json.dumps(run["load"]["counts"]))
    return 0


def read_log(path: str) -> str:
    """A server log's text, gzip-compressed (``.gz``) or not; undecodable bytes replaced."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", errors="replace") as f:
        return f.read()


def _check_cmd(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="soak.py check", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                description="The checks of one run that `load` wrote, as a table; exit 1 when one "
                                            "fails, 2 for a missing file or folder.")
    p.add_argument("run", help="what `load` wrote")
    p.add_argument("--log", help="the server's log (no traceback or leak, retractions); without it those are not checked")
    p.add_argument("--trace", help="the top-k trace plugin's folder for this run (sampled rows, oracle layer); "
                                   "without it the top-k rows are not checked")
    p.add_argument("--draft-tokens", type=int, default=4,
                   help="with --trace: the server's --speculative-num-draft-tokens")
    p.add_argument("--no-oracle", action="store_true",
                   help="with --trace: leave out the fp64 oracle's row (a server whose index logits keep SGLang's "
                        "dummy-weight scale, at which its top-k kernels differ from the exact top-k on long rows); "
                        "the rows are still checked for validity")
    p.add_argument("--expect-hicache", action="store_true",
                   help="the server was started with HiCache: its row is checked even where /get_server_info does not "
                        "say so")
    p.add_argument("--json", help="also write the rows here")
    o = p.parse_args(argv)
    for opt, path, want in (("run", o.run, os.path.isfile), ("--log", o.log, os.path.isfile),
                            ("--trace", o.trace, os.path.isdir)):
        if path and not want(path):
            p.error(f"{opt}: no {'folder' if want is os.path.isdir else 'file'} {path}")
    try:
        run = json.load(open(o.run))
    except json.JSONDecodeError as e:
        p.error(f"run: {o.run} is not the JSON `load` writes ({e})")
    if not isinstance(run, dict) or not isinstance(run.get("load"), dict) or "counts" not in run["load"]:
        p.error(f"run: {o.run} is not the JSON `load` writes (no load counts in it)")
    if o.json and not os.path.isdir(os.path.dirname(os.path.abspath(o.json))):
        p.error(f"--json: the folder {os.path.dirname(os.path.abspath(o.json))} does not exist")
    trace = None
    if o.trace:
        try:
            trace = trace_summary(o.trace, o.draft_tokens)
        except FileNotFoundError as e:  # a folder without a record: the top-k rows fail, with why
            trace = {"records": 0, "valid": {}, "oracle": {}, "error": str(e)}
    rows = checks(run, read_log(o.log) if o.log else None, trace, with_oracle=not o.no_oracle,
                  expect_hicache=o.expect_hicache)
    if o.json:
        with open(o.json, "w") as f:
            json.dump(rows, f, indent=1)
    for r in rows:
        print(f"{r['check']:<66} {'PASS' if r['ok'] else 'FAIL'} {r['detail']}")
    not_run = [what for what, given in (("the server log's (--log)", o.log), ("the top-k rows' (--trace)", o.trace),
                                        ("the fp64 oracle's (--no-oracle)", not (o.trace and o.no_oracle)))
               if not given]
    print(f"{sum(r['ok'] for r in rows)} of {len(rows)} checks passed"
          + (f"; not checked: {' and '.join(not_run)}" if not_run else ""))
    return 0 if all(r["ok"] for r in rows) else 1


def summary_rows(runs: dict[str, dict], logs: dict[str, str], checks_by_arm: dict[str, list[dict]]) -> list[tuple]:
    """The soak's table for the docs, one column per arm (e.g. ``{"FP8": run, "FP4": run}``): what the load did,
    what the server logged, the pool before and after, and how many checks passed. Rows of ``(label, value per
    arm...)``; every value is read from the run's JSON, the server log's text (``log_counts``) or the checks."""
    arms = list(runs)

    def col(fn):
        return tuple(fn(a) for a in arms)

    def count(a, key):
        return runs[a]["load"]["counts"].get(key, 0)

    def pool(a, when):
        p = runs[a].get(f"pool_{when}") or {}
        return "not read" if "error" in p or not p else f"{p['free_tokens']:,} free of {p['max_total_num_tokens']:,}"

    def passed(a):
        rows = checks_by_arm[a]
        return f"{sum(r['ok'] for r in rows)} of {len(rows)}"

    lc = {a: log_counts(logs[a]) for a in arms}
    rows = [
        ("requests sent", col(lambda a: sum(v for k, v in runs[a]["load"]["counts"].items() if k != "not sent (time limit)"))),
        ("completed", col(lambda a: count(a, "completed"))),
        ("disconnected by the client (prefill or decode)", col(lambda a: count(a, "disconnected"))),
        ("aborted through /abort_request", col(lambda a: count(a, "aborted"))),
        ("server errors", col(lambda a: count(a, "error"))),
        ("seconds of load", col(lambda a: f"{runs[a]['load']['seconds']:.0f}")),
        ("decode requests SGLang retracted (times it retracted)",
         col(lambda a: f"{lc[a]['retracted_requests']} ({lc[a]['retractions']})")),
        ("tracebacks / pool leaks SGLang reported", col(lambda a: f"{lc[a]['tracebacks']} / {lc[a]['leaks']}")),
        ("KV pool before the load (after /flush_cache)", col(lambda a: pool(a, "before"))),
        ("KV pool after the load (after /flush_cache)", col(lambda a: pool(a, "after"))),
        ("probes identical before and after", col(lambda a: "yes" if runs[a]["probes_before"] == runs[a]["probes_after"] else "no")),
        ("checks passed", col(passed)),
        ("checks failed", col(lambda a: "; ".join(r["check"] for r in checks_by_arm[a] if not r["ok"]) or "none")),
    ]
    if any("cache" in runs[a]["load"] for a in arms):  # runs since the load read SGLang's cache breakdown
        def cache(a):
            c = runs[a]["load"].get("cache")
            return "not counted" if c is None else (f"{c['prefix_tokens']:,} / {c['from_host']:,} "
                                                    f"({c['requests_from_host']})")
        rows.insert(6, ("prefix tokens from the cache / of them loaded back from host memory (requests)", col(cache)))
        rows.insert(8, ("finished requests SGLang had retracted",
                        col(lambda a: (runs[a]["load"].get("cache") or {}).get("requests_retracted", "not counted"))))
    if any("refusals" in runs[a]["load"] for a in arms):  # runs since the load counted HTTP 4xx apart
        rows.insert([r[0] for r in rows].index("server errors") + 1,
                    ("requests refused (HTTP 4xx)", col(lambda a: count(a, "refused")
                                                        if "refusals" in runs[a]["load"] else "not counted")))
    if any("kinds" in runs[a]["load"] for a in arms):  # runs since the load counted them
        rows.insert(1, ("of them sampled / long outputs / with log-probabilities / behind a shared prefix",
                        col(lambda a: " / ".join(str((runs[a]["load"].get("kinds") or {}).get(x, "not counted"))
                                                 for x in ("sampled", "long", "logprob", "shared_prefix")))))
    return rows


def _table_cmd(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="soak.py table",
                                description="Runs side by side as a Markdown table (one column each): what `load` "
                                            "wrote, what `check --json` wrote, and the server's log (.gz or not).")
    p.add_argument("arms", nargs="+", metavar="LABEL=RUN.json,CHECKS.json,SERVER.log",
                   help="one per column, e.g. FP8=soak_fp8.json,soak_checks_fp8.json,soak_server_fp8.log")
    o = p.parse_args(argv)
    runs, logs, checks_by_arm = {}, {}, {}
    for spec in o.arms:
        label, _, files = spec.partition("=")
        try:
            run, chk, log = files.split(",")
        except ValueError:
            p.error(f"arms: expected LABEL=RUN.json,CHECKS.json,SERVER.log, got {spec!r}")
        for what, path in (("RUN.json", run), ("CHECKS.json", chk), ("SERVER.log", log)):
            if not os.path.isfile(path):
                p.error(f"arms: {label}'s {what}: no file {path}")
        try:
            runs[label], checks_by_arm[label] = json.load(open(run)), json.load(open(chk))
        except json.JSONDecodeError as e:
            p.error(f"arms: {label}: {e}")
        if not (isinstance(runs[label], dict) and "load" in runs[label] and isinstance(checks_by_arm[label], list)):
            p.error(f"arms: {label}: expected `load`'s JSON, then `check --json`'s, then the log, in that order")
        logs[label] = read_log(log)
    print("| | " + " | ".join(runs) + " |")
    print("| --- |" + " --- |" * len(runs))
    for label, vals in summary_rows(runs, logs, checks_by_arm):
        print(f"| {label} | " + " | ".join(str(v) for v in vals) + " |")
    return 0


def main() -> int:
    cmds = {"load": _load_cmd, "check": _check_cmd, "table": _table_cmd}
    if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        print(__doc__)
        print("usage: soak.py {load,check,table} ... (each with --help)", file=sys.stderr)
        return 2
    return cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())

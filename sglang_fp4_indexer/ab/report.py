"""The A/B's report: FP8 and FP4 arms side by side, a verdict in the deployer's units, JSON and a plot.

Built from the arms' recorded results only (``result.json`` of each arm: the server's KV pool lines, SGLang's
serving benchmark lines, the GSM8K and passkey outcomes), so a report can be rebuilt, or checked, without a GPU.
"""

from __future__ import annotations

from ..serving import SERVING_FIELDS, serving_table
from .stats import binomial_se, paired_difference

__all__ = ["AB_FIELDS", "ARMS", "build_report", "report_text", "plot_report"]

#: The two arms: FP8 (SGLang's own index cache, the plugin not asked) and FP4 (``--enable-fp4-indexer``).
ARMS = ("fp8", "fp4")
#: bench_serving fields the A/B pairs: the serving table's, the tail percentiles and the client's peak requests in flight.
AB_FIELDS = SERVING_FIELDS + (("p99_tpot_ms", "p99 TPOT ms", "{:.2f}"), ("p99_ttft_ms", "p99 TTFT ms", "{:.0f}"),
                              ("max_concurrent_requests", "peak requests in flight at the client", "{:.0f}"))


def _accuracy(outcomes: list[int]) -> dict:
    n, k = len(outcomes), sum(outcomes)
    return {"correct": k, "n": n, "accuracy": k / n, "se": binomial_se(k, n)}


def _quality(first: dict, what: str) -> dict | None:
    """Per-arm accuracy and the paired FP4 - FP8 of one check (``gsm8k`` or ``passkey``) in one order's arms;
    None where an arm did not run it. ValueError naming the check when the arms answered different items."""
    got = {arm: first[arm].get(what) for arm in ARMS if arm in first}
    if len(got) < 2 or any(not v for v in got.values()):
        return None
    outs = {arm: (v["outcomes"] if what == "gsm8k" else [r["correct"] for r in v]) for arm, v in got.items()}
    if len(outs["fp8"]) != len(outs["fp4"]) or not outs["fp8"]:
        raise ValueError(f"{what}: the FP8 arm answered {len(outs['fp8'])} items and the FP4 arm "
                         f"{len(outs['fp4'])}; the same items expected in both")
    out = {arm: _accuracy(o) for arm, o in outs.items()}
    out["fp4_minus_fp8"] = paired_difference(outs["fp8"], outs["fp4"])
    if what == "passkey":  # per length: the deployer's lengths, each on its own
        by_len = {}
        for arm in ARMS:
            for r in got[arm]:
                by_len.setdefault(r["length"], {}).setdefault(arm, []).append(r["correct"])
        out["by_length"] = {str(length): {arm: _accuracy(v) for arm, v in per.items()}
                            for length, per in sorted(by_len.items())}
    return out


def build_report(arms: dict[str, dict[str, dict]], *, meta: dict) -> dict:
    """The report of a finished (or partly finished) A/B.

    Args:
        arms: ``{order: {"fp8": result, "fp4": result}}``, ``order`` ``fp8-first`` or ``fp4-first`` in the order
            run; a result as the command records it (``kv``: ``serving.kv_pool_tokens``'s dict, ``server_info``,
            ``bench``: bench_serving result lines, ``gsm8k``: ``{"outcomes": [...]}`` or None, ``passkey``: list
            of ``{"length", "correct", ...}`` or None, ``commands``).
        meta: what the command knows beyond the arms: ``dummy_weights`` (bool), ``environment``, ``check``
            (the plugin's decision text), ``plan`` (the options), ``mode`` (``launch`` or ``urls``).

    Returns:
        dict: ``meta``, ``capacity`` (per order and arm the KV pool tokens and FP4's gain), ``speed`` (per order
        the paired bench rows of ``AB_FIELDS``), ``quality`` (``gsm8k`` and ``passkey``: per arm accuracy and
        binomial SE, the paired FP4 - FP8, from the first order that has both arms; ``note`` when weights are
        dummy), ``arms_kv`` (per order and arm the KV pool lines read from its server log), ``problems`` (why no
        verdict can be drawn: an FP4 server that did not use FP4, an arm that lost requests), ``verdict`` (lines
        of text) and ``missing`` (arms not finished).
    """
    capacity, speed, missing = {}, {}, []
    for order, per in arms.items():
        missing += [f"{order}/{arm}" for arm in ARMS if arm not in per]
        cap = {}
        for arm, res in per.items():
            kv = res.get("kv") or {}
            tokens = kv.get("max_total_num_tokens") or kv.get("kv_cache_tokens")
            if tokens is None:
                tokens = (res.get("server_info") or {}).get("max_total_num_tokens")
            cap[arm] = tokens
        if cap.get("fp8") and cap.get("fp4"):
            cap["fp4_gain"] = cap["fp4"] / cap["fp8"] - 1.0
        capacity[order] = cap
        if "fp8" in per and "fp4" in per:
            speed[order] = serving_table(per["fp8"].get("bench", []), per["fp4"].get("bench", []), AB_FIELDS)
    first = next((per for per in arms.values() if all(a in per for a in ARMS)), {})
    quality = {"gsm8k": _quality(first, "gsm8k") if first else None,
               "passkey": _quality(first, "passkey") if first else None}
    if meta.get("dummy_weights"):
        quality["note"] = ("the servers load dummy weights (--load-format dummy): the quality numbers are "
                           "meaningless; only speed and capacity count")
    report = {"meta": meta, "capacity": capacity, "speed": speed, "quality": quality, "missing": missing,
              "arms_kv": {order: {arm: res.get("kv") or {} for arm, res in per.items()} for order, per in arms.items()}}
    report["problems"] = _problems(report)
    report["verdict"] = _verdict(report)
    return report


def _pp(x: float) -> str:
    return f"{x * 100:+.1f}"


#: A load where FP4's output tokens/s fell below this fraction of FP8's counts as slower (the order effect of a pair
#: of servers on one machine was up to about 2 % in this repository's own runs; one pair resolves no less).
SLOWER_BELOW = 0.98


def _expected_loads(plan: dict) -> dict[tuple[int, int, int], int | None]:
    """The loads the plan sends to each server, ``(input_len, output_len, concurrency)`` -> requests sent: one per
    input length at ``concurrency`` (``prompts`` each), then the KV-limited load at the longest (twice its
    concurrency) where it runs."""
    loads = {(il, plan["output_len"], plan["concurrency"]): plan.get("prompts") for il in plan.get("input_lens") or []}
    kvc = plan.get("kv_limited_concurrency")
    if kvc and plan.get("input_lens"):
        loads[(max(plan["input_lens"]), plan["output_len"], kvc)] = 2 * kvc
    return loads


def _problems(r: dict) -> list[str]:
    """Why no verdict can be drawn: an FP4 server whose log has no "FP4 indexer active" line (the plugin fell back
    to FP8: its warning in that log says why), an FP8 server whose log has one (FP4 switched on for it, e.g. by
    ``SGLANG_ENABLE_FP4_INDEXER`` in the environment), servers given by URL (their logs unread) whose KV pools are
    the same size (nothing shows FP4 in use), a load of the plan without a result from both servers or without its
    completed count, or a load where a server completed fewer requests than were sent."""
    out = []
    for order, per in r.get("arms_kv", {}).items():
        kv4, kv8 = per.get("fp4") or {}, per.get("fp8") or {}
        if "fp4_indexer_active" in kv4 and kv4["fp4_indexer_active"] is None:
            out.append(f"the FP4 server of {order} did not use FP4 (its log has no \"FP4 indexer active\" line; "
                       "its warning says why)")
        if kv8.get("fp4_indexer_active"):
            out.append(f"the FP8 server of {order} used FP4 (its log has an \"FP4 indexer active\" line: is "
                       "SGLANG_ENABLE_FP4_INDEXER set where the servers run?)")
        gain = r["capacity"].get(order, {}).get("fp4_gain")
        if kv4 and "fp4_indexer_active" not in kv4 and gain is not None and gain <= 0:
            out.append(f"the FP4 server of {order} holds no more KV tokens than the FP8 server, and its log is not "
                       "read for servers given by URL: nothing shows that it uses FP4 (look for \"FP4 indexer "
                       "active\" in its log)")
    plan = r["meta"].get("plan") or {}
    for order, rows in r["speed"].items():
        by_load = {(row["input_len"], row["output_len"], row["concurrency"]): row for row in rows}
        expected = (_expected_loads(plan) if plan.get("output_len") is not None
                    else dict.fromkeys(by_load, plan.get("prompts")))
        for load, sent in expected.items():
            row = by_load.get(load)
            what = f"{load[0]} in / {load[1]} out, {load[2]} at a time"
            if row is None:
                out.append(f"no result from both servers of {order} for the load at {what}")
                continue
            done = row.get("completed") or {}
            for arm in ARMS:
                if done.get(arm) is None:
                    out.append(f"the {arm.upper()} server's result of {order} at {what} has no completed count")
                elif sent and done[arm] < sent:
                    out.append(f"the {arm.upper()} server of {order} completed {done[arm]:.0f} of {sent} requests at "
                               f"{what}")
    return out


def _summary(r: dict) -> str | None:
    """The one-line verdict in the deployer's units, first of ``_verdict``'s lines: FP4's KV pool gain, its output
    tokens/s against FP8's over every load and order, and the quality checks. "no verdict" (and why) where
    ``_problems`` finds any; "keep FP8" where a load was slower (below ``SLOWER_BELOW``) or a quality check resolved
    FP4 worse (beyond 2 standard errors); "turn FP4 on" where FP4 holds more KV tokens, or every load in both server
    orders was faster (above ``1 / SLOWER_BELOW``; in one order the first server on a fresh machine may still pay
    JIT compiles the benchmark's warm-up did not reach, so one order's speed gain does not count; two servers
    given by URL run already, and their one measurement counts), and neither happened (with dummy weights: only
    after a run with the real ones). None before any pair of arms finished."""
    gains = [c["fp4_gain"] for c in r["capacity"].values() if "fp4_gain" in c]
    rows = [row for rows in r["speed"].values() for row in rows if row.get("output_ratio")]
    if not gains and not rows:
        return None
    parts, against = [], []
    faster = faster_once = False
    if gains:
        parts.append(f"{gains[0] * 100:+.1f} % KV tokens")
    if rows:
        lo, hi = min(x["output_ratio"] for x in rows), max(x["output_ratio"] for x in rows)
        orders = [o for o, rs in r["speed"].items() if any(x.get("output_ratio") for x in rs)]
        # Faster counts only over both server orders where the command launched the servers: in one order the
        # first server may still pay compiles. Two servers given by URL were started before the run: their one
        # measurement counts either way.
        counted = len(orders) > 1 or (r.get("meta") or {}).get("mode") == "urls"
        parts.append(f"output tok/s FP4 / FP8 {lo:.3f}" + (f" to {hi:.3f}" if hi - lo >= 0.0005 else "")
                     + f" over {len(rows)} load{'s' if len(rows) > 1 else ''}"
                     + (f" in one server order ({orders[0]}; a speed gain counts only over both orders)"
                        if not counted else ""))
        slow = [x for x in rows if x["output_ratio"] < SLOWER_BELOW]
        faster = lo > 1 / SLOWER_BELOW and counted
        faster_once = lo > 1 / SLOWER_BELOW and not counted
        if slow:
            x = min(slow, key=lambda x: x["output_ratio"])
            against.append(f"FP4 slower at {x['input_len']} in / {x['output_len']} out, {x['concurrency']} at a time")
    worse = [w for w in ("gsm8k", "passkey") if (q := r["quality"].get(w)) and q["fp4_minus_fp8"]["se"] is not None
             and q["fp4_minus_fp8"]["diff"] < -2 * q["fp4_minus_fp8"]["se"]]
    if r["quality"].get("note"):
        parts.append("quality not measured (dummy weights)")
    elif any(r["quality"].get(w) for w in ("gsm8k", "passkey")):
        parts.append("quality: " + ("FP4 worse on " + " and ".join(worse) if worse else "no difference resolved"))
        against += [f"FP4 worse on {w}" for w in worse]
    gained = bool(gains and gains[0] > 0)
    if r.get("problems"):
        advice = "no verdict (" + "; ".join(r["problems"]) + ")"
    elif against:
        advice = "keep FP8 (" + "; ".join(against) + ")"
    elif (gained or faster) and r["quality"].get("note"):
        pros = (["holds more KV tokens"] if gained else []) + ["was faster" if faster else "was not slower"]
        advice = "FP4 " + " and ".join(pros) + ", but turn it on only after a run with the real weights"
    elif gained or faster:
        advice = "turn FP4 on"
    elif faster_once:
        advice = "nothing counted yet: FP4 was faster in one server order only; run both orders"
    else:
        advice = "FP4 gains nothing measured here: keep FP8"
    return "verdict: " + advice + ": " + ", ".join(parts) + (" (not finished: see below)" if r["missing"] else "")


def _verdict(r: dict) -> list[str]:
    summary = _summary(r)
    lines = [summary] if summary else []
    for order, cap in r["capacity"].items():
        if "fp4_gain" in cap:
            kv = {arm: r.get("arms_kv", {}).get(order, {}).get(arm) or {} for arm in ARMS}
            peak = {arm: kv[arm].get("running_peak") for arm in ARMS}
            ranks = max(kv[arm].get("running_ranks") or 1 for arm in ARMS)
            where = f" on the busiest of {ranks} DP ranks" if ranks > 1 else ""
            lines.append(f"capacity ({order}): the KV pool holds {cap['fp4']} tokens with FP4, {cap['fp8']} with "
                         f"FP8 ({cap['fp4_gain'] * 100:+.1f} %)"
                         + (f"; at most {peak['fp4']} requests ran at once{where} with FP4, {peak['fp8']} with FP8 "
                            "(server logs)" if None not in peak.values() else ""))
    for order, rows in r["speed"].items():
        for row in rows:
            ratio = row["output_ratio"]
            tpot = row["median_tpot_ms"]
            shape = f"{row['input_len']} in / {row['output_len']} out, {row['concurrency']} at a time"
            if row["concurrency"] == r["meta"].get("plan", {}).get("kv_limited_concurrency"):
                shape += ", the KV-limited load"
            lines.append(f"speed ({order}, {shape}): output tok/s "
                         f"FP8 {row['output_throughput']['fp8']:.1f}, FP4 {row['output_throughput']['fp4']:.1f}"
                         + (f" (FP4 / FP8 {ratio:.3f})" if ratio else "")
                         + (f"; median TPOT FP8 {tpot['fp8']:.2f} ms, FP4 {tpot['fp4']:.2f} ms"
                            if tpot["fp8"] is not None and tpot["fp4"] is not None else ""))
    for what, label in (("gsm8k", "GSM8K few-shot"), ("passkey", "passkey retrieval")):
        q = r["quality"].get(what)
        if not q:
            continue
        d = q["fp4_minus_fp8"]
        se = d["se"]
        resolved = ("no difference resolved (within 2 standard errors)" if se is None or abs(d["diff"]) <= 2 * se
                    else "FP4 better" if d["diff"] > 0 else "FP4 worse")
        lines.append(f"{label} ({q['fp8']['n']} items): FP8 {q['fp8']['accuracy'] * 100:.1f} ± "
                     f"{q['fp8']['se'] * 100:.1f} %, FP4 {q['fp4']['accuracy'] * 100:.1f} ± {q['fp4']['se'] * 100:.1f} %; "
                     f"FP4 - FP8 {_pp(d['diff'])}" + (f" ± {se * 100:.1f}" if se is not None else "")
                     + f" points, paired: {resolved}"
                     + (" (dummy weights: meaningless)" if r["quality"].get("note") else ""))
    if r["quality"].get("note"):
        lines.append("quality: " + r["quality"]["note"])
    if r["missing"]:
        lines.append("not finished: " + ", ".join(r["missing"]) + " (rerun the same command to finish them)")
    return lines


def report_text(r: dict) -> str:
    """The report as text: the environment, then the verdict lines."""
    env = r["meta"].get("environment", {})
    gpu = env.get("gpu", {})
    where = "environment of this client (the servers given by URL may run elsewhere)" if env.get("where") \
        else "environment"
    head = [f"{where}: {gpu.get('count', '?')} x {gpu.get('name', gpu.get('error', '?'))}, driver "
            f"{gpu.get('driver', '?')}; " + ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
            + "".join(f" ({env[k]})" for k in ("note", "differs") if env.get(k))]
    if r["meta"].get("check"):
        head.append(f"plugin check: {r['meta']['check']}")
    return "\n".join(head + r["verdict"])


def plot_report(r: dict, path: str) -> str:
    """A figure of the report (matplotlib, Agg): output tok/s and median TPOT per shape and order, the KV pool
    tokens, and the quality checks with their binomial standard errors; saved to ``path`` (PNG). Returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    colors = {"fp8": "tab:blue", "fp4": "tab:orange"}
    panels = ((axes[0][0], "output_throughput", "output tok/s"), (axes[0][1], "median_tpot_ms", "median TPOT (ms)"))
    for ax, field, label in panels:
        labels, x = [], 0
        for order, rows in r["speed"].items():
            for row in rows:
                for k, arm in enumerate(("fp8", "fp4")):
                    v = row[field][arm]
                    ax.bar(x + 0.4 * k, v or 0, 0.4, color=colors[arm], label=arm.upper() if x == 0 else None)
                labels.append(f"{order}\n{row['input_len']}/{row['output_len']} x{row['concurrency']}")
                x += 1
        ax.set_xticks([i + 0.2 for i in range(len(labels))], labels, fontsize=7)
        ax.set_title(label)
        if labels:
            ax.legend(fontsize=8)
    ax = axes[1][0]
    orders = [o for o, c in r["capacity"].items() if c.get("fp8") or c.get("fp4")]
    for i, order in enumerate(orders):
        for k, arm in enumerate(("fp8", "fp4")):
            ax.bar(i + 0.4 * k, r["capacity"][order].get(arm) or 0, 0.4, color=colors[arm])
    ax.set_xticks([i + 0.2 for i in range(len(orders))], orders, fontsize=8)
    ax.set_title("KV pool tokens" + (" (/server_info)" if r["meta"].get("mode") == "urls" else " (server log)"))
    ax = axes[1][1]
    checks = [w for w in ("gsm8k", "passkey") if r["quality"].get(w)]
    for i, what in enumerate(checks):
        q = r["quality"][what]
        for k, arm in enumerate(("fp8", "fp4")):
            ax.bar(i + 0.4 * k, q[arm]["accuracy"], 0.4, yerr=q[arm]["se"], color=colors[arm], capsize=3)
    ax.set_xticks([i + 0.2 for i in range(len(checks))], checks, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title("accuracy ± binomial SE" + (" (dummy weights: meaningless)" if r["quality"].get("note") else ""))
    fig.suptitle("FP4 vs FP8 index cache on this deployment")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

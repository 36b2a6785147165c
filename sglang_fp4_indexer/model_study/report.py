"""Summaries, tables and the plot of the real-model study (``model-accuracy.json``).

Every mean comes with its standard error over the windows (or prompts):
``sd / sqrt(n)`` with the sample standard deviation (``n - 1``). Differences
(a variant's loss minus the dense loss; FP4 minus FP8) are formed per window
first, so the error is that of the paired difference.
"""

from __future__ import annotations

import math
import os

__all__ = ["mean_se", "summarize", "study_device", "trained_on", "render_markdown", "plot", "plot_indexers"]

_FORM_LABEL = {"exact": "exact", "fp8": "FP8", "fp4": "FP4"}


def mean_se(values) -> tuple[float, float]:
    """``(mean, standard error)`` of a sequence; the error is NaN for fewer than two values.

    Raises:
        ValueError: an empty sequence.
    """
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("values: expected at least one value")
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan")
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var / len(xs))


def _name(form: str, k: int) -> str:
    return f"{form} k={k}"


def summarize(doc: dict) -> dict:
    """Aggregate a study's raw result.

    Returns:
        ``{"loss": {context: {"windows", "dense", "topk": {k: {"delta": {form: (m, se)},
        "fp4_minus_fp8": (m, se), "recall": {form: (m, se)}, "recall_layers": {form: {layer: (m, se)}}, "attention_recall": {form: (m, se)} (when measured)}}}},
        "passkey": {context: {"prompts", "variants": {name: {"retrieved", "by_depth": {depth: (ok, n)},
        "logprob": (m, se), "delta_logprob": (m, se)}}}}}``; contexts and k as ints.
    """
    out = {"loss": {}, "passkey": {}}
    for ctx, entry in doc.get("loss", {}).items():
        ws = entry["windows"]
        if not ws:
            continue
        dense = [w["nll"]["dense"] for w in ws]
        case = {"windows": len(ws), "dense": mean_se(dense), "topk": {}}
        for k in entry["topk"]:
            row = {"delta": {}, "recall": {}, "recall_layers": {}}
            for form in ("exact", "fp8", "fp4"):
                n = _name(form, k)
                row["delta"][form] = mean_se([w["nll"][n] - w["nll"]["dense"] for w in ws])
                rec = [w["recall"].get(n, {}) for w in ws]
                if form != "exact" and rec and all(rec):
                    layers = sorted(rec[0], key=int)
                    row["recall_layers"][form] = {int(la): mean_se([r[la] for r in rec]) for la in layers}
                    row["recall"][form] = mean_se([sum(r.values()) / len(r) for r in rec])
            att = [w.get("attention_recall", {}).get(_name(f, k), {}) for f in ("exact", "fp8", "fp4") for w in ws]
            if att and all(att):
                row["attention_recall"] = {f: mean_se([sum(r.values()) / len(r) for r in
                                                       (w["attention_recall"][_name(f, k)] for w in ws)])
                                           for f in ("exact", "fp8", "fp4")}
            row["fp4_minus_fp8"] = mean_se([w["nll"][_name("fp4", k)] - w["nll"][_name("fp8", k)] for w in ws])
            case["topk"][int(k)] = row
        out["loss"][int(ctx)] = case
    for ctx, entry in doc.get("passkey", {}).items():
        ps = entry["prompts"]
        if not ps:
            continue
        names = ["dense"] + [_name(f, k) for k in entry["topk"] for f in ("exact", "fp8", "fp4")]
        variants = {}
        for n in names:
            depths = sorted({p["depth"] for p in ps})
            variants[n] = {
                "retrieved": (sum(p["retrieved"][n] for p in ps), len(ps)),
                "by_depth": {d: (sum(p["retrieved"][n] for p in ps if p["depth"] == d),
                                 sum(1 for p in ps if p["depth"] == d)) for d in depths},
                "logprob": mean_se([p["logprob"][n] for p in ps]),
                "delta_logprob": mean_se([p["logprob"][n] - p["logprob"]["dense"] for p in ps]),
            }
        out["passkey"][int(ctx)] = {"prompts": len(ps), "topk": [int(k) for k in entry["topk"]],
                                    "variants": variants}
    return out


def _compute_seconds(doc: dict) -> float:
    """Wall seconds the scored sequences took, summed over windows and prompts (across resumed runs)."""
    total = sum(sum(w.get("seconds", {}).values()) for e in doc.get("loss", {}).values() for w in e["windows"])
    return total + sum(p.get("seconds", 0) for e in doc.get("passkey", {}).values() for p in e["prompts"])


def _pm(ms: tuple[float, float], digits: int = 4, signed: bool = True) -> str:
    m, se = ms
    sign = "+" if signed else ""
    if math.isnan(se):
        return f"{m:{sign}.{digits}f}"
    return f"{m:{sign}.{digits}f} ± {se:.{digits}f}"


def _ctx(c: int) -> str:
    return f"{c // 1024}K" if c % 1024 == 0 else str(c)


def study_device(doc: dict) -> str:
    """Where a study's result was measured: the GPU's name (``--device cuda``; ``"GPU"`` when unrecorded) or
    ``"CPU"``."""
    if doc.get("device") == "cuda":
        return (doc.get("environment") or {}).get("gpu") or "GPU"
    return "CPU"


def trained_on(doc: dict) -> str | None:
    """What a trained indexer was trained on, ``"12 x 8192 tokens"``; None for the stand-in (or unrecorded)."""
    trained = (doc.get("indexer") or {}).get("trained")
    if doc.get("indexer_kind") != "trained" or not trained:
        return None
    return f"{trained.get('sequences', '?')} x {trained.get('context', '?')} tokens"


def _where(doc: dict) -> str:
    """``"on an NVIDIA H100 80GB HBM3"`` (``--device cuda``) or ``"on the CPU (16 threads)"``."""
    if doc.get("device") == "cuda":
        return f"on an {study_device(doc)}"
    return f"on the CPU ({(doc.get('environment') or {}).get('threads', '?')} threads)"


def _indexer_label(doc: dict, detail: bool = True) -> str:
    """``"stand-in indexer"`` or ``"trained indexer (64 heads, trained on 12 x 8192 tokens)"`` (``detail`` False:
    ``"trained indexer"``)."""
    if doc.get("indexer_kind") != "trained":
        return "stand-in indexer"
    trained = (doc.get("indexer") or {}).get("trained") or {}
    on = trained_on(doc) or "text not recorded"
    return f"trained indexer ({trained.get('heads', '?')} heads, trained on {on})" if detail else "trained indexer"


def render_markdown(doc: dict) -> str:
    """The study's tables as markdown: loss and recall per context and top-k, then passkey retrieval."""
    s = summarize(doc)
    lines = ["# Gemma 3 270M with DSA-style sparse attention: exact, FP8 and FP4 index keys", ""]
    if doc.get("command"):  # a resumed run records each command, "; "-separated
        lines += ["```", *doc["command"].split("; "), "```", ""]
    env = doc.get("environment", {})
    text = (doc.get("text") or "Opticks").replace("Opticks", "Newton's *Opticks*", 1)
    lines += [f"Text: {text}, {doc.get('windows')} disjoint windows per context, loss over the last "
              f"{doc.get('scored')} positions of each; mean ± standard error over the windows; Δ = variant minus "
              f"dense attention, paired per window (nats/token). {_indexer_label(doc)}; {_where(doc)}, torch "
              f"{env.get('torch', '?')}, transformers {env.get('transformers', '?')}; "
              + f"{_compute_seconds(doc) / 60:,.0f} minutes of wall time over the sequences"
              + ("." if doc.get("seconds") else " (the last run was interrupted; what it measured is below)."), ""]
    lines += ["| context | windows | k | k / context | dense loss | Δ exact selection | Δ FP8 | Δ FP4 | FP4 − FP8 | "
              "recall FP8 | recall FP4 |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for ctx, case in sorted(s["loss"].items()):
        for k, row in case["topk"].items():
            rec = lambda f: _pm(row["recall"][f], 4, False) if f in row["recall"] else "1 (all kept)"  # noqa: E731
            lines.append(f"| {_ctx(ctx)} | {case['windows']} | {k} | 1/{ctx // k if k < ctx else 1} | "
                         f"{_pm(case['dense'], 3, False)} | {_pm(row['delta']['exact'])} | {_pm(row['delta']['fp8'])} | "
                         f"{_pm(row['delta']['fp4'])} | {_pm(row['fp4_minus_fp8'])} | {rec('fp8')} | {rec('fp4')} |")
    lines += ["", "Recall of the exact top-k per global layer (same rows, each variant's own activations):", "",
              "| context | k | format | layer 5 | layer 11 | layer 17 |", "| ---: | ---: | --- | ---: | ---: | ---: |"]
    for ctx, case in sorted(s["loss"].items()):
        for k, row in case["topk"].items():
            for form, layers in row["recall_layers"].items():
                cells = " | ".join(_pm(layers[la], 4, False) for la in sorted(layers))
                lines.append(f"| {_ctx(ctx)} | {k} | {_FORM_LABEL[form]} | {cells} |")
    att = [(ctx, k, row) for ctx, case in sorted(s["loss"].items()) for k, row in case["topk"].items()
           if "attention_recall" in row]
    if att:
        lines += ["", f"Recall of the layer's attention top-k (its softmax weights summed over heads), mean over the "
                  f"global layers, {doc.get('indexer_kind', 'stand-in')} indexer:", "",
                  "| context | k | exact selection | FP8 | FP4 |", "| ---: | ---: | ---: | ---: | ---: |"]
        for ctx, k, row in att:
            r = row["attention_recall"]
            lines.append(f"| {_ctx(ctx)} | {k} | {_pm(r['exact'], 4, False)} | {_pm(r['fp8'], 4, False)} | "
                         f"{_pm(r['fp4'], 4, False)} |")
    if s["passkey"]:
        lines += ["", "Passkey retrieval (the five digits all the argmax under teacher forcing; prompts per depth; "
                  "answer log-probability mean ± standard error over the prompts):", "",
                  "| context | variant | retrieved | by depth (10 / 50 / 90 %) | answer log-prob | Δ vs dense |",
                  "| ---: | --- | ---: | --- | ---: | ---: |"]
        for ctx, case in sorted(s["passkey"].items()):
            for n, v in case["variants"].items():
                form, _, k = n.partition(" ")
                label = "dense" if n == "dense" else f"{_FORM_LABEL[form]} {k}"
                depth = " / ".join(f"{a}/{b}" for a, b in v["by_depth"].values())
                lines.append(f"| {_ctx(ctx)} | {label} | {v['retrieved'][0]}/{v['retrieved'][1]} | {depth} | "
                             f"{_pm(v['logprob'], 3)} | {'—' if n == 'dense' else _pm(v['delta_logprob'], 3)} |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: str | os.PathLike) -> bool:
    """Δ loss vs top-k per context (exact, FP8, FP4 with standard-error bars), and FP4 − FP8 in a last panel.

    Returns:
        False (nothing written) when matplotlib is not installed or there is nothing to plot.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    s = summarize(doc)["loss"]
    if not s:
        return False
    ctxs = sorted(s)
    fig, axes = plt.subplots(1, len(ctxs) + 1, figsize=(4.4 * (len(ctxs) + 1), 4.2), squeeze=False)
    styles = {"exact": ("k", "o", "exact selection"), "fp8": ("tab:blue", "s", "FP8 index keys"),
              "fp4": ("tab:red", "^", "FP4 index keys (MXFP4)")}

    def log_ticks(ax, ks):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.set_xlabel("top-k")
        ax.grid(True, alpha=0.3)
        ax.axhline(0, color="0.6", lw=0.8)

    for ax, ctx in zip(axes[0], ctxs):
        ks = sorted(s[ctx]["topk"])
        for i, form in enumerate(("exact", "fp8", "fp4")):
            color, marker, label = styles[form]
            ms = [s[ctx]["topk"][k]["delta"][form] for k in ks]
            ax.errorbar([k * (1 + 0.04 * (i - 1)) for k in ks], [m for m, _ in ms],
                        yerr=[0 if math.isnan(e) else e for _, e in ms], color=color, marker=marker, ms=5,
                        capsize=3, lw=1.2, label=label)
        log_ticks(ax, ks)
        ax.set_title(f"Δ loss vs dense, context {_ctx(ctx)} ({s[ctx]['windows']} windows)", fontsize=10)
    axes[0][0].set_ylabel("nats/token")
    axes[0][0].legend(fontsize=8)
    ax = axes[0][-1]
    all_ks = sorted({k for c in ctxs for k in s[c]["topk"]})
    for i, ctx in enumerate(ctxs):
        ks = sorted(s[ctx]["topk"])
        ms = [s[ctx]["topk"][k]["fp4_minus_fp8"] for k in ks]
        ax.errorbar([k * (1 + 0.04 * i) for k in ks], [m for m, _ in ms], yerr=[0 if math.isnan(e) else e for _, e in ms],
                    marker="D", ms=5, capsize=3, lw=1.2, label=f"context {_ctx(ctx)}")
    log_ticks(ax, all_ks)
    ax.set_title("FP4 − FP8, paired per window", fontsize=10)
    ax.legend(fontsize=8)
    fig.suptitle(f"Gemma 3 270M, sparse attention in its 3 global layers over a {_indexer_label(doc)}, "
                 f"{_where(doc)}\n(mean ± standard error over windows)", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=110)
    plt.close(fig)
    return True


def plot_indexers(docs: list[dict], path: str | os.PathLike) -> bool:
    """Several studies side by side over the context, one line per (study, top-k rule): FP4 − FP8 loss, FP4's
    recall of the exact top-k, and the exact selection's recall of the layer's attention top-k.

    Per context the largest top-k measured is drawn as one line and the smallest as another (``k = 2048`` and
    ``k`` at 1/64 of the context in the long-context preset); each study is labelled by its indexer
    (``_indexer_label``) and where it ran. Error bars: standard errors over the windows.

    Args:
        docs: ``model-accuracy.json`` results (as ``--from-json`` reads them), at least one.

    Returns:
        False (nothing written) when matplotlib is not installed or no study has a complete loss case.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series = []  # (label, [(context, row)])
    for doc in docs:
        loss = summarize(doc)["loss"]
        if not loss:
            continue
        largest, smallest = ([pick(loss[c]["topk"]) for c in sorted(loss)] for pick in (max, min))
        for ks in (largest, smallest) if smallest != largest else (largest,):  # one top-k per context: drawn once
            label = f"{_indexer_label(doc, detail=False)}, {study_device(doc)}, k {'/'.join(map(str, ks))}"
            series.append((label, [(c, loss[c]["topk"][k]) for c, k in zip(sorted(loss), ks)]))
    if not series:
        return False
    panels = (("FP4 − FP8 loss (nats/token)", lambda r: r["fp4_minus_fp8"]),
              ("FP4 recall of the exact top-k", lambda r: r["recall"].get("fp4")),
              ("exact selection's recall of the attention top-k", lambda r: (r.get("attention_recall") or {}).get("exact")))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for ax, (title, value) in zip(axes, panels):
        for i, (label, points) in enumerate(series):
            pts = [(c, value(r)) for c, r in points if value(r) is not None]
            if not pts:
                continue
            ax.errorbar([c * (1 + 0.03 * (i - len(series) / 2)) for c, _ in pts], [v[0] for _, v in pts],
                        yerr=[0 if math.isnan(v[1]) else v[1] for _, v in pts], marker="os^Dv<>"[i % 7], ms=5,
                        color=f"C{i % 10}",  # a series' colour in every panel, as the first panel's legend shows it
                        capsize=3, lw=1.2, label=label)
        ctxs = sorted({c for _, pts in series for c, _ in pts})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ctxs, [_ctx(c) for c in ctxs])
        ax.minorticks_off()
        ax.set_xlabel("context (tokens)")
        ax.grid(True, alpha=0.3)
        ax.set_title(title, fontsize=10)
    axes[0].axhline(0, color="0.6", lw=0.8)
    axes[0].legend(fontsize=7)
    fig.suptitle("Gemma 3 270M, sparse attention in its 3 global layers: the indexers compared "
                 "(mean ± standard error over windows)", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=110)
    plt.close(fig)
    return True

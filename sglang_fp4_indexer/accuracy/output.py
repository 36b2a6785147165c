"""The study's outputs: the markdown report, the recall plot (matplotlib, imported only to draw it) and the JSON
result, written and read back.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from ..workload import check_input_path
from .inputs import NEEDLE_DEPTHS
from .measuring import CaseResult, FormatMetrics
from .diagnostics import Diagnostics, LossAnalysis
from .study import StudyResult

__all__ = [
    "render_markdown",
    "plot_recall",
    "load_result",
    "write_outputs",
]


def _pct(x: float) -> str:
    return f"{x:.4f}"


def _k_of(case: CaseResult) -> int:
    return min(case.topk, case.context)


def render_markdown(result: StudyResult, command: str | None = None) -> str:
    """The study's tables as markdown (recall, logit agreement, logits dtype, needle, diagnostics)."""
    lines: list[str] = []
    env = result.environment
    lines.append(f"Device `{result.device}`"
                 + (f" ({env['gpu']})" if "gpu" in env else "")
                 + f"; torch {env['torch']}, triton {env['triton']}, Python {env['python']}; "
                 f"{result.rows} decode rows per case; top-k {result.topk} (capped at each row's visible keys); "
                 f"wall time {result.seconds:.0f} s.")
    if command:
        lines += ["", f"Command: `{command}`"]
    lines += ["", "FP4 path: `triton` / `hopper` = the store op and the paged scorer (`ops.quantize.store_index_k`, "
              "`ops.paged_logits.paged_logits`, through its Triton kernels or the Hopper CUDA kernel); `torch` = the format's exact torch oracle "
              "(`format.quantize_index_k` + `dequantize_index_k` + fp32 matmul). FP8 and `keys exact` are torch.",
              ""]
    lines += ["### Top-k recall of the exact top-k", "",
              "| workload | context | H | k | FP8 mean | FP8 p1 | FP8 min | FP4 mean | FP4 p1 | FP4 min "
              "| FP4 − FP8 | keys exact (q e4m3) | FP4 path |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for c in result.cases:
        f8, f4, kx = c.formats["FP8"], c.formats["FP4"], c.formats["keys exact"]
        lines.append(f"| {c.workload} | {c.context:,} | {c.heads} | {_k_of(c)} | {_pct(f8.recall_mean)} | "
                     f"{_pct(f8.recall_p1)} | {_pct(f8.recall_min)} | {_pct(f4.recall_mean)} | {_pct(f4.recall_p1)} | "
                     f"{_pct(f4.recall_min)} | {f4.recall_mean - f8.recall_mean:+.4f} | {_pct(kx.recall_mean)} | "
                     f"{c.fp4_path} |")
    lines += ["", "### Logit agreement over the visible keys", "",
              "| workload | context | H | Spearman FP8 | Spearman FP4 | min Spearman FP4 | rel. L2 FP8 | rel. L2 FP4 "
              "| max rel. L2 FP4 |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in result.cases:
        f8, f4 = c.formats["FP8"], c.formats["FP4"]
        lines.append(f"| {c.workload} | {c.context:,} | {c.heads} | {f8.spearman_mean:.5f} | {f4.spearman_mean:.5f} | "
                     f"{f4.spearman_min:.5f} | {f8.rel_l2_mean:.4f} | {f4.rel_l2_mean:.4f} | {f4.rel_l2_max:.4f} |")
    low = [n for n in next(iter(result.cases)).formats if n.startswith("FP4 ") and n.endswith(" logits")]
    if low:
        lines += ["", "### FP4 recall by logits dtype (the scorer's `logits_dtype`)", "",
                  "| workload | context | H | fp32 | " + " | ".join(n.split()[1] for n in low) + " | FP4 path |",
                  "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in low) + " | --- |"]
        for c in result.cases:
            vals = " | ".join(_pct(c.formats[n].recall_mean) for n in low)
            lines.append(f"| {c.workload} | {c.context:,} | {c.heads} | {_pct(c.formats['FP4'].recall_mean)} | "
                         f"{vals} | {c.fp4_path} |")
    needle_cases = [c for c in result.cases if c.needle_depths is not None]
    if needle_cases:
        lines += ["", "### Needle: still selected (in the top-k) / still first", "",
                  "| context | H | depth | rows | FP8 kept | FP4 kept | FP8 first | FP4 first | FP4 path |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for c in needle_cases:
            for depth in NEEDLE_DEPTHS:
                idx = [r for r, d in enumerate(c.needle_depths) if d == depth]

                def share(flags: list[bool] | None) -> str:
                    return f"{sum(flags[r] for r in idx)}/{len(idx)}"

                f8, f4 = c.formats["FP8"], c.formats["FP4"]
                lines.append(f"| {c.context:,} | {c.heads} | {depth:.0%} | {len(idx)} | {share(f8.needle_kept)} | "
                             f"{share(f4.needle_kept)} | {share(f8.needle_top1)} | {share(f4.needle_top1)} | "
                             f"{c.fp4_path} |")
    checks = [c for c in result.cases if c.store_bit_exact is not None]
    if checks:
        worst = max(c.triton_vs_oracle for c in checks)
        ok = all(c.store_bit_exact for c in checks)
        lines += ["", f"Triton checks ({len(checks)} cases): store op vs `format.quantize_index_k` "
                  f"{'bit-exact' if ok else 'MISMATCH'}; max |Triton FP4 logit − torch oracle| = {worst:.2e}."]
    if result.diagnostics:
        lines += ["", "### Where the recall goes (torch path)", "",
                  "| workload | context | H | format | recall | noise-model recall | error std / logit std "
                  "| error std in top-k / overall | lost share | lost in last quarter of top-k "
                  "| lost: median gap to k-th score (error std) | lost within 2 std | top-k/4 kept |",
                  "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for d in result.diagnostics:
            for name, a in d.analysis.items():
                lines.append(f"| {d.workload} | {d.context:,} | {d.heads} | {name} | {_pct(a.recall)} | "
                             f"{_pct(a.noise_model_recall)} | {a.noise_to_spread:.4f} | {a.error_topk_ratio:.2f} | "
                             f"{a.lost_share:.4f} | {a.lost_in_last_quarter:.2f} | {a.lost_median_gap:.2f} | "
                             f"{a.lost_within_2sd:.2f} | {_pct(a.head_recall)} |")
        lines += ["", "### FP4 encoder variants (torch path; findings, not the format)", "",
                  "| workload | context | H | FP8 | ceil (the format's rule) | ocp | mse | group16 (72 B) | ceil, bf16 q "
                  "| FP4/FP8 error std | FP4 error must shrink × | key error FP8 | key error ceil | key error mse "
                  "| key error group16 |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                  "| ---: |"]
        for d in result.diagnostics:
            v, ke = d.variants, d.variant_key_error
            need = "met" if d.needed_error_factor >= 1.0 else f"{1 / max(d.needed_error_factor, 1e-9):.2f}"
            lines.append(f"| {d.workload} | {d.context:,} | {d.heads} | {_pct(d.analysis['FP8'].recall)} | "
                         f"{_pct(v['ceil'])} | {_pct(v['ocp'])} | {_pct(v['mse'])} | {_pct(v['group16'])} | "
                         f"{_pct(d.fp4_bf16_queries)} | "
                         f"{d.error_ratio:.2f} | {need} | {d.fp8_key_error:.4f} | {ke['ceil']:.4f} | "
                         f"{ke['mse']:.4f} | {ke['group16']:.4f} |")
    lines += ["", "Workloads:"] + [f"- `{k}`: {s}" for k, s in result.sources.items()]
    for note in result.notes:
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def plot_recall(result: StudyResult, path: str | os.PathLike) -> bool:
    """Draw mean recall vs context, one line per format (FP8 dashed, FP4 solid) and workload, one panel per H.

    Returns:
        False (nothing written) when matplotlib is not installed; True otherwise.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    heads = sorted({c.heads for c in result.cases}, reverse=True)
    kinds = list(dict.fromkeys(c.workload for c in result.cases))
    colors = dict(zip(kinds, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    markers = dict(zip(kinds, "osx^dv*"))  # distinct markers: needle's lines lie on gaussian's (same keys and rows)
    fig, axes = plt.subplots(1, len(heads), figsize=(6.2 * len(heads), 4.4), sharey=True, squeeze=False)
    for ax, h in zip(axes[0], heads):
        for kind in kinds:
            cs = sorted((c for c in result.cases if c.heads == h and c.workload == kind), key=lambda c: c.context)
            x = [c.context for c in cs]
            for name, style in (("FP8", "--"), ("FP4", "-")):
                ax.plot(x, [c.formats[name].recall_mean for c in cs], style, marker=markers[kind], ms=5,
                        color=colors[kind], label=f"{name} {kind}")
        ax.set_xscale("log", base=2)
        ticks = sorted({c.context for c in result.cases})
        ax.set_xticks(ticks, [f"{t // 1024}K" if t % 1024 == 0 else str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("context (keys)")
        ax.set_title(f"H = {h}, top-k {result.topk}")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("mean recall of the exact top-k")
    axes[0][-1].legend(fontsize=8, ncol=2, loc="lower left")
    fig.suptitle(f"FP4 (solid) vs FP8 (dashed) top-k recall, device {result.device}", fontsize=11)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=110)
    plt.close(fig)
    return True


def _json_ready(result: StudyResult) -> dict:
    data = asdict(result)
    for case in data["cases"]:
        case.pop("logits", None)
    return data


def load_result(path: str | os.PathLike) -> tuple[StudyResult, str | None]:
    """Read an ``accuracy.json`` written by ``write_outputs``: the result (without logits) and its command.

    Lets a GPU run's numbers be re-rendered (tables, plot) on another machine.

    Raises:
        ValueError: no such file, a directory, an unreadable file, not JSON, or
            JSON that is not an accuracy result; the message names ``path``.
    """
    name = check_input_path(path, "an accuracy.json")
    try:
        data = json.loads(Path(name).read_text())
    except OSError as exc:
        raise ValueError(f"{name}: cannot be read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name}: not JSON ({exc}); expected an accuracy.json written by "
                         f"'sglang-fp4-indexer accuracy'") from None
    try:
        command = data.pop("command", None)
        cases = [CaseResult(**{**c, "formats": {n: FormatMetrics(**f) for n, f in c["formats"].items()},
                               "logits": None}) for c in data.pop("cases")]
        diags = [Diagnostics(**{**d, "analysis": {n: LossAnalysis(**a) for n, a in d["analysis"].items()}})
                 for d in data.pop("diagnostics")]
        return StudyResult(cases=cases, diagnostics=diags, **data), command
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not an accuracy.json written by 'sglang-fp4-indexer accuracy' ({exc})") from None


def write_outputs(result: StudyResult, out_dir: str | os.PathLike, command: str | None = None) -> dict[str, Path]:
    """Write ``accuracy.md`` (tables), ``accuracy.json`` (every number) and ``accuracy.png`` (plot) to ``out_dir``.

    Returns:
        ``{"markdown": path, "json": path, "plot": path}`` (``"plot"`` absent without matplotlib).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "accuracy.md", "json": out / "accuracy.json"}
    paths["markdown"].write_text(render_markdown(result, command))
    data = _json_ready(result)
    data["command"] = command
    paths["json"].write_text(json.dumps(data, indent=1))
    if plot_recall(result, out / "accuracy.png"):
        paths["plot"] = out / "accuracy.png"
    return paths

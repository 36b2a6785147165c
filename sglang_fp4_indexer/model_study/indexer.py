"""A trained lightning indexer for Gemma 3's global layers, as DeepSeek-V3.2 trains its own in the dense warm-up.

One ``LightningIndexer`` per global layer, DeepSeek-V3.2's indexer shape:

- index queries ``q_t = W_qb W_qa x_t`` (``heads x 128``; a low-rank query, as DeepSeek's indexer reads
  its compressed query latent), index key ``k_s = LayerNorm(W_k x_s)`` (128), head weights
  ``w_t = W_w x_t * heads ** -0.5 * 128 ** -0.5``, all from the layer's input hidden states ``x`` (after the
  layer's input norm, what its attention reads);
- RoPE on the first ``rope_dim`` of the 128 dims of queries and keys (half-split pairs), then the 128x128
  Hadamard rotation DeepSeek applies before quantizing (``workload.rotate_activation``);
- score ``I(t, s) = sum_h w_{t,h} relu(q_{t,h} . k_s)`` over ``s <= t``.

Training (``train``): the model frozen, each indexer alone is fitted by the KL divergence from the layer's
attention distribution (``attention_target``: softmax attention weights summed over the layer's query heads,
normalised, causal) to ``softmax(I(t, .))``, averaged over query rows, on a text that is not the evaluation
text. The result is a ``TrainedIndexer`` (``queries_for`` / ``keys_for``, what ``sparse.Selection`` calls),
saved with ``save`` and read with ``load`` (a few MiB in bf16).

Nothing here imports SGLang.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import format as fmt
from ..workload import rotate_activation

__all__ = ["HEADS", "QUERY_RANK", "ROPE_DIM", "ROPE_THETA", "LightningIndexer", "TrainedIndexer",
           "attention_target", "kl_to_target", "train", "save", "load"]

#: Index heads (DeepSeek-V3.2's 64).
HEADS = 64
#: Rank of the low-rank index-query projection.
QUERY_RANK = 128
#: Index dims that carry RoPE (DeepSeek-V3.2: 64 of 128).
ROPE_DIM = 64
#: RoPE base.
ROPE_THETA = 1_000_000.0
_FORMAT = "sglang-fp4-indexer-trained-indexer/1"


def _rope(x: torch.Tensor, positions: torch.Tensor, rope_dim: int, theta: float) -> torch.Tensor:
    """Half-split RoPE on the first ``rope_dim`` dims of ``x [..., T, (H,) 128]`` at ``positions [T]``."""
    half = rope_dim // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]  # [T, half]
    if x.dim() == 3:  # [T, H, D]
        ang = ang[:, None, :]
    cos, sin = ang.cos(), ang.sin()
    a, b, rest = x[..., :half], x[..., half:rope_dim], x[..., rope_dim:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos, rest], -1)


class LightningIndexer(torch.nn.Module):
    """One layer's lightning indexer (module docstring); fp32 parameters.

    Args:
        hidden: the model's hidden size (Gemma 3 270M: 640).
        heads, rank, rope_dim, theta: index heads, query rank, RoPE dims and base.
    """

    def __init__(self, hidden: int, heads: int = HEADS, rank: int = QUERY_RANK, rope_dim: int = ROPE_DIM,
                 theta: float = ROPE_THETA):
        super().__init__()
        d = fmt.INDEX_HEAD_DIM
        self.heads, self.rope_dim, self.theta = heads, rope_dim, theta
        self.wq_a = torch.nn.Linear(hidden, rank, bias=False)
        self.wq_b = torch.nn.Linear(rank, heads * d, bias=False)
        self.wk = torch.nn.Linear(hidden, d, bias=False)
        self.k_norm = torch.nn.LayerNorm(d)
        self.weights_proj = torch.nn.Linear(hidden, heads, bias=False)

    def queries(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [T, hidden]`` at ``positions [T]`` -> rotated queries ``[T, H, 128]`` and weights fp32 ``[T, H]``."""
        x = x.to(self.wq_a.weight.dtype)
        q = self.wq_b(self.wq_a(x)).view(x.shape[0], self.heads, fmt.INDEX_HEAD_DIM)
        q = rotate_activation(_rope(q, positions, self.rope_dim, self.theta))
        w = self.weights_proj(x).float() * (self.heads ** -0.5) * (fmt.INDEX_HEAD_DIM ** -0.5)
        return q, w

    def keys(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x [S, hidden]`` at ``positions [S]`` -> rotated index keys ``[S, 128]``."""
        k = self.k_norm(self.wk(x.to(self.wk.weight.dtype)))
        return rotate_activation(_rope(k, positions, self.rope_dim, self.theta))

    def logits(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """fp32 ``[len(rows), S]`` scores of query rows ``rows`` over keys ``0 .. S - 1`` of ``x [S, hidden]``,
        ``-inf`` past each row (causal)."""
        from .sparse import index_logits

        q, w = self.queries(x[rows], rows)
        k = self.keys(x, torch.arange(x.shape[0], device=x.device))
        return index_logits(q.float(), w, k.float(), rows)


@dataclass
class TrainedIndexer:
    """Trained indexers of a model's global layers, in the interface ``sparse.Selection`` uses.

    Attributes:
        layers: ``{layer: LightningIndexer}``.
        meta: how they were trained (seed, steps, text, KL before and after).
    """

    layers: dict
    meta: dict = field(default_factory=dict)

    def to(self, device, dtype: torch.dtype = torch.float32) -> "TrainedIndexer":
        """Move every indexer to ``device`` / ``dtype`` (in place); returns self."""
        for m in self.layers.values():
            m.to(device=device, dtype=dtype)
        return self

    def queries_for(self, layer: int, query: torch.Tensor, hidden: torch.Tensor | None,
                    positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Index queries bf16 ``[C, H, 128]`` and weights fp32 ``[C, H]`` of rows ``positions`` (``query`` unused).

        Raises:
            ValueError: no hidden states (``sparse.install_hidden_hook`` passes them).
        """
        if hidden is None:
            raise ValueError("hidden: the trained indexer reads the layer's hidden states; none were passed")
        with torch.no_grad():
            q, w = self.layers[layer].queries(hidden[positions], positions)
        return q.to(torch.bfloat16), w

    def keys_for(self, layer: int, key: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
        """Index keys bf16 ``[S, 128]`` of the sequence (``key`` unused).

        Raises:
            ValueError: no hidden states.
        """
        if hidden is None:
            raise ValueError("hidden: the trained indexer reads the layer's hidden states; none were passed")
        with torch.no_grad():
            return self.layers[layer].keys(hidden, torch.arange(hidden.shape[0], device=hidden.device)) \
                .to(torch.bfloat16)


def attention_target(query: torch.Tensor, key: torch.Tensor, rows: torch.Tensor, scale: float) -> torch.Tensor:
    """The layer's attention distribution of query rows ``rows``: softmax weights summed over heads, normalised.

    Args:
        query: ``[H, T, D]`` post-RoPE queries; key: ``[S, D]`` post-RoPE keys (one KV head).
        rows: int64 ``[R]`` query positions; scale: the softmax scale.

    Returns:
        fp32 ``[R, S]``, each row summing to 1, zero past its position.
    """
    logits = torch.einsum("hrd,sd->hrs", query[:, rows].float(), key.float()) * scale
    cols = torch.arange(key.shape[0], device=key.device)
    logits = logits.masked_fill(cols[None, None, :] > rows[None, :, None], float("-inf"))
    return torch.softmax(logits, -1).mean(0)


def kl_to_target(target: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``KL(target || softmax(logits))`` in nats; ``-inf`` logits where the target is 0.

    Args:
        target: fp32 ``[R, S]`` distributions; logits: fp32 ``[R, S]``.

    Returns:
        A scalar tensor (differentiable in ``logits``).
    """
    logp = torch.log_softmax(logits, -1)
    t = target.clamp_min(0)
    terms = torch.where(t > 0, t * (torch.log(t.clamp_min(1e-30)) - logp), torch.zeros_like(t))
    return terms.sum(-1).mean()


def train(records: list[dict], scale: dict, *, hidden: int, steps: int, seed: int, rows_per_step: int = 256,
          lr: float = 1e-3, heads: int = HEADS, rank: int = QUERY_RANK, device=None, log=print,
          meta: dict | None = None) -> TrainedIndexer:
    """Fit one indexer per layer to the frozen model's attention on training sequences.

    Args:
        records: per training sequence ``{layer: (query [H, T, D], key [T, D], hidden [T, hidden])}`` from a
            dense pass (``run.record_global_layers``).
        scale: ``{layer: attention softmax scale}``.
        hidden: the model's hidden size.
        steps: optimizer steps per layer (AdamW), each on ``rows_per_step`` random query rows of one random
            sequence (rows from position 1 on).
        seed: seeds the initialization and the row sampling.
        device: where to train (default: the records' device).

    Returns:
        The trained indexers, ``meta`` holding the KL on every record's rows before and after training.

    Raises:
        ValueError: no records, ``steps`` or ``rows_per_step`` below 1.
    """
    if not records:
        raise ValueError("records: expected at least one training sequence")
    if steps < 1 or rows_per_step < 1:
        raise ValueError(f"steps, rows_per_step: expected >= 1, got {steps}, {rows_per_step}")
    layers = sorted(records[0])
    device = device or records[0][layers[0]][0].device
    # Own copies (a dense pass records under inference mode; autograd cannot save such tensors).
    records = [{la: tuple(t.detach().to(device).clone() for t in rec[la]) for la in layers} for rec in records]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    out, kl_before, kl_after = {}, {}, {}
    started = time.perf_counter()
    for layer in layers:
        model = LightningIndexer(hidden, heads, rank).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 20) * 0.5 *
                                                  (1 + math.cos(math.pi * min(i, steps) / steps)))

        def evaluate():
            with torch.no_grad():
                return sum(_record_kl(model, rec[layer], scale[layer]) for rec in records) / len(records)

        kl_before[layer] = evaluate()
        for _ in range(steps):
            rec = records[int(torch.randint(len(records), (1,), generator=gen))][layer]
            q, k, x = rec
            t = k.shape[0]
            rows = torch.randint(1, t, (min(rows_per_step, t - 1),), generator=gen).to(device).sort().values
            loss = kl_to_target(attention_target(q, k, rows, scale[layer]), model.logits(x.float(), rows))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        kl_after[layer] = evaluate()
        log(f"indexer layer {layer}: KL {kl_before[layer]:.4f} -> {kl_after[layer]:.4f} nats ({steps} steps)")
        out[layer] = model.eval()
    info = {"seed": seed, "steps": steps, "rows_per_step": rows_per_step, "lr": lr, "heads": heads,
            "rank": rank, "rope_dim": ROPE_DIM, "theta": ROPE_THETA, "hidden": hidden,
            "kl_before": {str(k): v for k, v in kl_before.items()},
            "kl_after": {str(k): v for k, v in kl_after.items()},
            "seconds": round(time.perf_counter() - started, 1), **(meta or {})}
    return TrainedIndexer(out, info)


def _record_kl(model: LightningIndexer, rec, scale: float, chunk: int = 1024) -> float:
    """KL over every row (1 .. T - 1) of one recorded sequence, chunked."""
    q, k, x = rec
    t = k.shape[0]
    total, n = 0.0, 0
    for r0 in range(1, t, chunk):
        rows = torch.arange(r0, min(t, r0 + chunk), device=k.device)
        total += float(kl_to_target(attention_target(q, k, rows, scale), model.logits(x.float(), rows))) * len(rows)
        n += len(rows)
    return total / n


def save(indexer: TrainedIndexer, path: str | Path) -> None:
    """Write the indexers' weights (bf16) and ``meta`` to ``path`` (``torch.save``)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    state = {str(layer): {k: v.detach().to("cpu", torch.bfloat16) for k, v in m.state_dict().items()}
             for layer, m in indexer.layers.items()}
    torch.save({"format": _FORMAT, "meta": indexer.meta, "layers": state}, str(path))


def load(path: str | Path, device=None) -> TrainedIndexer:
    """Read ``save``'s file into fp32 indexers on ``device``.

    Raises:
        ValueError: the file is not a trained-indexer file of this format.
    """
    doc = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise ValueError(f"path: {path} is not a trained-indexer file ({_FORMAT})")
    meta = doc["meta"]
    layers = {}
    for layer, state in doc["layers"].items():
        m = LightningIndexer(meta["hidden"], meta["heads"], meta["rank"], meta["rope_dim"], meta["theta"])
        m.load_state_dict({k: v.float() for k, v in state.items()})
        layers[int(layer)] = m.to(device or "cpu").eval()
    return TrainedIndexer(layers, meta)

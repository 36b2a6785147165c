"""Running Gemma 3 with dense and sparse global attention: loss windows, passkey prompts, recall.

One sequence (``run_sequence``) is scored under every variant at once,
sharing what the variants share:

- the embedding and the layers before the first global layer (5) run once;
- every variant, like the dense run, computes every position of the
  remaining layers: the same rows through the same calls, so a sparse variant
  that keeps every key gives the dense loss bit for bit (CPU matrix products
  in bf16 round differently for different row counts, so recomputing only the
  positions past a shared prefix would not);
- the first global layer's index keys and top-k indices (the largest ``k``,
  sorted, so every smaller ``k`` is a prefix) are computed once per format.

Scored positions are ``score_from .. L - 2``, each predicting the next token;
the loss is computed chunk by chunk from the final hidden states times the
tied embedding, so the full ``L x 262144`` logits never exist.

Nothing here imports SGLang.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .gemma import BOS_ID, GLOBAL_LAYERS
from .sparse import IndexerProjection, KVCache, Selection, calibrate_projection, install_hidden_hook

__all__ = ["LOSS_CHUNK", "Variant", "SequenceResult", "run_sequence", "calibrate", "record_global_layers",
           "attention_scales", "dense_loss_reference"]

#: Positions per chunk of the loss (final norm, tied embedding, log-softmax).
LOSS_CHUNK = 256


@dataclass(frozen=True)
class Variant:
    """A sparse-attention variant: index-key format and top-k."""

    form: str
    topk: int

    @property
    def name(self) -> str:
        """``"fp4 k=2048"`` style."""
        return f"{self.form} k={self.topk}"


@dataclass
class SequenceResult:
    """What one sequence gives under the dense model and every variant.

    Attributes:
        length: tokens (``<bos>`` included).
        score_from: first scored position.
        nll: ``{"dense" | variant name: fp64 [scored] per-position loss in nats}``.
        argmax_ok: ``{name: bool [scored]}`` the next token is the argmax.
        recall: ``{variant name: {layer: mean recall of the exact top-k over scored rows}}`` (FP8, FP4).
        attention_recall: ``{variant name: {layer: mean recall of the layer's attention top-k (its softmax
            weights summed over heads) over scored rows}}``.
        fp4_paths: what wrote the FP4 bytes per layer call, ``{variant name: [...]}``.
        seconds: ``{name: wall seconds}`` (``"shared"``: embedding and the layers before the first global layer).
    """

    length: int
    score_from: int
    nll: dict = field(default_factory=dict)
    argmax_ok: dict = field(default_factory=dict)
    recall: dict = field(default_factory=dict)
    attention_recall: dict = field(default_factory=dict)
    fp4_paths: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)


def _layers(model, h, positions, layers, cache, **extra):
    inner = model.model
    pos = positions[None]
    pe = {t: inner.rotary_emb(h, pos, t) for t in set(inner.config.layer_types)}
    for i in layers:
        h = inner.layers[i](h, attention_mask=None, position_embeddings=pe[inner.config.layer_types[i]],
                            position_ids=pos, past_key_values=cache, **extra)
    return h


def _score(model, h: torch.Tensor, targets: torch.Tensor, normed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position loss and argmax hit of hidden states ``h [1, n, D]`` against ``targets [n]``, chunked.

    ``normed``: ``h`` already went through the final norm (``Gemma3TextModel.forward`` applies it).
    """
    nll, ok = [], []
    for c0 in range(0, h.shape[1], LOSS_CHUNK):
        x = h[:, c0:c0 + LOSS_CHUNK]
        x = x if normed else model.model.norm(x)
        logits = model.lm_head(x)[0].to(torch.float32)
        t = targets[c0:c0 + LOSS_CHUNK]
        nll.append(torch.nn.functional.cross_entropy(logits, t, reduction="none").to(torch.float64))
        ok.append(logits.argmax(-1) == t)
    return torch.cat(nll), torch.cat(ok)


@torch.inference_mode()
def run_sequence(model, ids: torch.Tensor, score_from: int, variants: list[Variant], projection: IndexerProjection,
                 *, store_op: str = "first", recall: bool = True, scorer: str = "torch") -> SequenceResult:
    """Score one token sequence under the dense model and every variant.

    Args:
        model: Gemma 3 loaded with ``attn_implementation = sparse.ATTENTION_NAME``.
        ids: int64 ``[L]`` token ids, ``<bos>`` first.
        score_from: first scored position (``1 <= score_from <= L - 2``); position ``p`` predicts ``ids[p + 1]``.
        variants: sparse variants (format, top-k).
        projection: the indexer: the stand-in's projection or an ``indexer.TrainedIndexer``.
        store_op: which FP4 index keys the store op writes (``"all"``, ``"first"``: the first global
            layer's, once per sequence, ``"none"``); the rest come from its bit-exact oracle.
        recall: measure each format's recall of the exact top-k, and each variant's recall of the layer's
            attention top-k, on the scored rows.
        scorer: ``"torch"`` or ``"paged"`` (FP4 scored by the product's paged scorer; ``sparse.Selection``).

    Raises:
        ValueError: ``ids`` does not start with ``<bos>`` or ``score_from`` is out of range.
    """
    length = ids.shape[0]
    if int(ids[0]) != BOS_ID:
        raise ValueError(f"ids: expected <bos> (id {BOS_ID}) first, got {int(ids[0])}")
    if not 1 <= score_from <= length - 2:
        raise ValueError(f"score_from: expected 1 .. {length - 2}, got {score_from}")
    dev = next(model.parameters()).device
    ids = ids.to(dev)
    install_hidden_hook(model)
    scales = attention_scales(model)
    res = SequenceResult(length, score_from)
    targets = ids[score_from + 1:]
    positions = torch.arange(length, device=dev)
    first, n_layers = GLOBAL_LAYERS[0], model.config.num_hidden_layers
    t0 = time.perf_counter()
    h = model.model.embed_tokens(ids[None])
    h_first = _layers(model, h, positions, range(first), KVCache())
    res.seconds["shared"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    hd = _layers(model, h_first, positions, range(first, n_layers), KVCache())
    res.nll["dense"], res.argmax_ok["dense"] = _score(model, hd[:, score_from:length - 1], targets)
    res.seconds["dense"] = time.perf_counter() - t0
    del hd
    shared: dict = {}
    max_k = max((v.topk for v in variants), default=0)
    for v in variants:
        t0 = time.perf_counter()
        sel = Selection(v.form, v.topk, projection, first, shared, shared_topk=max_k,
                        recall_from=score_from if recall else None, store_op=store_op, scorer=scorer,
                        attention_scale=scales[first] if recall else None)
        hv = _layers(model, h_first, positions, range(first, n_layers), KVCache(), fp4_selection=sel)
        res.nll[v.name], res.argmax_ok[v.name] = _score(model, hv[:, score_from:length - 1], targets)
        res.recall[v.name] = {layer: s / n for layer, (s, n) in sel.recall.items() if n}
        res.attention_recall[v.name] = {layer: s / n for layer, (s, n) in sel.attention_recall.items() if n}
        if sel.fp4_paths:
            res.fp4_paths[v.name] = sel.fp4_paths
        res.seconds[v.name] = time.perf_counter() - t0
    return res


@torch.inference_mode()
def calibrate(model, ids: torch.Tensor) -> IndexerProjection:
    """The stand-in indexer's projection from one dense pass over ``ids`` (a calibration text, not a test window)."""
    dev = next(model.parameters()).device
    ids = ids.to(dev)
    positions = torch.arange(ids.shape[0], device=dev)
    record: dict = {}
    _layers(model, model.model.embed_tokens(ids[None]), positions, range(model.config.num_hidden_layers), KVCache(),
            fp4_record=record)
    return calibrate_projection({i: q for i, (q, _) in record.items()}, {i: k for i, (_, k) in record.items()})


def attention_scales(model) -> dict:
    """``{global layer: its attention's softmax scale}`` (Gemma 3: ``query_pre_attn_scalar ** -0.5``, one value).

    Raises:
        ValueError: the global layers' scales differ (``Selection`` takes one).
    """
    scales = {i: float(model.model.layers[i].self_attn.scaling) for i in GLOBAL_LAYERS}
    if len(set(scales.values())) != 1:
        raise ValueError(f"model: the global layers' attention scales differ ({scales})")
    return scales


@torch.inference_mode()
def record_global_layers(model, ids: torch.Tensor) -> dict:
    """One dense pass over ``ids``: each global layer's ``(query [H, L, D], key [L, D], hidden [L, hidden])``.

    ``query`` and ``key`` are post-RoPE (what the attention reads), ``hidden`` the attention module's input
    (after the layer's input norm); what an indexer is trained on (``indexer.train``).
    """
    dev = next(model.parameters()).device
    ids = ids.to(dev)
    install_hidden_hook(model)
    positions = torch.arange(ids.shape[0], device=dev)
    record: dict = {}
    hidden: dict = {}
    _layers(model, model.model.embed_tokens(ids[None]), positions, range(model.config.num_hidden_layers), KVCache(),
            fp4_record=record, fp4_record_hidden=hidden)
    return {i: (record[i][0], record[i][1], hidden[i]) for i in record}


@torch.inference_mode()
def dense_loss_reference(model, ids: torch.Tensor, score_from: int) -> torch.Tensor:
    """Per-position loss of ``ids`` through ``model``'s own ``forward`` (its masks, its attention), positions ``score_from ..``.

    The independent check of the study's driver: with ``model`` loaded with
    ``transformers``' own ``sdpa`` attention this is the library's dense model.
    """
    dev = next(model.parameters()).device
    ids = ids.to(dev)
    out = model.model(input_ids=ids[None], use_cache=False)
    return _score(model, out.last_hidden_state[:, score_from:ids.shape[0] - 1], ids[score_from + 1:], normed=True)[0]

"""DSA-style sparse attention on a ``transformers`` model, selected by a stand-in indexer over three key formats.

The stand-in indexer (not a trained DSA indexer: Gemma 3 has none) is built
from the model's own post-RoPE attention queries and keys of a global layer:

- **index keys**: the layer's key rows (one KV head, 256 dims), **index
  queries**: its query heads (``H = 4``), both projected to the 128 dims of
  one DSA index key by a fixed orthogonal coordinate projection
  (``IndexerProjection``) and rotated by the 128x128 Hadamard matrix DeepSeek
  applies before quantizing (``workload.rotate_activation``; on queries and
  keys alike, so exact scores do not move);
- **score** ``sum_h w_h relu(q_h . k)`` with constant weights
  ``w_h = H ** -0.5 * 128 ** -0.5`` (DSA's constant factors; the model has no
  weights projection);
- **selection**: a query at position ``p`` attends only to the top-``k`` keys
  by that score among ``0 .. p``; with ``p + 1 <= k`` it keeps every key, as
  SGLang's DSA indexer does.

Why a projection and not two 128-dim rows: Gemma's RoPE (``rotate_half``)
pairs dim ``i`` with dim ``i + 128``, so cutting the 256 dims into two
128-dim rows would split every rotation pair between the rows (each row's dot
product would then depend on absolute position, not only on the distance),
and DSA's score applies ``relu`` to one 128-dim dot product per head, which
two rows would split in two. The projection keeps 64 whole RoPE pairs, so the
index score keeps the property of attention scores that it depends on the
distance between query and key, and each token has exactly one 68-byte FP4
index key, as the product stores it. Which 64 pairs: those with the largest
product of query and key energy on a calibration text
(``calibrate_projection``), a bound on their share of ``q . k``.

Index keys are kept three ways (``FORMATS``):

- ``exact``: the bf16 index keys and bf16 index queries;
- ``fp8``: SGLang's FP8 format, e4m3 with one fp32 scale per key
  (``reference.fp8_quantize_rows`` with ``demo.FP8_KEY_SCALE_FMT``);
- ``fp4``: this project's MXFP4, the bytes written by the store op
  (``ops.quantize.store_index_k``) into a paged cache, or by its bit-exact
  torch oracle ``format.quantize_index_k`` where ``Selection.store_op`` says
  so (the Triton interpreter is slow on the CPU), decoded exactly
  (``format.dequantize_index_k``).

FP8 and FP4 share the e4m3 index queries with the UE8M0 scale folded into the
weights (``demo.quantize_queries``), as SGLang's indexer scores them; the score
is summed in fp32 over the decoded values, the arithmetic of the project's
scorer (``reference.logits_from_keys`` is its fp64 oracle).

On a GPU (``Selection.scorer = "paged"``) the FP4 logits are not decoded and
multiplied in torch: the product's paged scorer (``ops.paged_logits``; the
Hopper kernel on an H200) reads the cache the store op wrote, one query row per
request over the same block table (``paged_index_logits``; heads padded with
zero weights to the scorer's smallest head count). Exact and FP8 stay in torch
(FP8 is SGLang's format emulated as above). On the CPU the same function runs
the paged scorer in the Triton interpreter (tests, tiny sizes).

A trained indexer (``indexer.TrainedIndexer``) plugs in where the projection
does: both give ``queries_for`` and ``keys_for``; the trained one reads the
layer's input hidden states, which ``install_hidden_hook`` passes to the
attention function. Each variant also measures how well its selection matches
the layer's own attention: the recall of the top-k keys by attention weight
summed over heads (``attention_topk``), the target a trained indexer learns.

Attention itself always uses the model's real keys and values: only which
keys a query may read changes. ``register`` adds the attention function
``ATTENTION_NAME`` to ``transformers.AttentionInterface`` and the same name to
``AttentionMaskInterface`` (with ``flash_attention_mask``, which builds no
``L x L`` mask for an unpadded batch): an attention name missing from the mask
registry makes ``transformers`` drop the causal and sliding-window masks
silently. The function applies causality and Gemma's sliding window itself,
query chunk by query chunk, so no ``L x L`` tensor is ever built.

Nothing here imports SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import format as fmt
from ..demo import FP8_KEY_SCALE_FMT, quantize_queries
from ..metrics import topk_recall_rows
from ..pool import allocate_index_k_cache, read_index_k
from ..reference import fp8_dequantize_rows, fp8_quantize_rows
from ..workload import rotate_activation

__all__ = [
    "ATTENTION_NAME",
    "FORMATS",
    "QUERY_CHUNK",
    "IndexerProjection",
    "calibrate_projection",
    "index_keys",
    "store_op_bytes",
    "index_logits",
    "paged_index_logits",
    "attention_topk",
    "install_hidden_hook",
    "Selection",
    "KVCache",
    "register",
    "sparse_attention",
]

#: The attention name registered with ``transformers``.
ATTENTION_NAME = "fp4_indexer_sparse"
#: Index-key formats, in table order.
FORMATS = ("exact", "fp8", "fp4")
#: Queries per attention chunk.
QUERY_CHUNK = 512
_PAIRS = fmt.INDEX_HEAD_DIM // 2  # RoPE pairs kept by the projection


@dataclass(frozen=True)
class IndexerProjection:
    """A fixed orthogonal coordinate projection of 256-dim heads onto 128 index dims, per global layer.

    Attributes:
        pairs: ``{layer: 64 pair indices in 0..127}``; the index vector of a head ``x``
            is ``x[pairs] ++ x[pairs + 128]`` (dim ``j`` and ``j + 64`` form one RoPE pair).
        head_dim: the model's head dim (256).
    """

    pairs: dict[int, tuple[int, ...]]
    head_dim: int = 256

    def dims(self, layer: int, device=None) -> torch.Tensor:
        """int64 ``[128]``: the head dims kept for ``layer``, in index order."""
        p = torch.tensor(self.pairs[layer], dtype=torch.int64, device=device)
        return torch.cat([p, p + self.head_dim // 2])

    def project(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """``x [..., 256]`` -> Hadamard-rotated ``[..., 128]`` in ``x``'s dtype (DSA's pre-quantization rotation)."""
        return rotate_activation(x.index_select(-1, self.dims(layer, x.device)))

    def queries_for(self, layer: int, query: torch.Tensor, hidden: torch.Tensor | None = None,
                    positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Index queries and head weights of a chunk: ``(query [H, C, 256] projected -> [C, H, 128], fp32 [C, H])``.

        The weights are DSA's constant factors ``H ** -0.5 * 128 ** -0.5``; ``hidden`` and ``positions`` are
        not used (the stand-in reads the attention's own queries).
        """
        qi = self.project(layer, query.transpose(0, 1))
        w = torch.full(qi.shape[:2], (qi.shape[1] ** -0.5) * (fmt.INDEX_HEAD_DIM ** -0.5), dtype=torch.float32,
                       device=qi.device)
        return qi, w

    def keys_for(self, layer: int, key: torch.Tensor, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Index keys of a sequence: ``key [S, 256]`` -> rotated ``[S, 128]`` in ``key``'s dtype (``hidden`` unused)."""
        return self.project(layer, key)


def calibrate_projection(queries: dict[int, torch.Tensor], keys: dict[int, torch.Tensor]) -> IndexerProjection:
    """Keep the 64 RoPE pairs with the largest query-energy x key-energy product, per layer.

    Args:
        queries: ``{layer: [H, T, 256]}`` post-RoPE queries of a calibration text.
        keys: ``{layer: [T, 256]}`` post-RoPE keys of the same text.

    Returns:
        The projection; pairs listed in increasing order.

    Raises:
        ValueError: a head dim that is not twice 128 (the index key).
    """
    pairs = {}
    head_dim = None
    for layer, q in queries.items():
        k = keys[layer]
        head_dim = q.shape[-1]
        if head_dim != 2 * fmt.INDEX_HEAD_DIM:
            raise ValueError(f"queries: expected head dim {2 * fmt.INDEX_HEAD_DIM}, got {head_dim}")
        half = head_dim // 2
        qe = q.float().pow(2).reshape(-1, head_dim).mean(0)
        ke = k.float().pow(2).reshape(-1, head_dim).mean(0)
        energy = (qe[:half] + qe[half:]) * (ke[:half] + ke[half:])
        top = torch.topk(energy, _PAIRS).indices.sort().values
        pairs[layer] = tuple(int(i) for i in top)
    return IndexerProjection(pairs, head_dim or 256)


def index_keys(keys: torch.Tensor, form: str, *, use_store_op: bool = True) -> tuple[torch.Tensor, str]:
    """Index keys as one format keeps them, decoded to fp32 for scoring.

    Args:
        keys: bf16 ``[S, 128]`` rotated index keys.
        form: ``"exact"``, ``"fp8"`` or ``"fp4"``.
        use_store_op: FP4 bytes written by the store op (else by its bit-exact oracle
            ``format.quantize_index_k``; the Triton interpreter takes about 1.5 ms per key on a CPU).

    Returns:
        ``(fp32 [S, 128], path)``: ``path`` says what wrote the FP4 bytes (``"store op"`` or
        ``"format.quantize_index_k"``; ``"-"`` for exact and FP8).

    Raises:
        ValueError: unknown ``form``.
    """
    if form == "exact":
        return keys.to(torch.float32), "-"
    if form == "fp8":
        return fp8_dequantize_rows(*fp8_quantize_rows(keys, FP8_KEY_SCALE_FMT)), "-"
    if form != "fp4":
        raise ValueError(f"form: expected one of {FORMATS}, got {form!r}")
    if use_store_op:
        payload, scales = store_op_bytes(keys)
        return fmt.dequantize_index_k(payload, scales), "store op"
    return fmt.dequantize_index_k(*fmt.quantize_index_k(keys)), "format.quantize_index_k"


def store_op_bytes(keys: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP4 bytes the store op writes for ``keys``: stored into a paged cache with a shuffled block table, read back.

    Returns:
        ``(payload uint8 [S, 64], scales uint8 [S, 4])``.
    """
    cache, table, slots = store_op_cache(keys, seed)
    return read_index_k(cache, slots)


def store_op_cache(keys: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``keys`` (bf16 ``[S, 128]``) written by the store op into a paged cache over a seeded shuffled block table.

    Returns:
        ``(cache uint8 [pages, page_size * 68], block_table int32 [1, pages], slots int64 [S])`` on ``keys``' device.
    """
    from ..demo import request_slots, shuffled_block_table
    from ..ops.quantize import store_index_k

    n = keys.shape[0]
    table = shuffled_block_table(1, n, seed, device=keys.device)
    slots = request_slots(table, n)
    cache = allocate_index_k_cache(table.numel(), device=keys.device)
    store_index_k(keys.contiguous(), cache, slots)
    return cache, table, slots


def paged_index_logits(q: torch.Tensor, w: torch.Tensor, cache: torch.Tensor, block_table: torch.Tensor,
                       positions: torch.Tensor) -> torch.Tensor:
    """The product's paged scorer over one sequence's FP4 cache, one request per query row.

    Row ``r`` sees keys ``0 .. positions[r]`` (the block table's first ``positions[r] + 1`` slots); heads below
    the scorer's smallest supported count are padded with zero queries and zero weights (``relu(0) * 0`` adds
    nothing).

    Args:
        q: float8_e4m3fn ``[C, H, 128]`` index queries, ``H <= 128``.
        w: fp32 ``[C, H]`` head weights (query scale folded in, ``demo.quantize_queries``).
        cache: uint8 FP4 index-key cache the store op wrote (``store_op_cache``).
        block_table: int32 ``[1, pages]`` the sequence's pages.
        positions: int64 ``[C]`` query positions.

    Returns:
        fp32 ``[C, max(positions) + 1]``, ``-inf`` past each row's position.

    Raises:
        ValueError: more heads than the scorer takes (``ops.paged_logits.SUPPORTED_HEADS``).
    """
    from ..ops.paged_logits import SUPPORTED_HEADS, paged_logits

    c, h, d = q.shape
    heads = next((x for x in SUPPORTED_HEADS if x >= h), None)
    if heads is None:
        raise ValueError(f"q: {h} heads, the paged scorer takes at most {SUPPORTED_HEADS[-1]}")
    if heads != h:
        q = torch.cat([q, torch.zeros(c, heads - h, d, dtype=q.dtype, device=q.device)], 1)
        w = torch.cat([w, torch.zeros(c, heads - h, dtype=w.dtype, device=w.device)], 1)
    width = int(positions.max()) + 1
    lens = (positions + 1).to(torch.int32)
    table = block_table[:1].expand(c, -1).contiguous()
    out = paged_logits(q.contiguous(), w.to(torch.float32).contiguous(), cache, table, lens, width=width)
    cols = torch.arange(width, device=out.device)
    return out.float().masked_fill(cols[None, :] > positions[:, None], float("-inf"))


def attention_topk(query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, k: int,
                   scale: float) -> torch.Tensor:
    """The top-``k`` keys of each query row by the layer's attention weight, summed over its heads.

    Args:
        query: ``[H, C, D]`` post-RoPE queries; key: ``[S, D]`` post-RoPE keys (one KV head).
        positions: int64 ``[C]`` query positions (< S); row ``r`` attends to keys ``0 .. positions[r]``.
        k: keys per row (at most ``positions.min() + 1``).
        scale: the attention's softmax scale.

    Returns:
        int64 ``[C, k]`` key indices, best first.
    """
    end = int(positions.max()) + 1
    logits = torch.einsum("hcd,sd->hcs", query.float(), key[:end].float()) * scale
    cols = torch.arange(end, device=key.device)
    logits = logits.masked_fill(cols[None, None, :] > positions[None, :, None], float("-inf"))
    return torch.topk(torch.softmax(logits, -1).sum(0), k, dim=1).indices


def index_logits(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``sum_h w[r, h] relu(q[r, h] . k_j)`` for ``j <= positions[r]``, ``-inf`` beyond; fp32.

    Args:
        q: fp32 ``[C, H, 128]`` index queries (decoded).
        w: fp32 ``[C, H]`` weights.
        keys: fp32 ``[S, 128]`` index keys (decoded).
        positions: int64 ``[C]`` query positions (< S).

    Returns:
        fp32 ``[C, S]``.
    """
    c, h, d = q.shape
    scores = torch.relu((q.reshape(c * h, d) @ keys.t()).view(c, h, -1))
    out = torch.einsum("chs,ch->cs", scores, w)
    cols = torch.arange(keys.shape[0], device=keys.device)
    return out.masked_fill(cols[None, :] > positions[:, None], float("-inf"))


@dataclass
class Selection:
    """One sparse-attention variant: which index-key format selects, and how many keys (``topk``).

    The attention function asks it for each global layer's key mask, chunk by
    chunk. State shared across variants of one sequence lives in ``shared``
    (``{(layer, form): top-k indices}`` for ``shared_layer``, whose inputs are
    the same in every variant), measured recall in ``recall``.

    Attributes:
        form: ``"exact"``, ``"fp8"`` or ``"fp4"``.
        topk: keys per query (every key up to ``topk`` tokens).
        projection: the stand-in indexer's projection.
        shared_layer: the first global layer (its index keys and top-k are computed once per sequence).
        shared: cache for ``shared_layer``, owned by the caller, one per sequence.
        shared_topk: top-k width cached for ``shared_layer`` (the largest ``topk`` of the study).
        recall_from: rows at positions ``>= recall_from`` get a recall against exact selection.
        store_op: which FP4 layer calls use the store op: ``"all"``, ``"first"`` (``shared_layer``
            only, once per sequence) or ``"none"`` (all from ``format.quantize_index_k``).
        recall: ``{layer: [sum of recalls, rows]}``.
        fp4_paths: what wrote the FP4 bytes, per layer call.
        scorer: ``"torch"`` (FP4 keys decoded, scored in fp32 by ``index_logits``) or ``"paged"`` (the FP4 cache
            the store op wrote, scored by the product's paged scorer, ``paged_index_logits``; every FP4 layer
            call then uses the store op).
        attention_scale: the attention's softmax scale; when set, ``attention_recall`` measures the recall of
            the attention's own top-k (``attention_topk``) on the recall rows.
        attention_recall: ``{layer: [sum of recalls, rows]}``.
    """

    form: str
    topk: int
    projection: IndexerProjection
    shared_layer: int
    shared: dict = field(default_factory=dict)
    shared_topk: int = 0
    recall_from: int | None = None
    store_op: str = "first"
    recall: dict = field(default_factory=dict)
    fp4_paths: list = field(default_factory=list)
    scorer: str = "torch"
    attention_scale: float | None = None
    attention_recall: dict = field(default_factory=dict)
    _layer: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.scorer not in ("torch", "paged"):
            raise ValueError(f"scorer: expected 'torch' or 'paged', got {self.scorer!r}")

    def _queries(self, layer: int, query: torch.Tensor, form: str, hidden: torch.Tensor | None = None,
                 positions: torch.Tensor | None = None, raw: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Index queries (fp32 decoded; e4m3 with ``raw`` for FP8 / FP4) and weights of a chunk ``[C, H, 128]``."""
        qi, w = self.projection.queries_for(layer, query, hidden, positions)
        if form == "exact":
            return qi.to(torch.float32), w
        q8, w8 = quantize_queries(qi, w)
        return (q8 if raw else q8.to(torch.float32)), w8

    def _keys(self, layer: int, key: torch.Tensor, form: str, hidden: torch.Tensor | None = None) -> torch.Tensor:
        tag = (layer, "keys", form)
        cache = self.shared if layer == self.shared_layer else self._layer
        if tag not in cache:
            ki = self.projection.keys_for(layer, key, hidden)
            if form == "fp4" and self.scorer == "paged":
                paged, table, slots = store_op_cache(ki, seed=layer)
                cache[(layer, "paged", form)] = (paged, table)
                cache[tag] = fmt.dequantize_index_k(*read_index_k(paged, slots))
                cache[(layer, "path", form)] = "store op, paged scorer"
            else:
                use = self.store_op == "all" or (self.store_op == "first" and layer == self.shared_layer)
                cache[tag], cache[(layer, "path", form)] = index_keys(ki, form, use_store_op=use)
        self._note_path(layer, form)
        return cache[tag]

    def _note_path(self, layer: int, form: str) -> None:
        """Record once per layer which path made this variant's FP4 index keys (``fp4_paths``)."""
        if form == "fp4" and (layer, "seen") not in self._layer:
            self._layer[(layer, "seen")] = True
            cache = self.shared if layer == self.shared_layer else self._layer
            self.fp4_paths.append(f"layer {layer}: {cache[(layer, 'path', form)]}")

    def _topk(self, layer: int, form: str, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor,
              width: int, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Top-``width`` indices (best first) of each row under ``form`` over keys ``0 .. positions[-1]``."""
        end = int(positions[-1]) + 1
        tag = (layer, "top", form, int(positions[0]), end)
        if layer == self.shared_layer and tag in self.shared and self.shared[tag].shape[1] >= width:
            self._note_path(layer, form)  # keys and top-k from an earlier variant of this sequence
            return self.shared[tag][:, :width].long()
        keys = self._keys(layer, key, form, hidden)
        if form == "fp4" and self.scorer == "paged":
            cache = self.shared if layer == self.shared_layer else self._layer
            paged, table = cache[(layer, "paged", form)]
            q8, w8 = self._queries(layer, query, form, hidden, positions, raw=True)
            logits = paged_index_logits(q8, w8, paged, table, positions)
        else:
            q, w = self._queries(layer, query, form, hidden, positions)
            logits = index_logits(q, w, keys[:end], positions)
        keep = max(width, self.shared_topk) if layer == self.shared_layer else width
        keep = min(keep, logits.shape[1])
        top = torch.topk(logits, keep, dim=1).indices
        if layer == self.shared_layer:
            self.shared[tag] = top.to(torch.int32)
        return top[:, :width]

    def key_mask(self, layer: int, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor,
                 hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Which keys each query of a chunk reads: bool ``[C, S]``.

        Args:
            layer: the global layer.
            query: bf16 ``[H, C, 256]`` post-RoPE queries of the chunk.
            key: bf16 ``[S, 256]`` post-RoPE keys ``0 .. S - 1`` of the whole sequence.
            positions: int64 ``[C]`` the chunk's query positions, increasing by one.
            hidden: ``[S, D]`` the layer's input hidden states (a trained indexer reads them), or None.

        Returns:
            bool ``[C, positions[-1] + 1]``.
        """
        s = int(positions[-1]) + 1
        cols = torch.arange(s, device=key.device)
        causal = cols[None, :] <= positions[:, None]
        k = min(self.topk, s)
        top = self._topk(layer, self.form, query, key, positions, k, hidden)
        mask = torch.zeros_like(causal).scatter_(1, top, True) & causal
        full = positions + 1 <= self.topk
        mask[full] = causal[full]
        rows = (positions >= self.recall_from) & ~full if self.recall_from is not None else None
        if rows is not None and self.form != "exact" and bool(rows.any()):
            exact = self._topk(layer, "exact", query[:, rows], key, positions[rows], k, hidden) \
                if layer != self.shared_layer else self._topk(layer, "exact", query, key, positions, k, hidden)[rows]
            self._add(self.recall, layer, topk_recall_rows(top[rows], exact))
        if rows is not None and self.attention_scale is not None and bool(rows.any()):
            want = attention_topk(query[:, rows], key, positions[rows], k, self.attention_scale)
            self._add(self.attention_recall, layer, topk_recall_rows(top[rows], want))
        return mask

    @staticmethod
    def _add(acc: dict, layer: int, recall: torch.Tensor) -> None:
        entry = acc.setdefault(layer, [0.0, 0])
        entry[0] += float(recall.sum())
        entry[1] += int(recall.numel())


class KVCache:
    """The one cache method ``transformers``' attention modules call, ``update``, for one pass over a sequence.

    Each layer is called once per pass with every position, so ``update``
    returns the keys and values it is given (a fresh cache per pass).
    """

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Return the layer's keys and values, as ``Cache.update`` does on a cache that starts empty."""
        return key_states, value_states


def sparse_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                     **kwargs):
    """The registered attention function: causal, sliding-window or top-k sparse, chunk by chunk.

    Args (as ``transformers`` passes them to an ``AttentionInterface`` function):
        module: the attention module (``layer_idx``, ``scaling``).
        query: ``[1, Hq, Lq, D]``; key, value: ``[1, Hkv, S, D]`` with key ``j`` at position ``j``.
        attention_mask: must be None (padding is not supported; causality and the window are applied here).
        sliding_window: the layer's window (Gemma: a key ``j`` is visible to ``p`` when ``p - W < j <= p``), or None.
        kwargs: ``position_ids`` ``[1, Lq]`` (contiguous), ``fp4_selection`` (a ``Selection``, or None: dense),
            ``fp4_record`` (a dict: each global layer's ``(query [Hq, Lq, D], key [S, D])`` is put there),
            ``fp4_record_hidden`` (a dict: each global layer's input hidden states ``[S, hidden]``),
            ``fp4_hidden`` (``[1, S, hidden]``, passed by ``install_hidden_hook``).

    Returns:
        ``(out [1, Lq, Hq, D], None)``.

    Raises:
        ValueError: a padding mask, a batch above 1, or positions that do not end at the last key.
    """
    if attention_mask is not None:
        raise ValueError("attention_mask: padded batches are not supported by the sparse-attention study")
    if query.shape[0] != 1:
        raise ValueError(f"query: expected batch 1, got {query.shape[0]}")
    positions = kwargs["position_ids"].reshape(-1).to(query.device)
    s = key.shape[2]
    if int(positions[-1]) != s - 1:
        raise ValueError(f"position_ids: the last query sits at {int(positions[-1])}, the keys end at {s - 1}")
    selection = kwargs.get("fp4_selection")
    record = kwargs.get("fp4_record")
    if record is not None and not sliding_window:
        record[module.layer_idx] = (query[0], key[0, 0])
    hidden = kwargs.get("fp4_hidden")
    hidden = hidden[0] if hidden is not None else None
    if kwargs.get("fp4_record_hidden") is not None and not sliding_window:
        if hidden is None:
            raise ValueError("fp4_record_hidden: no hidden states passed (call install_hidden_hook first)")
        kwargs["fp4_record_hidden"][module.layer_idx] = hidden
    scale = module.scaling if scaling is None else scaling
    out = torch.empty_like(query)
    first = int(positions[0])
    # Chunks aligned to absolute positions, so that variants starting at different positions share chunks.
    bounds = [0] + list(range(-first % QUERY_CHUNK or QUERY_CHUNK, query.shape[2], QUERY_CHUNK)) + [query.shape[2]]
    for c0, c1 in zip(bounds[:-1], bounds[1:]):
        if c1 <= c0:
            continue
        pos = positions[c0:c1]
        end = int(pos[-1]) + 1
        lo = max(0, int(pos[0]) - sliding_window + 1) if sliding_window else 0
        cols = torch.arange(lo, end, device=query.device)
        if sliding_window:
            mask = (cols[None, :] <= pos[:, None]) & (cols[None, :] > pos[:, None] - sliding_window)
        elif selection is not None:
            mask = selection.key_mask(module.layer_idx, query[0, :, c0:c1], key[0, 0], pos, hidden)
        else:
            mask = cols[None, :] <= pos[:, None]
        out[:, :, c0:c1] = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, c0:c1], key[:, :, lo:end], value[:, :, lo:end], attn_mask=mask[None, None],
            scale=scale, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register ``sparse_attention`` as ``ATTENTION_NAME`` with ``AttentionInterface`` and ``AttentionMaskInterface``.

    Returns:
        ``ATTENTION_NAME`` (pass it as ``attn_implementation``).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(ATTENTION_NAME, sparse_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, flash_attention_mask)
    return ATTENTION_NAME


def _pass_hidden(module, args, kwargs):
    """Forward pre-hook: hand the attention module's input hidden states to the attention function."""
    if kwargs.get("fp4_selection") is not None or kwargs.get("fp4_record_hidden") is not None:
        kwargs["fp4_hidden"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    return args, kwargs


def install_hidden_hook(model) -> None:
    """Pass each full-attention layer's input hidden states to the attention function as ``fp4_hidden``.

    A forward pre-hook on the attention module of every layer whose ``config.layer_types`` entry is
    ``"full_attention"``, active only in passes given ``fp4_selection`` or ``fp4_record_hidden``; installed once.
    """
    inner = model.model
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        if inner.config.layer_types[i] == "full_attention" and not getattr(attn, "_fp4_hidden_hook", False):
            attn.register_forward_pre_hook(_pass_hidden, with_kwargs=True)
            attn._fp4_hidden_hook = True

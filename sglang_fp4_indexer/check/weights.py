"""The weights a DeepSeek-V3.2 / GLM-5.x model puts on each GPU, from its ``config.json`` alone (no SGLang import).

Each tensor's shape follows from the config's sizes as SGLang 0.5.23 builds the model (``models/deepseek_v2.py``,
``layers/attention/dsa/dsa_indexer.py``, ``models/deepseek_nextn.py``): the embeddings and LM head, per layer the
MLA projections (``q_a``, ``q_b``, ``kv_a``, ``kv_b``, ``o``), the lightning indexer (``wq_b``, ``wk``, its
LayerNorm, ``weights_proj``), the dense MLP of the first ``first_k_dense_replace`` layers, the routed and shared
experts and the router of the others, and the multi-token-prediction (MTP) layer(s). With a ``quantization_config``
of ``quant_method: fp8`` and a ``weight_block_size``, the linear layers SGLang quantizes are one byte per weight plus
one fp32 scale per block; the embeddings, LM head, router, indexer ``weights_proj``, MTP ``eh_proj`` and norms stay
in bf16.

How the weights split over the GPUs (SGLang's parallel groups): ``q_b``, ``kv_b`` and ``o`` over the attention TP
group (TP / DP with DP attention); ``q_a``, ``kv_a``, the indexer, the router and the norms replicated; the dense
MLP and the experts over TP (expert parallelism splits the experts over the same ranks); the shared experts over TP,
or replicated with an all-to-all MoE backend (``--moe-a2a-backend`` other than ``none``); the embedding over the
attention TP group; the LM head over TP (the attention TP group with ``--enable-dp-lm-head``). The MTP layer is
loaded only with speculative decoding (it is the draft model); it shares the target's embedding and LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Parallel", "WeightBytes", "parameter_count", "weight_bytes_per_gpu", "WEIGHT_KEYS"]

#: Config keys the shapes need, and what each is; a missing one is named in the error.
WEIGHT_KEYS = {
    "hidden_size": "the model width",
    "vocab_size": "the vocabulary size",
    "num_attention_heads": "the attention head count",
    "kv_lora_rank": "the MLA KV rank",
    "qk_nope_head_dim": "the MLA non-RoPE query/key dims",
    "qk_rope_head_dim": "the MLA RoPE dims",
    "v_head_dim": "the MLA value dims",
    "num_hidden_layers": "the layer count",
    "intermediate_size": "the dense MLP width",
    "moe_intermediate_size": "the expert MLP width",
    "n_routed_experts": "the routed expert count",
}
_BF16 = 2


@dataclass(frozen=True)
class Parallel:
    """How SGLang splits the model over GPUs.

    Attributes:
        tp: tensor-parallel size (``--tp-size``), >= 1.
        attn_dp: DP-attention size (``--dp-size`` with ``--enable-dp-attention``; 1 without), dividing ``tp``.
        dp_lm_head: ``--enable-dp-lm-head`` (the LM head over the attention TP group).
        a2a_moe: an all-to-all MoE backend (``--moe-a2a-backend`` not ``none``): shared experts replicated.
        mtp: speculative decoding loads the MTP layer(s) as the draft model.
    """

    tp: int = 1
    attn_dp: int = 1
    dp_lm_head: bool = False
    a2a_moe: bool = False
    mtp: bool = False

    @property
    def attn_tp(self) -> int:
        """The attention TP group's size: ``tp // attn_dp``."""
        return self.tp // self.attn_dp


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes on one GPU, in bytes, by part (``total`` is their sum)."""

    embeddings: float
    attention: float
    indexer: float
    dense_mlp: float
    experts: float
    mtp: float
    dtype: str

    @property
    def total(self) -> float:
        """All weight bytes on one GPU."""
        return self.embeddings + self.attention + self.indexer + self.dense_mlp + self.experts + self.mtp


def _int(cfg: dict, key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ValueError(f"model: config.json lacks {key} ({WEIGHT_KEYS.get(key, key)}), which the weight size "
                         "needs; give the model's complete config.json, or --memory-gib")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"model: config.json: {key} must be a non-negative integer, got {value!r}")
    return value


def _fp8_block(cfg: dict) -> tuple[int, int] | None:
    """The FP8 weight block ``(rows, cols)`` of a block-quantized checkpoint, else None (bf16 weights).

    Raises:
        ValueError: a ``quantization_config`` this module cannot size (another method, or FP8 without blocks).
    """
    q = cfg.get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method") if isinstance(q, dict) else None
    block = q.get("weight_block_size") if isinstance(q, dict) else None
    if method != "fp8" or not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0
                                                                                    for b in block)):
        raise ValueError(f"model: config.json's quantization_config {q!r}: the weight size is computed for bf16 "
                         "or block-quantized FP8 (quant_method fp8 with weight_block_size) only; give --memory-gib")
    return block[0], block[1]


def _linear(n_out: int, n_in: int, block: tuple[int, int] | None) -> int:
    """Bytes of one ``n_out x n_in`` linear weight: bf16, or FP8 plus one fp32 scale per block."""
    if block is None:
        return n_out * n_in * _BF16
    return n_out * n_in + -(-n_out // block[0]) * -(-n_in // block[1]) * 4


def _shapes(cfg: dict) -> dict:
    """Every tensor group's ``(elements, bytes)`` per layer or model, keyed by part; see the module text."""
    h, vocab = _int(cfg, "hidden_size"), _int(cfg, "vocab_size")
    heads, kv_rank = _int(cfg, "num_attention_heads"), _int(cfg, "kv_lora_rank")
    nope, rope, v = _int(cfg, "qk_nope_head_dim"), _int(cfg, "qk_rope_head_dim"), _int(cfg, "v_head_dim")
    q_rank = cfg.get("q_lora_rank")
    block = _fp8_block(cfg)

    def lin(n_out, n_in, quantized=True):
        return n_out * n_in, _linear(n_out, n_in, block if quantized else None)

    def norm(n):
        return n, n * _BF16

    s = {}
    if q_rank:
        s["q_a"], s["q_a_norm"] = lin(q_rank, h), norm(q_rank)
        s["q_b"] = lin(heads * (nope + rope), q_rank)
    else:
        s["q_b"] = lin(heads * (nope + rope), h)  # q_proj: over the attention TP group like q_b
    s["kv_a"], s["kv_a_norm"] = lin(kv_rank + rope, h), norm(kv_rank)
    s["kv_b"], s["o"] = lin(heads * (nope + v), kv_rank), lin(h, heads * v)
    s["layer_norms"] = norm(2 * h)
    if cfg.get("index_topk") is not None:
        n_idx, d_idx = _int(cfg, "index_n_heads"), _int(cfg, "index_head_dim")
        s["indexer"] = tuple(map(sum, zip(lin(n_idx * d_idx, q_rank or h), lin(d_idx, h), norm(2 * d_idx),
                                          lin(n_idx, h, quantized=False))))
    s["dense_mlp"] = lin(3 * _int(cfg, "intermediate_size"), h)
    expert = lin(3 * _int(cfg, "moe_intermediate_size"), h)
    n_routed, n_shared = _int(cfg, "n_routed_experts"), _int(cfg, "n_shared_experts", 0)
    s["routed"] = (n_routed * expert[0], n_routed * expert[1])
    s["shared"] = (n_shared * expert[0], n_shared * expert[1])
    s["router"] = (n_routed * h + n_routed, n_routed * h * _BF16 + n_routed * 4)  # weight bf16, bias fp32
    s["embedding"] = lin(vocab, h, quantized=False)
    s["mtp_extra"] = tuple(map(sum, zip(lin(h, 2 * h, quantized=False), norm(3 * h))))  # eh_proj, enorm/hnorm/head norm
    return s


def _layer_kinds(cfg: dict) -> tuple[int, int]:
    """``(dense layers, MoE layers)`` of the main model: MoE from ``first_k_dense_replace`` every ``moe_layer_freq``."""
    layers = _int(cfg, "num_hidden_layers")
    first, freq = _int(cfg, "first_k_dense_replace", 0), max(_int(cfg, "moe_layer_freq", 1), 1)
    moe = sum(1 for i in range(layers) if i >= first and i % freq == 0)
    return layers - moe, moe


def parameter_count(cfg: dict, *, include_mtp: bool = False) -> int:
    """The model's parameter count from its config (FP8 block scales not counted).

    With ``include_mtp`` the ``num_nextn_predict_layers`` MTP layers are added as a checkpoint stores them: each a
    MoE decoder layer, its ``eh_proj`` and norms, and its own copies of the embedding and LM head.

    Raises:
        ValueError: the config lacks a size key (``WEIGHT_KEYS``) or holds a quantization this module cannot size.
    """
    s = _shapes(cfg)
    dense, moe = _layer_kinds(cfg)
    attn = sum(s[k][0] for k in ("q_a", "q_a_norm", "q_b", "kv_a", "kv_a_norm", "kv_b", "o", "layer_norms", "indexer")
               if k in s)
    moe_layer = attn + s["routed"][0] + s["shared"][0] + s["router"][0]
    total = 2 * s["embedding"][0] + cfg["hidden_size"] + dense * (attn + s["dense_mlp"][0]) + moe * moe_layer
    if include_mtp:
        total += _int(cfg, "num_nextn_predict_layers", 0) * (moe_layer + s["mtp_extra"][0] + 2 * s["embedding"][0])
    return total


def weight_bytes_per_gpu(cfg: dict, par: Parallel) -> WeightBytes:
    """Weight bytes SGLang holds on each GPU for this model and parallel layout (see the module text).

    Raises:
        ValueError: the config lacks a size key (``WEIGHT_KEYS``), holds a quantization this module cannot size,
            or ``par`` is not a layout SGLang accepts (sizes below 1, a DP-attention size not dividing TP).
    """
    if par.tp < 1 or par.attn_dp < 1 or par.tp % par.attn_dp:
        raise ValueError(f"--sglang-args: --dp-size {par.attn_dp} with DP attention must divide --tp-size {par.tp}")
    s = _shapes(cfg)
    dense, moe = _layer_kinds(cfg)
    tp, atp = par.tp, par.attn_tp
    attn = (sum(s[k][1] for k in ("q_a", "q_a_norm", "kv_a", "kv_a_norm", "layer_norms") if k in s)
            + (s["q_b"][1] + s["kv_b"][1] + s["o"][1]) / atp)
    indexer = s["indexer"][1] if "indexer" in s else 0
    shared = s["shared"][1] if par.a2a_moe else s["shared"][1] / tp
    moe_mlp = s["routed"][1] / tp + shared + s["router"][1]
    embeddings = s["embedding"][1] / atp + s["embedding"][1] / (atp if par.dp_lm_head else tp) + cfg["hidden_size"] * 2
    layers = dense + moe
    mtp = 0.0
    if par.mtp:
        mtp = _int(cfg, "num_nextn_predict_layers", 0) * (attn + indexer + moe_mlp + s["mtp_extra"][1])
    return WeightBytes(embeddings=embeddings, attention=layers * attn, indexer=layers * indexer,
                       dense_mlp=dense * s["dense_mlp"][1] / tp, experts=moe * moe_mlp, mtp=mtp,
                       dtype="FP8 with 128x128-block scales" if _fp8_block(cfg) == (128, 128)
                       else ("FP8 block-quantized" if _fp8_block(cfg) else "bf16"))

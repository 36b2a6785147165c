"""The gate: decide whether the FP4 index-key cache can serve a deployment.

``decide(model, server, device) -> Decision`` is a pure function of three
fact records, so it is deterministic and gives the same
answer on every rank that sees the same configuration. The SGLang plugin
(``sglang_plugin/facts.py``) fills the records from SGLang's objects; the
``check`` command fills them from a Hugging Face ``config.json``. Nothing here
imports SGLang.

Enabled only when the user asked for it (``--enable-fp4-indexer``) and all of
these hold: a DeepSeek Sparse Attention model (SGLang's ``is_deepseek_dsa``),
``index_head_dim == 128``, an index head count the paged scorer supports
(``ops.paged_logits.SUPPORTED_HEADS``), a 64-token index page, ``index_kpool
== 1``, a CUDA GPU with FP8 MMA (compute capability >= 8.9: Ada, Hopper,
Blackwell), and none of the parallel or cache features the FP4 layout does not
handle yet (prefill context parallelism, KV sharding, HiSparse, the hierarchical cache or PD disaggregation
together with decode context parallelism, HiCache storage backends, hybrid KV pools, unified memory pools,
external KV stores). The hierarchical cache (host memory) and PD disaggregation
are served: SGLang's host pool holds 68-byte tokens, and both PD servers must
use the same index-key format (checked when they first connect). Every refusal names all the reasons that apply and the
fix; SGLang then keeps its FP8 indexer. ``report`` logs one line per process
(rank 0 only): the active line, or one warning.

Decode context parallelism (``--dcp-size W > 1``) is served in one of two
modes (``Decision.dcp_mode``, ``sglang_fp4_indexer.dcp``): ``"replicated"``
(every rank keeps the whole FP4 index, SGLang's layout; the default) or, with
``--fp4-indexer-dcp-shard``, ``"sharded"`` (each rank keeps the keys of the
slots it owns; decode exchanges top-k candidates, prefill stages keys).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

__all__ = [
    "FP4_INDEX_PAGE_SIZE",
    "MIN_CUDA_CAPABILITY",
    "INTERLEAVED_INDEXER_ARCHS",
    "INDEXER_FUSION_ENV",
    "ModelFacts",
    "ServerFacts",
    "DeviceFacts",
    "Decision",
    "supported_heads",
    "index_key_rotation",
    "dcp_mode_for",
    "decide",
    "report",
    "reset_reports",
]

logger = logging.getLogger("sglang_fp4_indexer")

#: Name of this plugin's entry point in SGLang's ``sglang.srt.plugins`` group (what ``SGLANG_PLUGINS`` lists).
ENTRY_POINT_NAME = "fp4_indexer"

#: Tokens per page of the index-key cache the FP4 path serves.
FP4_INDEX_PAGE_SIZE = 64
#: Smallest CUDA compute capability with FP8 (e4m3) MMA.
MIN_CUDA_CAPABILITY = (8, 9)
#: DSA architectures whose SGLang 0.5.23 model builds the indexer with interleaved RoPE whatever the
#: config says (``models/dots3_common/modeling.py``: ``is_neox_style=False``).
INTERLEAVED_INDEXER_ARCHS = frozenset({"Dots3NoteForCausalLM", "Dots3NoteForCausalLMNextN"})
#: SGLang's environment switch to its unfused DSA indexer (which applies the Hadamard rotation).
INDEXER_FUSION_ENV = "SGLANG_DISABLE_DSA_INDEXER_FUSION"


@dataclass(frozen=True)
class ModelFacts:
    """What the gate needs to know about the model.

    Attributes:
        architecture: ``architectures[0]`` of the HF config, or None.
        is_dsa: SGLang's ``is_deepseek_dsa(config)``.
        is_deepseek_v4: SGLang's ``is_deepseek_v4(config)``.
        index_head_dim: indexer head dimension (``index_head_dim``), None if absent.
        index_n_heads: index heads ``H`` (``index_n_heads``), None if absent.
        index_kpool: tokens pooled per index key (``index_kpool``, default 1).
        indexer_rope_interleave: the indexer's RoPE is interleaved, so SGLang
            builds its ``Indexer`` with ``is_neox_style=False`` (the config's
            ``indexer_rope_interleave``, e.g. GLM-5.2, or an architecture whose
            indexer always is: ``INTERLEAVED_INDEXER_ARCHS``). On CUDA SGLang
            then runs its fused indexer kernels, which do not apply the Hadamard
            rotation to the index queries and keys; with the FP4 cache the
            plugin's hooks apply it (``index_key_rotation``).
    """

    architecture: str | None
    is_dsa: bool
    is_deepseek_v4: bool = False
    index_head_dim: int | None = None
    index_n_heads: int | None = None
    index_kpool: int = 1
    indexer_rope_interleave: bool = False


@dataclass(frozen=True)
class ServerFacts:
    """What the gate needs to know about the server configuration.

    Attributes:
        requested: the user asked for the FP4 indexer (``--enable-fp4-indexer``).
        page_size: tokens per KV page, or None when left to SGLang (which sets
            64 for DSA models); the index page is ``page_size // index_kpool``.
        dcp_size: decode context parallel width (``--dcp-size``).
        dcp_shard: ``--fp4-indexer-dcp-shard``: under DCP, shard the FP4 index
            over the DCP ranks instead of replicating it (no effect without DCP).
        attn_cp_size: attention context parallel width (``--attn-cp-size``).
        enable_prefill_cp: prefill context parallelism (``--enable-prefill-cp``).
        kv_shard: logical-page KV sharding (SGLang's page-interleave pool).
        hicache: hierarchical cache (``--enable-hierarchical-cache``).
        hicache_storage: the HiCache storage backend (``--hicache-storage-backend``), empty if none.
        hisparse: HiSparse (``--enable-hisparse``).
        disaggregation_mode: ``"null"``, ``"prefill"`` or ``"decode"``.
        hybrid_pool: the kind of hybrid KV pool in use (hybrid SWA, hybrid
            linear attention), empty when the pool is a plain DSA pool.
        unified_memory: ``--enable-unified-memory`` or the unified-cache
            external linker (pools whose entries are sized by other code).
        external_kv_store: names of external KV stores in use (``"flexkv"``,
            ``"lmcache"``), empty if none.
        indexer_fusion_disabled: SGLang's ``SGLANG_DISABLE_DSA_INDEXER_FUSION``
            is set: its unfused indexer runs, which applies the Hadamard
            rotation whatever the RoPE style (only reported: with fusion on,
            the plugin applies the rotation itself).
        speculative_eagle_topk: ``--speculative-eagle-topk`` (1 without a draft
            tree). Above 1 EAGLE tree verify moves index keys between slots of
            different DCP ranks, so ``--fp4-indexer-dcp-shard`` is served replicated.
        off_by: when not ``requested``, what turned FP4 off if something did
            explicitly: ``"env"`` (``SGLANG_ENABLE_FP4_INDEXER`` set to an off
            value), ``"flag"`` (``--no-enable-fp4-indexer``); empty when it was
            simply not asked for.
    """

    requested: bool
    page_size: int | None = None
    dcp_size: int = 1
    dcp_shard: bool = False
    attn_cp_size: int = 1
    enable_prefill_cp: bool = False
    kv_shard: bool = False
    hicache: bool = False
    hicache_storage: str = ""
    hisparse: bool = False
    disaggregation_mode: str = "null"
    hybrid_pool: str = ""
    unified_memory: bool = False
    external_kv_store: str = ""
    indexer_fusion_disabled: bool = False
    speculative_eagle_topk: int = 1
    off_by: str = ""


@dataclass(frozen=True)
class DeviceFacts:
    """What the gate needs to know about the device.

    Attributes:
        kind: ``"cuda"`` (NVIDIA), ``"rocm"``, ``"cpu"``, ``"xpu"``, ``"npu"``, ...
        capability: CUDA compute capability ``(major, minor)``, None if unknown.
        name: device name for messages, optional.
    """

    kind: str
    capability: tuple[int, int] | None = None
    name: str | None = None


@dataclass(frozen=True)
class Decision:
    """The gate's answer.

    Attributes:
        enabled: True when the FP4 index-key cache and scorers are used.
        reason: why (all refusal reasons, ``"; "``-joined, when refused).
        fix: what the user can do about it (empty when enabled or not requested).
        codes: short machine-readable tags of the refusal reasons, in check order
            (``"off"`` when not requested, empty when enabled).
        dcp_mode: under decode context parallelism, how the FP4 index is held:
            ``"replicated"`` or ``"sharded"`` (``dcp.MODES``); empty without DCP
            or when not enabled.
    """

    enabled: bool
    reason: str
    fix: str = ""
    codes: tuple[str, ...] = field(default=())
    dcp_mode: str = ""


def supported_heads() -> tuple[int, ...]:
    """Index head counts the paged FP4 scorer supports (``ops.paged_logits.SUPPORTED_HEADS``).

    Imported on call so that importing the gate does not import Triton.
    """
    from .ops.paged_logits import SUPPORTED_HEADS

    return tuple(SUPPORTED_HEADS)


def index_key_rotation(model: ModelFacts, server: ServerFacts) -> tuple[bool, str]:
    """Whether the FP4 cache's index keys (and the queries scored against them) are Hadamard-rotated, and by whom.

    SGLang 0.5.23 (``layers/attention/dsa/dsa_indexer.py``) rotates q and k
    before quantization in its unfused indexer; it runs its fused indexer
    kernels, which skip the rotation, exactly when the indexer's RoPE is
    interleaved (``is_neox_style`` false) and
    ``SGLANG_DISABLE_DSA_INDEXER_FUSION`` is not set. With the FP4 cache the
    plugin's hooks (``sglang_plugin/indexer.py``) then apply SGLang's own
    rotation to both in every branch of the fused indexer, so the keys are
    rotated in every case; the text says which path does it.

    Returns:
        ``(rotated, text)``; ``rotated`` is always True in this release (a
        plugin whose hooks SGLang could not apply is refused before this is
        asked: ``seams.refusal``).
    """
    if not model.indexer_rope_interleave:
        return True, "rotated (NeoX-style indexer RoPE: SGLang's unfused indexer applies the Hadamard rotation)"
    if server.indexer_fusion_disabled:
        return True, (f"rotated (interleaved indexer RoPE with {INDEXER_FUSION_ENV}=1: SGLang's unfused indexer "
                      "applies the Hadamard rotation)")
    return True, ("rotated (interleaved indexer RoPE: SGLang's fused indexer skips the Hadamard rotation; with the "
                  "FP4 cache the plugin applies SGLang's rotation to the index queries and keys)")


def dcp_mode_for(server: ServerFacts) -> str:
    """How an enabled FP4 index is held under decode context parallelism: ``""`` (no DCP: ``dcp_size`` 1),
    ``"sharded"`` (``--fp4-indexer-dcp-shard`` without an EAGLE draft tree) or ``"replicated"``.

    With ``--speculative-eagle-topk > 1`` EAGLE tree verify moves index keys
    between slots that different DCP ranks own, which the sharded index does
    not exchange, so it is served replicated.
    """
    if server.dcp_size <= 1:
        return ""
    return "sharded" if server.dcp_shard and server.speculative_eagle_topk <= 1 else "replicated"


def _check_types(model, server, device) -> None:
    for name, value, cls in (("model", model, ModelFacts), ("server", server, ServerFacts), ("device", device, DeviceFacts)):
        if not isinstance(value, cls):
            raise TypeError(f"{name}: expected {cls.__name__}, got {type(value).__name__}")


def decide(model: ModelFacts, server: ServerFacts, device: DeviceFacts) -> Decision:
    """Decide whether the FP4 indexer serves this deployment (pure, deterministic).

    Checks, in this order, and collects every reason that applies: requested;
    DeepSeek-V4 (SGLang has its own FP4 indexer for it); DSA model; index head
    dim 128; index head count in ``supported_heads()``; ``index_kpool == 1``;
    64-token index page; CUDA device with capability >= 8.9; then the
    parallel and cache features the FP4 layout does not handle yet.

    Args:
        model: facts about the model (``ModelFacts``).
        server: facts about the server flags (``ServerFacts``).
        device: facts about the device (``DeviceFacts``).

    Returns:
        ``Decision``; ``enabled`` only when nothing refuses. A refusal's
        ``reason`` names each failed condition, ``fix`` says what to change.

    Raises:
        TypeError: an argument is not the expected facts record.
    """
    _check_types(model, server, device)
    if not server.requested:
        if server.off_by == "env":
            return Decision(False, "SGLANG_ENABLE_FP4_INDEXER is set to an off value, which wins over the command "
                                   "line and the --config file",
                            "unset SGLANG_ENABLE_FP4_INDEXER (or set it to 1) to use the FP4 indexer", ("off",))
        if server.off_by == "flag":
            return Decision(False, "--no-enable-fp4-indexer given (it wins over enable-fp4-indexer in a --config "
                                   "file too)",
                            "drop --no-enable-fp4-indexer to use the FP4 indexer", ("off",))
        return Decision(False, "--enable-fp4-indexer not given", "", ("off",))

    reasons: list[tuple[str, str, str]] = []  # (code, reason, fix)
    arch = model.architecture or "unknown architecture"
    if model.is_deepseek_v4:
        reasons.append((
            "deepseek_v4",
            f"{arch} is a DeepSeek-V4 model, whose indexer SGLang already stores in FP4",
            "use SGLang's own --enable-deepseek-v4-fp4-indexer instead of --enable-fp4-indexer",
        ))
    elif not model.is_dsa:
        reasons.append((
            "not_dsa",
            f"{arch} is not a DeepSeek Sparse Attention model (SGLang's is_deepseek_dsa is False), "
            "so it has no lightning-indexer key cache",
            "drop --enable-fp4-indexer for this model",
        ))
    else:
        if model.index_head_dim != 128:
            reasons.append((
                "index_head_dim",
                f"index_head_dim is {model.index_head_dim}; the MXFP4 index-key format stores 128-element keys",
                "drop --enable-fp4-indexer for this model",
            ))
        heads = supported_heads()
        if model.index_n_heads not in heads:
            reasons.append((
                "index_heads",
                f"index_n_heads is {model.index_n_heads}; the FP4 scorer supports {list(heads)} index heads",
                "drop --enable-fp4-indexer for this model",
            ))
        if model.index_kpool != 1:
            reasons.append((
                "index_kpool",
                f"index_kpool is {model.index_kpool}; the FP4 cache holds one key per token (index_kpool 1)",
                "drop --enable-fp4-indexer for this model",
            ))
        kpool = model.index_kpool if model.index_kpool and model.index_kpool > 0 else 1
        if server.page_size is not None and server.page_size // kpool != FP4_INDEX_PAGE_SIZE:
            reasons.append((
                "page_size",
                f"the index page is {server.page_size // kpool} tokens; the FP4 cache uses {FP4_INDEX_PAGE_SIZE}-token pages",
                f"use --page-size {FP4_INDEX_PAGE_SIZE * kpool} (SGLang's default for DSA models)",
            ))
    if device.kind != "cuda":
        reasons.append((
            "device",
            f"device {device.kind!r}: the FP4 kernels serve NVIDIA CUDA GPUs with FP8 MMA "
            "(compute capability >= 8.9: Ada, Hopper, Blackwell); ROCm and other devices are not validated",
            "run on an NVIDIA GPU of compute capability 8.9 or newer, or drop --enable-fp4-indexer",
        ))
    elif device.capability is None or tuple(device.capability) < MIN_CUDA_CAPABILITY:
        cap = "unknown" if device.capability is None else "%d.%d" % tuple(device.capability)
        reasons.append((
            "device",
            f"CUDA compute capability {cap}{' (' + device.name + ')' if device.name else ''} has no FP8 MMA; "
            "the FP4 scorer needs 8.9 or newer (Ada, Hopper, Blackwell)",
            "run on an NVIDIA GPU of compute capability 8.9 or newer, or drop --enable-fp4-indexer",
        ))

    feature_fix = "turn that feature off, or drop --enable-fp4-indexer to keep SGLang's FP8 indexer"
    features = (
        ("prefill_cp", server.attn_cp_size > 1 or server.enable_prefill_cp,
         "context parallelism (--attn-cp-size / --enable-prefill-cp) shards the indexer in ways the FP4 path does not handle yet"),
        ("kv_shard", server.kv_shard,
         "logical-page KV sharding (page-interleave pool) writes the index cache through its own FP8 writer"),
        ("hicache_dcp", server.hicache and server.dcp_size > 1,
         "the hierarchical cache with decode context parallelism (--enable-hierarchical-cache with --dcp-size "
         f"{server.dcp_size}) translates host pages per rank in ways the FP4 path does not handle yet"),
        ("hicache_storage", server.hicache and bool(server.hicache_storage),
         f"a HiCache storage backend (--hicache-storage-backend {server.hicache_storage}) keeps index pages that "
         "servers with the FP8 layout may read"),
        ("hisparse", server.hisparse,
         "HiSparse (--enable-hisparse) keeps its own FP8 index pool"),
        ("pd_dcp", server.disaggregation_mode not in ("null", None) and server.dcp_size > 1,
         f"PD disaggregation with decode context parallelism (--disaggregation-mode {server.disaggregation_mode} "
         f"with --dcp-size {server.dcp_size}) packs index pages per rank in ways the FP4 path does not handle yet"),
        ("hybrid_pool", bool(server.hybrid_pool),
         f"{server.hybrid_pool} KV pools build and size the index cache in their own code"),
        ("unified_memory", server.unified_memory,
         "unified memory pools (--enable-unified-memory / unified-cache linker) size the index entry in their own code"),
        ("external_kv_store", bool(server.external_kv_store),
         f"external KV stores ({server.external_kv_store}) keep index pages that servers with the FP8 layout may read"),
    )
    for code, active, reason in features:
        if active:
            reasons.append((code, reason, feature_fix))

    if not reasons:
        dcp_mode = ""
        dcp_text = ""
        if server.dcp_size > 1:
            dcp_mode = dcp_mode_for(server)
            shard = dcp_mode == "sharded"
            per_rank = 68 / server.dcp_size if shard else 68
            dcp_text = f", DCP {server.dcp_size}: {dcp_mode} index ({per_rank:g} B per token per layer on each rank)"
            if server.dcp_shard and not shard:
                dcp_text += (f"; --fp4-indexer-dcp-shard is not served with --speculative-eagle-topk "
                             f"{server.speculative_eagle_topk}: EAGLE tree verify moves index keys between slots of "
                             "different DCP ranks")
        return Decision(
            True,
            f"{arch}: {model.index_n_heads} index heads x {model.index_head_dim}, "
            f"{FP4_INDEX_PAGE_SIZE}-token pages, CUDA {'%d.%d' % tuple(device.capability)}{dcp_text}",
            dcp_mode=dcp_mode,
        )
    fixes: list[str] = []
    for _, _, fix in reasons:
        if fix not in fixes:
            fixes.append(fix)
    return Decision(
        False,
        "; ".join(r for _, r, _ in reasons),
        "; ".join(fixes),
        tuple(c for c, _, _ in reasons),
    )


_reported: dict[str, bool] = {"active": False, "refused": False}


def report(decision: Decision, *, rank: int = 0, log: logging.Logger | None = None) -> bool:
    """Log a decision once per process, on rank 0 only.

    An enabled decision logs one INFO line starting ``FP4 indexer active``; a
    refused one (when the user asked for FP4) logs one WARNING starting ``FP4
    indexer disabled`` with the reasons and the fix. Later calls of the same
    kind log nothing; a decision that was not requested logs nothing.

    Args:
        decision: from ``decide``.
        rank: the process's global rank; only rank 0 logs.
        log: logger (default ``logging.getLogger("sglang_fp4_indexer")``).

    Returns:
        True if a line was logged by this call.

    Raises:
        TypeError: ``decision`` is not a ``Decision``.
    """
    if not isinstance(decision, Decision):
        raise TypeError(f"decision: expected Decision, got {type(decision).__name__}")
    log = log or logger
    if rank != 0 or decision.codes == ("off",):
        return False
    kind = "active" if decision.enabled else "refused"
    if _reported[kind]:
        return False
    _reported[kind] = True
    if decision.enabled:
        log.info(
            "FP4 indexer active: MXFP4 index-key cache, 68 B/token/layer instead of 132 (%s)",
            decision.reason,
        )
    else:
        log.warning(
            "FP4 indexer disabled, SGLang keeps its FP8 indexer: %s. Fix: %s.",
            decision.reason,
            decision.fix,
        )
    return True


def reset_reports() -> None:
    """Forget what ``report`` logged in this process (for tests)."""
    for key in _reported:
        _reported[key] = False

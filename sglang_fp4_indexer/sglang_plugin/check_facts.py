"""The facts ``sglang-fp4-indexer check`` reads through SGLang: its DSA helpers and its server-flag parser.

``check`` (core) decides from the gate's fact records; with SGLang installed the command hands it
``read_sglang_facts`` to fill them the way a server would (``facts``, ``server_args``). Nothing here runs
inside a server.
"""

from __future__ import annotations

import warnings

from .facts import index_layer_count, model_facts, server_facts, server_field
from .server_args import server_args_from_flags

__all__ = ["read_sglang_facts", "speculative_next_n", "sglang_import_error", "memory_facts", "gsm8k_answer_value"]


def gsm8k_answer_value(text: str):
    """SGLang's own GSM8K answer reader (``sglang.test.few_shot_gsm8k.get_answer_value``): the last number of
    ``text``, commas dropped, or SGLang's invalid marker; ``ab`` scores each question with it (``cli`` passes it).

    Raises:
        ImportError: SGLang is not installed.
    """
    from sglang.test.few_shot_gsm8k import get_answer_value

    return get_answer_value(text)


def read_sglang_facts(cfg: dict, model_path: str, flags: list[str]):
    """``((model facts, server facts, index layers, SGLang's --kv-cache-dtype, --context-length, verify, memory), "")``.

    What ``check`` reads with SGLang installed (the ``sglang-fp4-indexer`` command passes this function to
    ``check.run_check``): the model classified by SGLang's own DSA helpers, the server flags parsed by SGLang's
    own parser, with a ``--config FILE`` among them merged as SGLang merges it. ``verify`` is
    ``(next_n, how)``: the query rows per request of target verify that the speculative flags give
    (``speculative_next_n``), or ``(None, "")`` without speculative decoding. ``memory`` is ``memory_facts``'s
    dict: the parallel layout and SGLang's ``--mem-fraction-static`` rule, and ``config_model_path``, the
    ``model-path`` of a ``--config`` file among the flags (None without one).

    Args:
        cfg: the model's ``config.json`` as a dict.
        model_path: the model directory (the ``--model-path`` the flags are parsed with).
        flags: SGLang server flags.

    Returns:
        ``(None, why)`` when SGLang cannot be imported. SGLang's import-time UserWarnings (AWQ, GGUF on a
        machine without a GPU) are suppressed.

    Raises:
        ValueError: SGLang cannot read the config (a field of the wrong type), its parser rejects the flags or
            cannot read their ``--config`` file, they carry
            ``--model-path``, or their parallel sizes are ones SGLang refuses (``--tp-size`` or ``--dcp-size``
            below 1, a ``--dcp-size`` that does not divide ``--tp-size``).
    """
    why = sglang_import_error()
    if why is not None:
        return None, why
    given = next((a for a in flags if a == "--model-path" or a.startswith("--model-path=")), None)
    if given is not None:
        raise ValueError("--sglang-args: --model-path is not used by check, which reads the model given as its "
                         "positional argument; drop --model-path from --sglang-args")
    # check answers as if FP4 were asked for, unless the user's own flags turn it off (server_args_from_flags), as
    # at launch; SGLANG_ENABLE_FP4_INDEXER set to off wins over both (server_facts).
    record = server_args_from_flags(model_path, flags, requested=True)
    tp, dcp = int(server_field(record, "tp_size", 1)), int(server_field(record, "dcp_size", 1))
    for name, value in (("--tp-size", tp), ("--dcp-size", dcp)):
        if value < 1:
            raise ValueError(f"--sglang-args: {name} {value}: expected an integer >= 1")
    if tp % dcp:
        raise ValueError(f"--sglang-args: --dcp-size {dcp} must divide --tp-size {tp} (SGLang refuses it at launch)")
    layers = int(cfg.get("num_hidden_layers", 0) or 0)
    context_length = server_field(record, "context_length", None)
    arch = (cfg.get("architectures") or [""])[0]
    try:
        model, index_layers = model_facts(cfg), index_layer_count(cfg, layers)
    except Exception as exc:  # noqa: BLE001 -- SGLang (or transformers, huggingface_hub) reading a bad field
        raise _config_error(exc) from None
    memory = memory_facts(record)
    memory["config_model_path"] = getattr(record, "_config_model_path", None)
    return (model, server_facts(record), index_layers,
            str(server_field(record, "kv_cache_dtype", "auto")), context_length,
            speculative_next_n(record, arch), memory), ""


def _config_error(exc: Exception) -> ValueError:
    """The usage error for a config.json field SGLang (through transformers) cannot read: its own words, which
    name the field, on one line."""
    text = " ".join(str(exc).split())
    return ValueError(f"model: SGLang cannot read this config.json ({type(exc).__name__}: {text[:300]})")


def memory_facts(record) -> dict:
    """What SGLang's KV budget depends on, from a raw record: the parallel layout and its static-memory fraction;
    also the FP8 GEMM backend (the measured SGLang decode step holds for one backend only).

    Returns:
        dict: ``tp``, ``pp`` (``--pp-size``), ``nnodes``, ``base_gpu_id`` and ``gpu_id_step`` (``--nnodes``,
        ``--base-gpu-id``, ``--gpu-id-step``: which GPUs a server takes), ``fp8_gemm_backend`` (``--fp8-gemm-backend``, SGLang's ``auto`` when not given), ``attn_dp``
        (the DP-attention size: ``--attn-dp-size``, or ``--dp-size`` with ``--enable-dp-attention``, or
        ``--dwdp-size``, which also turns CUDA graphs off; 1 without),
        ``dp_replicas`` (``--dp-size`` without DP attention: data-parallel replicas, each a whole server),
        ``device`` (``--device``, None when SGLang picks it), ``eager_decode`` and ``decode_graph_max_bs``
        (``_decode_graphs``: decode without CUDA graphs, and the largest captured decode batch the flags set),
        ``two_batch_overlap`` (``--enable-two-batch-overlap``: each decode batch runs as two micro-batches),
        ``max_running_requests`` (the flag's value, or None; SGLang splits it over DP-attention ranks),
        ``dp_lm_head``,
        ``a2a_moe`` (``--moe-a2a-backend`` not ``none``), ``mtp`` (``--speculative-algorithm`` EAGLE or NEXTN,
        which loads the MTP layer as the draft model), ``mem_fraction_static`` (the flag's value, or None) and
        ``fraction_for``: ``fraction_for(gpu_mib) -> (fraction, how)``, SGLang 0.5.23's own default for a GPU
        of ``gpu_mib`` MiB (``memory_hook.handle_gpu_memory_settings`` after ``handle_cuda_graph_config`` on a
        copy of the record, the device's capacity given as ``gpu_mib``), or the flag's value. It raises
        ValueError where the raw record cannot resolve SGLang's default (DP attention: its extra reserve
        depends on the DP layout SGLang resolves only at launch).

    Raises:
        ValueError: a DP-attention layout SGLang refuses (a size below 1, one that does not divide
            ``--tp-size``, ``--dp-size`` and ``--attn-dp-size`` that disagree).
    """
    import copy
    from unittest import mock

    dp_attention = bool(server_field(record, "enable_dp_attention", False))
    # --attn-dp-size N, or the older --dp-size N with --enable-dp-attention (SGLang resolves both to one size).
    tp, dp = int(server_field(record, "tp_size", 1)), int(server_field(record, "dp_size", 1) or 1)
    raw = server_field(record, "attn_dp_size", None)
    attn_dp_size = 1 if raw is None else int(raw)
    if attn_dp_size < 1:
        raise ValueError(f"--sglang-args: --attn-dp-size {attn_dp_size}: expected an integer >= 1")
    if dp_attention and dp > 1 and attn_dp_size > 1 and dp != attn_dp_size:
        raise ValueError(f"--sglang-args: --dp-size {dp} with --enable-dp-attention and --attn-dp-size "
                         f"{attn_dp_size} disagree (SGLang refuses it at launch); give one of them")
    attn_dp, flag = ((dp, "--dp-size") if dp_attention and dp > 1 else (attn_dp_size, "--attn-dp-size"))
    # DWDP (--dwdp-size N): SGLang requires N == --tp-size, then sets --attn-dp-size N and turns CUDA graphs off.
    dwdp = int(server_field(record, "dwdp_size", 1) or 1)
    if dwdp > 1:
        if dwdp != tp:
            raise ValueError(f"--sglang-args: --dwdp-size {dwdp} must equal --tp-size {tp} (SGLang refuses it at "
                             "launch)")
        attn_dp, flag, dp_attention = dwdp, "--dwdp-size", True
    if tp % attn_dp:
        raise ValueError(f"--sglang-args: {flag} {attn_dp} (DP attention) must divide --tp-size {tp} (SGLang "
                         "refuses it at launch)")
    dp_attention = dp_attention or attn_dp > 1
    given = server_field(record, "mem_fraction_static", None)
    algorithm = str(server_field(record, "speculative_algorithm", "") or "").upper()

    def fraction_for(gpu_mib: int) -> tuple[float, str]:
        if given is not None:
            return float(given), "--mem-fraction-static in --sglang-args"
        if dp_attention:
            raise ValueError("--sglang-args: with DP attention SGLang sizes its reserve from the DP layout it "
                             "resolves at launch; give --mem-fraction-static in --sglang-args, or --memory-gib")
        import sglang.srt.arg_groups.memory_hook as memory_hook
        from sglang.srt.arg_groups.cuda_graph_hook import handle_cuda_graph_config

        probe = copy.deepcopy(record)
        try:
            with mock.patch.object(memory_hook, "get_device_memory_capacity", return_value=gpu_mib):
                handle_cuda_graph_config(probe)
                memory_hook.handle_gpu_memory_settings(probe)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 -- SGLang reads the model's config here too (a bad field)
            raise _config_error(exc) from None
        return float(server_field(probe, "mem_fraction_static", 0.0)), "SGLang's default for this GPU and flags"

    eager, graph_max_bs = _decode_graphs(record)
    eager = eager or dwdp > 1
    return {"tp": tp, "pp": int(server_field(record, "pp_size", 1) or 1), "attn_dp": attn_dp,
            "nnodes": int(server_field(record, "nnodes", 1) or 1),
            "base_gpu_id": int(server_field(record, "base_gpu_id", 0) or 0),
            "gpu_id_step": int(server_field(record, "gpu_id_step", 1) or 1),
            "dp_replicas": 1 if dp_attention else dp,
            "device": server_field(record, "device", None),
            "eager_decode": eager, "decode_graph_max_bs": graph_max_bs,
            "two_batch_overlap": bool(server_field(record, "enable_two_batch_overlap", False)),
            "max_running_requests": server_field(record, "max_running_requests", None),
            "fp8_gemm_backend": str(server_field(record, "fp8_gemm_runner_backend", "auto")),
            "dp_lm_head": bool(server_field(record, "enable_dp_lm_head", False)),
            "a2a_moe": str(server_field(record, "moe_a2a_backend", "none")) != "none",
            "mtp": algorithm in ("EAGLE", "NEXTN"), "mem_fraction_static": given, "fraction_for": fraction_for}


def _decode_graphs(record) -> tuple[bool, int | None]:
    """``(decode runs without CUDA graphs, the largest decode batch captured when the flags set it, else None)``,
    as SGLang 0.5.23 resolves its CUDA-graph flags (``cuda_graph_hook.parse_cuda_graph_config``, on a copy of the
    record: ``--disable-cuda-graph``, ``--disable-decode-cuda-graph``, ``--cuda-graph-backend-decode``,
    ``--cuda-graph-max-bs-decode``, ``--cuda-graph-bs-decode`` (a list: its largest size, which SGLang's
    ``memory_hook`` makes the maximum whatever ``--cuda-graph-max-bs-decode`` says), ``--cuda-graph-config``, in
    SGLang's precedence)."""
    import copy

    from sglang.srt.arg_groups.cuda_graph_hook import parse_cuda_graph_config

    probe = copy.deepcopy(record)
    parse_cuda_graph_config(probe)
    decode = server_field(probe, "cuda_graph_config", None).decode
    locked = server_field(probe, "_cuda_graph_config_locked", set()) or set()
    if ("decode", "bs") in locked and decode.bs:  # a list of sizes: SGLang sets max_bs to its largest
        max_bs = max(int(b) for b in decode.bs)
    elif ("decode", "max_bs") in locked and decode.max_bs is not None:
        max_bs = int(decode.max_bs)
    else:
        max_bs = None
    return str(decode.backend) == "disabled", max_bs


def speculative_next_n(record, architecture: str) -> tuple[int | None, str]:
    """Target verify's query rows per request (next_n) from a raw record's speculative flags, and how.

    SGLang 0.5.23's rule (``arg_groups/speculative_hook``): without
    ``--speculative-num-steps`` it picks steps, top-k and draft tokens itself
    (``_auto_choose_speculative_params``, called here); with
    ``--speculative-eagle-topk 1`` the draft tokens are the steps + 1; else
    ``--speculative-num-draft-tokens``. Target verify scores that many rows per request.

    Args:
        record: a raw ``ServerArgs`` (``server_args_from_flags``).
        architecture: the model's first ``architectures`` entry.

    Returns:
        ``(next_n, text)``; ``(None, "")`` without ``--speculative-algorithm``; ``(None, why)`` when the
        flags leave it to something ``check`` cannot see.
    """
    algorithm = server_field(record, "speculative_algorithm", None)
    if algorithm is None:
        return None, ""
    steps = server_field(record, "speculative_num_steps", None)
    topk = server_field(record, "speculative_eagle_topk", None)
    tokens = server_field(record, "speculative_num_draft_tokens", None)
    how = f"--speculative-algorithm {algorithm}"
    if steps is None:
        from sglang.srt.arg_groups.speculative_hook import _auto_choose_speculative_params

        try:
            steps, topk, tokens = _auto_choose_speculative_params(record, architecture)
        except Exception as exc:  # SGLang's choice needs what a raw record lacks
            return None, f"{how}: SGLang picks the draft tokens at launch ({exc})"
        how += f" (SGLang's own choice for {architecture}: {steps} steps, top-k {topk}, {tokens} draft tokens)"
    elif topk == 1:
        tokens = int(steps) + 1
        how += (f", --speculative-eagle-topk 1 and --speculative-num-steps {steps}: {tokens} draft tokens "
                "(SGLang: steps + 1)")
    elif tokens is not None:
        how += f", --speculative-num-draft-tokens {tokens}"
    if tokens is None:
        return None, f"{how}: the draft tokens are not given, SGLang picks them at launch"
    return int(tokens), how + "; target verify scores them as next_n"


def sglang_import_error() -> str | None:
    """Import the SGLang modules ``check`` reads; ``None`` when they import, else the reason.

    SGLang's import-time UserWarnings (AWQ, GGUF on a machine without a GPU)
    are suppressed.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            import sglang.srt.configs.model_config  # noqa: F401
            import sglang.srt.server_args  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None

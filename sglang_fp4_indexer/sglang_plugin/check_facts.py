"""The facts ``sglang-fp4-indexer check`` reads through SGLang: its DSA helpers and its server-flag parser.

``check`` (core) decides from the gate's fact records; with SGLang installed the command hands it
``read_sglang_facts`` to fill them the way a server would (``facts``, ``server_args``). Nothing here runs
inside a server.
"""

from __future__ import annotations

import warnings

from .facts import index_layer_count, model_facts, server_facts, server_field
from .server_args import server_args_from_flags

__all__ = ["read_sglang_facts", "sglang_import_error"]


def read_sglang_facts(cfg: dict, model_path: str, flags: list[str]):
    """``((model facts, server facts, index layers, SGLang's --kv-cache-dtype, --context-length), "")`` through SGLang.

    What ``check`` reads with SGLang installed (the ``sglang-fp4-indexer`` command passes this function to
    ``check.run_check``): the model classified by SGLang's own DSA helpers, the server flags parsed by SGLang's
    own parser.

    Args:
        cfg: the model's ``config.json`` as a dict.
        model_path: the model directory (the ``--model-path`` the flags are parsed with).
        flags: SGLang server flags.

    Returns:
        ``(None, why)`` when SGLang cannot be imported. SGLang's import-time UserWarnings (AWQ, GGUF on a
        machine without a GPU) are suppressed.

    Raises:
        ValueError: SGLang's parser rejects the flags, or they carry another ``--model-path``.
    """
    why = sglang_import_error()
    if why is not None:
        return None, why
    record = server_args_from_flags(model_path, flags, requested=True)
    given_path = server_field(record, "model_path", model_path)
    if given_path != model_path:
        raise ValueError(f"--sglang-args: --model-path {given_path} is not used by check, which reads the model "
                         "given as its positional argument; drop --model-path from --sglang-args")
    layers = int(cfg.get("num_hidden_layers", 0) or 0)
    context_length = server_field(record, "context_length", None)
    return (model_facts(cfg), server_facts(record), index_layer_count(cfg, layers),
            str(server_field(record, "kv_cache_dtype", "auto")), context_length), ""


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

"""``sglang-fp4-indexer check``: would the FP4 indexer serve this model, and what does it save?

Given a model directory (with ``config.json``), a Hugging Face config JSON or
the name of a packaged config (``PACKAGED_MODELS``: the public config fields of
DeepSeek-V3.2, GLM-5 and GLM-5.2, so no download is needed), and optionally
SGLang server flags (``--sglang-args="..."``), prints the gate's
``Decision`` as if ``--enable-fp4-indexer`` were given (unless ``$SGLANG_ENABLE_FP4_INDEXER`` set to off or
``--no-enable-fp4-indexer`` turns it off, as at launch), and the memory effect:
index bytes per token per layer (132 FP8 -> 68 FP4) and the KV tokens a memory
budget holds with each. No weights are read and no GPU is needed.

With SGLang installed, the model is classified by SGLang's own DSA helpers and
the server flags are parsed by SGLang's own parser (the adapter's ``sglang_plugin.check_facts``, which the
``sglang-fp4-indexer`` command hands to ``run_check``: the core never imports the adapter).
Without SGLang (not importable), the config keys decide (``index_topk``
present, not a DeepSeek-V4 architecture), and server flags are refused; the
output says so. The device is the local CUDA GPU when there is one, else
``--capability`` (default 9.0, an H200; given without ``--gpu``, no GPU is named). The MLA KV format is the server
flags' ``--kv-cache-dtype``, else ``check``'s own, else SGLang's default for
DSA models on that device (``sglang_kv_cache_dtype``). Under DCP the memory
rows are per rank (``dcp.bytes_per_token`` / ``dcp.dcp_capacity``); when the
deployment refuses FP4 (flags, device) its rows are labelled as
what it would give if the refusal were lifted; when the model itself rules FP4
out (``MODEL_REFUSALS``) no FP4 figure is printed. A config lacking a key
``check`` reads is a usage error naming it.

With ``--context N`` (at most the model's positions; ``--batch`` and ``--next-n`` only with it) it adds what FP4 gains and
costs at that request length (``worth_it``): the requests that fit with each
index format, the indexer scorer's time FP4 vs FP8 measured on an H200 at the
nearest measured shape with the asked next_n, the top-k recall of each format
and the real-model study's loss and passkey numbers at the nearest measured
context (``tables``: the measured tables shipped in the package), then a
verdict that leads with the requests FP4 gains ("FP4 fits 5 requests of 128K where FP8 fits 4 (+25 %)") and
decides, with its exit code (``worth_it``, ``main``); it says "turn it on" only for a measured benefit.

Modules, one job each: ``model`` (the config and what it says), ``findings`` (``run_check``: decision and memory),
``trade`` (``worth_it``: gains, costs and the verdict) and ``command`` (options and the printed report). The public
names are re-exported here.
"""

from __future__ import annotations

# The package's names are its modules' __all__ (one list each, in the module that defines them).
from . import model, findings, trade, command
from .model import *  # noqa: F401,F403
from .findings import *  # noqa: F401,F403
from .trade import *  # noqa: F401,F403
from .command import *  # noqa: F401,F403

__all__ = [
    *model.__all__,
    *findings.__all__,
    *trade.__all__,
    *command.__all__,
]

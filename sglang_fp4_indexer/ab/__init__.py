"""``sglang-fp4-indexer ab``: FP4 against FP8 on the deployer's own model, flags and GPUs.

Modules, one job each: ``stats`` (binomial standard error, paired difference), ``quality`` (SGLang's few-shot
GSM8K on a local file, the passkey prompts), ``report`` (the arms side by side, verdict, plot) and ``command``
(options, refusal through the plugin's own check, the arms, resume). The shared server helpers are
``sglang_fp4_indexer.serving``. Nothing here imports SGLang at import time.
"""

from __future__ import annotations

from . import stats, quality, report, command
from .stats import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403
from .command import *  # noqa: F401,F403

__all__ = [*stats.__all__, *report.__all__, *command.__all__]

"""The accuracy study: what the FP4 index-key format costs the indexer's top-k.

``sglang-fp4-indexer accuracy`` (``cli.py`` wires it; ``docs/accuracy.md``
explains method and results). For each workload x context length x index
heads ``H`` it scores ``rows`` decode rows three ways and compares each with
the exact logits:

- **exact**: the unquantized bf16 index keys and queries, fp64
  (``reference.logits_from_keys``);
- **FP8** (SGLang's format): keys per-token e4m3 with one fp32 scale
  (``reference.fp8_quantize_rows`` with ``demo.FP8_KEY_SCALE_FMT``, SGLang's
  CUDA store), scored in fp32 torch (``demo.dense_logits``);
- **FP4** (this project's format): keys written by the Triton store op
  (``ops.quantize.store_index_k``) into a paged cache with a shuffled block
  table, scored by the Triton paged scorer (``ops.paged_logits.paged_logits``)
  in fp32, bf16 and fp16 logits. Where the Triton interpreter would be too slow
  (on the CPU beyond ``triton_max_context``, by default the smallest context)
  the FP4 logits come from the exact torch oracle of the same format instead:
  ``format.quantize_index_k`` (bit-exact with the store op) and
  ``format.dequantize_index_k`` (exact), then an fp32 matmul -- what the
  scorer computes up to fp32 summation order (``tests/test_paged_logits.py``).
  Every result names the path that produced it (``"triton"`` or ``"torch"``).

Queries are quantized the same way for FP8 and FP4 (``demo.quantize_queries``:
e4m3 per (row, head), UE8M0 scale folded into the weights), so the two differ
only in the key format. A fourth comparison, **keys exact** (bf16 keys, e4m3
queries), isolates what the shared query quantization costs on its own.

Decode rows. All rows of one (workload, context, H) case read one key stream
(keys ``0 .. context - 1``); row ``r`` is a decode token at position
``len_r - 1`` that sees keys ``0 .. len_r - 1``, with
``len_r = context - (r * context) // (2 * rows)`` (``decode_row_lengths``): from
the full context down to just over half of it, so the rows are distinct
queries at distinct positions. The top-k is ``k_r = min(topk, len_r)``.

Measures per format (``metrics.py``): recall of the exact top-k (mean over
rows, 1st percentile, worst row), Spearman rank correlation of the logits over
the row's visible keys, relative L2 error of the logits; for the needle
workload, whether each row's needle is still selected (in the top-k) and still
ranked first.

Workloads (``build_study_input``):

- ``text``: MiniLM hidden states over the standard library's docstrings
  (``workload.text_hidden_states``), one token stream; keys via
  ``workload.project_to_indexer`` then k_norm, RoPE, Hadamard; the query of row
  ``r`` is the projection of the hidden state at its own position.
- ``gaussian``: the keys of ``workload.gaussian_workload(1, context, 1, seed)``;
  queries and weight logits i.i.d. N(0, 1) from a generator seeded per
  (seed, context, H) (``_rows_seed``), then RoPE at the row's position, Hadamard,
  head-weight scaling.
- ``outlier``: the gaussian workload's pre-norm keys (the same draw), k_norm and
  RoPE, then -- before the Hadamard rotation -- ``OUTLIER_CHANNELS`` (four of the
  non-RoPE dims) replaced by heavy values ``sign * OUTLIER_GAIN * (1 +
  OUTLIER_SPREAD * n)`` (``n`` ~ N(0, 1) per token, drawn after the keys; signs
  ``OUTLIER_SIGNS``): channels about ten times the others' unit RMS with a
  fixed sign, as the massive activations of real LLMs. They then carry about
  three quarters of each key's energy, which the Hadamard spreads over all 128
  dims. Queries as gaussian (they are quantized identically for both formats).
- ``needle``: the gaussian keys and rows; row ``r`` gets one needle key at depth
  ``NEEDLE_DEPTHS[r % 3]`` of its visible keys (position ``floor(depth * len_r)``,
  moved up to the next free position if another row's needle is there). The
  needle is the unit direction that maximises the row's score
  ``f(u) = sum_h w_h relu(q_h . u)`` (projected gradient ascent from
  ``sum_h max(w_h, 0) q_h``), scaled so that its exact logit is
  ``1 + margin`` times the best other visible key's (``f`` is positively
  homogeneous); every needle is checked to be its row's exact top-1.

Diagnostics (``diagnose``; by default at each workload's largest context for
the first H): why recall is lost -- error-to-spread ratio, where the lost keys
sat (exact rank, distance to the k-th score in units of the error), a
Gaussian-noise model of recall, and FP4 encoder variants that keep the byte
format (scale-rounding rules) or change it (16-element groups), as findings.

Modules, one job each: ``inputs`` (the study's parameters, decode rows and workloads), ``encoders``
(FP4 encoder variants), ``measuring`` (one case scored three ways and its measures), ``diagnostics``
(where recall goes), ``study`` (every case, ``run_accuracy``), ``output`` (markdown, plot, JSON) and
``command`` (the command line). The public names are re-exported here.

Nothing here imports SGLang; Triton ops are imported when first used (so
``cli.main`` can set ``TRITON_INTERPRET=1`` first); matplotlib is imported
only to draw the plot.
"""

from __future__ import annotations

# The package's names are its modules' __all__ (one list each, in the module that defines them).
from . import inputs, encoders, measuring, diagnostics, study, output, command
from .inputs import *  # noqa: F401,F403
from .encoders import *  # noqa: F401,F403
from .measuring import *  # noqa: F401,F403
from .diagnostics import *  # noqa: F401,F403
from .study import *  # noqa: F401,F403
from .output import *  # noqa: F401,F403
from .command import *  # noqa: F401,F403

__all__ = [
    *inputs.__all__,
    *encoders.__all__,
    *measuring.__all__,
    *diagnostics.__all__,
    *study.__all__,
    *output.__all__,
    *command.__all__,
]

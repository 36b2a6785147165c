"""Launch the Hopper scorer (and its compute-only probe build) for `ncu` at 8 x 128K, H 64 (scripts/ncu_sm90.sh)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from perf_probe import build  # noqa: E402

from sglang_fp4_indexer.ops import sm90  # noqa: E402
from sglang_fp4_indexer.ops.paged_logits import default_block_kv  # noqa: E402
from sglang_fp4_indexer.ops.schedule import plan_paged_schedule  # noqa: E402
from sglang_fp4_indexer.schedule import default_num_ctas  # noqa: E402

batch, ctx, heads = 8, 131072, 64
(cache,), bt, lens, q, w, (out,) = build(batch, ctx, heads, 1, 1)
block_kv = default_block_kv(q.device)  # the product's tile and grid, so the profile is the default's
sched = plan_paged_schedule(lens, block_kv, default_num_ctas(q.device))
for probe in ((0, 2) if len(sys.argv) < 2 else tuple(int(p) for p in sys.argv[1].split(","))):
    for _ in range(2):
        sm90.launch(q, w, cache, bt, lens, sched, out, batch=batch, next_n=1, heads=heads, width=ctx, block_kv=block_kv,
                    probe=probe)
torch.cuda.synchronize()
print("driver done")

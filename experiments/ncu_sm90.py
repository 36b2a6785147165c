"""Launch the Hopper scorer (and its probe builds) for `ncu` at 8 x 128K, H 64 (experiments/ncu_sm90*.sh).

Usage: PYTHONPATH=. python3 -m experiments.ncu_sm90 [PROBES]  (comma list; 0 is the product kernel; default 0,2)
"""
import sys

import torch

from sglang_fp4_indexer.ops import sm90
from sglang_fp4_indexer.ops.paged_logits import default_block_kv
from sglang_fp4_indexer.ops.schedule import plan_paged_schedule
from sglang_fp4_indexer.ops.grid import default_num_ctas

from . import sm90_variants as variants
from .common import build

batch, ctx, heads = 8, 131072, 64
(cache,), bt, lens, q, w, (out,) = build(batch, ctx, heads, 1, 1)
block_kv = default_block_kv(q.device)  # the product's tile and grid, so the profile is the default's
sched = plan_paged_schedule(lens, block_kv, default_num_ctas(q.device))
config = sm90.Config.of_call(1, heads, out.dtype, lens.dim() == 2)
for probe in ((0, 2) if len(sys.argv) < 2 else tuple(int(p) for p in sys.argv[1].split(","))):
    for _ in range(2):
        if probe == 0:
            sm90.launch(config, q, w, cache, bt, lens, sched, out, block_kv=block_kv)
        else:
            variants.launch(q, w, cache, bt, lens, sched, out, batch=batch, next_n=1, heads=heads, width=ctx,
                            block_kv=block_kv, probe=probe)
torch.cuda.synchronize()
print("driver done")

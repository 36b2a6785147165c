"""The folded scorer's inline PTX, executed on the CPU by a tiny interpreter of its
instruction subset, against the lookup table it implements (every payload byte x
every A, four bytes per register as the GPU packs them).

The PTX only runs on NVIDIA GPUs; this test checks its arithmetic here, and the
GPU tests check the kernel that uses it against the scorer oracle.
"""

from __future__ import annotations

import random

import torch

from sglang_fp4_indexer.format import e2m1_to_float
from sglang_fp4_indexer.ops.paged_logits import _FOLD_ASM

MASK = 0xFFFFFFFF


def run_ptx(text: str, inputs: dict[str, int]) -> dict[str, int]:
    regs = dict(inputs)

    def val(tok: str) -> int:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return int(tok, 0)

    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        a = [x.strip() for x in args.split(",")]
        d = a[0]
        if op == "not.b32":
            regs[d] = ~val(a[1]) & MASK
            continue
        if op == "mov.b32":
            regs[d] = val(a[1]) & MASK
            continue
        x, y = val(a[1]), val(a[2])
        r = {
            "shl.b32": lambda: x << y, "shr.b32": lambda: x >> y, "and.b32": lambda: x & y,
            "or.b32": lambda: x | y, "xor.b32": lambda: x ^ y, "add.u32": lambda: x + y,
            "mul.lo.u32": lambda: x * y,
        }[op]()
        regs[d] = r & MASK
    return regs


def lut_byte(code: int, a: int) -> int:
    """e4m3 bits of E2M1(code) * 2**(a - 6) (a in 1..12), sign kept; 0 when a == 0 (flushed)."""
    mag = code & 7
    if a == 0 or mag == 0:
        return 0
    byte = (a << 3) if mag == 1 else (mag << 2) + (a << 3)
    return byte | ((code & 8) << 4)


def test_lut_bytes_are_exact_e4m3_values():
    for a in range(1, 13):
        for code in range(16):
            got = torch.tensor([lut_byte(code, a)], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()
            want = e2m1_to_float(torch.tensor([code])).item() * 2.0 ** (a - 6)
            assert got == want or (got == 0 and want == 0), (code, a, got, want)


def test_fold_ptx_matches_the_lookup_table_for_every_byte_and_scale():
    rng = random.Random(0)
    cases = [(b, a) for b in range(256) for a in range(13)]
    rng.shuffle(cases)
    for i in range(0, len(cases), 4):
        chunk = cases[i : i + 4]
        while len(chunk) < 4:
            chunk.append((0, 0))
        word = sum(b << (8 * k) for k, (b, _) in enumerate(chunk))
        aw = sum(a << (8 * k) for k, (_, a) in enumerate(chunk))
        regs = run_ptx(_FOLD_ASM.value, {"$2": word, "$3": aw})
        for k, (b, a) in enumerate(chunk):
            lo = (regs["$0"] >> (8 * k)) & 0xFF
            hi = (regs["$1"] >> (8 * k)) & 0xFF
            assert lo == lut_byte(b & 0xF, a), (b, a, lo)
            assert hi == lut_byte(b >> 4, a), (b, a, hi)

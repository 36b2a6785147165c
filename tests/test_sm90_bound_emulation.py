"""The Hopper kernel's error bound (``sm90.logit_error_bound`` with ``sm90.logit_error_floor``) holds for an
emulation of its numerics on the CPU, with the f16 accumulator rounded to nearest and truncated.

The emulation follows docs/format.md and docs/design.md ("Hopper numerics") independently of the kernel's code:
each key folded to ``k' = k x 2**(124 - s_max)`` and rounded once to e4m3 (subnormals included: torch's
``float8_e4m3fn`` cast of a value exact in fp32), the index query as it comes, the products summed exactly per k32
step (32 elements) and the running sum rounded to f16 after each of the four steps, relu, the weights as
hi + lo f16 of ``w x 2**(141 - e_r)``, an fp64 head sum and the factors undone. The keys' groups span ten binades
below their key's largest, so groups are rounded and flushed; the queries are scaled so that some head scores
fall into f16's subnormal range.
"""

from __future__ import annotations

import pytest
import torch

from sglang_fp4_indexer.format import dequantize_index_k, quantize_index_k
from sglang_fp4_indexer.ops import sm90


def _f16(x: torch.Tensor, mode: str) -> torch.Tensor:
    """fp64 ``x`` rounded to f16 (``"nearest"``: ties to even; ``"truncate"``: toward zero), as fp64."""
    if mode == "nearest":
        return x.to(torch.float16).to(torch.float64)  # one rounding: fp64 -> f16 directly
    _, e = torch.frexp(x)
    ulp = torch.clamp(e - 11, min=-24).to(torch.float64)
    return torch.ldexp(torch.trunc(torch.ldexp(x, -ulp)), ulp)


def _emulated(q, w, payload, scales, mode):
    deq = dequantize_index_k(payload, scales).to(torch.float64)
    s_max = scales.to(torch.int64).max(dim=1).values
    folded = (deq * torch.ldexp(torch.ones_like(deq[:, :1]), (124 - s_max[:, None]).to(torch.float64)))
    folded = folded.to(torch.float32).to(torch.float8_e4m3fn).to(torch.float64)
    qd = q.to(torch.float64)
    acc = torch.zeros(deq.shape[0], q.shape[0], dtype=torch.float64)
    for k0 in range(0, 128, 32):
        acc = _f16(acc + folded[:, k0:k0 + 32] @ qd[:, k0:k0 + 32].T, mode)
    e_r = min(max(int(w.abs().max().view(torch.int32)) >> 23, 12), 254)
    ws = torch.ldexp(w.to(torch.float32), torch.tensor(141 - e_r, dtype=torch.float32))
    hi = ws.to(torch.float16).to(torch.float32)
    lo = (ws - hi).to(torch.float16).to(torch.float32)
    hs = torch.relu(acc) @ (hi.double() + lo.double())
    return hs * 2.0 ** (e_r - 141) * torch.ldexp(torch.ones_like(hs), (s_max - 124).to(torch.float64))


@pytest.mark.parametrize("mode", ["nearest", "truncate"])
@pytest.mark.parametrize("q_scale", [1.0, 2.0**-12])
def test_bound_holds_for_the_emulated_kernel(mode, q_scale):
    g = torch.Generator().manual_seed(7)
    n, heads = 512, 64
    spread = torch.randint(-10, 1, (n, 4), generator=g).double()
    keys = (torch.randn(n, 128, generator=g).double() * torch.exp2(spread).repeat_interleave(32, 1)).float()
    payload, scales = quantize_index_k(keys)
    q = (torch.randn(heads, 128, generator=g) * 60 * q_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = torch.randn(heads, generator=g) * 0.1
    w[3] = 1e-9  # a weight whose low half is an f16 subnormal after the row's scale
    got = _emulated(q, w, payload, scales, mode)
    deq = dequantize_index_k(payload, scales).to(torch.float64)
    qd, wd = q.to(torch.float64), w.to(torch.float64)
    s = deq @ qd.T
    exact = torch.relu(s) @ wd
    term = (deq.abs() @ qd.abs().T) @ wd.abs()
    relu_term = torch.relu(s) @ wd.abs()
    floor = sm90.logit_error_floor(q, w, deq, scales)
    bound = sm90.logit_error_bound(term, relu_term, floor)
    err = (got - exact).abs()
    assert bool(torch.all(err <= bound)), float((err / bound).max())
    assert float(err.max()) > 0  # the emulation rounds
    low = (scales.to(torch.int64) - scales.to(torch.int64).max(dim=1, keepdim=True).values + 3 < -2).any(dim=1)
    assert bool(low.any()) and bool((~low).any())  # both kinds of key are exercised


@pytest.mark.parametrize("mode", ["nearest", "truncate"])
def test_the_floor_is_what_covers_a_key_read_through_its_low_groups(mode):
    # A key whose largest group meets zeros of the query and whose other groups lie 7 .. 9 binades below it: the
    # logit comes from the rounded groups alone, far beyond MMA_REL of its term bound; the floor covers it.
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(64, 128, generator=g)
    keys[:, 32:] *= torch.tensor([2.0**-7, 2.0**-8, 2.0**-9]).repeat_interleave(32)
    payload, scales = quantize_index_k(keys)
    q = (torch.rand(8, 128, generator=g) * 100 + 1).to(torch.float8_e4m3fn)
    q[:, :32] = 0  # the largest group does not count
    w = torch.rand(8, generator=g) + 0.1
    got = _emulated(q, w, payload, scales, mode)
    deq = dequantize_index_k(payload, scales).to(torch.float64)
    qd, wd = q.to(torch.float64), w.to(torch.float64)
    s = deq @ qd.T
    exact = torch.relu(s) @ wd
    term, relu_term = (deq.abs() @ qd.abs().T) @ wd.abs(), torch.relu(s) @ wd.abs()
    err = (got - exact).abs()
    assert bool(torch.all(err <= sm90.logit_error_bound(term, relu_term, sm90.logit_error_floor(q, w, deq, scales))))
    assert not bool(torch.all(err <= sm90.logit_error_bound(term, relu_term)))  # without the floor it fails

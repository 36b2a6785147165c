"""The FP4 index under SGLang 0.5.23's decode context parallelism (sglang_plugin/dcp_modes.py).

Real SGLang objects where they construct on the CPU: the parser
(``prepare_server_args``, ``--config``), ``ServerArgs`` pickling, SGLang's
published runtime context with ``dcp_size`` W (``published_topology``: it
sets ``attn_dcp_size`` / ``attn_dcp_rank``), SGLang's own sizing methods
(``_compute_dsa_indexer_cell_size``, ``_compute_cell_size``), the real
``DSATokenToKVPool`` built through the hooked ``_build_dsa_kv_pool``, and the
real ``Indexer`` hooks. The multi-process test (gloo, W = 2,
``tests/dcp_plugin_workers.py``) drives the hooked store, decode / verify and
prefill methods on each rank's sharded pool and checks them against the
unsharded core oracles.
"""

from __future__ import annotations

import os
import pickle
from fractions import Fraction

import pytest
import torch
import torch.multiprocessing as mp

import dcp_plugin_workers
from plugin_support import DSV32, H200, published, stand_in_kvc
from test_plugin_pool import _build, plugin  # noqa: F401 (``plugin``: hooks applied, H200 gate, state reset)
from sglang_fp4_indexer import dcp
from sglang_fp4_indexer.format import quantize_index_k
from sglang_fp4_indexer.gate import DeviceFacts, ModelFacts, ServerFacts, decide

pytestmark = pytest.mark.sglang

GOOD = ModelFacts("DeepseekV32ForCausalLM", True, False, 128, 64)
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@pytest.fixture(autouse=True)
def _no_shard_env(monkeypatch):
    monkeypatch.delenv("SGLANG_FP4_INDEXER_DCP_SHARD", raising=False)


def _server_args(*flags):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--model-path", "dummy", *flags])


# ---------------------------------------------------------------------------
# Gate
# ---------------------------------------------------------------------------


def test_gate_enables_dcp_replicated_by_default_sharded_on_request():
    rep = decide(GOOD, ServerFacts(True, 64, dcp_size=8), H200)
    shard = decide(GOOD, ServerFacts(True, 64, dcp_size=8, dcp_shard=True), H200)
    plain = decide(GOOD, ServerFacts(True, 64, dcp_shard=True), H200)
    assert rep.enabled and rep.dcp_mode == dcp.REPLICATED and "DCP 8: replicated index (68 B" in rep.reason
    assert shard.enabled and shard.dcp_mode == dcp.SHARDED and "DCP 8: sharded index (8.5 B" in shard.reason
    assert plain.enabled and plain.dcp_mode == "" and "DCP" not in plain.reason  # no DCP: the flag does nothing
    # DCP no longer refuses, other refusals still apply and carry no mode.
    refused = decide(GOOD, ServerFacts(True, 64, dcp_size=2, hisparse=True), DeviceFacts("cuda", (9, 0)))
    assert not refused.enabled and refused.codes == ("hisparse",) and refused.dcp_mode == ""


def test_eagle_tree_verify_keeps_the_replicated_index(plugin):
    """EAGLE tree verify (--speculative-eagle-topk > 1) moves index keys between slots of different DCP ranks, which
    the sharded index does not exchange: the gate serves the replicated index and says why (read from SGLang's
    own server args)."""
    tree = decide(GOOD, ServerFacts(True, 64, dcp_size=4, dcp_shard=True, speculative_eagle_topk=4), H200)
    assert tree.enabled and tree.dcp_mode == dcp.REPLICATED
    assert tree.reason.endswith("DCP 4: replicated index (68 B per token per layer on each rank); "
                                "--fp4-indexer-dcp-shard is not served with --speculative-eagle-topk 4: EAGLE tree "
                                "verify moves index keys between slots of different DCP ranks")
    chain = decide(GOOD, ServerFacts(True, 64, dcp_size=4, dcp_shard=True, speculative_eagle_topk=1), H200)
    assert chain.dcp_mode == dcp.SHARDED
    from sglang_fp4_indexer.sglang_plugin.facts import server_facts

    record = _server_args("--enable-fp4-indexer", "--fp4-indexer-dcp-shard", "--speculative-eagle-topk", "4")
    assert server_facts(record).speculative_eagle_topk == 4


# ---------------------------------------------------------------------------
# Flag: CLI, --config, environment, Engine keyword, pickled record
# ---------------------------------------------------------------------------


def test_shard_flag_on_every_entry(plugin, tmp_path, monkeypatch, capsys):
    from sglang.srt.entrypoints import engine as engine_module
    from sglang.srt.server_args import ServerArgs

    from sglang_fp4_indexer.sglang_plugin.server_args import install_engine_kwarg
    from sglang_fp4_indexer.sglang_plugin.facts import dcp_shard_requested, server_facts

    on = _server_args("--enable-fp4-indexer", "--fp4-indexer-dcp-shard")
    off = _server_args("--enable-fp4-indexer")
    assert on._fp4_indexer_dcp_shard is True and dcp_shard_requested(on)
    assert off._fp4_indexer_dcp_shard is False and not dcp_shard_requested(off)
    assert pickle.loads(pickle.dumps(on))._fp4_indexer_dcp_shard is True  # reaches the scheduler processes
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model-path: dummy\nenable-fp4-indexer: true\nfp4-indexer-dcp-shard: true\n")
    assert _server_args_from(["--config", str(cfg)])._fp4_indexer_dcp_shard is True
    monkeypatch.setenv("SGLANG_FP4_INDEXER_DCP_SHARD", "1")
    assert dcp_shard_requested(off)
    monkeypatch.delenv("SGLANG_FP4_INDEXER_DCP_SHARD")
    Engine = engine_module.Engine
    monkeypatch.setattr(Engine, "server_args_class", ServerArgs)
    install_engine_kwarg(Engine)
    rec = Engine.server_args_class(model_path="dummy", enable_fp4_indexer=True, fp4_indexer_dcp_shard=True)
    assert rec._fp4_indexer_dcp_shard is True
    with published(page_size=64, dcp_size=4, tp_size=4):
        facts = server_facts(on)
    assert facts.dcp_size == 4 and facts.dcp_shard
    with pytest.raises(SystemExit):
        _server_args("--help")
    assert "--fp4-indexer-dcp-shard" in capsys.readouterr().out


def _server_args_from(argv):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(argv)


def test_check_command_reports_the_dcp_mode(tmp_path, capsys):
    import json

    from sglang_fp4_indexer.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(DSV32))
    assert main(["check", str(path), "--capability", "9.0", "--memory-gib", "100",
                 "--sglang-args=--dcp-size 8 --tp-size 8"]) == 0
    assert "DCP 8: replicated index" in capsys.readouterr().out
    assert main(["check", str(path), "--capability", "9.0", "--memory-gib", "100",
                 "--sglang-args=--dcp-size 8 --tp-size 8 --fp4-indexer-dcp-shard"]) == 0
    assert "DCP 8: sharded index (8.5 B" in capsys.readouterr().out


# ---------------------------------------------------------------------------
# Pool accounting: SGLang's own sizing under DCP
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 8])
def test_sizing_under_dcp(plugin, world):
    """SGLang multiplies the target's index cell by W; replicated FP4 is charged 68 B per global token on each
    rank, sharded 68 / W (rounded up to whole bytes over the layers), FP8 132: the per-rank bytes per token of
    dcp.bytes_per_token (W = 8 with FP8 MLA KV: 214 -> 150 -> 90.5)."""
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    layers = DSV32["num_hidden_layers"]
    conf = object.__new__(DefaultPoolConfigurator)
    with published(page_size=64, dcp_size=world, tp_size=world):
        fp8 = stand_in_kvc(DSV32, _server_args())
        rep = stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer"))
        shard = stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer", "--fp4-indexer-dcp-shard"))
        draft = stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer", "--fp4-indexer-dcp-shard"),
                             is_draft_worker=True)
        idx = {name: conf._compute_dsa_indexer_cell_size(kvc=k, num_layers=layers)
               for name, k in (("fp8", fp8), ("rep", rep), ("shard", shard), ("draft", draft))}
        cells = {name: conf._compute_cell_size(k, layers) for name, k in (("fp8", fp8), ("rep", rep), ("shard", shard))}
        # The EAGLE/MTP draft's share in the target's sizing stays replicated.
        assert conf._compute_dsa_indexer_cell_size(kvc=shard, num_layers=1, allocate_all_layers=True) == 68
    assert idx == {"fp8": layers * 132, "rep": layers * 68, "shard": -(-layers * 68 // world), "draft": layers * 68}
    kv = (cells["fp8"] - world * layers * 132) // layers  # stand-in kvc: bf16 MLA KV (576 * 2 B per local token)
    assert kv == (512 + 64) * 2
    # One local token of a rank stands for W global tokens: per-rank bytes per global token = cell / W.
    for name, index, mode in (("fp8", "fp8", "replicated"), ("rep", "fp4", "replicated"), ("shard", "fp4", "sharded")):
        exact = layers * dcp.bytes_per_token(world, index=index, mode=mode, kv_bytes=kv)
        assert 0 <= Fraction(cells[name], world) - exact < 1, name  # sharded: rounded up by < W bytes per local token
    # With FP8 MLA KV (656 B per token) the same index cells give the figures at W = 8.
    if world == 8:
        per = {m: Fraction(layers * 656 + world * idx[m], world * layers) for m in ("fp8", "rep", "shard")}
        assert per["fp8"] == 214 and per["rep"] == 150
        assert 0 <= per["shard"] - Fraction(181, 2) < Fraction(1, layers)


def test_build_pools_replicated_and_sharded(plugin):
    """The replicated pool keeps SGLang's widened index (68-byte cells); the sharded one 1/W of its pages, per rank."""
    from sglang_fp4_indexer.sglang_plugin import dcp_modes

    world = 2
    shapes = {}
    for rank in range(world):
        with published(page_size=64, dcp_size=world, tp_size=world, ranks={"world_rank": rank}):
            rep = _build(stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer"), num_layers=2))
            shard = _build(stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer", "--fp4-indexer-dcp-shard"),
                                        num_layers=2))
            draft = _build(stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer", "--fp4-indexer-dcp-shard"),
                                        num_layers=2, is_draft_worker=True))
        assert plugin.is_fp4_pool(rep) and not dcp_modes.is_sharded(rep)
        assert plugin.is_fp4_pool(shard) and dcp_modes.is_sharded(shard)
        assert not dcp_modes.is_sharded(draft)
        cache = shard.index_key_cache
        assert (cache.dcp_size, cache.dcp_rank, cache.global_buf_size) == (world, rank, rep.index_buf_size)
        shapes[rank] = ([tuple(b.shape) for b in rep.index_key_cache.buffer], [tuple(b.shape) for b in cache.buffer])
    # SGLang's widened index: (256 + 64) * 2 - 64 slots -> (576 + 65) // 64 = 10 pages; sharded: 10 / 2 per rank.
    assert rep.index_buf_size == (256 + 64) * world - 64
    assert shapes[0] == shapes[1] == ([(10, 64 * 68)] * 2, [(5, 64 * 68)] * 2)


def test_hooked_store_writes_owned_slots_and_move_cpu_copy(plugin, monkeypatch):
    """The hooked _store_index_k_cache on a sharded pool writes exactly the owned keys (at s // W, scales through
    pool.scale_row); move (without a host sync) and cpu_copy act on the owned local slots."""
    from test_plugin_indexer import _batch, _forward, _indexer
    from test_pool import _forbid_host_reads

    from sglang_fp4_indexer import pool as fp4_pool

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)  # SGLang's cpu_copy syncs; no CUDA here
    world = 2
    g = torch.Generator().manual_seed(0)
    slots = torch.arange(128, 128 + 200)  # global slots of one request, as SGLang's allocator hands them out
    keys = torch.randn(200, 128, generator=g).to(torch.bfloat16)
    for rank in range(world):
        with published(page_size=64, dcp_size=world, tp_size=world, ranks={"world_rank": rank}):
            pool = _build(stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer", "--fp4-indexer-dcp-shard"),
                                       num_layers=1))
        cache = pool.index_key_cache.buffer[0]
        with _forward(pool):
            _indexer(64)._store_index_k_cache(_batch("EXTEND", out_cache_loc=slots), 0, keys, out_cache_loc=slots)
        owned = slots % world == rank
        local = slots[owned] // world
        want = quantize_index_k(keys[owned])
        got = fp4_pool.read_index_k(cache, local)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        # Nothing else was written: every other local slot still holds zero bytes.
        written = torch.zeros(cache.shape[0] * 64, dtype=torch.bool)
        written[local] = True
        other = torch.nonzero(~written).flatten()
        assert int(fp4_pool.read_index_k(cache, other)[1].abs().sum()) == 0
        # Move: global slot pairs with one owner each; this rank copies its own.
        pool.index_key_cache.move(torch.tensor([600, 601]), torch.tensor([130, 131]))
        mine = 600 + rank
        assert torch.equal(fp4_pool.read_index_k(cache, torch.tensor([mine // world]))[1],
                           quantize_index_k(keys[[130 + rank - 128]])[1])
        # Without a host read (each is a GPU sync, every EAGLE tree verify step): a pair across owners -- which
        # the gate never lets reach a sharded cache -- is skipped on every rank, nothing is written.
        before = cache.clone()
        with pytest.MonkeyPatch.context() as mp:
            _forbid_host_reads(mp)
            pool.index_key_cache.move(torch.tensor([602, 603]), torch.tensor([131, 130]))
        assert torch.equal(cache, before)
        with pytest.MonkeyPatch.context() as mp:
            _forbid_host_reads(mp)
            pool.index_key_cache.move(torch.tensor([604, 605]), torch.tensor([130, 131]))
        mine = 604 + rank
        assert torch.equal(fp4_pool.read_index_k(cache, torch.tensor([mine // world]))[1],
                           quantize_index_k(keys[[130 + rank - 128]])[1])
        # cpu_copy of the request's pages (global slots 128..255) is this rank's local page 1.
        copy = pool.index_key_cache.cpu_copy(torch.arange(128, 256))
        assert torch.equal(copy[0][0], cache[1:2])
        cache[1].zero_()
        pool.index_key_cache.load_cpu_copy(copy, torch.arange(128, 256))
        assert torch.equal(cache[1:2], copy[0][0])


@pytest.mark.parametrize("world", [2, 4])
def test_draft_pool_under_dcp_holds_every_slot(plugin, world, monkeypatch):
    """Under --dcp-size W SGLang builds the MTP/EAGLE draft pool with ``page_size = 64 W`` and ``dcp_replicated``
    (``loc_space_scale`` W): its index cache must hold W 64-token pages per pool row, as SGLang's FP8 one does.
    Store, score and move reach the last slots of the widened space, and the bytes SGLang charges for the draft's
    index cell in the target's sizing are the bytes the draft pool allocates."""
    from test_plugin_indexer import _batch, _forward, _indexer, _metadata, _queries

    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    from sglang_fp4_indexer import pool as fp4_pool
    from sglang_fp4_indexer.format import dequantize_index_k
    from sglang_fp4_indexer.reference import paged_logits_reference

    target_tokens = 512  # per-rank rows of the target pool; SGLang widens the draft's by loc_space_scale
    with published(page_size=64, dcp_size=world, tp_size=world):
        fp8_kvc = stand_in_kvc(DSV32, _server_args(), num_layers=1, is_draft_worker=True)
        assert (fp8_kvc.loc_space_scale, fp8_kvc.pool_page_size) == (world, 64 * world)  # SGLang's own rule
        draft_tokens = target_tokens * fp8_kvc.loc_space_scale  # as _derive_pool_sizes passes it
        fp8 = _build(fp8_kvc, draft_tokens)
        plugin.reset_state()
        kvc = stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer"), num_layers=1, is_draft_worker=True)
        p4 = _build(kvc, draft_tokens)
        conf = object.__new__(DefaultPoolConfigurator)
        target_kvc = stand_in_kvc(DSV32, _server_args("--enable-fp4-indexer"), num_layers=61)
        draft_cell = conf._compute_dsa_indexer_cell_size(kvc=target_kvc, num_layers=1, allocate_all_layers=True)
    assert plugin.is_fp4_pool(p4) and p4.index_page_size == 64 and p4.page_size == 64 * world
    cache8 = fp8.get_index_k_with_scale_buffer(0)
    cache = p4.get_index_k_with_scale_buffer(0)
    # SGLang's FP8 view and ours: the same number of 64-token pages, enough for every slot of the pool.
    assert cache.shape == (cache8.shape[0], 64 * 68) and cache8.shape[1] == 64 * 132
    assert cache.shape[0] * 64 >= p4.size + 1
    assert cache.data_ptr() == p4.index_key_cache.buffer[0].data_ptr()
    # Sizing: SGLang multiplies the draft's index cell (68 B for its one layer) by W per target token; that is
    # what the draft pool allocates per target token (up to its one spare page row).
    assert draft_cell == 68
    allocated = p4.index_key_cache.buffer[0].nbytes
    assert 0 <= allocated - target_tokens * draft_cell * world <= 2 * 64 * world * 68

    # Store through the hooked Indexer at the first and the last slots of the widened space.
    g = torch.Generator().manual_seed(world)
    last = cache.shape[0] * 64
    slots = torch.cat([torch.arange(0, 70), torch.arange(last - 192, last)])
    keys = torch.randn(slots.numel(), 128, generator=g).to(torch.bfloat16)
    ix = _indexer(64)
    with _forward(p4):
        ix._store_index_k_cache(_batch("EXTEND", out_cache_loc=slots), 0, keys, out_cache_loc=slots)
    want = quantize_index_k(keys)
    got = fp4_pool.read_index_k(cache, slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    # Score a draft-decode request whose pages are the last ones of the pool (SGLang runs the draft without
    # DCP: its page table is in 64-token pages of the widened space).
    n = 130
    table = torch.tensor([[last // 64 - 3, last // 64 - 2, last // 64 - 1]], dtype=torch.int32)
    seqlens = torch.tensor([n], dtype=torch.int32)
    md = _metadata(cache_seqlens=seqlens, seqlens_expanded=seqlens, table=table, extend_lens=[1])
    q, w = _queries(1, 64, seed=world + 1)
    with _forward(p4):
        ix._get_topk_paged(_batch("DECODE"), 0, q, w, md)
    ref = paged_logits_reference(q, w[:, :, 0], cache, table, seqlens)
    key_vals = dequantize_index_k(*fp4_pool.read_index_k(cache, torch.arange(last - 192, last - 192 + n)))
    bound = (key_vals.double().abs() @ q[0].double().abs().t()) @ w[0, :, 0].double().abs()
    seen = md.seen[0]
    assert torch.all(torch.isfinite(seen[0, :n])) and torch.all(seen[0, n:192] == float("-inf"))
    assert torch.all((seen[0, :n].double() - ref[0, :n].double()).abs() <= 2e-5 * bound + 1e-30)

    # Move (SGLang's move_kv_cache): from the last slots to the first ones, and back into the last page.
    src, dst = torch.tensor([last - 1, last - 100, 5]), torch.tensor([3, 64, last - 2])
    moved = fp4_pool.read_index_k(cache, src)
    p4.move_kv_cache(dst, src)
    after = fp4_pool.read_index_k(cache, dst)
    assert torch.equal(after[0], moved[0]) and torch.equal(after[1], moved[1])


# ---------------------------------------------------------------------------
# Multi-process: the hooked Indexer on W = 2 sharded pools (gloo)
# ---------------------------------------------------------------------------


@pytest.mark.skipif(not INTERPRET, reason="CPU ranks run the Triton kernels under TRITON_INTERPRET=1")
def test_sharded_hooks_equal_unsharded(tmp_path):
    mp.spawn(dcp_plugin_workers.run, args=(2, str(tmp_path / "store")), nprocs=2, join=True)

"""The FP4 index-key cache under SGLang 0.5.23's PD disaggregation, through SGLang's own code on the CPU:
the transfer engine is told the FP4 index buffers' real sizes (target and MTP draft), and a prefill and a
decode server that hold different index-key formats stop when they first meet, at the bootstrap (SGLang's
``CommonKVBootstrapServer`` on localhost, SGLang's ``CommonKVManager`` on each side), before any transfer."""

from __future__ import annotations

import socket

import pytest

from plugin_support import DSV32, published, stand_in_kvc
from plugin_support import plugin  # noqa: F401 (the fixture)
from plugin_support import server_args as _server_args

pytestmark = pytest.mark.sglang

#: DeepSeek-V3.2's geometry; layer 1 reuses layer 0's top-k and keeps no index keys.
SKIPPING = {**DSV32, "index_topk_pattern": "FSF"}
FP4_PAGE = 64 * (64 + 4)  # bytes of one 64-token page of one layer, docs/format.md
FP8_PAGE = 64 * (128 + 4)
ROWS = 5  # SGLang's index rows for 256 tokens: (256 + 64 + 1) // 64


def _pools(mode, *flags):
    """Target (3 layers) and MTP draft (1 layer) DSA pools built through the plugin's gate for a PD server."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    def build(kvc):
        return KVCacheConfigurator._build_dsa_kv_pool(
            kvc, max_total_num_tokens=256, max_running_requests=4, dsa_pool_class=DSATokenToKVPool)

    with published(page_size=64, disaggregation_mode=mode):
        args = _server_args("--disaggregation-mode", mode, *flags)
        target = build(stand_in_kvc(SKIPPING, args, num_layers=3))
        draft = build(stand_in_kvc(SKIPPING, args, num_layers=1, is_draft_worker=True))
    return target, draft


def _kv_args(target, draft, page_size=64):
    """SGLang's ``KVArgs`` with the state components its ``setup_state_kv_args`` describes for the pools."""
    from sglang.srt.disaggregation.base.conn import KVArgs
    from sglang.srt.disaggregation.utils import setup_state_kv_args

    args = KVArgs()
    args.kv_cache_dtype_str = "auto"
    args.kv_layout = None
    args.kv_item_lens = [1]
    args.page_size = page_size
    args.engine_rank = args.pp_rank = args.system_dp_rank = 0
    setup_state_kv_args(args, target, draft, total_kv_layers=target.layer_num)
    return args


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_transfer_engine_gets_the_fp4_index_buffers(plugin, mode):
    from sglang.srt.disaggregation.base.conn import StateType

    target, draft = _pools(mode, "--enable-fp4-indexer")
    assert plugin.is_fp4_pool(target) and plugin.is_fp4_pool(draft)
    args = _kv_args(target, draft)
    assert args.state_types == [StateType.DSA]
    buffers = list(target.index_k_with_scale_buffer) + list(draft.index_k_with_scale_buffer)
    # Layers 0 and 2, then the draft's: one 64 x 68-byte page per item; the skip-top-k layer has no rows.
    assert args.state_item_lens == [[FP4_PAGE, 0, FP4_PAGE, FP4_PAGE]]
    assert args.state_data_lens == [[ROWS * FP4_PAGE, 0, ROWS * FP4_PAGE, ROWS * FP4_PAGE]]
    assert args.state_data_ptrs == [[b.data_ptr() for b in buffers]]


def test_without_the_flag_the_transfer_engine_gets_sglangs_buffers(plugin):
    target, draft = _pools("prefill")
    assert not plugin.is_fp4_pool(target)
    assert _kv_args(target, draft).state_item_lens == [[FP8_PAGE, 0, FP8_PAGE, FP8_PAGE]]


@pytest.fixture()
def bootstrap():
    """SGLang's prefill bootstrap server on a free localhost port (its HTTP address is yielded)."""
    from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = CommonKVBootstrapServer("127.0.0.1", port)
    try:
        yield port
    finally:
        server.close()


@pytest.fixture()
def managers(plugin):
    """Builds SGLang's ``CommonKVManager`` of one side, ``make(mode, fp4, port)``: its pools built with or
    without ``--enable-fp4-indexer`` (the plugin's state is this process's, so each side is built after
    forgetting the other's pools). A prefill manager registers with the bootstrap server at ``port`` while
    it is built. Their ZMQ sockets are closed at the end (an open one blocks the interpreter's exit)."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.runtime_context import get_parallel

    built = []

    def make(mode, fp4, port):
        plugin.reset_state()
        target, draft = _pools(mode, *(["--enable-fp4-indexer"] if fp4 else []))
        assert plugin.is_fp4_pool(target) == fp4
        args = _kv_args(target, draft)
        role = DisaggregationMode.PREFILL if mode == "prefill" else DisaggregationMode.DECODE
        with published(page_size=64, disaggregation_mode=mode, disaggregation_bootstrap_port=port,
                       host="127.0.0.1") as sa:
            with get_parallel().override(pp_group=None):  # no torch.distributed groups here; PP size 1
                built.append(CommonKVManager(args, role, sa, True))
        return built[-1]

    yield make
    for manager in built:
        manager._zmq_ctx.destroy(linger=0)


@pytest.mark.parametrize("fp4", [True, False], ids=["both-fp4", "neither"])
def test_bootstrap_accepts_the_same_format(managers, bootstrap, fp4):
    managers("prefill", fp4, bootstrap)
    decode = managers("decode", fp4, bootstrap)
    assert decode.try_ensure_parallel_info(f"127.0.0.1:{bootstrap}") is True
    published_dtype = "auto with MXFP4 index keys (--enable-fp4-indexer)" if fp4 else "auto"
    assert decode.prefill_info_table[f"127.0.0.1:{bootstrap}"].kv_cache_dtype == published_dtype


@pytest.mark.parametrize("prefill_fp4", [True, False], ids=["fp4-prefill", "fp4-decode"])
def test_bootstrap_refuses_mixed_formats_in_one_line(managers, bootstrap, prefill_fp4):
    managers("prefill", prefill_fp4, bootstrap)
    decode = managers("decode", not prefill_fp4, bootstrap)
    with pytest.raises(RuntimeError) as raised:
        decode.try_ensure_parallel_info(f"127.0.0.1:{bootstrap}")
    fp4, fp8 = "kv_cache_dtype=auto with MXFP4 index keys (--enable-fp4-indexer)", "kv_cache_dtype=auto"
    prefill, decode_side = (fp4, fp8) if prefill_fp4 else (fp8, fp4)
    line = str(raised.value)
    assert "\n" not in line
    assert f"prefill server has {prefill}," in line and f"decode server has {decode_side}." in line
    assert f"127.0.0.1:{bootstrap}" not in decode.prefill_info_table  # never paired: nothing is transferred

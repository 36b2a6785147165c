"""The GPU check of the radix cache and HiCache (scripts/hicache_radix_gpu.py), on the CPU.

Its runs need a GPU; here: the top-k rows it reads from the trace plugin and their agreement (against
hand-computed values), the Engine
arguments it builds, and its scheduler-side page probe run on SGLang's real HiCache host pool (CPU
tensors, as in test_plugin_hicache.py): it finds every reloaded page identical, and finds a page
corrupted in host memory.
"""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import pytest
import torch

from plugin_support import plugin  # noqa: F401 (the fixture)
from test_plugin_hicache import FP4_PAGE, _fill, _pools, cpu_host_pools  # noqa: F401 (a fixture)

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "hicache_radix_gpu.py"
_spec = importlib.util.spec_from_file_location("hicache_radix_gpu", _PATH)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def test_topk_agreement_over_the_rows_both_computed():
    longer = {(0, 9): [9], (0, 10): [1, 2, 3, 4], (0, 11): [5, 6]}  # its first row has no counterpart
    shorter = {(0, 10): [1, 2, 3, 4], (0, 11): [5, 7]}
    got = tool.topk_agreement(longer, shorter)
    assert got == {"rows": 2, "equal_rows": 1, "mean_overlap": 0.75, "min_overlap": 0.5, "unpaired_rows": 1}
    with pytest.raises(ValueError, match="a, b"):
        tool.topk_agreement({(1, 10): [1]}, shorter)


def _record(plen, slots, calls, mode="DECODE", bs=1):
    return {"forward_mode": mode, "batch_size": bs, "prompt_lens": [plen], "req_lens": [plen + 1],
            "req_slots": [torch.tensor(slots)], "calls": calls}


def _call(layer, values, pos, mode="DECODE"):
    return {"layer": layer, "mode": mode, "topk": torch.tensor([values + [-1]], dtype=torch.int32),
            "pos": torch.tensor([pos])}


def test_decode_runs_map_slots_to_positions_and_split_the_runs_of_one_prompt():
    """Two runs of a 3-token prompt whose pages sit in other slots (a reused or reloaded prefix): the same
    positions, so the runs agree, though no slot is shared; another prompt's rows and prefill rows are left out."""
    first, second = [10, 11, 12, 13, 14], [70, 71, 72, 13, 20]
    recs = [_record(3, first, [_call(0, [12, 10], 3), _call(1, [11], 3)]),
            _record(3, first, [_call(0, [13, 10], 4), _call(1, [13], 4)]),
            _record(5, first, [_call(0, [10], 5)]),  # another prompt
            _record(3, second, [_call(0, [70], 2, mode="EXTEND")], mode="EXTEND"),
            _record(3, second, [_call(0, [72, 70], 3), _call(1, [71], 3)]),
            _record(3, second, [_call(0, [13, 70], 4), _call(1, [13, 99], 4)])]  # slot 99 is not the request's
    runs = tool.decode_runs(recs, 3)
    assert runs == [{(0, 3): [0, 2], (1, 3): [1], (0, 4): [0, 3], (1, 4): [3]},
                    {(0, 3): [0, 2], (1, 3): [1], (0, 4): [0, 3], (1, 4): [-100, 3]}]
    got = tool.topk_agreement(*runs)
    assert got == {"rows": 4, "equal_rows": 3, "mean_overlap": 0.875, "min_overlap": 0.5, "unpaired_rows": 0}


def test_read_runs_names_a_missing_trace_and_too_few_runs(tmp_path):
    with pytest.raises(RuntimeError, match="no top-k trace"):
        tool.read_runs(str(tmp_path / "none"), 3, 2)
    (tmp_path / "t").mkdir()
    torch.save(_record(3, [1, 2, 3, 4], [_call(0, [1], 3)]), tmp_path / "t" / "1_00000.pt")
    with pytest.raises(RuntimeError, match="1 decode runs of the 3-token prompt, expected 2"):
        tool.read_runs(str(tmp_path / "t"), 3, 2)


def test_engine_arguments_keep_the_radix_cache():
    opts = types.SimpleNamespace(model="/tmp/tiny", fp8=False, mem_fraction_static=0.006)
    kw = tool.engine_kwargs(opts, enable_hierarchical_cache=True)
    assert kw["enable_fp4_indexer"] is True and kw["enable_hierarchical_cache"] is True
    assert "disable_radix_cache" not in kw and "enable_return_indexer_topk" not in kw
    assert "enable_fp4_indexer" not in tool.engine_kwargs(types.SimpleNamespace(**{**vars(opts), "fp8": True}))
    with pytest.raises(ValueError, match="disable_radix_cache"):
        tool.engine_kwargs(opts, disable_radix_cache=True)


@pytest.mark.sglang
@pytest.mark.parametrize("corrupt", [False, True], ids=["intact", "corrupted-host-page"])
def test_page_probe_on_sglangs_host_pool(plugin, cpu_host_pools, monkeypatch, tmp_path, corrupt):
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost

    for name in ("backup_from_device_all_layer", "load_to_device_per_layer"):  # restored after the test
        monkeypatch.setattr(DSAIndexerPoolHost, name, getattr(DSAIndexerPoolHost, name))
    out = tmp_path / "probe.jsonl"
    monkeypatch.setenv(tool.PROBE_ENV, str(out))
    exec(compile(tool.PROBE_SOURCE, "sitecustomize.py", "exec"), {})

    target, _, host = _pools(["--enable-fp4-indexer"], hicache_mem_layout="layer_first", hicache_io_backend="direct")
    _fill(target.index_k_with_scale_buffer, seed=3)
    device_slots, host_slots = torch.arange(64, 192), torch.arange(192, 320)  # device pages 1-2 -> host 3-4
    host.backup_from_device_all_layer(target, host_slots, device_slots, "direct")
    _fill(target.index_k_with_scale_buffer, seed=4)
    if corrupt:
        host.index_k_with_scale_buffer[1, 4, 7] ^= 0xFF  # host layer 1 (device layer 2), host page 4, one byte
    for layer in range(4):
        host.load_to_device_per_layer(target, host_slots, device_slots, layer, "direct")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {"op": "backup", "pages": 2, "layers": 2, "page_bytes": FP4_PAGE}
    loads = [(r["layer"], r["pages"], r["identical"], r["not_backed_up"]) for r in rows[1:]]
    assert loads == [(0, 2, 2, 0), (1, 2, 1 if corrupt else 2, 0)]  # skip-top-k layers 1 and 3 copy nothing

"""Safe beside any SGLang: the plugin never harms a server that did not ask for FP4.

Against the real SGLang 0.5.23 classes and its real ``HookRegistry``: hooks
pass calls through untouched while FP4 is not active; a target whose
signature changed or that was renamed is not hooked and FP4 is refused with
one warning naming it; ``requested`` is checked before any SGLang internal is
read and an error while reading them is a refusal; the SGLang version, the
index-key cache's attributes and the DSA pool class are checked before sizing.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_support import DSV32, ENTRY, published, stand_in_kvc
from plugin_support import plugin  # noqa: F401 (the fixture)
from plugin_support import server_args as _server_args

pytestmark = pytest.mark.sglang

TESTS = Path(__file__).resolve().parent

# A fresh process: SGLang's Indexer as the next SGLang might have it (one method gains a keyword, another is
# renamed) before SGLang's own load_plugins() registers and applies the plugin's hooks.
_CHILD = r"""
import json, logging, sys
sys.path.insert(0, sys.argv[1])
from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer

seen = []
def _get_topk_paged(self, forward_batch, layer_id, q_fp8, weights, metadata, topk_out=None):
    seen.append(topk_out)  # stands for the next SGLang's method, which gains a keyword
    return "sglang"
Indexer._get_topk_paged = _get_topk_paged
Indexer._fused_k_prepare_and_store_v2 = Indexer._fused_k_prepare_and_store  # renamed upstream
del Indexer._fused_k_prepare_and_store

messages = []
class Keep(logging.Handler):
    def emit(self, record):
        messages.append((record.name, record.levelno, record.getMessage()))
for name in ("sglang_fp4_indexer", "sglang.srt.plugins.hook_registry"):
    logging.getLogger(name).addHandler(Keep(logging.INFO))
    logging.getLogger(name).setLevel(logging.INFO)

from sglang.srt.plugins import load_plugins
load_plugins()
out = {"wrapped": hasattr(Indexer._get_topk_paged, "__wrapped__")}
out["call"] = Indexer._get_topk_paged(None, None, 0, None, None, None, topk_out="buffer")
out["seen"] = seen

from plugin_support import DSV32, H200, published, stand_in_kvc
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator
from sglang.srt.server_args import prepare_server_args
from sglang_fp4_indexer.sglang_plugin import facts, kv_pool
facts.device_facts = lambda *a, **k: H200  # no GPU on the CPU test machine
record = prepare_server_args(["--model-path", "dummy", "--enable-fp4-indexer"])
with published(page_size=64):
    kvc = stand_in_kvc(DSV32, record, num_layers=2)
    conf = object.__new__(DefaultPoolConfigurator)
    out["cell"] = conf._compute_dsa_indexer_cell_size(kvc=kvc, num_layers=61)
    built = KVCacheConfigurator._build_dsa_kv_pool(
        kvc, max_total_num_tokens=256, max_running_requests=4, dsa_pool_class=DSATokenToKVPool)
out["fp4_pool"] = kv_pool.is_fp4_pool(built)
out["messages"] = [m for m in messages if m[1] >= logging.WARNING]
print("RESULT" + json.dumps(out))
"""


def test_changed_and_renamed_sglang_targets_leave_sglang_as_it_is():
    """A target that gains a keyword stays SGLang's own (its calls work; hooked with the old parameter list, every
    call raised TypeError), a renamed one is not hooked (no 'Failed to apply hooks' traceback), and an FP4 server
    keeps FP8 with one warning naming both."""
    env = {**os.environ, "SGLANG_PLUGINS": ENTRY}
    env.pop("SGLANG_ENABLE_FP4_INDEXER", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(TESTS)], capture_output=True, text=True, env=env,
                          timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT"):])
    assert out["wrapped"] is False and out["call"] == "sglang" and out["seen"] == ["buffer"]
    assert out["cell"] == 61 * 132 and out["fp4_pool"] is False
    assert len(out["messages"]) == 1, out["messages"]
    name, _, text = out["messages"][0]
    assert name == "sglang_fp4_indexer" and text.startswith("FP4 indexer disabled, SGLang keeps its FP8 indexer:")
    indexer = "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer"
    assert f"{indexer}._get_topk_paged signature is (self, forward_batch, layer_id, q_fp8, weights, metadata, " \
           "topk_out=None), the plugin was written for (self, forward_batch, layer_id, q_fp8, weights, metadata)" in text
    assert f"{indexer}._fused_k_prepare_and_store not found in this SGLang (AttributeError" in text


def test_every_hook_passes_an_unknown_call_through_while_fp4_is_not_active(plugin):
    """SGLang may call a hooked method with arguments the plugin does not know: untouched to SGLang's original."""
    from sglang_fp4_indexer.sglang_plugin import hooks

    calls = []

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "sglang"

    for hook in hooks():
        calls.clear()
        if hook.kind == "AROUND":
            assert hook.hook(original, "a", 2, new_keyword=3) == "sglang", hook.target
            assert calls == [(("a", 2), {"new_keyword": 3})], hook.target
        else:
            assert hook.hook("result", "a", 2, new_keyword=3) == "result", hook.target


def _sizing_and_pool(kvc):
    """SGLang's own sizing of the index cell (61 layers) and pool build for ``kvc``."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    conf = object.__new__(DefaultPoolConfigurator)
    cell = conf._compute_dsa_indexer_cell_size(kvc=kvc, num_layers=61)
    pool_class = KVCacheConfigurator._resolve_kv_pool_class(kvc, kind="dsa", default=DSATokenToKVPool)
    built = KVCacheConfigurator._build_dsa_kv_pool(
        kvc, max_total_num_tokens=256, max_running_requests=4, dsa_pool_class=pool_class
    )
    return cell, built


def _warnings(caplog, run):
    logging.getLogger().addHandler(caplog.handler)  # prepare_server_args' basicConfig(force=True) removed it
    try:
        with caplog.at_level(logging.WARNING, logger="sglang_fp4_indexer"):
            result = run()
    finally:
        logging.getLogger().removeHandler(caplog.handler)
    return result, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_not_requested_reads_no_sglang_internals(plugin, monkeypatch, caplog):
    """Without the flag the pool hooks look only at whether FP4 was asked for: a renamed SGLang helper the gate's
    facts need cannot fail an FP8 launch. With the flag, the error is a refusal naming it."""
    from sglang.srt.configs import model_config

    from sglang_fp4_indexer.sglang_plugin import facts

    read = []
    real = facts.decision_for_kvc
    monkeypatch.setattr(facts, "decision_for_kvc", lambda *a, **k: read.append(1) or real(*a, **k))
    monkeypatch.setattr(plugin, "decision_for_kvc", facts.decision_for_kvc)
    off, on = _server_args(), _server_args("--enable-fp4-indexer")
    with published(page_size=64):
        monkeypatch.delattr(model_config, "get_dsa_index_kpool")  # as if renamed upstream (SGLang's callers bound it)
        (cell, built), warnings = _warnings(caplog, lambda: _sizing_and_pool(stand_in_kvc(DSV32, off, num_layers=2)))
    assert cell == 61 * 132 and not plugin.is_fp4_pool(built) and warnings == [] and read == []
    plugin.reset_state()
    record = on
    with published(page_size=64):
        (cell, built), warnings = _warnings(caplog, lambda: _sizing_and_pool(stand_in_kvc(DSV32, record, num_layers=2)))
    assert cell == 61 * 132 and not plugin.is_fp4_pool(built) and read
    assert len(warnings) == 1 and "could not read the server's facts from SGLang (ImportError" in warnings[0]
    assert "get_dsa_index_kpool" in warnings[0]


def test_untested_sglang_version_is_refused_before_sizing(plugin, monkeypatch, caplog):
    from sglang_fp4_indexer.sglang_plugin import seams

    assert seams.version_problem() is None  # the installed SGLang is the tested one
    monkeypatch.setattr(seams, "sglang_version", lambda: "0.6.0")
    record = _server_args("--enable-fp4-indexer")
    with published(page_size=64):
        (cell, built), warnings = _warnings(caplog, lambda: _sizing_and_pool(stand_in_kvc(DSV32, record, num_layers=2)))
    assert cell == 61 * 132 and not plugin.is_fp4_pool(built)
    assert len(warnings) == 1
    assert "SGLang 0.6.0 is installed; this release of sglang-fp4-indexer was tested with SGLang 0.5.23" in warnings[0]


def test_pool_class_with_its_own_index_cache_is_refused_before_sizing(plugin, monkeypatch, caplog):
    """A platform's DSA pool class that overrides _create_index_key_cache (as SGLang main's SharedDSATokenToKVPool
    does) would skip the hook after sizing charged 68 bytes: refused, sized and built as FP8."""
    from sglang.srt.mem_cache import kv_cache_configurator
    from sglang.srt.mem_cache.index_key_cache import IndexKeyCache
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    class OwnIndexCachePool(DSATokenToKVPool):  # stands for a pool class with its own index cache
        def _create_index_key_cache(self):
            return IndexKeyCache(self, self.index_buf_size)

    platform = kv_cache_configurator.current_platform
    monkeypatch.setattr(platform, "get_kv_pool_cls", lambda kind: OwnIndexCachePool if kind == "dsa" else None,
                        raising=False)
    record = _server_args("--enable-fp4-indexer")
    with published(page_size=64):
        (cell, built), warnings = _warnings(caplog, lambda: _sizing_and_pool(stand_in_kvc(DSV32, record, num_layers=2)))
    assert isinstance(built, OwnIndexCachePool) and cell == 61 * 132 and not plugin.is_fp4_pool(built)
    assert len(warnings) == 1 and "OwnIndexCachePool builds its index cache in" in warnings[0]
    assert "not DSATokenToKVPool's, which the FP4 cache hooks" in warnings[0]


def test_renamed_index_cache_attribute_is_refused_before_sizing(plugin, monkeypatch, caplog):
    """If SGLang's IndexKeyCache stopped calling _kernel_view (renamed upstream), the FP4 override would never run."""
    from sglang.srt.mem_cache.index_key_cache import IndexKeyCache

    def get_local_buffer(self, layer_id):  # stands for an upstream version that renamed _kernel_view
        return self._paged_view(self.buffer[layer_id - self.pool.start_layer])

    monkeypatch.setattr(IndexKeyCache, "get_local_buffer", get_local_buffer)
    record = _server_args("--enable-fp4-indexer")
    with published(page_size=64):
        (cell, built), warnings = _warnings(caplog, lambda: _sizing_and_pool(stand_in_kvc(DSV32, record, num_layers=2)))
    assert cell == 61 * 132 and not plugin.is_fp4_pool(built)
    assert len(warnings) == 1
    assert "sglang.srt.mem_cache.index_key_cache.IndexKeyCache.get_local_buffer no longer uses _kernel_view" \
        in warnings[0]


def test_unchanged_sglang_is_served(plugin):
    """The checks pass on the SGLang this release was tested with (the FP4 pool is built, 68 bytes sized)."""
    from sglang_fp4_indexer.sglang_plugin import seams

    assert seams.target_problems() == {} and seams.pool_attribute_problems() == []
    record = _server_args("--enable-fp4-indexer")
    with published(page_size=64):
        kvc = stand_in_kvc(DSV32, record, num_layers=2)
        assert seams.refusal(kvc) is None
        cell, built = _sizing_and_pool(kvc)
    assert cell == 61 * 68 and plugin.is_fp4_pool(built)

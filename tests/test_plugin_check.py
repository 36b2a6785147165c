"""``sglang-fp4-indexer check``: decision and memory effect from a config JSON, no weights, no GPU."""

from __future__ import annotations

import json
import sys

import pytest

from plugin_support import DSV32, GLM5, LLAMA
from sglang_fp4_indexer.cli import main

pytestmark = pytest.mark.sglang
GIB = 2**30


def _write(tmp_path, cfg, as_dir=True):
    if as_dir:
        d = tmp_path / "model"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        return str(d)
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    return str(f)


def _run(capsys, *argv):
    code = main(["check", *argv])
    return code, " ".join(capsys.readouterr().out.split())  # rich wraps lines: compare whitespace-normalised


@pytest.mark.parametrize("cfg, layers", [(DSV32, 61), (GLM5, 78)], ids=["deepseek-v3.2", "glm-5"])
def test_enabled_with_memory_effect(tmp_path, capsys, cfg, layers):
    code, out = _run(capsys, _write(tmp_path, cfg), "--memory-gib", "80", "--capability", "9.0")
    assert code == 0
    assert "FP4 indexer: ENABLED" in out and "classified by sglang" in out
    kv = 512 + (512 // 128) * 4 + 64 * 2  # FlashMLA FP8: 512 e4m3, one fp32 scale per 128, 64 bf16 RoPE dims
    assert kv == 656
    fp8, fp4 = layers * (kv + 132), layers * (kv + 68)
    assert str(fp8) in out and str(fp4) in out
    assert str(80 * GIB // fp8) in out and str(80 * GIB // fp4) in out
    assert f"{layers} with an index cache" in out


def test_bf16_kv_and_fewer_index_layers(tmp_path, capsys):
    # index_topk_freq 2: SGLang's rule skips layer l when max(l - 1, 0) is odd -> layers 0, 1, 3, ..., 59: 31.
    cfg = {**DSV32, "index_topk_freq": 2}
    code, out = _run(capsys, _write(tmp_path, cfg, as_dir=False), "--capability", "10.0", "--kv-cache-dtype", "bf16")
    assert code == 0 and "61 (31 with an index cache)" in out
    per_fp8 = 61 * (512 + 64) * 2 + 31 * 132
    assert str(per_fp8) in out and str(100 * GIB // per_fp8) in out


def test_refusals_name_reason_and_exit_1(tmp_path, capsys):
    path = _write(tmp_path, GLM5)
    code, out = _run(capsys, path, "--capability", "9.0", "--sglang-args=--dcp-size 2 --enable-hierarchical-cache")
    assert code == 1 and "DISABLED" in out and "hierarchical cache" in out and "--dcp-size" not in out
    code, out = _run(capsys, path, "--capability", "9.0", "--sglang-args=--enable-flexkv")
    assert code == 1 and "external KV stores (flexkv)" in out
    code, out = _run(capsys, path, "--capability", "8.0")
    assert code == 1 and "no FP8 MMA" in out
    code, out = _run(capsys, _write(tmp_path, LLAMA, as_dir=False))
    assert code == 1 and "not a DeepSeek Sparse Attention model" in out and "memory effect: none" in out


def test_deepseek_v4_points_to_sglang_flag(tmp_path, capsys):
    cfg = {"architectures": ["DeepseekV4ForCausalLM"], "index_topk": 512, "index_head_dim": 128, "index_n_heads": 64}
    code, out = _run(capsys, _write(tmp_path, cfg), "--capability", "9.0")
    assert code == 1 and "--enable-deepseek-v4-fp4-indexer" in out


def test_without_sglang_uses_config_keys(tmp_path, capsys, monkeypatch):
    # Importing the plugin's facts module fails as it would without SGLang installed.
    monkeypatch.setitem(sys.modules, "sglang_fp4_indexer.sglang_plugin.facts", None)
    path = _write(tmp_path, DSV32)
    code, out = _run(capsys, path, "--capability", "9.0")
    assert code == 0 and "classified by config keys" in out and "ENABLED" in out
    with pytest.raises(SystemExit) as exc:
        main(["check", path, "--sglang-args=--dcp-size 2"])
    assert exc.value.code == 2
    assert "SGLang is not installed" in capsys.readouterr().err


def test_bad_input(tmp_path, capsys):
    for argv in (
        [str(tmp_path / "missing")],
        [_write(tmp_path, DSV32), "--capability", "nine"],
        [str(tmp_path / "model"), "--memory-gib", "0"],
        [str(tmp_path / "model"), "--sglang-args=--no-such-flag"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(["check", *argv])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    for text in ("no config file", "--capability", "--memory-gib", "--no-such-flag"):
        assert text in err
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(SystemExit):
        main(["check", str(tmp_path / "bad.json")])

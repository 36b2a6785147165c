"""``sglang-fp4-indexer check``: decision and memory effect from a config JSON, no weights, no GPU."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from plugin_support import DSV32, GLM5, GLM52, LLAMA
from sglang_fp4_indexer.check import LOADING_SGLANG
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


#: The KV budget the tests about other things give (``--memory-gib``): their fixtures hold only the config keys the
#: decision reads, not the shapes the derived budget needs (tests/test_check_budget.py checks the derivation).
MEMORY = ("--memory-gib", "100")


def _run(capsys, *argv, derive=False):
    if not derive and not any(a.startswith("--memory-gib") for a in argv):
        argv = (*argv, *MEMORY)
    code = main(["check", *argv])
    # rich wraps lines and draws cell borders: compare whitespace-normalised, without the borders
    return code, " ".join(capsys.readouterr().out.replace("│", " ").replace("┃", " ").split())


@pytest.mark.parametrize("cfg, layers", [(DSV32, 61), (GLM5, 78)], ids=["deepseek-v3.2", "glm-5"])
def test_enabled_with_memory_effect(tmp_path, capsys, cfg, layers):
    code, out = _run(capsys, _write(tmp_path, cfg), "--memory-gib", "80", "--capability", "9.0", "--kv-cache-dtype", "fp8")
    assert code == 0
    assert "FP4 indexer: ENABLED" in out and "classified by SGLang's own DSA helpers" in out
    kv = 512 + (512 // 128) * 4 + 64 * 2  # FlashMLA FP8: 512 e4m3, one fp32 scale per 128, 64 bf16 RoPE dims
    assert kv == 656
    fp8, fp4 = layers * (kv + 132), layers * (kv + 68)
    assert f"{kv + 132} {fp8}" in out and f"{kv + 68} {fp4}" in out and "MLA KV 656 B per token and layer in fp8 (--kv-cache-dtype of check)" in out
    assert str(80 * GIB // fp8) in out and str(80 * GIB // fp4) in out
    assert f"{layers} with an index cache" in out


def test_bf16_kv_and_fewer_index_layers(tmp_path, capsys):
    # index_topk_freq 2: SGLang's rule skips layer l when max(l - 1, 0) is odd -> layers 0, 1, 3, ..., 59: 31.
    cfg = {**DSV32, "index_topk_freq": 2}
    code, out = _run(capsys, _write(tmp_path, cfg, as_dir=False), "--capability", "10.0", "--kv-cache-dtype", "bf16")
    assert code == 0 and "61 (31 with an index cache)" in out
    per_fp8 = 61 * (512 + 64) * 2 + 31 * 132
    assert str(per_fp8) in out and str(100 * GIB // per_fp8) in out


def test_hierarchical_cache_and_pd_are_served(tmp_path, capsys):
    path = _write(tmp_path, DSV32)
    for flags in ("--enable-hierarchical-cache", "--disaggregation-mode decode",
                  "--enable-hierarchical-cache --disaggregation-mode prefill"):
        code, out = _run(capsys, path, "--capability", "9.0", f"--sglang-args={flags}")
        assert code == 0 and "FP4 indexer: ENABLED" in out and "refused" not in out, flags
    code, out = _run(capsys, path, "--capability", "9.0", "--sglang-args=--enable-hierarchical-cache --tp-size 2 --dcp-size 2")
    assert code == 1 and "--dcp-size 2) translates host pages per rank" in out


def test_refusals_name_reason_and_exit_1(tmp_path, capsys):
    path = _write(tmp_path, GLM5)
    code, out = _run(capsys, path, "--capability", "9.0", "--sglang-args=--tp-size 2 --dcp-size 2 --enable-hisparse")
    assert code == 1 and "DISABLED" in out and "HiSparse" in out and "--dcp-size" not in out
    code, out = _run(capsys, path, "--capability", "9.0", "--sglang-args=--enable-flexkv")
    assert code == 1 and "external KV stores (flexkv)" in out
    code, out = _run(capsys, path, "--capability", "8.0")
    assert code == 1 and "no FP8 MMA" in out
    code, out = _run(capsys, _write(tmp_path, LLAMA, as_dir=False))
    assert code == 1 and "not a DeepSeek Sparse Attention model" in out and "memory effect: none" in out


def _tokens(memory, per_rank_bytes):
    return math.floor(Fraction(memory) / per_rank_bytes)


@pytest.mark.parametrize("w", [2, 8])
@pytest.mark.parametrize("shard", [False, True], ids=["replicated", "sharded"])
def test_dcp_rows_are_per_rank(tmp_path, capsys, w, shard):
    flags = f"--tp-size 8 --dcp-size {w}" + (" --fp4-indexer-dcp-shard" if shard else "")
    code, out = _run(capsys, _write(tmp_path, DSV32), "--memory-gib", "80", "--capability", "9.0",
                     "--kv-cache-dtype", "fp8", f"--sglang-args={flags}")
    assert code == 0 and f"DCP {w}: {'sharded' if shard else 'replicated'} index" in out
    assert f"per rank, DCP {w}" in out
    # Per rank and layer: MLA KV 656 / W always sharded; index 132 or 68 replicated, 68 / W sharded.
    fp8, rep, sh = Fraction(656, w) + 132, Fraction(656, w) + 68, Fraction(656 + 68, w)
    if w == 8:
        assert (fp8, rep, sh) == (214, 150, Fraction(181, 2))  # the DCP section of docs/user-guide.md
    t8, tr, ts = (_tokens(80 * GIB, 61 * b) for b in (fp8, rep, sh))
    show = lambda x: str(x.numerator) if x.denominator == 1 else f"{float(x):g}"  # noqa: E731
    assert f"FP8 (SGLang) 132 {show(fp8)} {show(61 * fp8)} {t8}" in out
    assert f"FP4 replicated{'' if shard else ' *'} 68 {show(rep)} {show(61 * rep)} {tr}" in out
    assert f"FP4 sharded{' *' if shard else ''} {show(Fraction(68, w))} {show(sh)} {show(61 * sh)} {ts}" in out
    tokens = ts if shard else tr
    gain = f"+{(tokens / t8 - 1) * 100:.1f} %"
    expected = {(2, False): "+16.2 %", (2, True): "+27.1 %", (8, False): "+42.7 %", (8, True): "+136.5 %"}
    assert gain == expected[w, shard]
    assert f"extra KV tokens with FP4 ({'sharded' if shard else 'replicated'}): {tokens - t8} ({gain})" in out


def _kv_line(out):
    return out[out.index("MLA KV"):]


def test_kv_cache_dtype_follows_sglang(tmp_path, capsys):
    path = _write(tmp_path, GLM5)
    # SGLang 0.5.23 (_dsa_kv_cache_dtype_default): auto -> bfloat16 below SM100, fp8_e4m3 from SM100.
    code, out = _run(capsys, path, "--capability", "9.0")
    bf16 = (512 + 64) * 2
    assert code == 0 and f"MLA KV {bf16} B per token and layer in bf16 (SGLang's default for DSA models on CUDA 9.0: bfloat16 below" in out
    t8, t4 = 100 * GIB // (78 * (bf16 + 132)), 100 * GIB // (78 * (bf16 + 68))
    assert f"+{(t4 / t8 - 1) * 100:.1f} %" == "+5.2 %" and f"{t4 - t8} (+5.2 %)" in out
    code, out = _run(capsys, path, "--capability", "10.0")
    assert "MLA KV 656 B per token and layer in fp8 (SGLang's default for DSA models on CUDA 10.0: fp8_e4m3 from" in out
    code, out = _run(capsys, path, "--capability", "10.0", "--sglang-args=--kv-cache-dtype bf16")
    assert f"MLA KV {bf16} B per token and layer in bf16 (--kv-cache-dtype bf16 in --sglang-args)" in out
    code, out = _run(capsys, path, "--capability", "9.0", "--kv-cache-dtype", "fp8", "--sglang-args=--kv-cache-dtype=fp8_e4m3")
    assert "MLA KV 656 B per token and layer in fp8 (--kv-cache-dtype fp8_e4m3 in --sglang-args)" in out
    (tmp_path / "sinks").mkdir()
    sinks = _write(tmp_path / "sinks", {**GLM5, "learnable_sink": True})
    code, out = _run(capsys, sinks, "--capability", "10.0")
    assert f"MLA KV {bf16} B per token and layer in bf16 (SGLang's default" in out and "bfloat16 for learnable attention sinks" in out
    for argv, text in (
        (["--kv-cache-dtype", "bf16", "--sglang-args=--kv-cache-dtype=fp8_e4m3"], "conflicts with --kv-cache-dtype fp8_e4m3"),
        (["--sglang-args=--kv-cache-dtype fp8_e5m2"], "bf16/bfloat16 or fp8_e4m3 only"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(["check", path, *argv])
        assert exc.value.code == 2 and text in capsys.readouterr().err


def test_sglang_kv_dtype_architectures_match_sglang():
    from sglang.srt.arg_groups.overrides import _DEEPSEEK_FAMILY_ARCHS

    from sglang_fp4_indexer.check import DSA_KV_DTYPE_ARCHS

    # model_hook runs the DSA dtype default for its DeepSeek-family list, which lacks the Longcat draft.
    assert DSA_KV_DTYPE_ARCHS == _DEEPSEEK_FAMILY_ARCHS - {"LongcatFlashForCausalLMNextN"}


@pytest.mark.parametrize("argv, cfg, reason", [
    (["--sglang-args=--page-size 32"], DSV32, "32 tokens"),
    (["--sglang-args=--enable-hierarchical-cache --hicache-storage-backend file"], DSV32, "storage backend"),
    (["--capability", "8.0"], DSV32, "no FP8 MMA"),
], ids=["page-size", "hicache-storage", "sm80"])
def test_refused_memory_rows_are_labelled_hypothetical(tmp_path, capsys, argv, cfg, reason):
    code, out = _run(capsys, _write(tmp_path, cfg), "--kv-cache-dtype", "fp8", *argv)
    assert code == 1 and "DISABLED" in out and reason in out
    t8, t4 = 100 * GIB // (61 * 788), 100 * GIB // (61 * 724)
    assert f"FP4 (refused) 68 724 {61 * 724} {t4}" in out and "what FP4 would give if the refusal were lifted" in out
    assert "extra KV tokens with FP4" not in out
    assert f"if the refusal were lifted, FP4 would add {t4 - t8} KV tokens (+{(t4 / t8 - 1) * 100:.1f} %)" in out


@pytest.mark.parametrize("blocked", [False, True], ids=["sglang", "config-keys"])
def test_glm5_index_key_rotation_decides_and_is_reported(tmp_path, capsys, monkeypatch, blocked):
    """GLM-5 / 5.1 (NeoX indexer RoPE): SGLang rotates the index keys. GLM-5.2 (interleaved): SGLang's fused
    indexer skips the rotation and the plugin applies it with the FP4 cache, so FP4 is enabled with SGLang's fusion
    on; with SGLANG_DISABLE_DSA_INDEXER_FUSION=1 SGLang's unfused indexer rotates. ``check`` prints which."""
    monkeypatch.delenv("SGLANG_DISABLE_DSA_INDEXER_FUSION", raising=False)
    if blocked:
        monkeypatch.setitem(sys.modules, "sglang", None)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code, out = _run(capsys, _write(tmp_path / "a", GLM5), "--capability", "9.0")
    assert code == 0 and "ENABLED" in out
    assert "index keys: rotated (NeoX-style indexer RoPE: SGLang's unfused indexer applies the Hadamard rotation)" in out
    glm52 = _write(tmp_path / "b", GLM52)
    code, out = _run(capsys, glm52, "--capability", "9.0")
    assert code == 0 and "ENABLED" in out and "SGLANG_DISABLE_DSA_INDEXER_FUSION" not in out
    assert ("index keys: rotated (interleaved indexer RoPE: SGLang's fused indexer skips the Hadamard rotation; "
            "with the FP4 cache the plugin applies SGLang's rotation to the index queries and keys)") in out
    monkeypatch.setenv("SGLANG_DISABLE_DSA_INDEXER_FUSION", "1")
    code, out = _run(capsys, glm52, "--capability", "9.0")
    assert code == 0 and "ENABLED" in out
    assert "index keys: rotated (interleaved indexer RoPE with SGLANG_DISABLE_DSA_INDEXER_FUSION=1" in out


def test_config_reporting(tmp_path, capsys):
    no_arch = {k: v for k, v in DSV32.items() if k != "architectures"}
    code, out = _run(capsys, _write(tmp_path, no_arch, as_dir=False), "--capability", "9.0")
    assert "model: no architectures in config, model_type 'deepseek_v32'" in out and "model: None" not in out
    (tmp_path / "s.json").write_text(json.dumps({**DSV32, "index_n_heads": "32"}))
    with pytest.raises(SystemExit) as exc:
        main(["check", str(tmp_path / "s.json")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "index_n_heads must be an integer" in err and "'32' (str)" in err
    with pytest.raises(SystemExit) as exc:
        main(["check", "some-org/Some-Model-7B"])  # a hub id without a packaged config
    err = " ".join(capsys.readouterr().err.split())
    assert exc.value.code == 2 and "hf download some-org/Some-Model-7B config.json --local-dir DIR" in err
    assert "huggingface-cli" not in err
    for missing in ("/nonexistent", "./v32", "v32/config.json", str(tmp_path / "gone")):  # paths, not hub ids
        with pytest.raises(SystemExit) as exc:
            main(["check", missing])
        err = " ".join(capsys.readouterr().err.split())
        assert exc.value.code == 2 and f"model: no such file or directory: {missing} (" in err, err
        assert "hf download" not in err and "deepseek-v3.2, glm-5, glm-5.2" in err
    with pytest.raises(SystemExit) as exc:
        main(["check", _write(tmp_path, DSV32), "--sglang-args=--model-path foo"])
    err = " ".join(capsys.readouterr().err.split())
    assert exc.value.code == 2 and "--model-path is not used by check" in err


def test_deepseek_v4_points_to_sglang_flag(tmp_path, capsys):
    cfg = {"architectures": ["DeepseekV4ForCausalLM"], "index_topk": 512, "index_head_dim": 128, "index_n_heads": 64}
    code, out = _run(capsys, _write(tmp_path, cfg), "--capability", "9.0")
    assert code == 1 and "--enable-deepseek-v4-fp4-indexer" in out


def test_without_sglang_uses_config_keys(tmp_path, capsys, monkeypatch):
    # Importing SGLang fails as it does where it is not installed.
    monkeypatch.setitem(sys.modules, "sglang", None)
    path = _write(tmp_path, DSV32)
    code, out = _run(capsys, path, "--capability", "9.0")
    assert code == 0 and "classified by its config keys, SGLang not being importable here" in out and "ENABLED" in out
    assert "MLA KV 1152 B per token and layer in bf16 (SGLang's default for DSA models on CUDA 9.0" in out
    with pytest.raises(SystemExit) as exc:
        main(["check", path, "--sglang-args=--dcp-size 2"])
    assert exc.value.code == 2
    assert "SGLang is not importable here" in capsys.readouterr().err


_BLOCKED = "import sys; sys.modules['sglang'] = None; from sglang_fp4_indexer.cli import main; sys.exit(main(sys.argv[1:]))"


def test_without_sglang_subprocess(tmp_path):
    path = _write(tmp_path, GLM5)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = lambda *a: subprocess.run([sys.executable, "-c", _BLOCKED, "check", path, "--capability", "10.0", *MEMORY, *a],  # noqa: E731
                                    capture_output=True, text=True, env=env, timeout=300)
    res = run()
    assert res.returncode == 0 and "ENABLED" in res.stdout and "Traceback" not in res.stderr, res.stderr
    assert "loading SGLang" not in res.stderr  # not installed: nothing to wait for
    assert "MLA KV 656 B per token and layer in fp8 (SGLang's default" in " ".join(res.stdout.split())
    res = run("--sglang-args=--dcp-size 2")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "SGLang is not importable here" in lines[0], res.stderr


def test_no_sglang_import_warnings(tmp_path):
    res = subprocess.run([sys.executable, "-m", "sglang_fp4_indexer.cli", "check", _write(tmp_path, DSV32), *MEMORY],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert res.returncode == 0 and "classified by SGLang's own DSA helpers" in " ".join(res.stdout.split())
    assert "UserWarning" not in res.stderr and "AWQ" not in res.stderr, res.stderr
    # SGLang's import takes ~20 s: check says so first, on stderr (stdout stays the report).
    assert res.stderr.startswith("loading SGLang to classify the model"), res.stderr


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
    for text in ("no such file or directory", "--capability", "--memory-gib", "--no-such-flag"):
        assert text in err
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(SystemExit):
        main(["check", str(tmp_path / "bad.json")])


def _one_line_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["check", *argv])
    captured = capsys.readouterr()
    err = captured.err.replace(LOADING_SGLANG + "\n", "")
    assert exc.value.code == 2, (argv, captured)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "ENABLED" not in captured.out
    return " ".join(err.split())


def test_binary_config_file_is_named(tmp_path, capsys):
    path = tmp_path / "model.safetensors"
    path.write_bytes(bytes(range(256)) * 4)
    err = _one_line_error(capsys, [str(path)])
    assert f"model: {path} is not a JSON text file (it holds binary data" in err


@pytest.mark.parametrize("drop", ["num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "index_n_heads",
                                  "index_head_dim"])
@pytest.mark.parametrize("cfg", [DSV32, GLM5], ids=["deepseek-v3.2", "glm-5"])
def test_dsa_config_without_a_key_check_reads_is_one_kind_of_error(tmp_path, capsys, cfg, drop):
    """Every key check needs, missing: the same usage error naming it (exit 2), never a refusal (exit 1)."""
    path = _write(tmp_path, {k: v for k, v in cfg.items() if k != drop}, as_dir=False)
    err = _one_line_error(capsys, [path, "--capability", "9.0"])
    assert f"model: {path}: missing {drop}, " in err and f"A {cfg['architectures'][0]} config.json has it" in err


@pytest.mark.parametrize("layers", [-3, 0])
def test_non_positive_layer_count_is_an_error(tmp_path, capsys, layers):
    path = _write(tmp_path, {**DSV32, "num_hidden_layers": layers}, as_dir=False)
    err = _one_line_error(capsys, [path])
    assert f"model: {path}: num_hidden_layers must be >= 1, got {layers}" in err


@pytest.mark.parametrize("cfg", [DSV32, GLM5], ids=["deepseek-v3.2", "glm-5"])
def test_dsa_architecture_without_index_topk_names_the_key(tmp_path, capsys, cfg):
    path = _write(tmp_path, {k: v for k, v in cfg.items() if k != "index_topk"}, as_dir=False)
    err = _one_line_error(capsys, [path])
    assert f"model: {path}: missing index_topk, the indexer's top-k; without it SGLang does not treat" in err
    assert f"A {cfg['architectures'][0]} config.json has it" in err


def test_deepseek_v3_without_index_topk_is_refused_not_an_error(tmp_path, capsys):
    # DeepSeek-V3 (same family, no sparse indexer) has no index_topk: a plain refusal, not a config error.
    cfg = {k: v for k, v in DSV32.items() if k != "index_topk"}
    code, out = _run(capsys, _write(tmp_path, {**cfg, "architectures": ["DeepseekV3ForCausalLM"]}), "--capability", "9.0")
    assert code == 1 and "not a DeepSeek Sparse Attention model" in out and "memory effect: none" in out


def test_bad_environment_value_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_ENABLE_FP4_INDEXER", "maybe")
    err = _one_line_error(capsys, [_write(tmp_path, DSV32)])
    assert "SGLANG_ENABLE_FP4_INDEXER='maybe': expected 1, true, yes or on to enable" in err


def test_context_shorter_than_next_n_is_an_error(tmp_path, capsys):
    err = _one_line_error(capsys, [_write(tmp_path, DSV32), "--context", "2", "--next-n", "4"])
    assert "error: --context: 2 tokens cannot hold --next-n 4 query tokens" in err


_REPO = Path(__file__).resolve().parents[1]


def _sources():
    from sglang_fp4_indexer.tables import load_tables

    bench_src, acc_src = load_tables()["sources"][:2]
    return json.loads((_REPO / bench_src).read_text()), json.loads((_REPO / acc_src).read_text())


def _row_us(batch: int, context: int) -> float:
    """Ours (FP4) at 64 heads, next_n 1, from the bench report the tables are built from."""
    from sglang_fp4_indexer.tables import load_tables

    row = next(r for r in load_tables()["timing"]["rows"]
               if (r["heads"], r["batch"], r["context"], r["next_n"]) == (64, batch, context, 1))
    return row["fp4_us"]


def _measured_on() -> str:
    """How check names the timing run: its GPU and the torch and triton it ran, from the bench report's meta."""
    meta = _sources()[0]["meta"]
    return f"measured on {meta['device']} (torch {meta['torch']}, triton {meta['triton']})"


def _model_cost(context, indexer="stand-in", trained_on=None):
    from sglang_fp4_indexer.tables import load_tables, nearest_model_cost

    return nearest_model_cost(load_tables(), context, 2048, indexer, trained_on)


def _pm(ms):
    return f"{ms[0]:+.4f} ± {ms[1]:.4f}"


def _bench_us(bench, heads, batch, context, next_n, column):
    row = next(r for r in bench["rows"]
               if (r["heads"], r["batch"], r["context"], r["next_n"]) == (heads, batch, context, next_n))
    res = row["results"].get(column, {})
    return res["seconds"] * 1e6 if res.get("status") == "ok" else None, row["fp8_floor_s"] * 1e6


#: The H100 kernel benchmarks beside DeepGEMM's newer SM90 kernel (docs/benchmarks.md), read raw here.
_H100_BENCHES = [_REPO / "benchmarks" / "results" / f"bench_h100_sm90_multicast_{name}_2026-12-06.json"
                 for name in ("n4n2", "shapes", "repeat", "4x128k", "4x128k_repeat")] + [
    _REPO / "benchmarks" / "results" / f"bench_h100_q_one_chunk{name}_2026-12-07.json" for name in ("", "_reverse")]


def _h100_bench_us(heads, batch, context, next_n, column):
    """A column's time at a shape on the H100 (µs): the median of its passing times over the runs of the newest day
    that measured that shape, the rule the tables state; None where no run has one."""
    import statistics

    runs = [(report["meta"]["date"][:10], r) for report in (json.loads(p.read_text()) for p in _H100_BENCHES)
            for r in report["rows"] if (r["heads"], r["batch"], r["context"], r["next_n"]) == (heads, batch, context, next_n)]
    newest = max((day for day, _ in runs), default=None)
    times = [r["results"][column]["seconds"] * 1e6 for day, r in runs
             if day == newest and r["results"].get(column, {}).get("status") == "ok"]
    return statistics.median(times) if times else None


def _recall(acc, workload, context, heads):
    case = next(c for c in acc["cases"] if (c["workload"], c["context"], c["heads"]) == (workload, context, heads))
    return case["formats"]["FP4"]["recall_mean"], case["formats"]["FP8"]["recall_mean"]


@pytest.mark.parametrize("cfg, layers, heads, kv", [(DSV32, 61, 64, 1152), (GLM5, 78, 32, 1152)],
                         ids=["deepseek-v3.2", "glm-5"])
def test_context_adds_what_fp4_gains_and_costs(tmp_path, capsys, cfg, layers, heads, kv):
    bench, acc = _sources()
    ours = next(s["name"] for s in bench["scorers"] if s["name"] in ("ours", "ours[auto]"))
    code, out = _run(capsys, _write(tmp_path, cfg), "--gpu", "H200", "--context", "131072", "--batch", "8")
    assert "ENABLED" in out  # the exit code is the verdict's (below)
    # Tokens: SGLang's Hopper default MLA KV is bf16 (1152 B); requests of 128K that fit.
    t8, t4 = 100 * GIB // (layers * (kv + 132)), 100 * GIB // (layers * (kv + 68))
    assert (f"at 128K tokens per request: requests that fit: FP8 {t8 // 131072}, FP4 {t4 // 131072} "
            f"(a batch of 8 needs {8 * 131072} KV tokens; FP8 holds {t8}, FP4 {t4})") in out
    # Time: the benchmark's own number at this exact shape, labelled as measured on H200.
    fp4_us, fp8_floor = _bench_us(bench, heads, 8, 131072, 1, ours)
    fp8_us, _ = _bench_us(bench, heads, 8, 131072, 1, "deepgemm-fp8")
    assert f"{_measured_on()} at this shape: FP4 {fp4_us:.1f} us (times {layers} index layers: " \
           f"{fp4_us * layers / 1000:.2f} ms per step, multiplied out)" in out
    if fp8_us is None:
        assert f"FP8 time not measured (its memory-bandwidth floor there: {fp8_floor:.1f} us)" in out
    else:
        assert f"FP8 (DeepGEMM, as SGLang calls it) {fp8_us:.1f} us" in out
    # Recall: the accuracy study's numbers at 128K for this H, every workload.
    text4, text8 = _recall(acc, "text", 131072, heads)
    assert f"at 128K, H {heads} (accuracy study on NVIDIA H200" in out
    assert f"text {text4:.3f} vs {text8:.3f}" in out
    gain = f"+{(t4 / t8 - 1) * 100:.1f} %"
    assert gain == "+5.2 %"
    verdict = out[out.index("verdict: "):]
    r8, r4 = t8 // 131072, t4 // 131072
    speed = f"a {fp8_us / fp4_us:.2f}x faster indexer" if fp8_us is not None else "a faster indexer"
    if r4 > r8:  # FP4 fits more requests of this length: exit 0
        assert code == 0
        # The gain first, in requests of the asked length (an independent count: the pools' tokens over 128K).
        # Where the batch of 8 fits FP8's pool too, the extra requests count only under a larger load.
        where = (f" (more than {r8} requests of 128K at once; your batch of 8 fits either way)" if 8 <= r8
                 else "; your batch fits only with FP4")
        assert verdict.startswith(f"verdict: FP4 fits {r4} requests of 128K where FP8 fits {r8} "
                                  f"(+{(r4 / r8 - 1) * 100:.0f} %): turn FP4 on where KV memory limits you{where}, "
                                  f"with {speed}; measured cost: ")
    else:  # the same number either way: exit 3
        assert code == 3
        assert verdict.startswith(f"verdict: FP4 fits no more requests of 128K than FP8 ({r8} either way; {gain} KV tokens), "
                                  f"so it buys only {speed}, at a measured cost of ")
    assert f"{(text8 - text4) * 100:.1f} points less top-2048 recall at 128K (text workload)" in verdict
    # The real-model study's numbers at its context nearest 128K for each indexer, as measured
    # (tables.nearest_model_cost): the GPU long-context study's 32K rows.
    quoted = []
    for indexer, on, label, words in (
            ("stand-in", None, "a stand-in indexer built from its own queries and keys", "stand-in indexer"),
            ("trained", "12 x 8192 tokens", "a small lightning indexer trained on 12 x 8192 tokens",
             "lightning indexer trained on 12 x 8192 tokens")):
        m = _model_cost(131072, indexer, on)
        assert m is not None and (m["topk"], m["context"], m["device"]) == (2048, 32768, "NVIDIA H100 80GB HBM3")
        text = (f"Δ loss vs dense attention FP4 {_pm(m['delta_fp4'])}, FP8 {_pm(m['delta_fp8'])} nats/token "
                f"(FP4 - FP8 {_pm(m['fp4_minus_fp8'])}), passkey FP4 {m['passkey_fp4'][0]}/{m['passkey_fp4'][1]} vs "
                f"FP8 {m['passkey_fp8'][0]}/{m['passkey_fp8'][1]} on Gemma 3 270M at 32K, top-2048 (real-model study, "
                f"{words}, NVIDIA H100 80GB HBM3)")
        assert text in verdict
        quoted.append(verdict.index(text))
        assert (f"on a real model (Gemma 3 270M, sparse attention in its 3 global layers over {label}, NVIDIA H100 "
                f"80GB HBM3), at 32K, top-2048, {m['windows']} text windows (the nearest measured context to 128K)") in out
        assert f"; the indexer's own selection holds {m['attention_recall_exact']:.2f} of the layer's attention top-2048" in out
    assert quoted == sorted(quoted)  # the stand-in first


def test_context_verdict_decides_and_its_exit_code_says_which(tmp_path, capsys):
    cfg = _write(tmp_path, DSV32)
    t8, t4 = 100 * GIB // (61 * (1152 + 132)), 100 * GIB // (61 * (1152 + 68))
    # Neither format fits 64 requests of 128K: exit 4.
    code, out = _run(capsys, cfg, "--capability", "9.0", "--context", "131072", "--batch", "64")
    assert code == 4
    assert out[out.index("verdict: "):] == (
        f"verdict: FP4 fits {t4 // 131072} requests of 128K where FP8 fits {t8 // 131072} "
        f"(+{(t4 // 131072 / (t8 // 131072) - 1) * 100:.0f} %); neither fits the batch asked: 64 x 128K needs "
        f"{64 * 131072} KV tokens, FP8 holds {t8}, FP4 {t4}; lower --batch or add memory")
    # One request of 1.3M tokens fits either way and no second one does: exit 3, the trade stated.
    context = t8 - 1000
    assert t4 // context == t8 // context == 1
    code, out = _run(capsys, cfg, "--capability", "9.0", "--context", str(context))
    assert code == 3 and "verdict: FP4 fits no more" in out and "(1 either way; +5.2 % KV tokens)" in out
    # The batch fits only with FP4: exit 0, said.
    batch = t8 // 131072 + 1
    assert batch * 131072 <= t4
    code, out = _run(capsys, cfg, "--capability", "9.0", "--context", "131072", "--batch", str(batch))
    assert code == 0 and "; your batch fits only with FP4, with " in out


def test_context_quotes_only_the_asked_next_n(tmp_path, capsys):
    from sglang_fp4_indexer.tables import load_tables

    measured = sorted({r["next_n"] for r in load_tables()["timing"]["rows"]})
    assert 8 not in measured
    code, out = _run(capsys, _write(tmp_path, DSV32), "--gpu", "H200", "--context", "131072", "--batch", "8",
                     "--next-n", "8")
    assert code == 0
    assert (f"indexer scorer time at next_n 8: not measured (the NVIDIA H200 tables have next_n "
            f"{', '.join(map(str, measured))}; no other next_n is quoted for it)") in out
    assert "next_n 1" not in out.replace(f"next_n {', '.join(map(str, measured))}", "")
    assert (f"with an indexer speed that is not measured at next_n 8 (measured: next_n "
            f"{', '.join(map(str, measured))})") in out


def test_context_names_the_nearest_measured_shape(tmp_path, capsys):
    code, out = _run(capsys, _write(tmp_path, DSV32), "--gpu", "H200", "--context", "100000", "--batch", "6",
                     "--next-n", "4")
    assert code in (0, 3)
    assert f"{_measured_on()} at the nearest measured shape, H 64, batch 8 x 128K, next_n 4" in out
    assert "at 128K (the nearest measured context to 100000)" in out
    code, out = _run(capsys, _write_dir(tmp_path, "short", DSV32), "--capability", "9.0", "--context", "2048")
    assert "top-2048 recall: 1 for FP4 and FP8 (a 2K context has at most 2048 keys" in out
    assert "no cost (top-2048 keeps all 2K keys, so the selection cannot change)" in out


def _write_dir(tmp_path, name, cfg):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_context_on_refused_and_non_dsa_models(tmp_path, capsys):
    code, out = _run(capsys, _write(tmp_path, LLAMA, as_dir=False), "--context", "131072")
    assert code == 1 and "verdict: FP4 changes nothing for this model at any context" in out
    code, out = _run(capsys, _write_dir(tmp_path, "v32", DSV32), "--capability", "8.0", "--context", "131072")
    assert code == 1 and "verdict: FP4 is refused for this deployment" in out


def test_without_context_check_points_to_it(tmp_path, capsys):
    code, out = _run(capsys, _write(tmp_path, DSV32), "--capability", "9.0")
    assert code == 0 and "add --context N (and --batch, --next-n)" in out


def test_context_says_when_the_head_count_is_what_was_not_measured(tmp_path, capsys):
    """GLM-5's 32 index heads at a shape measured with 64 only: the reason is the head count, not a 64-head shape."""
    from sglang_fp4_indexer.tables import load_tables

    rows = {(r["heads"], r["batch"], r["context"], r["next_n"]) for r in load_tables()["timing"]["rows"]}
    assert {(64, 1, 4096, 1), (64, 32, 32768, 1)} <= rows and not {(32, 1, 4096, 1), (32, 32, 32768, 1)} & rows
    assert sorted((b, c) for h, b, c, n in rows if h == 32 and n == 1) == [(8, 131072)]
    for shape, text in ((("--context", "4096"), "1 x 4K"), (("--context", "32768", "--batch", "32"), "32 x 32K")):
        code, out = _run(capsys, _write_dir(tmp_path, text.replace(" ", ""), GLM5), "--gpu", "H200", *shape)
        assert (f"indexer scorer time at {text}, next_n 1: not measured with 32 index heads at this shape (at "
                "next_n 1 the NVIDIA H200 tables have 32 index heads only at 8 x 128K, and a time measured with "
                "another head count is not quoted for 32)") in out
        assert "H 64" not in out and "too far" not in out and " us " not in out
        assert "an indexer speed that is not measured with 32 index heads at this shape" in out
    # A head count the tables never measured at all.
    code, out = _run(capsys, _write_dir(tmp_path, "h16", {**DSV32, "index_n_heads": 16}), "--gpu", "H200",
                     "--context", "131072", "--batch", "8")
    assert ("indexer scorer time at 8 x 128K, next_n 1: not measured with 16 index heads at this shape (at next_n 1 "
            "the NVIDIA H200 tables have no time with 16 index heads") in out
    # The model's own head count measured near, not at, the shape: the distance is the reason, as before.
    code, out = _run(capsys, _write_dir(tmp_path, "near", GLM5), "--gpu", "H200", "--context", "8192",
                     "--next-n", "4")
    assert ("not measured at this shape (the nearest measured one, H 32, batch 8 x 128K, next_n 4, is too far to "
            "stand for it") in out


def test_context_quotes_both_deepgemm_columns_where_they_differ(tmp_path, capsys):
    bench, _ = _sources()
    ours = next(s["name"] for s in bench["scorers"] if s["name"] in ("ours", "ours[auto]"))
    rows = [r for r in bench["rows"] if r["heads"] == 64 and r["results"].get(ours, {}).get("status") == "ok"]
    row = max(rows, key=lambda r: (r["next_n"], r["batch"] * r["context"]))  # a target-verify row where there is one
    shape = [str(row[k]) for k in ("context", "batch", "next_n")]
    code, out = _run(capsys, _write(tmp_path, DSV32), "--gpu", "H200", "--context", shape[0], "--batch",
                     shape[1], "--next-n", shape[2])
    assert code == 0 and f"{_measured_on()} at this shape" in out
    fp4 = row["results"][ours]["seconds"] * 1e6
    fp8, native = (row["results"].get(n, {}) for n in ("deepgemm-fp8", "deepgemm-fp8-native"))
    assert f"FP4 {fp4:.1f} us" in out
    if fp8.get("status") == "ok":
        fp8_us = fp8["seconds"] * 1e6
        assert f"FP8 (DeepGEMM, as SGLang calls it) {fp8_us:.1f} us" in out
        word = "faster" if fp4 <= fp8_us else "slower"
        assert f"a {max(fp8_us, fp4) / min(fp8_us, fp4):.2f}x {word} indexer" in out
        differs = native.get("status") == "ok" and abs(native["seconds"] * 1e6 - fp8_us) > 0.05 * fp8_us
        line = "DeepGEMM with its native next_n, which SGLang 0.5.23 does not use on Hopper"
        assert (f"{line}: {native['seconds'] * 1e6:.1f} us" in out) if differs else (line not in out)
    else:
        assert "FP8 time not measured" in out


@pytest.mark.parametrize("argv, reason", [
    ([{**DSV32, "index_head_dim": 64}], "index_head_dim is 64"),
    ([{**DSV32, "index_n_heads": 48}], "index_n_heads is 48"),
    ([{**DSV32, "index_kpool": 4}], "index_kpool is 4"),
], ids=["head-dim-64", "48-heads", "kpool-4"])
def test_refused_by_the_models_own_geometry_prices_nothing(tmp_path, capsys, argv, reason):
    """A refusal no flag can lift (the model's index geometry): no FP4 bytes, tokens or gain, with --context too."""
    code, out = _run(capsys, _write(tmp_path, argv[0]), "--capability", "9.0", "--context", "131072")
    assert code == 1 and "DISABLED" in out and reason in out
    assert "memory effect: none (FP4 cannot serve this model's indexer" in out
    assert "verdict: FP4 changes nothing for this model at any context" in out
    shown = out.replace(str(tmp_path), "<config dir>")  # pytest's folder name may hold "68"
    for priced in ("FP4 (refused)", "68", "would add", "KV tokens", "recall", "+"):
        assert priced not in shown, priced


def _rendered(capsys, *argv):
    """check's stdout as a user's 80-column terminal shows it (rich's width without a terminal is 80)."""
    code = main(["check", *argv, *MEMORY])
    return code, capsys.readouterr().out


def _depth(line):
    depth = deepest = 0
    for ch in line:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        deepest = max(deepest, depth)
    return deepest


def test_wording_names_what_the_model_is(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SGLANG_DISABLE_DSA_INDEXER_FUSION", raising=False)
    code, out = _run(capsys, _write(tmp_path, LLAMA, as_dir=False))
    assert code == 1 and "FP4 indexer: not applicable - LlamaForCausalLM is not a DeepSeek Sparse Attention" in out
    assert "DISABLED" not in out and "FP8 indexer" not in out and "fix:" not in out
    for flags, star, footnote in (
        ("--tp-size 8 --dcp-size 2", "FP4 replicated *",
         "* the mode the server would use: replicated (the default; --fp4-indexer-dcp-shard would shard the index)"),
        ("--tp-size 8 --dcp-size 2 --fp4-indexer-dcp-shard", "FP4 sharded *",
         "* the mode the server would use: sharded (--fp4-indexer-dcp-shard, or SGLANG_FP4_INDEXER_DCP_SHARD set)"),
    ):
        code, out = _run(capsys, "deepseek-v3.2", f"--sglang-args={flags}")
        assert code == 0 and star in out and footnote in out
    # At 80 columns: no header or cell cut short (rich's "…"), no parenthesis inside another, for each kind of output.
    for argv in (["deepseek-v3.2", "--context", "131072", "--batch", "8"],
                 ["deepseek-v3.2", "--sglang-args=--tp-size 8 --dcp-size 8 --fp4-indexer-dcp-shard"],
                 ["deepseek-v3.2", "--capability", "8.0"], ["glm-5.2", "--context", "65536"],
                 [_write(tmp_path / "..", {**DSV32, "index_head_dim": 64}, as_dir=False)]):
        _, out = _rendered(capsys, *argv)
        assert "…" not in out, out
        assert _depth(out) <= 1, out  # over the whole output: rich wraps a line wherever the width ends


def test_batch_and_next_n_need_context(capsys):
    for argv, flag in ((["--batch", "8"], "--batch"), (["--next-n", "2"], "--next-n"),
                       (["--batch", "8", "--next-n", "2"], "--batch")):
        err = _one_line_error(capsys, ["deepseek-v3.2", *argv])
        assert f"error: {flag}: only used with --context N" in err and "loading SGLang" not in err


def test_context_beyond_the_models_positions_is_refused(tmp_path, capsys):
    err = _one_line_error(capsys, ["deepseek-v3.2", "--context", "1000000", *MEMORY])
    assert ("--context: 1000000 tokens is more than this model's 163840 positions (max_position_embeddings in its "
            "config.json, the longest request SGLang serves); give at most 163840") in err
    err = _one_line_error(capsys, ["deepseek-v3.2", "--context", "131072", "--sglang-args=--context-length 65536",
                                   *MEMORY])
    assert "131072 tokens is more than this model's 65536 positions (--context-length in --sglang-args" in err
    code, out = _run(capsys, "deepseek-v3.2", "--context", "163840")  # the longest request: answered
    # (8 requests of 160K fit with either index format: the verdict's exit code 3)
    assert code == 3 and "at 160K tokens per request" in out and "verdict: FP4 fits no more requests of 160K than FP8" in out
    code, out = _run(capsys, _write(tmp_path, DSV32), "--context", "1000000")  # no max_position_embeddings: no bound
    assert code == 3 and "verdict: FP4 fits no more" in out


_PACKAGED = {"deepseek-v3.2": (DSV32, 61, "deepseek-ai/DeepSeek-V3.2"), "glm-5": (GLM5, 78, "zai-org/GLM-5"),
             "glm-5.2": (GLM52, 21, "zai-org/GLM-5.2")}


@pytest.mark.parametrize("name", sorted(_PACKAGED))
def test_packaged_configs_check_offline(tmp_path, capsys, monkeypatch, name):
    """check NAME reads the packaged config fields (no download), by short name or hub id; a local path wins."""
    from sglang_fp4_indexer.check import PACKAGED_MODELS, packaged_model

    monkeypatch.delenv("SGLANG_DISABLE_DSA_INDEXER_FUSION", raising=False)
    fixture, index_layers, repo = _PACKAGED[name]
    assert PACKAGED_MODELS[name] == repo
    folder, found_repo = packaged_model(repo.upper())
    cfg = json.loads((folder / "config.json").read_text())
    assert found_repo == repo and {k: cfg[k] for k in DSV32 if k != "model_type"} == {
        k: fixture[k] for k in DSV32 if k != "model_type"}
    assert cfg["max_position_embeddings"] == {"deepseek-v3.2": 163840, "glm-5": 202752, "glm-5.2": 1048576}[name]
    # GLM-5.x checkpoints set indexer_rope_interleave (SGLang's fused indexer; the plugin rotates for FP4).
    assert cfg.get("indexer_rope_interleave", False) is name.startswith("glm")
    for given in (name, repo):
        code, out = _run(capsys, given, "--context", "131072")
        assert f"(the config fields of {repo} packaged with sglang-fp4-indexer, " in out
        assert "ENABLED" in out and code in (0, 3), out
        assert f"layers: {fixture['num_hidden_layers']} ({index_layers} with an index cache)" in out
    monkeypatch.setenv("SGLANG_DISABLE_DSA_INDEXER_FUSION", "1")
    code, out = _run(capsys, name, "--context", "131072", "--batch", "8")
    verdict = out[out.index("verdict: "):]
    assert "ENABLED" in out  # and the exit code is the verdict's: 0 more requests fit with FP4, 3 the same number
    assert (code, "): turn FP4 on where KV memory limits you" in verdict,
            verdict.startswith("verdict: FP4 fits no more")) in ((0, True, False), (3, False, True)), verdict
    local = tmp_path / name
    local.mkdir()
    (local / "config.json").write_text(json.dumps(LLAMA))
    monkeypatch.chdir(tmp_path)
    code, out = _run(capsys, name)
    assert code == 1 and "model: LlamaForCausalLM (config " in out and "packaged" not in out


# --- what check is told: a --config file as SGLang reads it, speculative flags, parallel sizes ---------------

_CONFIGS = _REPO / "configs"


def test_a_config_file_is_read_as_sglang_reads_it(tmp_path, capsys):
    import yaml

    path = _CONFIGS / "deepseek-v3.2.yaml"
    file = yaml.safe_load(path.read_text())
    assert file["kv-cache-dtype"] == "fp8_e4m3"
    code, out = _run(capsys, _write(tmp_path, DSV32), f"--sglang-args=--config {path}")
    assert code == 0 and "MLA KV 656 B per token and layer in fp8 (--kv-cache-dtype fp8_e4m3 in --sglang-args)" in out
    t8, t4 = 100 * GIB // (61 * (656 + 132)), 100 * GIB // (61 * (656 + 68))
    assert f"{t4 - t8} (+{(t4 / t8 - 1) * 100:.1f} %)" in out and f"+{(t4 / t8 - 1) * 100:.1f} %" == "+8.8 %"
    # A flag after the file wins over it, as in SGLang (its merger puts the file first).
    code, out = _run(capsys, _write_dir(tmp_path, "bf", DSV32), f"--sglang-args=--config {path} --kv-cache-dtype bf16")
    assert "MLA KV 1152 B per token and layer in bf16 (--kv-cache-dtype bf16 in --sglang-args)" in out


@pytest.mark.parametrize("flags, message", [
    ("--config /nonexistent/c.yaml", "--config: Config file not found: /nonexistent/c.yaml"),
    ("--config={cfg}", "SGLang merges a config file only when it is given as --config FILE"),
    ("--config {json}", "--config: Config file must be YAML format, got: .json"),
    ("--tp-size -3", "--tp-size -3: expected an integer >= 1"),
    ("--dcp-size 3 --tp-size 8", "--dcp-size 3 must divide --tp-size 8"),
], ids=["missing", "equals", "not-yaml", "tp-negative", "dcp-not-dividing"])
def test_what_sglang_would_refuse_is_a_usage_error(tmp_path, capsys, flags, message):
    cfg = _write(tmp_path, DSV32)
    flags = flags.format(cfg=_CONFIGS / "deepseek-v3.2.yaml", json=cfg + "/config.json")
    with pytest.raises(SystemExit) as exc:
        main(["check", cfg, f"--sglang-args={flags}"])
    err = " ".join(capsys.readouterr().err.split())
    assert exc.value.code == 2 and message in err and "Traceback" not in err, err


def test_the_space_form_of_sglang_args_says_to_use_the_equals_form(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check", _write(tmp_path, DSV32), "--sglang-args", "--enable-hierarchical-cache"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and '--sglang-args="--enable-hierarchical-cache"' in err


def test_next_n_comes_from_the_speculative_flags(tmp_path, capsys):
    bench, _ = _sources()
    cfg = _write(tmp_path, DSV32)
    flags = "--speculative-algorithm EAGLE --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2"
    code, out = _run(capsys, cfg, "--context", "131072", "--batch", "8", f"--sglang-args={flags}")
    fp4_us, _ = _bench_us(bench, 64, 8, 131072, 2, "ours")
    fp8_us, _ = _bench_us(bench, 64, 8, 131072, 2, "deepgemm-fp8")
    assert "the trade below uses next_n 2" in out
    assert f"at this shape: FP4 {fp4_us:.1f} us" in out and f"a {fp8_us / fp4_us:.2f}x faster indexer" in out
    # SGLang's own rule for top-k 1: draft tokens = steps + 1, whatever --speculative-num-draft-tokens says.
    from sglang_fp4_indexer.sglang_plugin.check_facts import speculative_next_n
    from sglang_fp4_indexer.sglang_plugin.server_args import server_args_from_flags

    record = server_args_from_flags(cfg, ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                                          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "9"])
    assert speculative_next_n(record, "DeepseekV32ForCausalLM")[0] == 4
    # Without steps SGLang chooses them itself; its function is the oracle.
    from sglang.srt.arg_groups.speculative_hook import _auto_choose_speculative_params

    auto = server_args_from_flags(cfg, ["--speculative-algorithm", "EAGLE"])
    assert speculative_next_n(auto, "DeepseekV32ForCausalLM")[0] == _auto_choose_speculative_params(
        auto, "DeepseekV32ForCausalLM")[2]
    # The shipped MTP config: 4 rows per request (3 steps, top-k 1), a measured next_n, so its time is quoted.
    code, out = _run(capsys, _write_dir(tmp_path, "mtp", DSV32), "--context", "131072", "--batch", "8",
                     f"--sglang-args=--config {_CONFIGS / 'deepseek-v3.2-mtp.yaml'}")
    fp4_us, _ = _bench_us(bench, 64, 8, 131072, 4, "ours")
    assert "the trade below uses next_n 4" in out and f"FP4 {fp4_us:.1f} us" in out
    # One request of 4K at next_n 4 is far from every measured next_n 4 shape (8 x 128K): no time, no speed.
    code, out = _run(capsys, _write_dir(tmp_path, "mtp4k", DSV32), "--context", "4096",
                     f"--sglang-args=--config {_CONFIGS / 'deepseek-v3.2-mtp.yaml'}")
    assert ("indexer scorer time at 1 x 4K, next_n 4: not measured at this shape (the nearest measured one, H 64, "
            "batch 8 x 128K, next_n 4, is too far to stand for it") in out
    assert "an indexer speed that is not measured at this shape" in out and "faster indexer" not in out
    # 6 rows per request are not in the measured tables: no time is quoted.
    code, out = _run(capsys, _write_dir(tmp_path, "mtp6", DSV32), "--context", "131072",
                     "--sglang-args=--speculative-algorithm EAGLE --speculative-num-steps 5 --speculative-eagle-topk 1 "
                     "--speculative-num-draft-tokens 6")
    assert "the trade below uses next_n 6" in out and "indexer scorer time at next_n 6: not measured" in out
    with pytest.raises(SystemExit) as exc:
        main(["check", cfg, "--context", "131072", "--next-n", "3", f"--sglang-args={flags}", *MEMORY])
    assert exc.value.code == 2 and "--next-n 3 differs from the 2 rows per request" in capsys.readouterr().err


@pytest.mark.parametrize("argv, why", [
    (["--capability", "10.0", "--next-n", "2"], "on compute capability 10.0 this plugin scores with its Triton kernel"),
    (["--capability", "8.9"], "on compute capability 8.9 this plugin scores with its Triton kernel"),
    (["--sglang-args=--tp-size 8 --dcp-size 2 --fp4-indexer-dcp-shard"], "the sharded index under DCP adds"),
    (["--gpu", "H20"], "measured on NVIDIA H200 and NVIDIA H100 80GB HBM3, not H20"),
    (["--sglang-args=--disaggregation-mode prefill"], "reason: PD disaggregation prefill server"),
    (["--sglang-args=--disaggregation-mode decode"], "reason: PD decode server not measured"),
    (["--sglang-args=--enable-hierarchical-cache"], "reason: hierarchical cache not measured"),
    (["--sglang-args=--tp-size 8 --dcp-size 4"], "only DCP width 2 was measured (on two H200), not DCP 4"),
    (["--sglang-args=--cuda-graph-bs-decode 1 2 4"], "reason: a batch of 8 is above the largest decode CUDA graph (4"),
    (["--sglang-args=--cuda-graph-max-bs-decode 16 --cuda-graph-bs-decode 1 2 4"],
     "reason: a batch of 8 is above the largest decode CUDA graph (4"),
    (['--sglang-args=--cuda-graph-config \'{"decode": {"bs": [1, 2, 4]}}\''],
     "reason: a batch of 8 is above the largest decode CUDA graph (4"),
    (["--sglang-args=--enable-two-batch-overlap"], "reason: two-batch overlap runs each decode batch as two"),
    (["--sglang-args=--max-running-requests 4"], "reason: a batch of 8 is above --max-running-requests (4)"),
    (["--sglang-args=--tp-size 8 --attn-dp-size 2 --max-running-requests 4 --mem-fraction-static 0.8"],
     "reason: a batch of 4 is above --max-running-requests (2 per rank)"),
    (["--sglang-args=--disable-cuda-graph"], "reason: decode without CUDA graphs"),
    (["--sglang-args=--cuda-graph-backend-decode disabled"], "reason: decode without CUDA graphs"),
    (["--sglang-args=--disable-decode-cuda-graph"], "reason: decode without CUDA graphs"),
    (['--sglang-args=--cuda-graph-config \'{"decode": {"backend": "disabled"}}\''],
     "reason: decode without CUDA graphs"),
    (["--sglang-args=--cuda-graph-max-bs-decode 4"], "reason: a batch of 8 is above the largest decode CUDA graph (4"),
], ids=["sm100", "sm89", "dcp-sharded", "h20", "pd-prefill", "pd-decode", "hicache", "dcp4-replicated",
        "eager", "eager-backend", "eager-decode", "eager-json", "above-max-bs", "bs-list", "bs-list-over-max-bs", "bs-list-json", "tbo",
        "max-running", "max-running-dp"])
def test_no_speed_is_quoted_for_a_configuration_that_was_not_measured(tmp_path, capsys, argv, why):
    code, out = _run(capsys, _write(tmp_path, DSV32), "--context", "131072", "--batch", "8", *argv)
    assert code in (0, 3) and "indexer scorer time: not measured for this configuration (" in out and why in out
    assert "faster indexer" not in out and "slower indexer" not in out and " us " not in out
    # The replicated DCP rank runs the single-GPU kernel: its measured time holds and is quoted.
    code, out = _run(capsys, _write_dir(tmp_path, "rep", DSV32), "--context", "131072", "--batch", "8",
                     "--sglang-args=--tp-size 8 --dcp-size 2")
    assert "faster indexer" in out and "not measured for this configuration" not in out
    # SGLang's precedence: a decode backend given after --disable-cuda-graph keeps decode graphs on.
    code, out = _run(capsys, _write_dir(tmp_path, "graphs", DSV32), "--context", "131072", "--batch", "8",
                     "--sglang-args=--disable-cuda-graph --cuda-graph-backend-decode full --cuda-graph-max-bs-decode 8")
    assert "faster indexer" in out and "not measured for this configuration" not in out
    # A bs list wins over --cuda-graph-max-bs-decode (SGLang's memory_hook sets max_bs to the list's largest).
    code, out = _run(capsys, _write_dir(tmp_path, "bslist", DSV32), "--context", "131072", "--batch", "8",
                     "--sglang-args=--cuda-graph-max-bs-decode 4 --cuda-graph-bs-decode 1 2 4 8 16")
    assert "faster indexer" in out and "not measured for this configuration" not in out
    # --gpu H200 is the measured GPU: its time is quoted.
    code, out = _run(capsys, _write_dir(tmp_path, "h200", DSV32), "--context", "131072", "--batch", "8",
                     "--gpu", "H200")
    assert "faster indexer" in out and "not measured for this configuration" not in out


def test_a_derived_fraction_out_of_range_names_sglangs_default_not_a_flag_never_given(capsys):
    """--tp-size 1024 makes SGLang's own default --mem-fraction-static negative: the error says it is SGLang's
    default and what to give, not as if the user had passed that value; a value the user gave is named as theirs."""
    for flags, said in (("--tp-size 1024", "--sglang-args: SGLang's default for this GPU and flags is a "
                         "--mem-fraction-static of -0.008 (the memory it reserves for these flags exceeds the GPU's), "
                         "which leaves no KV pool: give --mem-fraction-static in --sglang-args, or --memory-gib"),
                        ("--tp-size 8 --mem-fraction-static 1.5",
                         "--sglang-args: --mem-fraction-static 1.5: expected a number in (0, 1]")):
        with pytest.raises(SystemExit) as e:
            main(["check", "deepseek-v3.2", "--gpu", "H200", f"--sglang-args={flags}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and err[-1] == f"sglang-fp4-indexer check: error: {said}", err


def test_a_capability_without_a_gpu_name_claims_no_time_measured_on_one_gpu(tmp_path, capsys, monkeypatch):
    """--capability 9.0 alone, no local GPU: the GPU is unknown, so no H200 time or speed-up; memory claims stay."""
    from sglang_fp4_indexer.check import budget

    monkeypatch.setattr(budget, "local_gpu", lambda: None)
    cfg = "deepseek-v3.2"  # the packaged config: its shapes give the weights the derived budget subtracts
    argv = ("--context", "57344", "--kv-cache-dtype", "fp8", "--sglang-args=--tp-size 8")  # a measured decode shape
    code, out = _run(capsys, cfg, "--capability", "9.0", *argv, derive=True)
    assert "device: CUDA 9.0 (given; GPU not named, pass --gpu)" in out
    assert "indexer scorer time: not measured for this configuration (reason: GPU not named; pass --gpu)" in out
    assert "decode step inside SGLang (bench_one_batch on NVIDIA H200) at 1 x 56K: not measured (reason: GPU not named; pass --gpu)" in out
    assert "indexer speed that is not measured for this configuration (reason: GPU not named; pass --gpu)" in out
    for h200_only in ("faster indexer", "slower indexer", " us ", "median FP8", "H200 at"):
        assert h200_only not in out
    # The memory claims are those of the default device (an H200's memory, as the budget line says).
    _, named = _run(capsys, cfg, "--gpu", "H200", *argv, derive=True)
    for claim in ("requests that fit: ", "extra KV tokens with FP4: ", "layers: 61"):
        line = lambda text: text[text.index(claim):][:120]  # noqa: E731
        assert line(out) == line(named)
    assert "H200, 143771 MiB, assumed: no local GPU" in out
    # A local GPU of the given capability is the GPU asked about: named, and its own reason given.
    monkeypatch.setattr(budget, "local_gpu", lambda: ((9, 0), "NVIDIA H100 80GB HBM3"))
    code, out = _run(capsys, cfg, "--capability", "9.0", *argv)
    assert "device: NVIDIA H100 80GB HBM3, CUDA 9.0 (given; the local GPU)" in out
    # Its times are the H100 serving rows (1 x 128K, 8 x 64K), too far from 1 x 56K; the decode step is H200's.
    assert "indexer scorer time at 1 x 56K, next_n 1: not measured at this shape" in out
    assert "decode step inside SGLang (bench_one_batch on NVIDIA H200) at 1 x 56K: not measured (measured on NVIDIA H200 only, not H100 80GB HBM3)" in out


def test_every_gpu_check_names_has_its_nvidia_smi_name_and_the_help_names_the_h100_rows():
    from sglang_fp4_indexer.check.budget import GPUS
    from sglang_fp4_indexer.tables import load_tables

    assert all(len(v) == 3 and v[2].startswith("NVIDIA ") for v in GPUS.values())  # each with its nvidia-smi name
    srv = load_tables()["timing_serving"]
    shapes = " and ".join(f"{r['batch']} x {r['context'] // 1024}K" for r in srv["rows"])
    assert {r["next_n"] for r in srv["rows"]} == {1} and GPUS["H100"][2] == srv["gpu"]
    from sglang_fp4_indexer.check.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    (kernel,) = load_tables()["timing_more"]
    assert kernel["gpu"] == srv["gpu"] and {r["next_n"] for r in kernel["rows"]} == {1, 2, 4}
    assert (f"on an H100 80GB HBM3 inside SGLang's server, at {shapes}, next_n 1 only, and elsewhere the scorer alone "
            "in a kernel benchmark at next_n 1, 2 and 4, also against DeepGEMM's newer SM90 kernel)") in text


def test_an_h100_gets_the_scorer_times_measured_inside_sglangs_server_on_an_h100(tmp_path, capsys, monkeypatch):
    """--gpu H100 (the 80 GB H100) or a local H100 80GB HBM3: the timing_serving rows, with how they were measured;
    another H100 variant gets none; an H200 keeps the H200 rows."""
    from sglang_fp4_indexer.check import budget
    from sglang_fp4_indexer.tables import load_tables

    rows = {(r["batch"], r["context"]): r for r in load_tables()["timing_serving"]["rows"]}
    for batch, context in ((1, 131072), (8, 65536)):
        row = rows[batch, context]
        code, out = _run(capsys, _write_dir(tmp_path, f"h100_{batch}", DSV32), "--context", str(context),
                         "--batch", str(batch), "--gpu", "H100")
        assert ("indexer scorer per layer and step, measured on NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130; inside "
                "SGLang's server, its profiler over 5 decode steps") in out
        assert (f"at this shape: FP4 {row['fp4_us']:.1f} us" in out
                and f"FP8 (DeepGEMM, as SGLang calls it) {row['fp8_us']:.1f} us" in out)
        assert f"a {row['fp8_us'] / row['fp4_us']:.2f}x faster indexer" in out
    # The nearest rule holds as for the H200 rows: 8 x 128K is within 2x of 8 x 64K's keys.
    code, out = _run(capsys, _write_dir(tmp_path, "h100_near", DSV32), "--context", "131072", "--batch", "8",
                     "--gpu", "H100")
    assert f"at the nearest measured shape, H 64, batch 8 x 64K, next_n 1: FP4 {rows[8, 65536]['fp4_us']:.1f} us" in out
    # 1 x 128K at next_n 2 is far from every H100 row at next_n 2 (8 x 128K, 32 x 32K and 8 x 4K in the kernel
    # benchmark), and next_n 3 was never measured there: nothing quoted.
    code, out = _run(capsys, _write_dir(tmp_path, "h100_n2", DSV32), "--context", "131072", "--gpu", "H100",
                     "--next-n", "2")
    assert "indexer scorer time at 1 x 128K, next_n 2: not measured at this shape (the nearest measured one" in out
    assert "faster indexer" not in out and "an indexer speed that is not measured at this shape" in out
    code, out = _run(capsys, _write_dir(tmp_path, "h100_n3", DSV32), "--context", "131072", "--gpu", "H100",
                     "--next-n", "3")
    assert ("indexer scorer time at next_n 3: not measured (the NVIDIA H100 80GB HBM3 tables have next_n 1, 2, 4; no "
            "other next_n is quoted for it)") in out
    for local in ("NVIDIA H100 PCIe", "NVIDIA H100", "NVIDIA H200 NVL", "NVIDIA GH200 480GB"):
        monkeypatch.setattr(budget, "local_gpu", lambda: ((9, 0), local))
        code, out = _run(capsys, _write_dir(tmp_path, local.replace(" ", "_"), DSV32), "--context", "131072")
        assert (f"not measured for this configuration (measured on NVIDIA H200 and NVIDIA H100 80GB HBM3, not "
                f"{local.removeprefix('NVIDIA ')})" in out and "faster indexer" not in out), local
    # The H100 rows were measured in one server without DCP: no time at DCP 2 (the H200 rows hold for it).
    code, out = _run(capsys, _write_dir(tmp_path, "h100_dcp", DSV32), "--context", "131072", "--gpu", "H100",
                     "--sglang-args=--tp-size 8 --dcp-size 2")
    assert "(the H100 80GB HBM3 times were measured without DCP, not at DCP 2)" in out and "faster indexer" not in out
    code, out = _run(capsys, _write_dir(tmp_path, "h200", DSV32), "--context", "131072", "--gpu", "H200")
    assert "measured on NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0) at this shape" in out


def test_an_h100_with_mtp_gets_the_kernel_benchmark_rows_against_both_deepgemm_kernels(tmp_path, capsys):
    """--gpu H100 at next_n 4 and 2, where no in-server row exists: the H100 kernel benchmark's row at that shape (the
    median of the runs that measured it, read here from the raw reports), with FP4 against DeepGEMM as SGLang 0.5.23
    calls it and against DeepGEMM's newer SM90 kernel in the scorer line and the verdict. The verdict decides against
    SGLang's call alone: faster than it but slower than the newer kernel still says "turn it on if that cost is
    acceptable"; slower than it says keep FP8."""
    sglang = "DeepGEMM as SGLang 0.5.23 calls it"
    newer = "DeepGEMM's newer SM90 kernel, which SGLang 0.5.23 does not use"
    us = {shape: {c: _h100_bench_us(64, *shape, c) for c in ("ours", "deepgemm-fp8", "deepgemm-fp8-sm90-multicast")}
          for shape in ((1, 131072, 4), (8, 131072, 4), (8, 4096, 2))}
    # Each of the three measured in both of the newest day's runs (the current kernel, both scorer orders).
    for (batch, context, next_n), runs, memory in (((1, 131072, 4), 2, "100"), ((8, 131072, 4), 2, "100"),
                                                   ((8, 4096, 2), 2, "100")):
        t = us[batch, context, next_n]
        code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", str(context), "--batch", str(batch),
                         "--next-n", str(next_n), "--memory-gib", memory)
        median = ", the median of 2 runs" if runs == 2 else ""
        assert (f"measured on NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0; the scorer alone, "
                f"sglang-fp4-indexer bench under CUDA graphs) at this shape{median}: FP4 {t['ours']:.1f} us") in out
        assert (f"; FP8 (DeepGEMM, as SGLang calls it) {t['deepgemm-fp8']:.1f} us; DeepGEMM's newer SM90 kernel "
                f"{t['deepgemm-fp8-sm90-multicast']:.1f} us; FP4 is ") in out
        assert code == 0  # 100 GiB: FP4 fits more requests of either length
    # 1 x 128K: FP4 faster than SGLang's call, slower than the newer kernel.
    t = us[1, 131072, 4]
    r8, rn = t["deepgemm-fp8"] / t["ours"], t["deepgemm-fp8-sm90-multicast"] / t["ours"]
    assert r8 >= 1 > rn
    said = f"{r8:.2f}x faster than {sglang}; {rn:.2f}x, i.e. {1 / rn:.2f}x slower, than {newer}"
    code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "131072", "--next-n", "4")
    assert f"FP4 is {said}" in out
    assert (f"with an indexer {r8:.2f}x faster than {sglang} ({rn:.2f}x, i.e. {1 / rn:.2f}x slower, than "
            f"{newer}); ") in out
    # The same with the requests equal (90 GiB: 9 of 128K either way): faster than SGLang's call decides, exit 3.
    code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "131072", "--next-n", "4",
                     "--memory-gib", "90")
    verdict = out[out.index("verdict: "):]
    assert code == 3 and verdict.startswith("verdict: FP4 fits no more requests of 128K than FP8 (9 either way;")
    assert (f"so it buys only an indexer {r8:.2f}x faster than {sglang} ({rn:.2f}x, i.e. {1 / rn:.2f}x slower, than "
            f"{newer}), at a measured cost of ") in verdict
    assert verdict.endswith("turn it on if that cost is acceptable")
    # 8 x 128K: faster than both.
    t = us[8, 131072, 4]
    r8, rn = t["deepgemm-fp8"] / t["ours"], t["deepgemm-fp8-sm90-multicast"] / t["ours"]
    assert r8 >= 1 and rn >= 1
    _, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "131072", "--batch", "8", "--next-n", "4")
    assert f"FP4 is {r8:.2f}x faster than {sglang}; {rn:.2f}x faster than {newer}" in out
    assert f"with an indexer {r8:.2f}x faster than {sglang} ({rn:.2f}x faster than {newer}); " in out
    # 8 x 4K next_n 2: slower than SGLang's call, faster than the newer kernel; with the requests equal (3 GiB: 10 of
    # 4K either way) the slower indexer says keep FP8, exit 3.
    t = us[8, 4096, 2]
    r8, rn = t["deepgemm-fp8"] / t["ours"], t["deepgemm-fp8-sm90-multicast"] / t["ours"]
    assert rn >= 1 > r8
    code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "4096", "--batch", "8", "--next-n", "2",
                     "--memory-gib", "3")
    verdict = out[out.index("verdict: "):]
    assert f"FP4 is {r8:.2f}x, i.e. {1 / r8:.2f}x slower, than {sglang}; {rn:.2f}x faster than {newer}" in out
    assert code == 3 and verdict.startswith("verdict: FP4 fits no more requests of 4K than FP8 (10 either way;")
    assert (f", and its indexer is {1 / r8:.2f}x slower here than {sglang} ({rn:.2f}x faster than {newer}): FP4 gains "
            "nothing for this deployment, keep FP8; ") in verdict
    # A shape the H100 did not measure says so (8 x 1K at next_n 4: the nearest, 1 x 128K, is too far) ...
    _, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "1024", "--batch", "8", "--next-n", "4")
    assert "indexer scorer time at 8 x 1K, next_n 4: not measured at this shape" in out and "FP4 is " not in out
    # ... and an H200 gets its own rows, which have no newer-kernel time: the speed as before.
    bench, _ = _sources()
    fp4_us, _ = _bench_us(bench, 64, 8, 131072, 4, "ours")
    fp8_us, _ = _bench_us(bench, 64, 8, 131072, 4, "deepgemm-fp8")
    _, out = _run(capsys, "deepseek-v3.2", "--gpu", "H200", "--context", "131072", "--batch", "8", "--next-n", "4")
    assert f"measured on NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0) at this shape: FP4 {fp4_us:.1f} us" in out
    assert f"with a {fp8_us / fp4_us:.2f}x faster indexer; " in out and f"than {newer}" not in out


def test_check_announces_the_sglang_import_time_of_the_user_guide():
    from sglang_fp4_indexer.check.findings import LOADING_SGLANG

    assert "10-30 s" in LOADING_SGLANG
    assert "importing SGLang takes 10-30 s" in " ".join((_REPO / "docs" / "user-guide.md").read_text().split())


def test_context_quotes_the_decode_step_measured_inside_sglang_only_where_it_was_measured(tmp_path, capsys):
    """The packaged SGLang bench_one_batch rows, quoted at exactly their shape and flags (FP8 MLA KV, next_n 1,
    Triton FP8 GEMMs on one GPU), else why not."""
    from sglang_fp4_indexer.tables import load_tables

    sec = load_tables()["sglang"]
    row = sec["rows"][0]
    b, ctx = row["batch"], row["context"]
    cfg = _write(tmp_path, DSV32)
    measured = ("--gpu", "H200", "--batch", str(b), "--sglang-args=--fp8-gemm-backend triton")
    code, out = _run(capsys, cfg, *measured, "--kv-cache-dtype", "fp8", "--context", str(ctx))
    f8, f4 = row["fp8"], row["fp4"]
    assert (f"decode step inside SGLang (bench_one_batch, CUDA graphs, {sec['model']}; {sec['gpu']}, {sec['date']}) "
            f"at {b} x {ctx // 1024}K: median FP8 {f8['decode_ms']:.2f} ms, FP4 {f4['decode_ms']:.2f} ms (single steps "
            f"vary by about 0.2 ms there, so this difference is not resolved); sum of kernel "
            f"times per step (not a step time) FP8 {f8['kernel_us']:.0f} us, FP4 {f4['kernel_us']:.0f} us, of which indexer logits "
            f"{f8['indexer_us']:.1f} and {f4['indexer_us']:.1f} us") in out
    shapes = ", ".join(f"{r['batch']} x {r['context'] // 1024}K" for r in sec["rows"])
    code, out = _run(capsys, cfg, *measured, "--kv-cache-dtype", "fp8", "--context", str(ctx + 1024))
    assert f"decode step inside SGLang (bench_one_batch on NVIDIA H200) at {b} x {(ctx + 1024) // 1024}K: not measured (measured at {shapes} only)" in out
    code, out = _run(capsys, cfg, *measured, "--kv-cache-dtype", "fp8", "--context", str(ctx), "--next-n", "2")
    assert "not measured (measured with MTP off, not at next_n 2)" in out
    code, out = _run(capsys, cfg, *measured, "--kv-cache-dtype", "bf16", "--context", str(ctx))
    assert "not measured (measured with an FP8 MLA KV cache, not BF16)" in out
    assert "median FP8" not in out
    # A shape never measured inside SGLang (8 x 128K: a scorer-table shape only) is the first reason, whatever else
    # differs (here SGLang's bf16 MLA KV on Hopper, its default FP8 GEMM backend).
    assert (8, 131072) not in {(r["batch"], r["context"]) for r in sec["rows"]}
    assert (64, 8, 131072) in {(r["heads"], r["batch"], r["context"]) for r in load_tables()["timing"]["rows"]}
    code, out = _run(capsys, cfg, "--gpu", "H200", "--context", "131072", "--batch", "8")
    assert "MLA KV 1152 B per token and layer in bf16" in out
    assert f"decode step inside SGLang (bench_one_batch on NVIDIA H200) at 8 x 128K: not measured (measured at {shapes} only)" in out
    # The runs' FP8 GEMM backend and TP size, recorded with them: other server flags are not what was measured.
    assert (sec["fp8_gemm_backend"], sec["tp_size"]) == ("triton", 1)
    for flags, asked in (("", "auto, SGLang's default, at --tp-size 1"),
                         ("--fp8-gemm-backend deep_gemm", "deep_gemm at --tp-size 1"),
                         ("--fp8-gemm-backend triton --tp-size 8", "triton at --tp-size 8")):
        code, out = _run(capsys, cfg, "--gpu", "H200", "--batch", str(b), f"--sglang-args={flags}",
                         "--kv-cache-dtype", "fp8", "--context", str(ctx))
        assert (f"decode step inside SGLang (bench_one_batch on NVIDIA H200) at {b} x {ctx // 1024}K: not measured (measured with --fp8-gemm-backend "
                f"triton on 1 GPU at --tp-size 1, not --fp8-gemm-backend {asked})") in out
        assert "median FP8" not in out


def test_context_claims_no_speed_for_the_rotation_inside_sglangs_fused_indexer(tmp_path, capsys, monkeypatch):
    """Interleaved indexer RoPE (GLM-5.2): the plugin's rotation runs SGLang's unfused query path, not measured."""
    monkeypatch.delenv("SGLANG_DISABLE_DSA_INDEXER_FUSION", raising=False)
    code, out = _run(capsys, _write(tmp_path, GLM52), "--gpu", "H200", "--context", "131072", "--batch", "8")
    assert ("indexer scorer time: not measured for this configuration (with interleaved indexer RoPE, as in GLM-5.x, "
            "FP4 replaces SGLang's fused index-query kernel by SGLang's unfused path") in out
    assert "faster indexer" not in out
    assert "that path was measured at one shape only" in " ".join(out.split())
    monkeypatch.setenv("SGLANG_DISABLE_DSA_INDEXER_FUSION", "1")  # SGLang's unfused indexer: the measured path
    code, out = _run(capsys, _write_dir(tmp_path, "unfused", GLM52), "--gpu", "H200", "--context", "131072",
                     "--batch", "8")
    assert f"{_measured_on()} at this shape" in out


def _glm5_cycle_oracle() -> tuple[float, float]:
    """The GLM-5 run's busy time per verify cycle (ms), FP8 and FP4: the median over each server's traces, read
    from the raw timeline file independently of the tables."""
    import statistics

    raw = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results"
                      / "sglang_timeline_glm5_layers3_mtp3x4_h100_2026-12-07.json").read_text())
    return tuple(statistics.median(r["busy_us"] for r in raw["rows"] if r["format"] == f) / 1e3 for f in ("fp8", "fp4"))


@pytest.mark.parametrize("memory", [40, 12])
def test_glm5_verdict_quotes_the_step_measured_longer_with_fp4(capsys, monkeypatch, memory):
    """GLM-5 (interleaved indexer RoPE): FP4 replaces SGLang's fused index-query kernel by its unfused path, whose
    step was measured at one shape (4 x 64K verifying 4 tokens, H100) longer with FP4 than with FP8. The verdict
    leads with the requests gained, quotes that measurement, and never says "turn it on" unqualified: 40 GiB, the
    same number of 64K requests: keep FP8 (exit 3); 12 GiB, one 128K request fits with FP4 and none with FP8: FP4
    only where that request is worth a longer step (exit 0). Both say how to measure the deployer's own shape."""
    from sglang_fp4_indexer.cli import build_parser

    monkeypatch.delenv("SGLANG_DISABLE_DSA_INDEXER_FUSION", raising=False)
    context = 65536 if memory == 40 else 131072
    code, out = _run(capsys, "glm-5", "--context", str(context), "--batch", "1", "--memory-gib", str(memory))
    # The oracle: 78 layers, each with a bf16 MLA KV of (512 + 64) x 2 B and an index key of 132 or 68 B.
    r8, r4 = (memory * GIB // (78 * (1152 + index)) // context for index in (132, 68))
    fp8_ms, fp4_ms = _glm5_cycle_oracle()
    assert fp4_ms > fp8_ms
    measured = ("on the index path FP4 takes with interleaved indexer RoPE its step was measured longer, not shorter "
                "(measured at one shape only, "
                "inside SGLang's server on one DP-attention + EP8 rank of GLM-5 with 3 of its 78 layers, NVIDIA H100 "
                "80GB HBM3, 2026-12-07, dummy weights: at 4 x 64K per rank verifying 4 tokens the GPU's busy time per "
                f"MTP verify cycle was FP8 {fp8_ms:.2f} ms, FP4 {fp4_ms:.2f} ms, a {fp4_ms / fp8_ms:.3f}x longer cycle "
                "with FP4)")
    verdict = " ".join(out[out.index("verdict: "):].split())
    if r4 == r8:
        assert code == 3 and verdict.startswith(f"verdict: FP4 fits no more requests of {context // 1024}K than FP8 "
                                                f"({r8} either way; +5.2 % KV tokens), and {measured}: FP4 gains "
                                                "nothing measured for this deployment, keep FP8 (to measure your own "
                                                "shape: the scorer with sglang-fp4-indexer bench --device cuda --quick")
    else:
        assert (code, r8, r4) == (0, 0, 1)
        assert verdict.startswith("verdict: FP4 fits 1 request of 128K where FP8 fits none; your batch fits only with "
                                  f"FP4, but {measured}: turn FP4 on only where those extra requests are worth that, "
                                  "and measure your own shape first, the scorer with sglang-fp4-indexer bench")
    assert "turn it on" not in verdict and "turn FP4 on where" not in verdict
    assert "the query path with SGLang's profiler on your server" in verdict
    build_parser().parse_args(["bench", "--device", "cuda", "--quick"])  # the command named exists as written


def test_the_fused_path_without_a_measurement_is_not_measured():
    """Tables without that path's measurement: check says the indexer may be slower and was not measured."""
    from sglang_fp4_indexer.check.trade import FUSED_PATH, _unmeasured_configuration, fused_cycle_text
    from sglang_fp4_indexer.gate import DeviceFacts

    dev = DeviceFacts(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0))
    assert fused_cycle_text(None) is None and fused_cycle_text({"rows": []}) is None
    assert _unmeasured_configuration(dev, "NVIDIA H100 80GB HBM3", False, 1, True) == (
        f"{FUSED_PATH}, so the indexer may be slower than with FP8; that path's time on a GPU is not measured")
    assert _unmeasured_configuration(dev, "NVIDIA H100 80GB HBM3", False, 1, True, fused_measured="measured at X") == (
        f"{FUSED_PATH}; that path was measured at X")


def test_check_says_what_turned_fp4_off(tmp_path, capsys, monkeypatch):
    """check answers as if FP4 were asked for, unless the user's own switches turn it off: it names which."""
    yaml = tmp_path / "on.yaml"
    yaml.write_text("enable-fp4-indexer: true\n")
    cfg = _write(tmp_path, DSV32)
    monkeypatch.setenv("SGLANG_ENABLE_FP4_INDEXER", "0")
    code, out = _run(capsys, cfg, "--capability", "9.0", f"--sglang-args=--config {yaml}")
    assert code == 1
    assert ("FP4 indexer: DISABLED (SGLang keeps its FP8 indexer) - SGLANG_ENABLE_FP4_INDEXER is set to an off "
            "value, which wins over the command line and the --config file") in out
    assert "fix: unset SGLANG_ENABLE_FP4_INDEXER (or set it to 1) to use the FP4 indexer" in out
    monkeypatch.delenv("SGLANG_ENABLE_FP4_INDEXER")
    code, out = _run(capsys, cfg, "--capability", "9.0", f"--sglang-args=--config {yaml} --no-enable-fp4-indexer")
    assert code == 1 and "DISABLED (SGLang keeps its FP8 indexer) - --no-enable-fp4-indexer given" in out
    assert "fix: drop --no-enable-fp4-indexer to use the FP4 indexer" in out
    code, out = _run(capsys, cfg, "--capability", "9.0", f"--sglang-args=--config {yaml}")
    assert code == 0 and "FP4 indexer: ENABLED" in out


@pytest.mark.parametrize("device", ["npu", "cpu", "xpu"])
def test_a_server_device_other_than_cuda_is_refused_as_the_server_refuses_it(tmp_path, capsys, device):
    """SGLang's --device in --sglang-args is the server's device: FP4 is refused there, and no H200 time or
    speed-up is quoted, whatever GPU this machine has."""
    code, out = _run(capsys, _write(tmp_path, DSV32), "--context", "131072", "--batch", "8",
                     f"--sglang-args=--tp-size 8 --device {device}")
    assert code == 1
    assert f"device: {device} (--device in --sglang-args)" in out
    assert f"FP4 indexer: DISABLED (SGLang keeps its FP8 indexer) - device '{device}'" in out
    assert "faster indexer" not in out and " us " not in out and "ENABLED" not in out


@pytest.mark.parametrize("flags", ["--tp-size 8 --attn-dp-size 8", "--tp-size 8 --dp-size 8 --enable-dp-attention"],
                         ids=["attn-dp-size", "dp-size"])
def test_dp_attention_fits_and_times_the_batch_per_rank(tmp_path, capsys, flags):
    """Each DP-attention rank has its own pool and decodes its share of the batch: 8 requests over 8 ranks are
    one per rank, which fits, and the time quoted is at batch 1, not 8."""
    code, out = _run(capsys, _write(tmp_path, DSV32), "--context", "131072", "--batch", "8", "--memory-gib", "30",
                     f"--sglang-args={flags}")
    assert code == 3, out  # 3 requests per rank either way: FP4 buys only its indexer time
    assert "per DP-attention rank (8 ranks, each with its own KV pool; the batch of 8 is 1 per rank)" in out
    assert "FP8 3, FP4 3 per rank (24 and 24 over the 8 ranks); 1 request needs 131072 KV tokens" in out
    assert "neither format fits" not in out and "at this shape: FP4" in out and "batch 8 x 128K" not in out
    assert f"{_row_us(1, 131072):.1f} us" in out
    code2, out2 = _run(capsys, _write_dir(tmp_path, "nodp", DSV32), "--context", "131072", "--batch", "8",
                       "--memory-gib", "30", "--sglang-args=--tp-size 8")
    assert code2 == 4 and "; neither fits the batch asked: 8 x 128K" in out2


def test_data_parallel_replicas_each_take_their_share_of_the_batch(tmp_path, capsys):
    """--dp-size 2 without DP attention: two replicas, each a whole server with its own pool, 4 requests each."""
    code, out = _run(capsys, _write(tmp_path, DSV32), "--context", "131072", "--batch", "8", "--memory-gib", "30",
                     "--sglang-args=--tp-size 8 --dp-size 2")
    assert code == 4, out
    assert ("per data-parallel replica (2 replicas, each with its own KV pool; the batch of 8 is 4 per replica): "
            "requests that fit: FP8 3, FP4 3 per replica (6 and 6 over the 2 replicas); 4 requests need 524288") in out
    assert ("verdict: FP4 fits no more requests of 128K than FP8 (3 either way; +5.2 % KV tokens), per "
            "data-parallel replica (2 data-parallel replicas, each with its own KV pool: the batch of 8 is 4 per "
            "replica); neither fits the batch asked: 4 x 128K") in out and "at this shape" not in out


def test_dwdp_is_dp_attention_without_cuda_graphs(tmp_path, capsys):
    """--dwdp-size 8 at TP 8: SGLang runs 8 DP-attention ranks and no CUDA graphs, so the fit is per rank and no
    time is quoted; a DWDP size other than the TP size is refused as SGLang refuses it."""
    code, out = _run(capsys, _write(tmp_path, DSV32), "--context", "131072", "--batch", "8", "--memory-gib", "30",
                     "--sglang-args=--tp-size 8 --dwdp-size 8")
    assert "per DP-attention rank (8 ranks, each with its own KV pool; the batch of 8 is 1 per rank)" in out
    assert "reason: decode without CUDA graphs" in out and "faster indexer" not in out
    err = _one_line_error(capsys, [_write_dir(tmp_path, "dwdp4", DSV32), "--memory-gib", "30",
                                   "--sglang-args=--tp-size 8 --dwdp-size 4"])
    assert "--dwdp-size 4 must equal --tp-size 8" in err


def test_dp_attention_of_two_ranks_quotes_the_nearest_row_not_this_shape(tmp_path, capsys):
    """8 requests over 2 ranks are 4 per rank: 4 x 128K was not measured, so the 8 x 128K row is named as the
    nearest measured shape, never as this one."""
    code, out = _run(capsys, _write(tmp_path, DSV32), "--context", "131072", "--batch", "8", "--memory-gib", "40",
                     "--sglang-args=--tp-size 8 --attn-dp-size 2")
    assert "the batch of 8 is 4 per rank" in out and "at this shape" not in out
    assert "at the nearest measured shape, H 64, batch 8 x 128K, next_n 1" in out


@pytest.mark.parametrize("flags, message", [
    ("--tp-size 8 --attn-dp-size 3", "--attn-dp-size 3 (DP attention) must divide --tp-size 8"),
    ("--tp-size 8 --attn-dp-size 16", "--attn-dp-size 16 (DP attention) must divide --tp-size 8"),
    ("--tp-size 8 --dp-size 3 --enable-dp-attention", "--dp-size 3 (DP attention) must divide --tp-size 8"),
    ("--tp-size 8 --dp-size 2 --enable-dp-attention --attn-dp-size 4", "--dp-size 2 with --enable-dp-attention and "
                                                                       "--attn-dp-size 4 disagree"),
    ("--tp-size 8 --attn-dp-size 0", "--attn-dp-size 0: expected an integer >= 1"),
    ("--tp-size 8 --device CUDA", "--device 'CUDA': expected one of cpu, cuda, hpu, mlu, mps, musa, npu, xpu"),
    ("--tp-size 8 --device foo", "--device 'foo': expected one of"),
    ("--tp-size 8 --device cuda:x", "--device 'cuda:x': expected one of"),
])
def test_a_layout_or_device_sglang_refuses_is_a_usage_error(tmp_path, capsys, flags, message):
    err = _one_line_error(capsys, [_write(tmp_path, DSV32), "--context", "131072", "--memory-gib", "40",
                                   f"--sglang-args={flags}"])
    assert message in err


def test_a_cuda_device_with_an_ordinal_is_the_measured_kind(tmp_path, capsys):
    code, out = _run(capsys, _write(tmp_path, DSV32), "--context", "131072", "--batch", "8",
                     "--sglang-args=--tp-size 8 --device cuda:0")
    assert code == 0 and "ENABLED" in out and "faster indexer" in out and "--device in --sglang-args" not in out


def test_the_models_own_top_k_is_the_one_the_cost_is_quoted_for(tmp_path, capsys):
    """index_topk 512: the recall and loss tables (top-2048) are not quoted as its cost, and a 2K context is not
    'no cost' (512 of 2048 keys are selected)."""
    path = _write(tmp_path, {**DSV32, "index_topk": 512})
    code, out = _run(capsys, path, "--context", "2048")
    assert code == 0
    assert "top-512 recall and the real-model cost: not measured (measured at top-2048, not at this model's " \
           "index_topk 512)" in out
    assert "no cost" not in out and "its cost is not measured" in out and "points less top-2048 recall" not in out
    code, out = _run(capsys, _write_dir(tmp_path, "k512", {**DSV32, "index_topk": 512}), "--context", "512")
    assert "top-512 recall: 1 for FP4 and FP8" in out
    # Nor is the decode step measured inside SGLang (a top-2048 model) quoted for it.
    code, out = _run(capsys, _write_dir(tmp_path, "k512b", {**DSV32, "index_topk": 512}), "--context", "57344",
                     "--gpu", "H200", "--memory-gib", "30",
                     "--sglang-args=--kv-cache-dtype fp8_e4m3 --fp8-gemm-backend triton")
    assert "decode step inside SGLang (bench_one_batch on NVIDIA H200) at 1 x 56K: not measured (measured with top-2048 selection, not top-512)" in out


@pytest.mark.parametrize("key, value, message", [
    ("max_position_embeddings", "lots", "max_position_embeddings must be an integer (SGLang uses it as one), got 'lots'"),
    ("hidden_size", "7168", "hidden_size must be an integer (SGLang uses it as one), got '7168'"),
    ("n_routed_experts", "many", "n_routed_experts must be an integer"),
    ("index_topk", -5, "index_topk must be >= 1, got -5"),
    ("quantization_config", "fp8", "quantization_config must be a JSON object, got 'fp8'"),
    ("architectures", "DeepseekV32ForCausalLM", "architectures must be a list of class names"),
    ("rms_norm_eps", "tiny", "SGLang cannot read this config.json ("),
])
def test_a_config_field_of_the_wrong_type_is_a_usage_error_naming_it(tmp_path, capsys, key, value, message):
    path = _write(tmp_path, {**DSV32, key: value}, as_dir=False)
    err = _one_line_error(capsys, [path, "--context", "8192", "--sglang-args=--tp-size 8"])
    assert message in err and key in err


@pytest.mark.parametrize("capability", ["-1.0", "0.0", "99.99", "9.10"])
def test_a_capability_no_cuda_gpu_has_is_a_usage_error(tmp_path, capsys, capability):
    err = _one_line_error(capsys, [_write(tmp_path, DSV32), f"--capability={capability}"])
    assert f"--capability: expected a CUDA compute capability MAJOR.MINOR (major 1 to 20, minor 0 to 9) such as " \
           f"9.0, got '{capability}'" in err


def test_a_pool_too_small_for_one_token_says_so_instead_of_an_infinite_share(tmp_path, capsys):
    code, out = _run(capsys, _write(tmp_path, DSV32), "--memory-gib", "0.000001")
    assert "extra KV tokens with FP4: 0 (FP8 holds no token in this pool)" in out and "inf" not in out


# --- the server's whole step, quoted only for the deployment measured ----------------------------------------

_MTP4 = "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
_DP8 = "--tp-size 8 --attn-dp-size 8 --kv-cache-dtype fp8_e4m3"


def test_check_quotes_the_verify_cycle_measured_for_a_dp_attention_rank_with_mtp(capsys):
    """8 x 128K per DP-attention rank with MTP 3 steps / 4 draft tokens on an H200: the busy times of the timeline
    summary (its medians, both run orders) and their ratios, measured and projected to 61 layers."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    agg = json.loads((results / "sglang_timeline_v32_rank20_mtp3x4_h200_2026-12-06.json").read_text())["shapes"]["8x131072"]
    ms = {f: agg[f]["busy_us"]["median"] / 1e3 for f in ("fp8", "fp4")}
    ms61 = {f: agg[f]["projected_busy_us"]["median"] / 1e3 for f in ("fp8", "fp4")}
    _, out = _run(capsys, "deepseek-v3.2", "--context", "131072", "--batch", "64", f"--sglang-args={_DP8} {_MTP4}")
    assert ("MTP verify cycle inside SGLang's server at 8 x 128K per rank, next_n 4 (NVIDIA H200, 2026-12-06; one "
            "DP-attention + EP8 rank of DeepSeek-V3.2 with 20 of its 61 layers, dummy weights;") in out
    assert (f"the GPU's busy time FP8 {ms['fp8']:.2f} ms, FP4 {ms['fp4']:.2f} ms ({ms['fp8'] / ms['fp4']:.3f}x); "
            f"projected to 61 layers {ms61['fp8']:.2f} / {ms61['fp4']:.2f} ms ({ms61['fp8'] / ms61['fp4']:.3f}x)") in out
    # What FP8 was there: SGLang 0.5.23's row-by-row call, and where a native next_n kernel is measured.
    assert ("FP8 there is DeepGEMM as SGLang 0.5.23 calls it on Hopper, one query row at a time: a DeepGEMM kernel "
            "that takes the verify rows natively would shorten FP8's side") in " ".join(out.split())
    bench = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    assert "### Against DeepGEMM's newer SM90 kernel" in bench
    # The verdict names that gain beside the indexer's, from the same row.
    verdict = " ".join(out.split("verdict:")[1].split())
    assert (f"and a {ms['fp8'] / ms['fp4']:.3f}x shorter MTP verify cycle (GPU busy time inside SGLang's server, "
            "NVIDIA H200, 20 of 61 layers)") in verdict


def test_cycle_gain_text_says_shorter_or_longer_and_the_depth_measured():
    from sglang_fp4_indexer.check.trade import cycle_gain_text

    run = {"gpu": "NVIDIA H100 80GB HBM3", "date": "d", "stack": "s"}
    row = {"batch": 4, "context": 131072, "next_n": 4, "layers": 61, "full_depth": 61, "fp8_ms": 30.0, "fp4_ms": 25.0}
    assert cycle_gain_text(row, run) == ("a 1.200x shorter MTP verify cycle (GPU busy time inside SGLang's server, "
                                         "NVIDIA H100 80GB HBM3, all 61 layers)")
    slower = dict(row, next_n=1, layers=20, fp8_ms=10.0, fp4_ms=12.5)
    assert cycle_gain_text(slower, run) == ("a 1.250x longer decode step (GPU busy time inside SGLang's server, "
                                            "NVIDIA H100 80GB HBM3, 20 of 61 layers)")
    assert cycle_gain_text(None, run) is None


@pytest.mark.parametrize("extra, batch, why", [
    ("--gpu H100", "64", "measured at 4 x 128K verifying 4 tokens per rank only"),
    ("--gpu H20", "64", "measured on NVIDIA H200 and NVIDIA H100 80GB HBM3 only, not H20"),
    ("", "32", "measured at 1 x 128K verifying 4 tokens, 8 x 128K verifying 4 tokens, 8 x 128K with MTP off per "
               "rank only"),
])
def test_check_says_why_no_verify_cycle_is_quoted_elsewhere(capsys, extra, batch, why):
    _, out = _run(capsys, "deepseek-v3.2", "--context", "131072", "--batch", batch, *extra.split(),
                  f"--sglang-args={_DP8} {_MTP4}")
    gpu = "NVIDIA H100 80GB HBM3" if "H100" in extra else "NVIDIA H200"
    assert (f"MTP verify cycle inside SGLang's server ({gpu}, DeepSeek-V3.2's layers) at {int(batch) // 8} x 128K "
            f"per rank, next_n 4: not measured ({why})") in " ".join(out.split())


_DP32 = "--tp-size 32 --attn-dp-size 32 --ep-size 32 --nnodes 4 --kv-cache-dtype fp8_e4m3"


def test_check_quotes_the_full_depth_h100_rank_and_its_verdict_says_that_gain(capsys):
    """An H100 deployment as the full-depth rank ran (DP attention over 32 GPUs, the experts over 32, 4 x 128K per
    rank, MTP 3 / 4, the KV pool the servers logged): the cycle line and the verdict quote the timeline summary's
    busy times at all 61 layers; both pools hold 4 requests, so the cycle is the whole gain."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    agg = json.loads((results / "sglang_timeline_v32_rank61_ep32_mtp3x4_h100_2026-12-06.json").read_text())["shapes"]
    ms = {f: agg["4x131072"][f]["busy_us"]["median"] / 1e3 for f in ("fp8", "fp4")}
    agg4 = json.loads((results / "sglang_timeline_v32_rank61_ep32_mtp3x4_fp4_first_h100_2026-12-06.json")
                      .read_text())["shapes"]  # the other run order: FP4's server first
    ms4 = {f: agg4["4x131072"][f]["busy_us"]["median"] / 1e3 for f in ("fp8", "fp4")}
    lo, hi = sorted((ms["fp8"] / ms["fp4"], ms4["fp8"] / ms4["fp4"]))
    code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "131072", "--batch", "128",
                     "--memory-gib", "26.38", f"--sglang-args={_DP32} {_MTP4}")
    flat = " ".join(out.split())
    assert ("MTP verify cycle inside SGLang's server at 4 x 128K per rank, next_n 4 (NVIDIA H100 80GB HBM3, "
            "2026-12-06; one DP-attention + EP32 rank of DeepSeek-V3.2 with all 61 layers, dummy weights;") in flat
    assert (f"the GPU's busy time FP8 {ms['fp8']:.2f} ms, FP4 {ms['fp4']:.2f} ms ({ms['fp8'] / ms['fp4']:.3f}x); with "
            f"the servers in the other order FP8 {ms4['fp8']:.2f} ms, FP4 {ms4['fp4']:.2f} ms "
            f"({ms4['fp8'] / ms4['fp4']:.3f}x); FP8 there is DeepGEMM as SGLang 0.5.23 calls it") in flat  # no projection
    verdict = flat[flat.index("verdict:"):]
    assert code == 3 and verdict.startswith("verdict: FP4 fits no more requests of 128K than FP8 (4 either way;")
    # The scorer at exactly 4 x 128K next_n 4 from the H100 kernel benchmark (the median of its two runs) comes first.
    us = {c: _h100_bench_us(64, 4, 131072, 4, c) for c in ("ours", "deepgemm-fp8", "deepgemm-fp8-sm90-multicast")}
    newer = us["deepgemm-fp8-sm90-multicast"] / us["ours"]
    assert newer < 1  # the newer kernel is the faster one here
    assert (f"so it buys only an indexer {us['deepgemm-fp8'] / us['ours']:.2f}x faster than DeepGEMM as SGLang 0.5.23 "
            f"calls it ({newer:.2f}x, i.e. {1 / newer:.2f}x slower, than DeepGEMM's newer SM90 kernel, which SGLang "
            f"0.5.23 does not use) and a {lo:.3f}-{hi:.3f}x shorter MTP verify cycle (GPU busy time inside SGLang's "
            "server, FP8 and FP4 servers in both orders, NVIDIA H100 80GB HBM3, all 61 layers), at a measured cost "
            "of") in verdict
    assert verdict.endswith("turn it on if that cost is acceptable")
    # The experts spread over 16 GPUs (an EP16 deployment): another rank, no cycle quoted, and the verdict says why.
    code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "131072", "--batch", "64",
                     "--memory-gib", "26.38", f"--sglang-args={_DP32.replace('32', '16')} {_MTP4}")
    flat = " ".join(out.split())
    assert ("not measured (measured with the routed experts spread over 32 GPUs as --tp-size 32 spreads them, not "
            "over 16)") in flat
    assert code == 3 and "shorter MTP verify cycle" not in flat[flat.index("verdict:"):]


def test_check_quotes_the_full_depth_ranks_kv_limited_load_where_its_pools_are_the_loads(capsys):
    """The same H100 deployment at 9 x 64K per rank (DP attention over 32 GPUs, batch 288): FP8's pool holds 8,
    FP4's 9, as in the load measured on that rank, so the verdict's first clause is followed by that load's output
    tokens/s from SGLang's result lines; at 8 per rank (FP8 holds them all: no KV limit) or with memory for other
    pool sizes, no load is quoted."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    f8, f4, o8, o4 = (json.loads((results / f"sglang_serving_v32_rank61_ep32_kv_limited_64k_{order}h100_{fmt}_2026-12-07"
                                          ".jsonl").read_text().splitlines()[0])["output_throughput"]
                      for order in ("", "fp4_first_") for fmt in ("fp8", "fp4"))
    code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "65536", "--batch", "288",
                     "--memory-gib", "26.38", f"--sglang-args={_DP32} {_MTP4}")
    verdict = " ".join(out.split())
    verdict = verdict[verdict.index("verdict:"):]
    assert verdict.startswith(
        "verdict: FP4 fits 9 requests of 64K where FP8 fits 8 (+12.5 %), per DP-attention rank (32 DP-attention ranks, "
        "each with its own KV pool: the batch of 288 is 9 per rank); measured on such a rank inside SGLang's server "
        "(9 requests of 64K with 512 output tokens each, MTP verifying 4 tokens, NVIDIA H100 80GB HBM3, all 61 "
        f"layers): FP8 ran 8 at once and FP4 9, {f8:.1f} against {f4:.1f} output tokens/s ({f4 / f8:.3f}x); with the "
        f"servers in the other order {o8:.1f} against {o4:.1f} ({o4 / o8:.3f}x): turn FP4 on where KV memory limits "
        "you; your batch fits only with FP4")
    assert code == 0
    for batch, memory in (("256", "26.38"), ("288", "30")):
        _, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "65536", "--batch", batch,
                      "--memory-gib", memory, f"--sglang-args={_DP32} {_MTP4}")
        assert "measured on such a rank" not in out
    # Another parallelism (the experts over 16 GPUs) at the same per-rank shape: not that rank, not quoted.
    _, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "65536", "--batch", "144",
                  "--memory-gib", "26.38", f"--sglang-args={_DP32.replace('32', '16')} {_MTP4}")
    assert "measured on such a rank" not in out


def test_a_measured_slower_cycle_without_an_indexer_time_says_keep_fp8():
    """Where only the server's step is measured (no indexer row at this next_n) and FP4's is longer, the verdict
    says so and to keep FP8, never "turn it on"."""
    from sglang_fp4_indexer.check import run_check, worth_it
    from sglang_fp4_indexer.sglang_plugin.check_facts import read_sglang_facts
    from sglang_fp4_indexer.tables import load_tables

    found = run_check("deepseek-v3.2", memory_gib=26.38, gpu="H100", server_flags=f"{_DP32} {_MTP4}".split(),
                      read_sglang=read_sglang_facts)
    row = {"batch": 4, "context": 131072, "next_n": 4, "layers": 61, "full_depth": 61, "traces": 3,
           "fp8_ms": 30.0, "fp4_ms": 33.0, "fp8_61_ms": 30.0, "fp4_61_ms": 33.0}
    run = {"gpu": "NVIDIA H100 80GB HBM3", "date": "d", "stack": "s", "rank": "DP-attention + EP32 rank"}
    no_kernel_rows = {k: v for k, v in load_tables().items() if k != "timing_more"}  # no H100 row at next_n 4
    w = worth_it(found, context=131072, batch=128, next_n=4, tables=no_kernel_rows,
                 cycle=lambda *a, **k: {"cycle": row, "cycle_why": None, "cycle_run": run})
    assert w["decision"] == "same" and w["timing"] is None
    assert ", and the server's step is 1.10x slower here (a 1.100x longer MTP verify cycle (GPU busy time inside " \
        in w["verdict"] and "keep FP8" in w["verdict"] and "turn it on" not in w["verdict"]


def test_check_quotes_no_step_time_for_another_parallelism(capsys):
    _, out = _run(capsys, "deepseek-v3.2", "--context", "131072", "--batch", "8",
                  "--sglang-args=--tp-size 8 --kv-cache-dtype fp8_e4m3")
    assert ("decode step inside SGLang's server (NVIDIA H200, DeepSeek-V3.2's layers) at 8 x 128K per rank, next_n 1: "
            "not measured (measured with DP attention, one rank's batch and layers, not this parallelism)") in out


# --- what a deployer is told first, and the inputs that are mistakes ------------------------------------------

@pytest.mark.parametrize("config", sorted(p.name for p in _CONFIGS.glob("*.yaml")))
def test_every_shipped_config_passes_its_own_check(capsys, config):
    """Each shipped --config file, checked as its header says (the model it names, the file as SGLang merges it):
    FP4 enabled and the weights fit the GPU the file is written for, so the derived KV budget exists."""
    import yaml

    path = _CONFIGS / config
    named = yaml.safe_load(path.read_text())["model-path"]
    code, out = _run(capsys, named, f"--sglang-args=--config {path}", derive=True)
    assert code == 0 and "FP4 indexer: ENABLED" in out, out
    assert "KV pool per GPU: " in out and "extra KV tokens with FP4: " in out


def test_a_config_file_naming_another_model_is_an_error_not_ignored(tmp_path, capsys):
    """A --config file whose model-path is another model than check's: a one-line error naming both and what
    differs; the same model (hub id of the packaged config) is checked; one check cannot read is named."""
    other = tmp_path / "glm.yaml"
    other.write_text("model-path: zai-org/GLM-5\ntp-size: 16\n")
    err = _one_line_error(capsys, ["deepseek-v3.2", f"--sglang-args=--config {other}", *MEMORY])
    assert ("--sglang-args: the --config file names model-path zai-org/GLM-5, another model than deepseek-v3.2 "
            "(architectures ['GlmMoeDsaForCausalLM'] there, ['DeepseekV32ForCausalLM'] here;") in err
    assert "index_n_heads 32 there, 64 here" in err and "give zai-org/GLM-5 as check's model" in err
    same = tmp_path / "v32.yaml"
    same.write_text("model-path: deepseek-ai/DeepSeek-V3.2\ntp-size: 8\n")
    code, out = _run(capsys, "deepseek-v3.2", f"--sglang-args=--config {same}")
    assert code == 0 and "model-path" not in out
    unknown = tmp_path / "hub.yaml"
    unknown.write_text("model-path: someone/another-model\n")
    code, out = _run(capsys, "deepseek-v3.2", f"--sglang-args=--config {unknown}")
    assert code == 0 and ("the --config file's model-path someone/another-model is not read here (no local copy and "
                          "no packaged config of it): check describes deepseek-v3.2") in out


def test_a_request_beyond_the_model_is_one_line_whatever_its_size(capsys):
    """--context 200000 and 99999999999 get the same message, the model's position limit; an absurd --batch is one
    line: no KV pool indexes more than 2**31 - 1 tokens (int32)."""
    for context in ("200000", "99999999999"):
        err = _one_line_error(capsys, ["deepseek-v3.2", "--context", context, *MEMORY])
        assert err.endswith(f"error: --context: {context} tokens is more than this model's 163840 positions "
                            "(max_position_embeddings in its config.json, the longest request SGLang serves); give at "
                            "most 163840"), err
    err = _one_line_error(capsys, ["deepseek-v3.2", "--context", "131072", "--batch", "10000000", *MEMORY])
    most = (2**31 - 1) // 131072
    assert most == 16383 and 10_000_000 * 131072 > 2**31 - 1
    assert (f"--batch: 10000000 requests of 131072 tokens need {10_000_000 * 131072} KV tokens, more than one KV pool "
            f"can index (2147483647, int32 token indices); give at most --batch {most}") in err
    code, out = _run(capsys, "deepseek-v3.2", "--context", "131072", "--batch", str(most))  # the largest: answered
    assert code == 4 and "neither fits the batch asked" in out


def test_a_config_without_positions_bounds_the_context_by_what_sglang_can_hold(tmp_path, capsys):
    assert "max_position_embeddings" not in DSV32
    err = _one_line_error(capsys, [_write(tmp_path, DSV32), "--context", "99999999999", *MEMORY])
    assert ("--context: 99999999999 tokens is more than the 2147483647 positions SGLang can hold (int32; this config "
            "has no max_position_embeddings); give at most 2147483647") in err


def test_a_config_file_that_is_not_yaml_is_one_message(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tp-size: [8\nfoo: : bar\n")
    err = _one_line_error(capsys, ["deepseek-v3.2", f"--sglang-args=--config {bad}", *MEMORY])
    assert "Failed to read config file" not in err and err.count(str(bad)) == 2  # PyYAML's two marks, said once
    assert "error: --config: SGLang cannot read it: while parsing a flow sequence" in err


@pytest.mark.parametrize("given, dtype, kv", [("fp8_e4m3", "fp8", 656), ("fp8", "fp8", 656), ("bfloat16", "bf16", 1152),
                                              ("bf16", "bf16", 1152)])
def test_kv_cache_dtype_takes_sglangs_value_names(capsys, given, dtype, kv):
    code, out = _run(capsys, "deepseek-v3.2", "--kv-cache-dtype", given)
    assert code == 0 and f"MLA KV {kv} B per token and layer in {dtype} (--kv-cache-dtype of check)" in out
    # The same format given both ways is no conflict; another one is.
    server = "fp8_e4m3" if dtype == "fp8" else "bf16"
    code, out = _run(capsys, "deepseek-v3.2", "--kv-cache-dtype", given, f"--sglang-args=--kv-cache-dtype {server}")
    assert code == 0
    err = _one_line_error(capsys, ["deepseek-v3.2", "--kv-cache-dtype", given, "--sglang-args=--kv-cache-dtype "
                                   + ("bf16" if dtype == "fp8" else "fp8_e4m3"), *MEMORY])
    assert f"--kv-cache-dtype {dtype} conflicts with --kv-cache-dtype" in err


def test_the_h100_figures_check_quotes_are_the_ones_measured_there(capsys):
    """On an H100 at 1 x 128K check quotes the per-layer indexer times measured inside SGLang's server on an H100
    (the raw profile's 3-layer sum over 3), and says the decode-step rows were measured on an H200 only."""
    raw = json.loads((_REPO / "benchmarks" / "results"
                      / "sglang_serving_profile_v32_layers_fp8_fp4_h100_1x131072_2026-12-05.json").read_text())
    kernel = {"fp4": "fp4_paged_logits_sm90", "fp8": "sm90_fp8_paged_mqa_logits"}  # the scorer kernels alone
    per = {k.rsplit("/", 1)[-1][:3]: next(us for name, us in v["top_kernels"] if kernel[k.rsplit("/", 1)[-1][:3]] in name) / 3
           for k, v in raw.items() if "gpu-only" not in k}
    code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H100", "--context", "131072",
                     "--sglang-args=--tp-size 16 --kv-cache-dtype fp8_e4m3")
    assert "measured on NVIDIA H100 80GB HBM3" in out
    assert f"at this shape: FP4 {per['fp4']:.1f} us" in out and f"FP8 (DeepGEMM, as SGLang calls it) {per['fp8']:.1f} us" in out
    assert ("decode step inside SGLang (bench_one_batch on NVIDIA H200) at 1 x 128K: not measured (measured on NVIDIA "
            "H200 only, not H100 80GB HBM3)") in out


def test_the_readmes_check_example_prints_the_verdict_the_readme_shows(capsys):
    """The README's first-screen example: the command as written, and the verdict line check prints for it."""
    import re
    import shlex

    readme = (_REPO / "README.md").read_text()
    blocks = re.findall(r"```\n(.*?)```", readme, re.S)
    at = next(i for i, b in enumerate(blocks) if b.startswith("verdict: "))
    command, shown = blocks[at - 1].strip(), blocks[at].strip()
    argv = shlex.split(command)
    assert argv[:2] == ["sglang-fp4-indexer", "check"]
    code, out = _run(capsys, *argv[2:], derive=True)
    assert out[out.index("verdict: "):] == shown
    assert code == 4 and shown.startswith("verdict: FP4 fits 5 requests of 128K where FP8 fits 4 (+25 %)")
    # The note under it: the pools' ratio, from the numbers the verdict prints.
    fp8, fp4 = (int(x) for x in re.search(r"FP8 holds (\d+), FP4 (\d+)", shown).groups())
    assert f"(FP4's {100 * (fp4 / fp8 - 1):.1f} % more tokens there are just enough for a fifth request of 128K;" \
        in " ".join(readme.split())


def test_the_readmes_dp_attention_example_begins_as_the_readme_quotes(capsys):
    """The README's second example (a rank of the full-depth deployment): the command as written, and the quoted
    beginning of the verdict check prints for it, the measured verify cycle included."""
    import re
    import shlex

    readme = (_REPO / "README.md").read_text()
    blocks = re.findall(r"```\n(.*?)```", readme, re.S)
    command = next(b for b in blocks if b.startswith("sglang-fp4-indexer check") and "--attn-dp-size 32" in b).strip()
    argv = shlex.split(command)
    code, out = _run(capsys, *argv[2:], derive=True)
    verdict = " ".join(out[out.index("verdict: ") + len("verdict: "):].split())
    quoted = re.search(r'its verdict begins "(.*?)", then names', " ".join(readme.split())).group(1)
    assert code == 3 and verdict.startswith(quoted), (quoted, verdict)  # same requests, measured faster: 3
    assert "1.090-1.092x shorter MTP verify cycle" in quoted and "servers in both orders" in quoted
    # The sentence after it: the same command at 9 x 64K per rank, its verdict as quoted (the rank count elided).
    argv64 = [a.replace("131072", "65536") for a in argv]
    argv64[argv64.index("--batch") + 1] = "288"
    code, out = _run(capsys, *argv64[2:], derive=True)
    verdict = " ".join(out[out.index("verdict: ") + len("verdict: "):].split())
    first, rest = re.search(r'the verdict quotes the KV-limited load measured there: "(.*?)"',
                            " ".join(readme.split())).group(1).split(" (...)")
    assert code == 0 and "`--context 65536 --batch 288` on the same rank" in readme
    assert verdict.startswith(first) and rest in verdict and verdict.index(rest) > verdict.index(first)


def test_the_same_requests_with_an_unmeasured_or_slower_indexer_is_no_turn_it_on(capsys):
    """Both fit the same number of requests: FP4 only buys indexer time. Unmeasured (an H20, no time in the tables)
    the verdict says so and how to measure it; measured slower (tables where FP4 takes twice FP8's time) it says to
    keep FP8; neither says "turn it on"."""
    import copy

    from sglang_fp4_indexer.check import run_check, worth_it
    from sglang_fp4_indexer.tables import load_tables

    code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H20", "--context", "163840")
    verdict = out[out.index("verdict: "):]
    assert code == 3 and verdict.startswith("verdict: FP4 fits no more requests of 160K than FP8 (")
    assert ", and its indexer speed is not measured for this configuration (measured on NVIDIA H200 and NVIDIA H100 " \
           "80GB HBM3, not H20), so no measured gain stands against its measured cost: measure the speed before " \
           "turning FP4 on, with sglang-fp4-indexer bench --device cuda --quick; measured cost: " in verdict
    assert "turn it on" not in verdict
    found = run_check("deepseek-v3.2", memory_gib=100, gpu="H200")
    tables = copy.deepcopy(load_tables())
    row = next(r for r in tables["timing"]["rows"] if (r["heads"], r["batch"], r["context"], r["next_n"]) == (64, 8, 131072, 1))
    row["fp4_us"] = 2 * row["fp8_us"]
    w = worth_it(found, context=163840, batch=8, tables=tables)
    assert (w["decision"], w["exit_code"]) == ("same", 3)
    assert w["verdict"].startswith(f"FP4 fits no more requests of 160K than FP8 ({w['requests_fp8']} either way; ")
    assert ", and its indexer is 2.00x slower here: FP4 gains nothing for this deployment, keep FP8; measured cost: " \
        in w["verdict"] and "turn it on" not in w["verdict"]


@pytest.mark.parametrize("listed", ["other", "fp4_indexer", "other, fp4_indexer ", ",", " ", "", None])
def test_sglang_plugins_whitelist_is_read_as_sglangs_loader_reads_it(capsys, monkeypatch, listed):
    """SGLANG_PLUGINS as SGLang's own loader reads it (the oracle: load_plugins_by_group over the installed entry
    points): where it leaves the plugin out, check says NOT LOADED with the fix, verdict and exit 1; else as without."""
    from sglang.srt.plugins import load_plugins_by_group

    from sglang_fp4_indexer.check.findings import plugin_not_listed

    if listed is None:
        monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("SGLANG_PLUGINS", listed)
    loaded = "fp4_indexer" in load_plugins_by_group("sglang.srt.plugins")
    assert (plugin_not_listed() is None) is loaded, listed
    code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H200", "--context", "131072")
    if not loaded:  # before any other refusal: a launch with the flag stops there (here --page-size 32's refusal)
        code_refused, refused = _run(capsys, "deepseek-v3.2", "--gpu", "H200", "--sglang-args=--page-size 32")
        assert code_refused == 1 and "FP4 indexer: NOT LOADED - SGLANG_PLUGINS=" in refused, refused
    if loaded:
        assert code in (0, 3) and "FP4 indexer: ENABLED" in out and "NOT LOADED" not in out
    else:
        assert code == 1 and (f"FP4 indexer: NOT LOADED - SGLANG_PLUGINS={listed!r} does not list fp4_indexer, so "
                              "SGLang does not load the plugin and launch_server stops at --enable-fp4-indexer "
                              "(unrecognized arguments) fix: add fp4_indexer to SGLANG_PLUGINS, or unset it") in out
        assert out.endswith("verdict: SGLang does not load the plugin in this environment (above): list it in "
                            "SGLANG_PLUGINS first"), out


def test_a_batch_that_fits_fp8_too_or_a_running_cap_is_said_in_the_verdict(capsys):
    """FP4's extra requests count only under a load larger than FP8's pool holds: where the batch asked fits FP8's
    pool, the verdict says so (exit 0 still: more fit); where --max-running-requests lets no more run than FP8's
    pool holds, FP4 buys no request (exit 3, the "same" verdicts)."""
    from sglang_fp4_indexer.check import run_check, worth_it
    from sglang_fp4_indexer.sglang_plugin.check_facts import read_sglang_facts

    found = run_check("deepseek-v3.2", memory_gib=100, gpu="H200")
    cap = found["capacity"]
    r8, r4 = cap.tokens_fp8 // 4096, cap.tokens_fp4_replicated // 4096  # independent count: pool tokens / 4K
    assert r4 > r8 > 8
    w = worth_it(found, context=4096, batch=8)
    assert (w["decision"], w["exit_code"]) == ("more", 0)
    assert w["verdict"].startswith(f"FP4 fits {r4} requests of 4K where FP8 fits {r8} (+{(r4 / r8 - 1) * 100:.1f} %): "
                                   f"turn FP4 on where KV memory limits you (more than {r8} requests of 4K at once; "
                                   "your batch of 8 fits either way), with "), w["verdict"]
    for running, decision in ((8, "same"), (r8, "same"), (r8 + 1, "more")):
        capped = run_check("deepseek-v3.2", memory_gib=100, gpu="H200",
                           server_flags=["--max-running-requests", str(running)], read_sglang=read_sglang_facts)
        w = worth_it(capped, context=4096, batch=8)
        assert (w["decision"], w["exit_code"]) == (decision, 3 if decision == "same" else 0), running
        said = f", but --max-running-requests lets {running} run at once, which FP8's pool holds already"
        assert (said in w["verdict"]) is (decision == "same"), w["verdict"]
        assert ("turn FP4 on" in w["verdict"]) is (decision == "more"), w["verdict"]
    code, out = _run(capsys, "deepseek-v3.2", "--gpu", "H200", "--context", "4096", "--batch", "8",
                     "--sglang-args=--max-running-requests 8")
    assert code == 3 and ", but --max-running-requests lets 8 run at once, which FP8's pool holds already" in out
    # A cap between the pools: only some of FP4's extra requests can run, and the verdict says how many.
    between = run_check("deepseek-v3.2", memory_gib=100, gpu="H200", read_sglang=read_sglang_facts,
                        server_flags=["--max-running-requests", str(r8 + 1)])
    w = worth_it(between, context=4096, batch=8)
    assert w["decision"] == "more" and (f"(+{(r4 / r8 - 1) * 100:.1f} %) (--max-running-requests lets {r8 + 1} run "
                                        f"at once: 1 more than FP8's pool holds)") in w["verdict"], w["verdict"]


def test_the_user_guides_dp_attention_mtp_example_prints_the_measured_verify_cycle(capsys):
    """The user guide's DP-attention + MTP check line, run as written, prints the verify-cycle line it promises."""
    import shlex

    guide = (Path(__file__).resolve().parents[1] / "docs" / "user-guide.md").read_text()
    line = next(ln for ln in guide.splitlines() if ln.startswith("sglang-fp4-indexer check") and "--attn-dp-size" in ln)
    argv = shlex.split(line.split("#")[0])[2:]  # past the program name and "check"
    code = main(["check", *argv])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and "verdict: FP4 fits 18 requests of 128K where FP8 fits 17" in out, out  # 100 GiB per rank
    assert ("MTP verify cycle inside SGLang's server at 8 x 128K per rank, next_n 4 (NVIDIA H200, 2026-12-06; one "
            "DP-attention + EP8 rank of DeepSeek-V3.2 with 20 of its 61 layers") in out
    # The H100 line after it: 32 H100s, the experts over 32, the KV pool the full-depth rank logged.
    h100 = [ln for ln in guide.splitlines() if ln.startswith("sglang-fp4-indexer check") and "--attn-dp-size 32" in ln]
    assert len(h100) == 1
    code = main(["check", *shlex.split(h100[0].split("#")[0])[2:]])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 3 and ("MTP verify cycle inside SGLang's server at 4 x 128K per rank, next_n 4 (NVIDIA H100 80GB "
                          "HBM3, 2026-12-06; one DP-attention + EP32 rank of DeepSeek-V3.2 with all 61 layers") in out
    assert "and a 1.090-1.092x shorter MTP verify cycle" in out[out.index("verdict:"):]


def test_requests_gain_gives_the_percentage_whole_where_it_is_and_to_one_decimal_elsewhere():
    """9 against 8 requests is 12.5 % more, not a rounded 12; 5 against 4 is 25; 4 against 3 is 33.3."""
    from sglang_fp4_indexer.check.trade import requests_gain

    assert requests_gain(8, 9, 65536, 0.088) == "FP4 fits 9 requests of 64K where FP8 fits 8 (+12.5 %)"
    assert requests_gain(4, 5, 131072, 0.052) == "FP4 fits 5 requests of 128K where FP8 fits 4 (+25 %)"
    assert requests_gain(3, 4, 100000, 0.088).endswith("where FP8 fits 3 (+33.3 %)")
    assert requests_gain(4, 4, 131072, 0.088) == ("FP4 fits no more requests of 128K than FP8 (4 either way; +8.8 % "
                                                  "KV tokens)")
    assert requests_gain(0, 1, 131072, 0.088) == "FP4 fits 1 request of 128K where FP8 fits none"


def test_help_names_every_measured_server_step_from_the_tables(monkeypatch):
    """``check --help`` lists where a server's whole step was measured from the packaged tables (every verify-cycle
    section, GLM-5's included, with its GPU, rank, model and shapes), and falls back to the benchmarks page when
    the tables cannot be read, so that help never fails."""
    from sglang_fp4_indexer.check import command
    from sglang_fp4_indexer.tables import cycle_sections, load_tables

    tables = load_tables()
    text = command.measured_cycles_text(tables)
    secs = cycle_sections(tables) + [tables["cycle_fused"]]
    assert len(secs) == 3 and text.count("; ") == 2
    for sec in secs:
        shapes = ", ".join(f"{b} x {c // 1024}K" for b, c in sorted({(r["batch"], r["context"]) for r in sec["rows"]}
                                                                     | {(x["concurrency"], x["context"])
                                                                        for x in sec.get("loads") or []}))
        assert f"{sec['gpu']}, a {sec['rank']} of {sec.get('model', 'DeepSeek-V3.2')}: {shapes}" in text
    assert "4 x 64K" in text and "of GLM-5: " in text

    def unreadable():
        raise ValueError("measured tables: cannot be read")

    monkeypatch.setattr(command, "load_tables", unreadable)
    assert command.measured_cycles_text() == "see docs/benchmarks.md"

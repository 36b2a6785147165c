"""``check``'s KV budget per GPU: GPU memory x --mem-fraction-static - the weights per GPU, as SGLang sizes it.

Oracles: the published parameter counts of the packaged models, a GLM-5.2 checkpoint's MTP-layer tensor bytes,
SGLang 0.5.23's own ``--mem-fraction-static`` rule (``memory_hook.handle_gpu_memory_settings``) and the formula
its docstring states, computed by hand here.
"""

from __future__ import annotations

import json

import pytest

from sglang_fp4_indexer.check import packaged_model
from sglang_fp4_indexer.check.weights import Parallel, parameter_count, weight_bytes_per_gpu
from sglang_fp4_indexer.cli import main

GIB = 2**30


def _cfg(name):
    folder, _ = packaged_model(name)
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("name, main_b, with_mtp_b", [
    ("deepseek-v3.2", 671, 685),  # model card: 671B parameters, 685B with the MTP module's weights
    ("glm-5", 744, None),         # model card: 744B parameters in total (40B active)
])
def test_parameter_count_matches_the_published_figure(name, main_b, with_mtp_b):
    """The count from the config's shapes is within 0.5 % of the model card's (rounded to 1B there)."""
    cfg = _cfg(name)
    assert parameter_count(cfg) / 1e9 == pytest.approx(main_b, rel=0.005)
    if with_mtp_b is not None:
        assert parameter_count(cfg, include_mtp=True) / 1e9 == pytest.approx(with_mtp_b, rel=0.005)


def test_mtp_layer_bytes_match_a_checkpoints_tensors():
    """GLM-5.2's MTP layer (layer 78, bf16 with an fp32 router bias, no embedding or head): 19 905 841 664 bytes in
    its checkpoint (the tensor inventory a public MTP-extraction tool checks against)."""
    w = weight_bytes_per_gpu(_cfg("glm-5.2"), Parallel(tp=1, mtp=True))
    assert w.mtp == 19_905_841_664 and w.dtype == "bf16"


def test_weights_split_over_tp_as_sglang_shards_them():
    cfg = _cfg("deepseek-v3.2")
    one, eight = weight_bytes_per_gpu(cfg, Parallel(tp=1)), weight_bytes_per_gpu(cfg, Parallel(tp=8))
    # 58 MoE layers of 256 routed + 1 shared experts (3 x 7168 x 2048 weights each, FP8: 1 B per weight + one fp32
    # scale per 128x128 block) and a bf16 router (256 x 7168) with an fp32 bias; the router is replicated
    expert = 3 * 7168 * 2048 + (3 * 2048 // 128) * (7168 // 128) * 4
    router = 256 * 7168 * 2 + 256 * 4
    assert one.experts == 58 * (257 * expert + router)
    assert eight.experts == 58 * (257 * expert / 8 + router)
    assert eight.indexer == one.indexer  # the indexer is replicated (ReplicatedLinear in SGLang)
    assert one.total / GIB == pytest.approx(627.7, abs=0.1) and eight.total / GIB == pytest.approx(80.1, abs=0.1)
    dp = weight_bytes_per_gpu(cfg, Parallel(tp=8, attn_dp=8))
    assert dp.attention > eight.attention and dp.experts == eight.experts
    with pytest.raises(ValueError, match="--dp-size 3 with DP attention must divide --tp-size 8"):
        weight_bytes_per_gpu(cfg, Parallel(tp=8, attn_dp=3))
    with pytest.raises(ValueError, match="lacks hidden_size"):
        weight_bytes_per_gpu({k: v for k, v in cfg.items() if k != "hidden_size"}, Parallel(tp=8))


@pytest.mark.sglang
@pytest.mark.parametrize("flags", [["--tp-size", "8"], ["--tp-size", "4", "--cuda-graph-max-bs-decode", "128"],
                                   ["--tp-size", "8", "--chunked-prefill-size", "16384"]])
@pytest.mark.parametrize("gpu_mib", [81559, 143771, 183359])
def test_mem_fraction_is_sglangs_own(flags, gpu_mib):
    """The adapter's fraction is what SGLang 0.5.23's resolution gives, and that is the formula its docstring
    states: (GPU memory - reserve) / GPU memory, the reserve 512 MiB + 1.5 MiB per activation token + TP/8 GiB +
    2 MiB per decode CUDA-graph batch, at least 10 GiB above 60 GiB (no prefill graph, no DP attention here)."""
    from sglang_fp4_indexer.sglang_plugin.check_facts import memory_facts
    from sglang_fp4_indexer.sglang_plugin.server_args import server_args_from_flags

    folder, _ = packaged_model("deepseek-v3.2")
    facts = memory_facts(server_args_from_flags(str(folder), flags))
    fraction, how = facts["fraction_for"](gpu_mib)
    args = dict(zip(flags[::2], map(int, flags[1::2])))
    tp = args["--tp-size"]
    chunk = args.get("--chunked-prefill-size", 16384 if gpu_mib >= 160 * 1024 else 8192)
    max_bs = args.get("--cuda-graph-max-bs-decode", 512 if gpu_mib >= 160 * 1024 or tp >= 4 else 256)
    reserve = max(512 + 1.5 * max(chunk, 2048) + tp / 8 * 1024 + 2 * max_bs, 10 * 1024)
    assert fraction == round((gpu_mib - reserve) / gpu_mib, 3) and how == "SGLang's default for this GPU and flags"
    given = memory_facts(server_args_from_flags(str(folder), [*flags, "--mem-fraction-static", "0.8"]))
    assert given["fraction_for"](gpu_mib) == (0.8, "--mem-fraction-static in --sglang-args")


def _out(capsys, *argv):
    code = main(["check", *argv])
    return code, " ".join(capsys.readouterr().out.split())


@pytest.mark.sglang
def test_check_derives_the_budget_and_says_how(capsys):
    cfg = _cfg("deepseek-v3.2")
    code, out = _out(capsys, "deepseek-v3.2", "--gpu", "H200", "--sglang-args=--tp-size 8")
    weights = weight_bytes_per_gpu(cfg, Parallel(tp=8)).total
    budget = int(143771 * 2**20 * 0.897 - weights)
    assert code == 0 and (f"KV pool per GPU: 140.4 GiB GPU memory (H200, 143771 MiB, given as --gpu) x 0.897 "
                          f"--mem-fraction-static (SGLang's default for this GPU and flags) - 80.1 GiB weights per GPU"
                          ) in out and f"= {budget / GIB:.1f} GiB" in out
    assert str(budget // (61 * (1152 + 132))) in out  # the FP8 rows' KV tokens: the budget / bytes per token
    code, out = _out(capsys, "deepseek-v3.2", "--gpu", "B200", "--sglang-args=--tp-size 8 --mem-fraction-static 0.85")
    assert "x 0.85 --mem-fraction-static (--mem-fraction-static in --sglang-args)" in out and "CUDA 10.0 (given)" in out
    code, out = _out(capsys, "deepseek-v3.2", "--memory-gib", "30")
    assert "KV pool per GPU: 30 GiB (--memory-gib)" in out and str(30 * GIB // (61 * (1152 + 132))) in out


@pytest.mark.sglang
@pytest.mark.parametrize("argv, message", [
    (["deepseek-v3.2"], "model: its weights take 627.7 GiB per GPU (FP8 with 128x128-block scales, TP 1), more than"),
    (["glm-5", "--sglang-args=--tp-size 8"], "or an FP8 checkpoint, or give --memory-gib"),
    (["deepseek-v3.2", "--gpu", "A10"], "--gpu: 'A10' is not one of H100, H20, H200, B200"),
])
def test_what_does_not_fit_is_a_one_line_error(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["check", *argv])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("loading SGLang")]
    assert exc.value.code == 2 and len(err) == 1 and message in err[0], err

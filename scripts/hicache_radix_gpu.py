"""The FP4 index cache with SGLang's radix cache and hierarchical cache (HiCache), on a GPU, tiny model.

Runs ``sglang.Engine`` on the tiny DeepSeek-V3.2 of ``scripts/sglang_one_batch.py make-model`` (dummy
weights, no network) with the radix cache on (every other GPU check runs with ``--disable-radix-cache``):

* ``radix --model DIR --out FILE.json [--fp8]``: two requests sharing a prefix; the second's
  ``cached_tokens`` shows the prefix's pages were reused, and its top-k is compared with the same
  request after ``flush_cache()`` (no reuse).
* ``hicache --model DIR --out FILE.json [--fp8]``: ``--enable-hierarchical-cache`` with a device pool of
  ``--max-total-tokens`` tokens; turn 1 of a conversation, filler conversations that evict it from the
  device to host memory, then turn 2, whose prefix is loaded back from the host
  (``cached_tokens_details``). A probe in the scheduler process (``sitecustomize``, enabled by an
  environment variable only this script sets) hashes every index page SGLang's ``DSAIndexerPoolHost``
  copies device -> host and compares the device page after each host -> device load with it. Turn 2's
  top-k is compared with turn 2 of a run that never evicted (``flush_cache()``, turn 1, turn 2 at once).
* ``compare FILE.json ...``: the checks of each file as a table; exit code 0 when every check passed.

Top-k rows are read by the test-only trace plugin (``scripts/topk_trace``, installed by
``scripts/sglang_gpu_check.sh``; ``FP4_INDEXER_TOPK_TRACE_DIR`` is set to ``FILE.json.trace`` for the
Engine's processes) as token positions: SGLang's own ``return_indexer_topk`` returns KV-cache slots, which
differ between two runs of one request whenever its pages sit elsewhere (a reused or reloaded prefix),
so slot sets cannot be compared. Each decode row is keyed by its query position; the two runs of a
request are told apart by order (the second run repeats the first's positions; a retracted and
retried request would look like one more run, which stops the check with that count). Both
runs must hold the same rows; compared as the share of rows with the same set and the mean overlap. Run the same
subcommand with ``--fp8`` for SGLang's own FP8 indexer on the same requests: FP8's agreement is the
yardstick for FP4's (both compute the prefix's index keys in a different batch when it is reused).

SGLang's Rust radix-tree core failed under torch 2.11 on the GPU machine used so far (with or without
the plugin); ``--radix-core python`` (the default) sets SGLang's ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``
to its Python core, ``--radix-core default`` leaves SGLang's choice.

    python scripts/sglang_one_batch.py make-model /tmp/tiny
    python scripts/hicache_radix_gpu.py radix --model /tmp/tiny --out radix_fp4.json
    python scripts/hicache_radix_gpu.py radix --model /tmp/tiny --out radix_fp8.json --fp8
    python scripts/hicache_radix_gpu.py hicache --model /tmp/tiny --out hicache_fp4.json
    python scripts/hicache_radix_gpu.py hicache --model /tmp/tiny --out hicache_fp8.json --fp8
    python scripts/hicache_radix_gpu.py compare radix_fp4.json radix_fp8.json hicache_fp4.json hicache_fp8.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "topk_trace"))  # its reader
from fp4_indexer_topk_trace import decode_rows, read_trace  # noqa: E402 (the test-only trace plugin's reader)
from sglang_one_batch import VOCAB  # noqa: E402 (the tiny model's vocabulary)

#: Environment variable naming the JSON-lines file the scheduler-side page probe appends to.
PROBE_ENV = "FP4_INDEXER_HICACHE_PROBE"

#: ``sitecustomize.py`` written to a temporary folder on ``PYTHONPATH`` for the Engine's processes. Inert
#: unless ``PROBE_ENV`` is set. It wraps SGLang's ``DSAIndexerPoolHost`` copies: a backup records a hash of
#: each device index page per (host layer, host page); a load compares the device page it wrote with it.
PROBE_SOURCE = r'''
import os
_out = os.environ.get("FP4_INDEXER_HICACHE_PROBE")
if _out:
    import hashlib, json
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost

    _saved = {}

    def _digest(buf, page):
        return hashlib.sha256(buf[int(page)].contiguous().cpu().numpy().tobytes()).hexdigest()

    def _layers(host):
        target = [(host._host_layer_index(l), host.device_pool.index_k_with_scale_buffer[l])
                  for l in host._live_target_layers]
        drafts = [(host.target_layer_num + i, p.index_k_with_scale_buffer[0])
                  for i, p in enumerate(host.mtp_draft_device_pools)]
        return target + drafts

    def _log(**row):
        with open(_out, "a") as f:
            f.write(json.dumps(row) + "\n")

    _backup = DSAIndexerPoolHost.backup_from_device_all_layer

    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices, io_backend):
        hp, dp = self._get_indexer_page_indices(host_indices, device_indices)
        for layer, buf in _layers(self):
            for h, d in zip(hp.tolist(), dp.tolist()):
                _saved[(id(self), layer, h)] = _digest(buf, d)
        _log(op="backup", pages=len(hp), layers=self.layer_num,
             page_bytes=self.indexer_page_stride_size)
        return _backup(self, device_pool, host_indices, device_indices, io_backend)

    _load = DSAIndexerPoolHost.load_to_device_per_layer

    def load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id, io_backend,
                                 *, is_draft=False):
        out = _load(self, device_pool, host_indices, device_indices, layer_id, io_backend, is_draft=is_draft)
        if not is_draft and not self._is_device_layer_owned(device_pool, layer_id):
            return out
        host_layer = self._draft_host_layer(layer_id) if is_draft else self._host_layer_index(layer_id)
        buf = device_pool.index_k_with_scale_buffer[0 if is_draft else layer_id]
        hp, dp = self._get_indexer_page_indices(host_indices, device_indices)
        same = missing = 0
        for h, d in zip(hp.tolist(), dp.tolist()):
            want = _saved.get((id(self), host_layer, h))
            if want is None:
                missing += 1
            elif want == _digest(buf, d):
                same += 1
        _log(op="load", layer=host_layer, pages=len(hp), identical=same, not_backed_up=missing)
        return out

    DSAIndexerPoolHost.backup_from_device_all_layer = backup_from_device_all_layer
    DSAIndexerPoolHost.load_to_device_per_layer = load_to_device_per_layer
'''


def _prompts(seed: int, lens) -> list[list[int]]:
    """Seeded token-id prompts (ids in [3, VOCAB)) of the given lengths."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, size=n).tolist() for n in lens]


def engine_kwargs(opts, **extra) -> dict:
    """``sglang.Engine`` keyword arguments of a run: the tiny model, dummy weights, FP8 MLA KV, the radix
    cache on (SGLang's default), FP4 unless ``opts.fp8``; ``extra`` added last.

    Raises:
        ValueError: ``extra`` turns the radix cache off (what these checks are about).
    """
    if extra.get("disable_radix_cache"):
        raise ValueError("extra: disable_radix_cache must stay off for the radix and HiCache checks")
    kwargs = dict(model_path=opts.model, load_format="dummy", kv_cache_dtype="fp8_e4m3",
                  mem_fraction_static=opts.mem_fraction_static, disable_prefill_cuda_graph=True,
                  random_seed=0, max_running_requests=4,
                  cuda_graph_max_bs_decode=4, log_level="info")
    if not opts.fp8:
        kwargs["enable_fp4_indexer"] = True
    kwargs.update(extra)
    return kwargs


def _generate(eng, input_ids: list[int], new_tokens: int) -> dict:
    """One greedy request through the Engine's tokenizer manager (as ``sglang_one_batch.py engine`` sends it):
    output ids, cached tokens (and their breakdown)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(input_ids=input_ids, sampling_params={"temperature": 0, "max_new_tokens": new_tokens,
                                                                 "ignore_eos": True})
    out = eng.loop.run_until_complete(eng.tokenizer_manager.generate_request(obj, None).__anext__())
    meta = out.get("meta_info", {})
    return {"output_ids": out.get("output_ids"), "cached_tokens": meta.get("cached_tokens"),
            "cached_tokens_details": meta.get("cached_tokens_details")}


def trace_dir(out: str) -> str:
    """Point the trace plugin of the Engine's processes (started after this call) at an empty ``OUT.trace``."""
    import shutil

    path = os.path.abspath(out + ".trace")
    shutil.rmtree(path, ignore_errors=True)
    os.environ["FP4_INDEXER_TOPK_TRACE_DIR"] = path
    return path


def decode_runs(records: list[dict], prompt_len: int) -> list[dict[tuple[int, int], list[int]]]:
    """The decode top-k rows of every run of the requests with ``prompt_len`` prompt tokens, in order.

    Args:
        records: ``fp4_indexer_topk_trace.read_trace`` of the Engine (requests sent one after another, so every
            decode record holds one request); rows as ``fp4_indexer_topk_trace.decode_rows`` gives them (token
            positions).
        prompt_len: the request's prompt length.

    Returns:
        One dict per run, ``{(layer, query position): sorted positions}``: a row whose key the current run
        already holds starts the next run (a later run of the request repeats the positions).
    """
    runs: list[dict[tuple[int, int], list[int]]] = []
    for plen, layer, pos, positions in decode_rows(records):
        if plen != prompt_len:
            continue
        if not runs or (layer, pos) in runs[-1]:
            runs.append({})
        runs[-1][(layer, pos)] = positions
    return runs


def read_runs(path: str, prompt_len: int, want: int) -> list[dict]:
    """``decode_runs`` of the trace under ``path``.

    Raises:
        RuntimeError: no trace there (the trace plugin is not installed in the Engine's environment), or not
            exactly ``want`` runs.
    """
    try:
        runs = decode_runs(read_trace(path), prompt_len)
    except FileNotFoundError as e:
        raise RuntimeError(f"{path}: no top-k trace ({e}); install scripts/topk_trace as "
                           "scripts/sglang_gpu_check.sh does") from e
    if len(runs) != want:  # more: a request retried (retracted), which these checks do not pair
        raise RuntimeError(f"{path}: {len(runs)} decode runs of the {prompt_len}-token prompt, expected {want}")
    return runs


def topk_agreement(a: dict, b: dict) -> dict:
    """How two runs' top-k rows agree over the rows both computed.

    Args:
        a, b: ``{(layer, query position): sorted positions}`` (``decode_runs``).

    Returns:
        ``{"rows", "equal_rows", "mean_overlap", "min_overlap", "unpaired_rows"}`` (overlap: ``|A ∩ B| / |B|`` per
        row; ``unpaired_rows``: rows only one run holds, which the checks require to be none).

    Raises:
        ValueError: the runs have no row in common.
    """
    both = sorted(set(a) & set(b))
    if not both:
        raise ValueError("a, b: the runs have no (layer, position) top-k row in common")
    equal, overlaps = 0, []
    for k in both:
        x, y = set(a[k]), set(b[k])
        equal += x == y
        overlaps.append(len(x & y) / max(len(y), 1))
    return {"rows": len(both), "equal_rows": equal, "mean_overlap": sum(overlaps) / len(both),
            "min_overlap": min(overlaps), "unpaired_rows": len(set(a) ^ set(b))}


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ("sglang", "torch", "sglang-fp4-indexer", "sglang-kernel"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def _finish(opts, res: dict, t0: float) -> None:
    res.update(fp4=not opts.fp8, wall_s=time.time() - t0, versions=_versions())
    with open(opts.out, "w") as f:
        json.dump(res, f)
    print(f"saved {opts.out}: " + json.dumps({k: v for k, v in res.items() if k not in ("runs",)})[:2000])


def radix(opts) -> None:
    """Prefix reuse: A = S + a, then B = S + b (reuses S), then B again after ``flush_cache()``."""
    import sglang

    t0 = time.time()
    shared, a, b = _prompts(11, (opts.prefix, 700, 900))
    trace = trace_dir(opts.out)
    eng = sglang.Engine(**engine_kwargs(opts))
    try:
        first = _generate(eng, shared + a, opts.new_tokens)
        reused = _generate(eng, shared + b, opts.new_tokens)
        eng.flush_cache()
        fresh = _generate(eng, shared + b, opts.new_tokens)
    finally:
        eng.shutdown()
    agree = topk_agreement(*read_runs(trace, len(shared + b), 2))
    checks = {
        "prefix reused (cached_tokens of B >= prefix pages)": reused["cached_tokens"] >= opts.prefix // 64 * 64,
        "no reuse after flush_cache": fresh["cached_tokens"] == 0,
        "same output ids with and without reuse": reused["output_ids"] == fresh["output_ids"],
        f"top-k with reuse vs without: every row paired, mean overlap >= {opts.min_overlap}":
            agree["unpaired_rows"] == 0 and agree["mean_overlap"] >= opts.min_overlap,
    }
    _finish(opts, {"check": "radix", "prefix": opts.prefix, "cached_tokens": [first["cached_tokens"],
                   reused["cached_tokens"], fresh["cached_tokens"]], "topk_agreement": agree,
                   "checks": checks, "passed": all(checks.values())}, t0)


def hicache(opts) -> None:
    """Multi-turn with eviction to host memory and reload, against a run that never evicted."""
    import sglang

    t0 = time.time()
    probe_out = os.path.abspath(opts.out + ".probe.jsonl")
    if os.path.exists(probe_out):
        os.remove(probe_out)
    probe_dir = tempfile.mkdtemp(prefix="fp4_hicache_probe_")
    with open(os.path.join(probe_dir, "sitecustomize.py"), "w") as f:
        f.write(PROBE_SOURCE)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (probe_dir, os.environ.get("PYTHONPATH")) if p)
    os.environ[PROBE_ENV] = probe_out
    turn1, user2, *fillers = _prompts(23, (opts.turn_tokens, 600) + (opts.turn_tokens,) * opts.fillers)
    trace = trace_dir(opts.out)
    extra = dict(enable_hierarchical_cache=True, hicache_ratio=opts.hicache_ratio,
                 hicache_mem_layout=opts.layout, hicache_io_backend=opts.io_backend,
                 max_total_tokens=opts.max_total_tokens)
    eng = sglang.Engine(**engine_kwargs(opts, **extra))
    try:
        one = _generate(eng, turn1, opts.new_tokens)
        for filler in fillers:  # each as long as turn 1: together more than the device pool holds
            _generate(eng, filler, opts.new_tokens)
        second_input = turn1 + one["output_ids"] + user2
        reloaded = _generate(eng, second_input, opts.new_tokens)
        eng.flush_cache()
        _generate(eng, turn1, opts.new_tokens)
        kept = _generate(eng, second_input, opts.new_tokens)  # turn 1's pages still on the device
    finally:
        eng.shutdown()
    probe = [json.loads(line) for line in open(probe_out)] if os.path.exists(probe_out) else []
    loads = [r for r in probe if r["op"] == "load"]
    backups = [r for r in probe if r["op"] == "backup"]
    loaded = sum(r["pages"] - r["not_backed_up"] for r in loads)
    identical = sum(r["identical"] for r in loads)
    agree = topk_agreement(*read_runs(trace, len(second_input), 2))
    page_bytes = 64 * 68 if not opts.fp8 else 64 * 132
    checks = {
        "turn 2 found turn 1's prefix (cached_tokens > 0)": (reloaded["cached_tokens"] or 0) > 0,
        "index pages were loaded back from host memory": loaded > 0,
        "every reloaded index page equals its bytes at backup": loaded > 0 and identical == loaded,
        f"host index page is {page_bytes} bytes per layer": bool(backups) and all(
            r["page_bytes"] == page_bytes for r in backups),
        "same output ids as the run that never evicted": reloaded["output_ids"] == kept["output_ids"],
        f"top-k after reload vs never evicted: every row paired, mean overlap >= {opts.min_overlap}":
            agree["unpaired_rows"] == 0 and agree["mean_overlap"] >= opts.min_overlap,
    }
    _finish(opts, {"check": "hicache", "layout": opts.layout, "io_backend": opts.io_backend,
                   "max_total_tokens": opts.max_total_tokens, "cached_tokens": reloaded["cached_tokens"],
                   "cached_tokens_details": reloaded["cached_tokens_details"],
                   "probe": {"backups": len(backups), "loads": len(loads), "pages_loaded": loaded,
                             "pages_identical": identical},
                   "topk_agreement": agree, "checks": checks, "passed": all(checks.values())}, t0)


def compare(paths: list[str]) -> int:
    """Print every file's checks; 0 when all passed, 1 otherwise."""
    ok = True
    for path in paths:
        res = json.load(open(path))
        fmt = "FP4" if res.get("fp4") else "FP8"
        print(f"## {path}: {res['check']} ({fmt}); top-k agreement {res['topk_agreement']}")
        for name, passed in res["checks"].items():
            print(f"  {'PASS' if passed else 'FAIL'}  {name}")
        ok &= bool(res["passed"])
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Command line: ``radix``, ``hicache`` or ``compare`` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="hicache_radix_gpu.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("radix", "hicache"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, help="the folder of sglang_one_batch.py make-model")
        p.add_argument("--out", required=True)
        p.add_argument("--fp8", action="store_true", help="SGLang's own FP8 indexer (no --enable-fp4-indexer)")
        p.add_argument("--new-tokens", type=int, default=16)
        p.add_argument("--mem-fraction-static", type=float, default=0.006)
        p.add_argument("--min-overlap", type=float, default=1.0,
                       help="mean top-k overlap the comparison must reach (1.0: the same sets)")
        p.add_argument("--radix-core", choices=("python", "default"), default="python")
        if name == "radix":
            p.add_argument("--prefix", type=int, default=4096, help="shared prefix tokens")
        else:
            p.add_argument("--turn-tokens", type=int, default=4096)
            p.add_argument("--fillers", type=int, default=3)
            p.add_argument("--max-total-tokens", type=int, default=12288,
                           help="device KV pool tokens: fewer than turn 1 plus the fillers, so turn 1 is evicted")
            p.add_argument("--hicache-ratio", type=float, default=4.0)
            p.add_argument("--layout", default="page_first",
                           choices=("layer_first", "page_first", "page_first_direct"))
            p.add_argument("--io-backend", default="kernel", choices=("kernel", "direct"))
    p = sub.add_parser("compare")
    p.add_argument("files", nargs="+")
    opts = parser.parse_args(argv)
    if opts.cmd == "compare":
        return compare(opts.files)
    if opts.radix_core == "python":
        os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = "python"
    (radix if opts.cmd == "radix" else hicache)(opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())

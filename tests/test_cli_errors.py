"""Usage errors a new user meets: one line, exit code 2, naming the option (argparse ``type=`` validators
in ``sglang_fp4_indexer.argtypes`` and the checks run before any slow work); ``--version``."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pytest

from sglang_fp4_indexer import __version__
from sglang_fp4_indexer.argtypes import MAX_MEMORY_GIB, int_list, integer, memory_gib, number
from sglang_fp4_indexer.cli import SGLANG_VERSION, main

REPO = Path(__file__).resolve().parents[1]


def _usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, (argv, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_validators_accept_and_refuse_by_their_bounds():
    assert integer(1)("7") == 7 and integer(0)("0") == 0 and integer(1, 3)("3") == 3
    for bad in ("0", "-5", "x", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected an integer >= 1"):
            integer(1)(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="<= 3"):
        integer(1, 3)("4")
    gib = memory_gib()
    assert gib("80") == 80.0 and gib(str(MAX_MEMORY_GIB)) == MAX_MEMORY_GIB
    for bad in ("inf", "-inf", "nan", "0", "-1", "1e30", "lots"):
        with pytest.raises(argparse.ArgumentTypeError, match="finite number > 0 and <= 1,048,576"):
            gib(bad)
    assert number(0)("0") == 0.0 and math.isclose(number(0, exclusive_minimum=True)("1e-9"), 1e-9)
    with pytest.raises(argparse.ArgumentTypeError, match="> 0"):
        number(0, exclusive_minimum=True)("0")
    assert int_list(1)("1024, 4096,") == [1024, 4096]
    for bad in ("-5", "1,-5", "1,x", ",", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="comma-separated integers >= 1"):
            int_list(1)(bad)


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"sglang-fp4-indexer {__version__} (for SGLang {SGLANG_VERSION})"


@pytest.mark.parametrize("argv, option, detail", [
    (["accuracy", "--triton-max-context", "-1"], "--triton-max-context", "expected an integer >= 0, got '-1'"),
    (["accuracy", "--needle-margin", "-1"], "--needle-margin", "expected a finite number > 0, got '-1'"),
    (["accuracy", "--needle-margin", "nan"], "--needle-margin", "finite number > 0"),
    (["accuracy", "--contexts", "-5"], "--contexts", "comma-separated integers >= 1, got '-5'"),
    (["accuracy", "--heads", "0"], "--heads", ">= 1"),
    (["accuracy", "--rows", "0"], "--rows", "expected an integer >= 1"),
    (["demo", "--context", "0"], "--context", "expected an integer >= 1, got '0'"),
    (["demo", "--batch", "-1"], "--batch", "expected an integer >= 1"),
    (["demo", "--memory-gib", "inf"], "--memory-gib", "finite number > 0"),
    (["demo", "--memory-gib", "nan"], "--memory-gib", "finite number > 0"),
    (["demo", "--repeats", "0"], "--repeats", ">= 1"),
    (["check", "m", "--memory-gib", "inf"], "--memory-gib", "got 'inf'"),
    (["check", "m", "--memory-gib", "nan"], "--memory-gib", "got 'nan'"),
    (["check", "m", "--memory-gib", "1e30"], "--memory-gib", "<= 1,048,576, got '1e30'"),
    (["check", "m", "--context", "-5"], "--context", "expected an integer >= 1, got '-5'"),
    (["check", "m", "--batch", "0"], "--batch", ">= 1"),
    (["check", "m", "--next-n", "0"], "--next-n", ">= 1"),
    (["check", "m", "--next-n", "9"], "--next-n", "<= 8, got '9'"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_values_are_refused_while_parsing(capsys, argv, option, detail):
    err = _usage_error(capsys, argv)
    assert f"error: argument {option}: expected " in err and detail in err, err
    assert "building" not in err and "loading SGLang" not in err  # nothing ran


def test_accuracy_out_dir_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    existing = tmp_path / "results.txt"
    existing.write_text("keep me\n")
    err = _usage_error(capsys, ["accuracy", "--workloads", "gaussian", "--contexts", "64", "--heads", "32",
                                "--rows", "4", "--out-dir", str(existing)])
    assert f"error: --out-dir: {existing}: exists and is not a directory" in err
    assert "building" not in capsys.readouterr().out and existing.read_text() == "keep me\n"
    err = _usage_error(capsys, ["accuracy", "--from-json", str(existing), "--out-dir", str(existing / "sub")])
    assert f"--out-dir: {existing / 'sub'}: {existing} is not a directory" in err


def test_accuracy_contexts_shorter_than_twice_the_rows_refused_before_building(capsys):
    err = _usage_error(capsys, ["accuracy", "--workloads", "gaussian", "--contexts", "64,16", "--rows", "16"])
    assert "error: --contexts: [16] below 2 x 16 rows = 32 keys" in err
    assert "building" not in capsys.readouterr().out


@pytest.mark.parametrize("command", ["demo", "accuracy"])
@pytest.mark.parametrize("content", [b"hello world\n", b"e\x00\x01 not pickle", b"\x80\x02}q\x00."],
                         ids=["text", "binary", "pickle-of-nothing"])
def test_load_workload_of_a_foreign_file_is_one_line(tmp_path, capsys, command, content):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    argv = [command, "--load-workload", str(path)]
    if command == "accuracy":
        argv += ["--out-dir", str(tmp_path / "o")]
    err = _usage_error(capsys, argv)
    assert f"error: --load-workload: {path}: not " in err, err


#: ``DESIGN`` in capitals names the original design file, which is not in the repository; docs/design.md is a user page.
_INTERNAL = re.compile(r"\bissue \d|\bruns? \d|\bsession\b|\bCEO\b|(?-i:DESIGN)|METHOD\.md|device tool|\.carry\b|"
                       r"\bcarry \[|huggingface-cli|\bgoals?\b|\bnot met\b|\btarget \d|\btarget <|the issue's",
                       re.IGNORECASE)
#: What a user reads (the run-by-run measurement logs are benchmarks/results/HISTORY.md and PERF_LOG.md).
_USER_DOCS = ("README.md", "CHANGELOG.md", "docs/user-guide.md", "docs/accuracy.md", "docs/demo.md",
              "docs/format.md", "docs/sglang-seams.md", "docs/design.md", "docs/benchmarks.md", "docs/perf-notes.md")


@pytest.mark.parametrize("command", [[], ["demo"], ["check"], ["bench"], ["accuracy"], ["model-accuracy"], ["docs"]],
                         ids=lambda c: " ".join(c) or "top")
def test_help_names_things_by_what_they_are(capsys, command):
    from sglang_fp4_indexer.guide import doc_path, docs_dir

    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0 and text.startswith("usage: sglang-fp4-indexer")
    assert _INTERNAL.findall(text) == []
    assert "source repository" not in text  # there is none to point to: the docs travel with the package
    for name in re.findall(r"([\w.-]+\.md)\b", text):  # every page a help text names is installed
        assert doc_path(name) is not None, name
    if not command:  # the top-level help says where the documentation is
        assert f"Theuserdocumentationisin{docs_dir()}(" in "".join(text.split()) and "sglang-fp4-indexer docs" in text


def test_docs_lists_the_installed_documents_and_how_to_report(capsys):
    from sglang_fp4_indexer.guide import DOCS, REPORT, docs_dir

    assert main(["docs"]) == 0
    out = capsys.readouterr().out
    folder = docs_dir()
    assert folder == REPO / "docs" and f"the user documentation is in {folder}" in out  # from the checkout
    for name, what in DOCS:
        shown = name if (folder / name).is_file() else f"../{name}"
        assert (folder / shown).resolve().is_file() and f"{shown}" in out and what in out, name
    assert " ".join(REPORT.split()) in " ".join(out.split()) and "no public issue tracker" in REPORT
    assert main(["docs", "--path"]) == 0 and capsys.readouterr().out == f"{folder}\n"
    guide = (REPO / "docs" / "user-guide.md").read_text()
    assert "There is no public issue tracker" in guide and "Open an issue" not in guide


@pytest.mark.parametrize("name", _USER_DOCS)
def test_user_docs_have_no_internal_terms(name):
    lines = (REPO / name).read_text().splitlines()
    found = [(i + 1, line) for i, line in enumerate(lines) if _INTERNAL.search(line)]
    assert found == [], found


def test_checks_next_n_bound_is_the_scorers():
    from sglang_fp4_indexer import check
    from sglang_fp4_indexer.ops import paged_logits

    assert check.MAX_NEXT_N == paged_logits.MAX_NEXT_N


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_output_file_in_a_missing_folder_is_refused_not_created(tmp_path, capsys, flag):
    """One rule for every file option (as demo --save-workload): the folder must exist; nothing is created."""
    folder = tmp_path / "nonexistent"
    target = folder / ("x.json" if flag == "--json" else "x.png")
    err = _usage_error(capsys, ["bench", "--device", "cpu", flag, str(target)])
    assert f"error: {flag}: {target}: the directory {folder} does not exist" in err
    assert not folder.exists()
    err = _usage_error(capsys, ["demo", "--save-workload", str(folder / "w.pt")])
    assert f"error: --save-workload: {folder / 'w.pt'}: the directory {folder} does not exist" in err


# --- inputs too large for the machine, and the smaller things a new user meets ------------------------------

@pytest.mark.parametrize("argv, option, keys", [
    (["demo", "--context", "99999999999999"], "--context", 2 * 99999999999999),
    (["demo", "--context", "50000000", "--workload", "gaussian", "--batch", "4"], "--context", 4 * 50000000),
    (["accuracy", "--contexts", "99999999999"], "--contexts", 99999999999),
], ids=["demo-huge", "demo-gaussian", "accuracy-huge"])
def test_inputs_that_cannot_fit_in_memory_are_refused_before_allocating(capsys, argv, option, keys):
    from sglang_fp4_indexer.workload import MIN_BYTES_PER_KEY, available_memory_bytes

    assert keys * MIN_BYTES_PER_KEY > available_memory_bytes("cpu")  # the premise: it cannot fit here
    err = _usage_error(capsys, argv)
    assert f"{option}: {keys:,} keys need at least {keys * MIN_BYTES_PER_KEY / 2**30:,.1f} GiB of memory" in err


def test_the_memory_check_is_a_lower_bound_of_what_a_key_takes():
    from sglang_fp4_indexer.format import INDEX_HEAD_DIM
    from sglang_fp4_indexer.workload import MIN_BYTES_PER_KEY, check_memory

    # bf16 key, SGLang's FP8 cell (e4m3 + fp32 scale), the MXFP4 cell, an fp32 logit for exact, FP8 and FP4.
    assert MIN_BYTES_PER_KEY == INDEX_HEAD_DIM * 2 + (INDEX_HEAD_DIM + 4) + (INDEX_HEAD_DIM // 2 + 4) + 3 * 4
    check_memory(1000, "--context", available=1000 * MIN_BYTES_PER_KEY)  # exactly fits: no error
    with pytest.raises(ValueError, match="--context: 1,001 keys need at least"):
        check_memory(1001, "--context", available=1000 * MIN_BYTES_PER_KEY)


def test_an_option_before_the_command_names_the_commands(capsys):
    err = _usage_error(capsys, ["--bogus"])
    assert "unrecognized option --bogus: the command comes first, one of demo, check, bench" in err


@pytest.mark.parametrize("argv", [["ab", "/tmp", "--out", "/tmp/ab-never-made", "--bogus"], ["check", "m", "--bogus"],
                                  ["bench", "--bogus", "x"]])
def test_an_unknown_option_is_named_under_its_command(capsys, argv):
    """argparse reports a subcommand's unknown option from the top-level parser; the line names the command."""
    err = _usage_error(capsys, argv)
    unknown = " ".join(argv[argv.index("--bogus"):])
    assert err.strip() == f"sglang-fp4-indexer {argv[0]}: error: unrecognized arguments: {unknown} (--help lists the options)"


@pytest.mark.parametrize("cases, detail", [
    ("4096:0", "'4096:0': expected each top-k >= 1 and below the context"),
    ("4096:4096", "'4096:4096': expected each top-k >= 1 and below the context"),
    ("99999999:2048", "'99999999:2048': expected a context from 1024 to 32768"),
    ("4096:x", "expected CONTEXT:K/K/..., comma-separated, got '4096:x'"),
])
def test_model_accuracy_cases_are_refused_while_parsing(capsys, cases, detail):
    err = _usage_error(capsys, ["model-accuracy", "--cases", cases])
    assert f"argument --cases: {detail}" in err and "invalid" not in err


@pytest.mark.parametrize("content", ["{}", '{"format": "sglang-fp4-indexer bench 1", "rows": []}', "not json"])
def test_model_accuracy_from_json_refuses_what_is_not_its_result(tmp_path, capsys, content):
    path = tmp_path / "x.json"
    path.write_text(content)
    err = _usage_error(capsys, ["model-accuracy", "--from-json", str(path), "--out-dir", str(tmp_path / "o")])
    assert f"--from-json: {path} is not" in err


def test_model_accuracy_renders_its_own_published_result(tmp_path, capsys):
    code = main(["model-accuracy", "--from-json", str(REPO / "benchmarks/results/model-accuracy-cpu.json"),
                 "--out-dir", str(tmp_path)])
    assert code == 0 and "None disjoint windows" not in capsys.readouterr().out


def test_model_accuracy_estimate_is_the_published_runs_pace(capsys):
    """The per-pass seconds behind the estimate are the published run's own times (its raw file)."""
    import json
    import statistics

    from sglang_fp4_indexer.model_study.study import (LOSS_PASS_SECONDS, PASSKEY_PASS_SECONDS, QUICK_ARGS,
                                                      estimate_seconds)

    doc = json.loads((REPO / "benchmarks/results/model-accuracy-cpu.json").read_text())
    assert doc["environment"]["threads"] == "2"
    per_pass = {int(c): statistics.mean(sum(w["seconds"].values()) / len(w["seconds"]) for w in e["windows"])
                for c, e in doc["loss"].items()}
    assert round(per_pass[4096]) == LOSS_PASS_SECONDS and abs(per_pass[8192] - LOSS_PASS_SECONDS) < 3
    prompts = doc["passkey"]["4096"]["prompts"]
    assert round(statistics.mean(p["seconds"] / len(p["logprob"]) for p in prompts)) == PASSKEY_PASS_SECONDS
    # One 4K window with one top-k: shared prefix, dense, three formats.
    assert estimate_seconds([(4096, (2048,))], 1, [], 2, ()) == 5 * LOSS_PASS_SECONDS
    with pytest.raises(SystemExit):
        main(["model-accuracy", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    quick = estimate_seconds([(4096, (2048,))], 2, [], 2, ())
    assert f"a quick first look, about {round(quick / 60)} min: sglang-fp4-indexer model-accuracy {QUICK_ARGS}" in out


def test_help_says_a_command_runs_on_the_gpu_where_its_device_option_takes_cuda():
    """A subcommand whose --device takes cuda is not described as running on the CPU only."""
    from sglang_fp4_indexer.cli import SUBCOMMANDS, build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for sub in SUBCOMMANDS:
        device = next((a for a in subparsers.choices[sub.name]._actions if "--device" in a.option_strings), None)
        on_gpu = device is not None and (device.choices is None or any("cuda" in c for c in device.choices))
        if on_gpu:
            assert not re.search(r"\(CPU[;)]|CPU[- ]only", sub.help), (sub.name, sub.help)
    model = next(s for s in SUBCOMMANDS if s.name == "model-accuracy")
    assert "--device cuda" in model.help


def test_docs_describes_the_readme_by_what_it_holds():
    """The README entry of ``docs`` names no single GPU: the README's tables are per GPU (H200 and H100)."""
    from sglang_fp4_indexer.guide import DOCS

    readme = (REPO / "README.md").read_text()
    gpus = set(re.findall(r"^### One (H\d+)", readme, re.M))
    assert gpus == {"H200", "H100"}
    what = dict(DOCS)["README.md"]
    assert not any(g in what for g in gpus) and "should you turn it on" in what

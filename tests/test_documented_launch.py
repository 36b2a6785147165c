"""Every documented SGLang launch command parses with SGLang 0.5.23's real parser, as written.

The commands are collected from the fenced code blocks of README.md and docs/*.md and from the comment headers
of configs/*.yaml (``sglang serve ...`` and ``python -m sglang.launch_server ...``, with any ``VAR=value``
prefix). Each runs through what SGLang itself does before a GPU is needed: ``sglang serve``'s dispatch (its
model-path lookup, which stops a launch without ``--model-path`` on the command line) and
``prepare_server_args`` (its ``--config`` merging and parser) after SGLang's own ``load_plugins()``. The
expected FP4 setting is worked out here from the command's parts by the documented order (environment, then
command line, then file), independently of the plugin's code.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from plugin_support import load

pytestmark = pytest.mark.sglang
REPO = Path(__file__).resolve().parents[1]
_LAUNCH = re.compile(r"^((?:[A-Z_]+=\S*\s+)*)(sglang serve|python -m sglang\.launch_server)\s(.*)$")


def _fenced_lines(text: str):
    inside = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside:
            yield line.strip()


def _documented_commands() -> list[tuple[str, str]]:
    """``(where, command line)`` for every launch command the user documents show."""
    found = []
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        for line in _fenced_lines(page.read_text()):
            if _LAUNCH.match(line):
                found.append((page.name, line))
    for config in sorted((REPO / "configs").glob("*.yaml")):
        for line in config.read_text().splitlines():
            body = line.lstrip("#").strip()
            if line.startswith("#") and _LAUNCH.match(body):
                found.append((config.name, body))
    return found


COMMANDS = _documented_commands()


def test_the_documents_show_launch_commands_of_both_entries_with_a_config_file():
    entries = {_LAUNCH.match(c).group(2) for _, c in COMMANDS}
    assert entries == {"sglang serve", "python -m sglang.launch_server"}
    with_config = {w for w, c in COMMANDS if "--config" in c}
    assert {"user-guide.md", "deepseek-v3.2.yaml", "deepseek-v3.2-mtp.yaml", "glm-5.yaml"} <= with_config


def _argv(command: str, capsys) -> tuple[dict, str, list[str]]:
    """``(environment, entry, argv)`` of a command line, with ``$(sglang-fp4-indexer docs --config NAME)`` run."""
    from sglang_fp4_indexer.cli import main

    def substitute(match):
        assert main(shlex.split(match.group(1))) == 0
        return capsys.readouterr().out.strip()

    command = command.split("  #")[0].strip()
    command = re.sub(r"\$\(sglang-fp4-indexer ([^)]*)\)", substitute, command)
    env_part, entry, rest = _LAUNCH.match(command).groups()
    env = dict(part.split("=", 1) for part in shlex.split(env_part))
    return env, entry, shlex.split(rest)


def _expected_fp4(env: dict, argv: list[str]) -> bool:
    """The documented order: the environment when set, else the last flag on the command line, else the file."""
    value = env.get("SGLANG_ENABLE_FP4_INDEXER", "").strip().lower()
    if value:
        return value in ("1", "true", "yes", "on")
    flags = [a for a in argv if a in ("--enable-fp4-indexer", "--no-enable-fp4-indexer")]
    if flags:
        return flags[-1] == "--enable-fp4-indexer"
    if "--config" in argv:
        return bool(yaml.safe_load(Path(argv[argv.index("--config") + 1]).read_text()).get("enable-fp4-indexer"))
    return False


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_documented_command_parses_with_sglangs_own_parser(where, command, monkeypatch, capsys):
    load()
    from sglang.cli.serve import _extract_model_type_override, _normalize_positional_model_path
    from sglang.cli.utils import get_model_path
    from sglang.srt.server_args import prepare_server_args

    from sglang_fp4_indexer.sglang_plugin.facts import requested

    monkeypatch.chdir(REPO)
    for name in ("SGLANG_ENABLE_FP4_INDEXER", "SGLANG_FP4_INDEXER_DCP_SHARD", "SGLANG_DISABLE_DSA_INDEXER_FUSION"):
        monkeypatch.delenv(name, raising=False)
    env, entry, argv = _argv(command, capsys)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if entry == "sglang serve":  # what sglang.cli.serve.serve does before it hands argv to prepare_server_args
        _, argv = _extract_model_type_override(argv)
        argv, _ = _normalize_positional_model_path(argv)
        cli_model = get_model_path(argv)  # raises "--model-path is required" as `sglang serve` does
    record = prepare_server_args(list(argv))
    file = yaml.safe_load(Path(argv[argv.index("--config") + 1]).read_text()) if "--config" in argv else {}
    expected_model = cli_model if entry == "sglang serve" else (
        argv[argv.index("--model-path") + 1] if "--model-path" in argv else file["model-path"])
    assert record.model_path == expected_model
    for key, value in file.items():
        if key not in ("enable-fp4-indexer", "model-path") and f"--{key}" not in argv:
            assert getattr(record, key.replace("-", "_")) == value, key
    assert requested(record) is _expected_fp4(env, argv)


def test_sglang_serve_without_model_path_on_the_command_line_fails_as_the_guide_says():
    """The oracle for the guide's note: SGLang's own dispatch refuses a config-only ``sglang serve``."""
    from sglang.cli.utils import get_model_path

    with pytest.raises(Exception, match="--model-path is required"):
        get_model_path(["--config", str(REPO / "configs" / "deepseek-v3.2.yaml")])


@pytest.mark.parametrize("env, extra, expected", [
    ({}, [], True),
    ({}, ["--no-enable-fp4-indexer"], False),
    ({}, ["--no-enable-fp4-indexer", "--enable-fp4-indexer"], True),
    ({"SGLANG_ENABLE_FP4_INDEXER": "0"}, [], False),
    ({"SGLANG_ENABLE_FP4_INDEXER": "0"}, ["--enable-fp4-indexer"], False),
    ({"SGLANG_ENABLE_FP4_INDEXER": "1"}, ["--no-enable-fp4-indexer"], True),
    ({"SGLANG_ENABLE_FP4_INDEXER": ""}, ["--no-enable-fp4-indexer"], False),
], ids=["file", "no-flag", "last-flag", "env-off", "env-off-over-flag", "env-on-over-no-flag", "empty-env"])
def test_environment_then_command_line_then_file(env, extra, expected, monkeypatch, capsys):
    load()
    from sglang.srt.server_args import prepare_server_args

    from sglang_fp4_indexer.sglang_plugin.facts import dcp_shard_requested, requested

    for name in ("SGLANG_ENABLE_FP4_INDEXER", "SGLANG_FP4_INDEXER_DCP_SHARD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = REPO / "configs" / "deepseek-v3.2.yaml"
    record = prepare_server_args(["--config", str(config), *extra])
    assert requested(record) is expected and expected is _expected_fp4(env, ["--config", str(config), *extra])
    warned = "SGLANG_ENABLE_FP4_INDEXER='0' wins over --enable-fp4-indexer" in capsys.readouterr().err
    assert warned is (env.get("SGLANG_ENABLE_FP4_INDEXER") == "0")  # the file's true counts as a flag given
    assert dcp_shard_requested(record) is False


def test_dcp_shard_has_the_same_order(monkeypatch, tmp_path):
    load()
    from sglang.srt.server_args import prepare_server_args

    from sglang_fp4_indexer.sglang_plugin.facts import dcp_shard_requested

    monkeypatch.delenv("SGLANG_FP4_INDEXER_DCP_SHARD", raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model-path: dummy\nfp4-indexer-dcp-shard: true\n")
    assert dcp_shard_requested(prepare_server_args(["--config", str(cfg)])) is True
    assert dcp_shard_requested(prepare_server_args(["--config", str(cfg), "--no-fp4-indexer-dcp-shard"])) is False
    monkeypatch.setenv("SGLANG_FP4_INDEXER_DCP_SHARD", "off")
    assert dcp_shard_requested(prepare_server_args(["--config", str(cfg)])) is False


def test_a_config_given_with_equals_is_ignored_by_sglang(tmp_path):
    """Why ``check`` refuses ``--config=FILE``: SGLang merges only ``--config FILE`` (the oracle is SGLang itself)."""
    load()
    from sglang.srt.server_args import prepare_server_args

    cfg = tmp_path / "c.yaml"
    cfg.write_text("model-path: dummy\ntp-size: 4\n")
    assert prepare_server_args(["--config", str(cfg)]).tp_size == 4
    assert prepare_server_args([f"--config={cfg}", "--model-path", "dummy"]).tp_size == 1


def test_the_uninstall_step_removes_what_sglang_alone_refuses(tmp_path):
    """SGLang's own parser, without the plugin's flags (a fresh process that loads no plugin), stops at
    --enable-fp4-indexer given on the command line or as a --config file's key; so the uninstall step says to remove
    both first, with the message a user would see."""
    import os
    import subprocess
    import sys

    config = tmp_path / "c.yaml"
    config.write_text("enable-fp4-indexer: true\n")
    probe = (
        "import argparse, sys\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger\n"
        "parser = argparse.ArgumentParser(prog='sglang serve')\n"
        "ServerArgs.add_cli_args(parser)\n"
        "argv = sys.argv[1:]\n"
        "if argv[0] == '--config':\n"
        "    argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)\n"
        "parser.parse_args(argv)\n")
    for argv in (["--model-path", "m", "--enable-fp4-indexer"], ["--config", str(config), "--model-path", "m"]):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=300,
                              env={k: v for k, v in os.environ.items() if k != "SGLANG_PLUGINS"})
        assert done.returncode == 2 and "unrecognized arguments: --enable-fp4-indexer" in done.stderr, done.stderr
    guide = " ".join((REPO / "docs" / "user-guide.md").read_text().split())
    step = guide[guide.index("**Uninstall:**"):]
    step = step[:step.index("pip uninstall sglang-fp4-indexer")]
    assert ("first remove `--enable-fp4-indexer`" in step and "the `enable-fp4-indexer:` line from any `--config` file"
            in step and "`unrecognized arguments: --enable-fp4-indexer`" in step)
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "before uninstalling, remove `--enable-fp4-indexer` and any `enable-fp4-indexer:` line" in readme

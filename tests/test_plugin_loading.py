"""Loading through SGLang's own machinery: entry point, SGLANG_PLUGINS, hook
targets, the flag on every entry (CLI, --config YAML, help, Engine kwarg), and
the flag reaching a fresh process in a pickled ServerArgs."""

from __future__ import annotations

import inspect
import json
import os
import pickle
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from plugin_support import ENTRY, load

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))

_CHILD = r"""
import json, os, pickle, sys
out = {}
path = sys.argv[1]
if path != "-":
    # Read the record before load_plugins(), as run_scheduler_process gets it.
    with open(path, "rb") as f:
        record = pickle.load(f)
    from sglang_fp4_indexer.sglang_plugin.facts import requested
    out["requested"] = requested(record)
    out["attr"] = getattr(record, "_enable_fp4_indexer", None)
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()
out["patched"] = sorted(t for t, hooks in HookRegistry._hooks.items()
                        if any(src and src.plugin_name == "fp4_indexer" for _, _, src in hooks) and t in HookRegistry._patched)
import argparse
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out["flag"] = "--enable-fp4-indexer" in parser._option_string_actions
print("RESULT" + json.dumps(out))
"""


def _child(env_plugins: str, record_path: str = "-") -> dict:
    env = {**os.environ, "SGLANG_PLUGINS": env_plugins}
    env.pop("SGLANG_ENABLE_FP4_INDEXER", None)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, record_path], capture_output=True, text=True, env=env, timeout=600
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT"):])


def _targets():
    from sglang_fp4_indexer.sglang_plugin import hooks

    return [h.target for h in hooks()]


def test_entry_point_loaded_and_pickled_flag_in_fresh_process(tmp_path):
    load()
    from sglang.srt.server_args import prepare_server_args

    record = prepare_server_args(["--model-path", "dummy", "--enable-fp4-indexer"])
    path = tmp_path / "server_args.pkl"
    path.write_bytes(pickle.dumps(record))
    out = _child(ENTRY, str(path))
    assert out["requested"] is True and out["attr"] is True
    assert out["patched"] == sorted(_targets())
    assert out["flag"] is True


def test_sglang_plugins_whitelist_excludes_us():
    out = _child("some_other_plugin")
    assert out["patched"] == [] and out["flag"] is False


def test_every_hook_target_resolves_and_is_ours():
    """Each target is wrapped by our hook, SGLang 0.5.23's parameters are those the plugin was written for,
    the hook takes SGLang's call as it comes, and its FP4 path binds exactly SGLang's parameters by name."""
    load()
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_fp4_indexer.sglang_plugin import hooks
    from sglang_fp4_indexer.sglang_plugin.seams import signature_text, target_problems

    assert target_problems() == {}
    for hook in hooks():
        assert hook.target in HookRegistry._patched, f"hook target not applied: {hook.target}"
        obj_path, attr = hook.target.rsplit(".", 1)
        owner = pkgutil.resolve_name(obj_path)
        raw = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        chain, original = [], fn
        while hasattr(original, "__wrapped__"):
            chain.append(original)
            original = original.__wrapped__
        assert chain, f"{hook.target} is not wrapped"
        assert signature_text(original) == hook.signature, hook.target
        first = "original" if hook.kind == "AROUND" else "result"
        assert signature_text(hook.hook) == f"({first}, *args, **kwargs)", hook.target
        fp4_path = getattr(hook.hook, "fp4_path", None)
        if fp4_path is not None:  # the CLI hooks have none: they find the parser / namespace among the arguments
            sig = inspect.signature(fp4_path)
            assert str(sig.replace(parameters=list(sig.parameters.values())[1:])) == hook.signature, hook.target


def test_prepare_server_args_flag_on_off_and_help(capsys):
    load()
    from sglang.srt.server_args import prepare_server_args

    from sglang_fp4_indexer.sglang_plugin.facts import requested

    on = prepare_server_args(["--model-path", "dummy", "--enable-fp4-indexer"])
    off = prepare_server_args(["--model-path", "dummy"])
    assert on._enable_fp4_indexer is True and requested(on)
    assert off._enable_fp4_indexer is False and not requested(off)
    with pytest.raises(SystemExit):
        prepare_server_args(["--help"])
    help_text = capsys.readouterr().out
    assert "--enable-fp4-indexer" in help_text and "MXFP4" in help_text


def test_environment_variable_asks_too(monkeypatch):
    load()
    from sglang.srt.server_args import prepare_server_args

    from sglang_fp4_indexer.sglang_plugin.facts import requested

    off = prepare_server_args(["--model-path", "dummy"])
    monkeypatch.setenv("SGLANG_ENABLE_FP4_INDEXER", "1")
    assert requested(off)
    monkeypatch.setenv("SGLANG_ENABLE_FP4_INDEXER", "0")
    assert not requested(off)
    for value in ("TRUE", " on ", "yes"):
        monkeypatch.setenv("SGLANG_ENABLE_FP4_INDEXER", value)
        assert requested(off)
    for value in ("", "off", "No", "false"):
        monkeypatch.setenv("SGLANG_ENABLE_FP4_INDEXER", value)
        assert not requested(off)


@pytest.mark.parametrize("var", ["SGLANG_ENABLE_FP4_INDEXER", "SGLANG_FP4_INDEXER_DCP_SHARD"])
def test_a_typo_in_the_environment_variable_stops_the_launch(monkeypatch, capsys, var):
    load()
    from sglang.srt.server_args import prepare_server_args

    from sglang_fp4_indexer.sglang_plugin.facts import dcp_shard_requested, requested

    monkeypatch.setenv(var, "maybe")
    # SGLang's own parser runs the plugin's from_cli_args hook: the launch stops there as on a bad flag (exit 2),
    # with one line naming the variable.
    with pytest.raises(SystemExit) as stop:
        prepare_server_args(["--model-path", "dummy"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (f"sglang-fp4-indexer: error: {var}='maybe': expected 1, true, yes or on to "
                                       "enable, or 0, false, no, off or empty to disable\n")
    ask = requested if var == "SGLANG_ENABLE_FP4_INDEXER" else dcp_shard_requested
    with pytest.raises(ValueError, match=f"^{var}='maybe'"):
        ask(None)


def _launch_server(env_update: dict, *argv: str) -> subprocess.CompletedProcess:
    """``python -m sglang.launch_server ARGV`` in a fresh process (it stops at argument parsing in these tests)."""
    env = {**os.environ, **env_update}
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", "dummy", *argv],
                          capture_output=True, text=True, env=env, timeout=600)


def test_launch_server_stops_in_one_line_on_a_bad_environment_value():
    proc = _launch_server({"SGLANG_PLUGINS": ENTRY, "SGLANG_ENABLE_FP4_INDEXER": "maybe"})
    errors = [line for line in proc.stderr.splitlines() if "Warning" not in line and not line.startswith("  ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors[-1].startswith("sglang-fp4-indexer: error: SGLANG_ENABLE_FP4_INDEXER='maybe': expected 1, true")
    assert sum("SGLANG_ENABLE_FP4_INDEXER" in line for line in errors) == 1


def test_a_whitelist_without_the_plugin_rejects_the_flag_in_sglangs_one_line():
    """SGLANG_PLUGINS naming only another plugin: SGLang does not load this one, so its parser does not know the flag
    and says so itself (argparse's usage and error lines, exit 2), as the user guide describes."""
    proc = _launch_server({"SGLANG_PLUGINS": "some_other_plugin", "SGLANG_ENABLE_FP4_INDEXER": "1"},
                          "--enable-fp4-indexer")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == "sglang serve: error: unrecognized arguments: --enable-fp4-indexer"


@pytest.mark.parametrize("value", [True, False])
def test_config_yaml(tmp_path, value):
    load()
    from sglang.srt.server_args import prepare_server_args

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model-path: dummy\nenable-fp4-indexer: {str(value).lower()}\n")
    record = prepare_server_args(["--config", str(cfg)])
    assert record._enable_fp4_indexer is value
    # The command line still wins over the file's false.
    record = prepare_server_args(["--config", str(cfg), "--enable-fp4-indexer"])
    assert record._enable_fp4_indexer is True


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_parse_with_sglang(path):
    load()
    from sglang.srt.server_args import prepare_server_args

    text = path.read_text()
    assert text.startswith("#"), "each config starts with a comment header"
    record = prepare_server_args(["--config", str(path)])
    assert record._enable_fp4_indexer is True
    for key, value in yaml.safe_load(text).items():
        if key == "enable-fp4-indexer":
            continue
        assert getattr(record, key.replace("-", "_")) == value, key
    assert record.page_size == 64


def test_configs_cover_the_dsa_models():
    names = {p.name for p in CONFIGS}
    assert {"deepseek-v3.2.yaml", "glm-5.yaml"} <= names


def test_engine_keyword(monkeypatch):
    load()
    from sglang.srt.entrypoints import engine as engine_module
    from sglang.srt.server_args import ServerArgs

    from sglang_fp4_indexer.sglang_plugin.server_args import install_engine_kwarg

    Engine = engine_module.Engine
    monkeypatch.setattr(Engine, "server_args_class", ServerArgs)  # restored after the test
    assert install_engine_kwarg(Engine) and install_engine_kwarg(Engine)  # idempotent
    on = Engine.server_args_class(model_path="dummy", enable_fp4_indexer=True)
    off = Engine.server_args_class(model_path="dummy")
    assert isinstance(on, ServerArgs) and on._enable_fp4_indexer is True
    assert not hasattr(off, "_enable_fp4_indexer")
    with pytest.raises(TypeError):
        Engine.server_args_class(model_path="dummy", no_such_field=1)
    # Engine.__init__ loads plugins before it builds the record through server_args_class.
    src = inspect.getsource(Engine.__init__)
    assert src.index("load_plugins()") < src.index("self.server_args_class(**kwargs)")
    # register() installs it when the engine module is loaded.
    monkeypatch.setattr(Engine, "server_args_class", ServerArgs)
    assert install_engine_kwarg() is True
    assert getattr(Engine.__dict__["server_args_class"].__func__, "_fp4_base") is ServerArgs


def test_serve_and_launch_server_load_plugins_before_parsing():
    """``sglang serve`` and ``python -m sglang.launch_server`` parse with prepare_server_args after load_plugins()."""
    import sglang.launch_server as launch_server
    from sglang.cli import serve

    src = inspect.getsource(launch_server)
    main = src[src.index('if __name__ == "__main__":'):]
    assert main.index("load_plugins()") < main.index("prepare_server_args(sys.argv[1:])")
    serve_src = inspect.getsource(serve.serve)
    assert serve_src.index("load_plugins()") < serve_src.index("registered.backend.run(request)")
    assert "prepare_server_args(list(request.argv))" in inspect.getsource(serve._run_llm)

"""The install route the README gives: a wheel built from the checkout, installed next to SGLang 0.5.23.

The wheel is built from a copy of the checkout (``pip wheel --no-deps``, as
``make wheel`` does) and installed with ``pip install --no-index WHEEL[sglang]``
into a new virtual environment that sees this test environment's packages
(SGLang, torch, ...) but not this checkout or its editable install: a
``.pth`` file points at a folder of links to every entry of this
environment's site-packages except ``sglang_fp4_indexer`` and its metadata.
``--no-index`` means pip installs nothing but the wheel and must find every
requirement (``sglang>=0.5.23,<0.6``, torch, ...) satisfied by what is installed.
Then, in that environment and outside the checkout, SGLang's own
``load_plugins()`` must find the entry point of the installed wheel and apply
every hook, SGLang's parser must take ``--enable-fp4-indexer``, and the
console script must run ``--version`` and ``check --context`` with the
measured tables read from the wheel, ``check deepseek-v3.2`` from the wheel's
packaged config, and ``docs`` / ``--help`` must point at the user documents
the wheel carries (byte-equal to the checkout's). About two minutes (SGLang's
import is most of it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from plugin_support import DSV32

pytestmark = [pytest.mark.slow, pytest.mark.sglang]
REPO = Path(__file__).resolve().parents[1]

_PROBE = r"""
import json, os, sys
os.environ["SGLANG_PLUGINS"] = "fp4_indexer"
import importlib.metadata as md
import sglang_fp4_indexer
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
from sglang_fp4_indexer.sglang_plugin import missing_hooks
from sglang_fp4_indexer.sglang_plugin.facts import requested
eps = [(e.name, e.value, e.dist.name, str(e.dist.locate_file(""))) for e in md.entry_points(group="sglang.srt.plugins")]
record = prepare_server_args(["--model-path", "dummy", "--enable-fp4-indexer"])
print(json.dumps({"file": sglang_fp4_indexer.__file__, "entry_points": eps, "missing": missing_hooks(),
                  "requested": requested(record)}))
"""


def _copy_checkout(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _shadow_site_packages(dest: Path) -> None:
    """Links to every entry of this environment's site-packages but this package's own (and .pth files)."""
    dest.mkdir()
    dirs = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    for folder in dirs:
        for entry in Path(folder).iterdir():
            if "sglang_fp4_indexer" in entry.name or entry.suffix == ".pth" or (dest / entry.name).exists():
                continue
            (dest / entry.name).symlink_to(entry)


def test_wheel_installs_next_to_sglang_and_sglang_loads_it(tmp_path):
    src, dist, env_dir = tmp_path / "src", tmp_path / "dist", tmp_path / "env"
    _copy_checkout(src)
    run = lambda *cmd, **kw: subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)  # noqa: E731
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), ".",
                cwd=src)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("sglang_fp4_indexer-*-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    user_docs = ["README.md", "CHANGELOG.md", *(p.name for p in sorted((REPO / "docs").glob("*.md")))]
    missing = [n for n in user_docs if f"sglang_fp4_indexer/docs/{n}" not in names]
    assert missing == [], missing  # the user docs travel with the wheel
    assert {f"sglang_fp4_indexer/data/models/{m}/config.json" for m in ("deepseek-v3.2", "glm-5", "glm-5.2")} <= names
    configs = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
    assert configs and {f"sglang_fp4_indexer/configs/{n}" for n in configs} <= names  # the --config files too

    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(run(str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    _shadow_site_packages(tmp_path / "shared")
    (site / "_test_shared_packages.pth").write_text(f"{tmp_path / 'shared'}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET", "VIRTUAL_ENV")}
    installed = run(sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index", f"{wheel}[sglang]",
                    env=env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "Successfully installed sglang-fp4-indexer" in installed.stdout

    probe = run(str(py), "-c", _PROBE, cwd=tmp_path, env=env)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert Path(found["file"]).is_relative_to(site), found["file"]  # the wheel's copy, not the checkout
    ours = [ep for ep in found["entry_points"] if ep[2] == "sglang-fp4-indexer" or ep[0] == "fp4_indexer"]
    assert ours == [["fp4_indexer", "sglang_fp4_indexer.sglang_plugin:register", "sglang-fp4-indexer", str(site)]]
    assert found["missing"] == [] and found["requested"] is True

    script = env_dir / "bin" / "sglang-fp4-indexer"
    version = run(str(script), "--version", cwd=tmp_path, env=env)
    from sglang_fp4_indexer import __version__

    assert version.returncode == 0 and version.stdout.strip().startswith(f"sglang-fp4-indexer {__version__}")
    (tmp_path / "v32.json").write_text(json.dumps(DSV32))
    check = run(str(script), "check", "v32.json", "--context", "131072", "--batch", "8", "--memory-gib", "100",
                cwd=tmp_path, env=env)
    out = " ".join(check.stdout.split())
    assert check.returncode == 0 and "Traceback" not in check.stderr, check.stdout + check.stderr
    tables = json.loads((REPO / "sglang_fp4_indexer" / "data" / "h200_tables.json").read_text())
    measured_on = f"measured on {tables['timing']['gpu']} ({tables['timing']['stack']}) at this shape"
    assert "ENABLED" in out and measured_on in out and "verdict: FP4 fits 11 requests of 128K where FP8 fits 10 (+10 %): turn FP4 on where KV memory limits you" in out

    # The packaged config, without a download; the installed docs, named by --help and listed by docs.
    packaged = run(str(script), "check", "deepseek-v3.2", "--context", "131072", "--memory-gib", "100",
                   cwd=tmp_path, env=env)
    out = " ".join(packaged.stdout.split())
    assert packaged.returncode == 0 and "the config fields of deepseek-ai/DeepSeek-V3.2 packaged" in out, out
    assert str(site) in "".join(packaged.stdout.split()) and "verdict: FP4 fits 11 requests of 128K where FP8 fits 10 (+10 %): turn FP4 on where KV memory limits you" in out
    folder = run(str(script), "docs", "--path", cwd=tmp_path, env=env)
    installed = Path(folder.stdout.strip())
    assert folder.returncode == 0 and installed == site / "sglang_fp4_indexer" / "docs", folder.stdout
    for name in user_docs:
        source = REPO / name if name in ("README.md", "CHANGELOG.md") else REPO / "docs" / name
        assert (installed / name).read_bytes() == source.read_bytes(), name
    helped = run(str(script), "--help", cwd=tmp_path, env=env)
    assert f"Theuserdocumentationisin{installed}(" in "".join(helped.stdout.split())  # argparse wraps at hyphens
    listed = run(str(script), "docs", cwd=tmp_path, env=env)
    assert listed.returncode == 0 and "no public issue tracker" in listed.stdout and "../" not in listed.stdout
    assert all(name in listed.stdout for name in configs)
    for name in configs:  # the path the user guide's launch commands take, byte-equal to the checkout's file
        where = run(str(script), "docs", "--config", name[:-5], cwd=tmp_path, env=env)
        assert where.returncode == 0 and Path(where.stdout.strip()) == site / "sglang_fp4_indexer" / "configs" / name
        assert Path(where.stdout.strip()).read_bytes() == (REPO / "configs" / name).read_bytes()

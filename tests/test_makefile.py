"""``make demo`` with ``VENV=`` an environment that already has SGLang: used as it is, not built again."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _logger(path: Path, log: Path) -> None:
    """An executable that appends its arguments to ``log`` and succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {log}\n')
    path.chmod(0o755)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_demo_uses_an_existing_venv_as_it_is(tmp_path):
    log = tmp_path / "calls.log"
    venv = tmp_path / "their-venv"
    _logger(venv / "bin" / "python", log)  # their environment's interpreter and the package's console script
    _logger(venv / "bin" / "sglang-fp4-indexer", log)
    _logger(tmp_path / "system-python", log)  # what would build a new environment
    done = subprocess.run(["make", "-C", str(REPO), "demo", f"VENV={venv}", f"PYTHON={tmp_path / 'system-python'}",
                           "ARGS=--workload gaussian"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    assert calls == ["python -m pip install --progress-bar on -e .[sglang,test,demo,plot,model]",
                     "sglang-fp4-indexer demo --workload gaussian"], calls
    assert f"Using the existing {venv}/" in done.stdout and (venv / ".installed").is_file()
    # Without one there, the environment is created first (the fresh-clone route).
    fresh = tmp_path / "fresh"
    log.write_text("")
    subprocess.run(["make", "-C", str(REPO), "venv", f"VENV={fresh}", f"PYTHON={tmp_path / 'system-python'}"],
                   capture_output=True, text=True, timeout=60)
    assert log.read_text().splitlines()[0] == f"system-python -m venv {fresh}"


def test_the_readme_documents_venv_for_make_demo():
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "`make demo VENV=/path/to/that/venv` installs this package and its extras there" in readme
    assert "VENV   ?= .venv" in (REPO / "Makefile").read_text()

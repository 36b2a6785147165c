"""The build requirements pyproject.toml declares are enough to build it (``make test`` / ``make wheel`` build it
in an isolated environment holding only those)."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
from packaging.requirements import Requirement  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def test_setuptools_floor_reads_an_spdx_license_string():
    """``license = "Apache-2.0"`` (an SPDX expression, PEP 639) needs setuptools 77; 76 refuses it
    ("`project.license` must be valid exactly by one definition"), so the declared floor must exclude it."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    (setuptools,) = [Requirement(r) for r in meta["build-system"]["requires"] if Requirement(r).name == "setuptools"]
    assert not setuptools.specifier.contains("76.1.0") and setuptools.specifier.contains("77.0.1")
    # This environment's setuptools builds it too (tests/test_wheel_install.py builds without build isolation).
    from importlib.metadata import version

    assert setuptools.specifier.contains(version("setuptools"))

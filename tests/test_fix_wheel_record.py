"""scripts/fix_wheel_record.py: a slimmed wheel's RECORD lists only the files it still holds."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "fix_wheel_record.py"
_spec = importlib.util.spec_from_file_location("fix_wheel_record", _PATH)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def test_rows_of_removed_files_are_dropped(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    info = tmp_path / "pkg-1.0.dist-info"
    info.mkdir()
    rows = [["pkg/a.py", "sha256=aa", "6"], ["pkg/gone.so", "sha256=bb", "9"], ["pkg-1.0.dist-info/RECORD", "", ""]]
    with open(info / "RECORD", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    assert tool.fix_record(str(tmp_path)) == 2
    with open(info / "RECORD", newline="") as f:
        assert list(csv.reader(f)) == [rows[0], rows[2]]
    with pytest.raises(FileNotFoundError, match="not an unpacked wheel"):
        tool.fix_record(str(tmp_path / "pkg"))

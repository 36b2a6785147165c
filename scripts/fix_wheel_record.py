"""Drop from an unpacked wheel's ``*.dist-info/RECORD`` the files that are no longer there.

    python3 scripts/fix_wheel_record.py DIR

Used after slimming a wheel (scripts/fetch_sglang_runtime_wheels.sh, scripts/fetch_pd_wheels.sh), so pip installs
the slimmed wheel without listing files it lacks.
"""

from __future__ import annotations

import csv
import glob
import os
import sys


def fix_record(directory: str) -> int:
    """Rewrite the RECORD under ``directory`` with only the rows whose file exists; return the rows kept.

    Raises:
        FileNotFoundError: ``directory`` holds no ``*.dist-info/RECORD``.
    """
    recs = glob.glob(os.path.join(directory, "*.dist-info", "RECORD"))
    if not recs:
        raise FileNotFoundError(f"{directory}: no *.dist-info/RECORD (not an unpacked wheel)")
    with open(recs[0], newline="") as f:
        rows = [r for r in csv.reader(f) if r and os.path.exists(os.path.join(directory, r[0]))]
    with open(recs[0], "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return len(rows)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 scripts/fix_wheel_record.py DIR")
    fix_record(sys.argv[1])

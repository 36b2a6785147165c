"""scripts/gpu_run.sh's memcheck mode on the CPU: the GPU tests under compute-sanitizer's memcheck, its report
file and its error exit code passed, or one line saying why it did not run. compute-sanitizer cannot run here
(it needs a GPU): a small stand-in script records the command line it is given and writes the last line
compute-sanitizer writes to its log file; the run on the GPU machine uses the real one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, sanitizer: str, *args: str) -> tuple[str, Path]:
    """gpu_run.sh memcheck ARGS in a copy of the scripts folder (no .peers beside it: no peers to build)."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "gpu_run.sh", root / "scripts" / "gpu_run.sh")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable, COMPUTE_SANITIZER=sanitizer, TEST_LIMIT="60")
    done = subprocess.run(["bash", str(root / "scripts" / "gpu_run.sh"), "memcheck", *args], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout, out


def test_memcheck_mode_runs_the_gpu_tests_under_the_sanitizer(tmp_path):
    record = tmp_path / "argv.txt"
    stand_in = tmp_path / "compute-sanitizer"
    stand_in.write_text("#!/usr/bin/env bash\n"
                        f"printf '%s\\n' \"$@\" > {record}\n"
                        "log=$(for ((i=1; i<=$#; i++)); do [ \"${!i}\" = --log-file ] && j=$((i+1)) && echo \"${!j}\"; done)\n"
                        "echo '========= ERROR SUMMARY: 0 errors' > \"$log\"\n")
    stand_in.chmod(0o755)
    stdout, out = _run(tmp_path, str(stand_in), "tests/test_sm90_gpu.py", "-k", "target_verify")
    argv = record.read_text().splitlines()
    assert argv[:6] == ["--tool", "memcheck", "--error-exitcode", "9", "--log-file", str(out / "memcheck.txt")]
    assert argv[6:11] == [sys.executable, "-m", "pytest", "-m", "gpu"]
    assert argv[-3:] == ["tests/test_sm90_gpu.py", "-k", "target_verify"]
    line = next(ln for ln in stdout.splitlines() if ln.startswith("== pytest -m gpu: "))
    assert line.startswith("== pytest -m gpu: rc=0: ") and line.endswith("; memcheck: ERROR SUMMARY: 0 errors"), line


def test_memcheck_mode_without_a_sanitizer_says_so(tmp_path):
    stdout, _ = _run(tmp_path, str(tmp_path / "none" / "compute-sanitizer"))
    assert (f"== pytest -m gpu: not run: no compute-sanitizer (COMPUTE_SANITIZER, PATH, /usr/local/cuda*/bin) at "
            f"{tmp_path / 'none' / 'compute-sanitizer'}") in stdout.splitlines()

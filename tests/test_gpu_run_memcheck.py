"""scripts/gpu_run.sh's memcheck mode on the CPU: the GPU tests run under compute-sanitizer's memcheck with one
report per process and its error exit code, the errors added up in the summary, and a zero exit only when the
tests passed with no error; one line saying why where it cannot run. compute-sanitizer cannot run here (it needs
a GPU): a small stand-in script records its command line, runs the command it wraps, and writes the ERROR
SUMMARY line compute-sanitizer writes, with the error count the test asks for; the GPU machine uses the real one.
The wrapped tests are one gpu-marked pytest test in the scratch checkout (the wiring is under test, not them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_STAND_IN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > {record}
log="$8"; log="${{log//%p/$$}}"
shift 8
"$@"; rc=$?
echo "========= ERROR SUMMARY: {errors} errors" > "$log"
[ {errors} -gt 0 ] && exit 9
exit $rc
"""


def _run(tmp_path: Path, sanitizer: str, *args: str) -> tuple[int, str, Path]:
    """gpu_run.sh memcheck ARGS in a scratch checkout (the script, one gpu-marked test; no .peers: no peers)."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    (root / "tests").mkdir()
    shutil.copy(REPO / "scripts" / "gpu_run.sh", root / "scripts" / "gpu_run.sh")
    (root / "tests" / "test_wrapped.py").write_text(
        "import os\nimport pytest\n\n\n@pytest.mark.gpu\ndef test_wrapped():\n"
        "    assert os.environ['PYTORCH_NO_CUDA_MEMORY_CACHING'] == '1'\n")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable, COMPUTE_SANITIZER=sanitizer, TEST_LIMIT="60")
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    done = subprocess.run(["bash", str(root / "scripts" / "gpu_run.sh"), "memcheck", *args], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, out


def _stand_in(tmp_path: Path, errors: int) -> tuple[Path, Path]:
    record, path = tmp_path / "argv.txt", tmp_path / "compute-sanitizer"
    path.write_text(_STAND_IN.format(record=record, errors=errors))
    path.chmod(0o755)
    return path, record


def _summary(stdout: str) -> str:
    return next(ln for ln in stdout.splitlines() if ln.startswith("== pytest -m gpu: "))


def test_memcheck_mode_runs_the_gpu_tests_under_the_sanitizer(tmp_path):
    sanitizer, record = _stand_in(tmp_path, 0)
    rc, stdout, out = _run(tmp_path, str(sanitizer), "tests/test_wrapped.py", "-k", "wrapped")
    argv = record.read_text().splitlines()
    assert argv[:8] == ["--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode", "9", "--log-file",
                        str(out / "memcheck.%p.txt")]
    assert argv[8:13] == [sys.executable, "-m", "pytest", "-m", "gpu"]
    assert argv[-3:] == ["tests/test_wrapped.py", "-k", "wrapped"]
    line = _summary(stdout)
    assert line.startswith("== pytest -m gpu: rc=0: 1 passed") and line.endswith(
        "; memcheck: ERROR SUMMARY: 0 errors in 1 report(s)"), line
    assert rc == 0


def test_memcheck_errors_fail_the_call(tmp_path):
    sanitizer, _ = _stand_in(tmp_path, 3)
    rc, stdout, _ = _run(tmp_path, str(sanitizer), "tests/test_wrapped.py")
    assert _summary(stdout).endswith("; memcheck: ERROR SUMMARY: 3 errors in 1 report(s)") and rc != 0


def test_memcheck_mode_without_a_sanitizer_says_so_and_fails(tmp_path):
    missing = tmp_path / "none" / "compute-sanitizer"
    rc, stdout, _ = _run(tmp_path, str(missing))
    assert _summary(stdout) == ("== pytest -m gpu: not run: no compute-sanitizer (COMPUTE_SANITIZER, PATH, "
                                f"/usr/local/cuda*/bin) at {missing}") and rc != 0

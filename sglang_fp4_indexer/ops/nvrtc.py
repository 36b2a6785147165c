"""Build CUDA C++ with NVRTC at first use, load it into torch's context, launch it on torch's stream.

The one build path of every CUDA kernel of the package (``ops/sm90.py``: the
Hopper scorer; ``ops/schedule.py``: the CTA planner; ``ops/quantize.py``: the
store kernel). A kernel is described by a ``KernelSpec`` (its source, the
``#define`` lines prepended to it, its entry point, its dynamic shared memory)
and built for one device arch; a build is keyed by ``BuildKey`` (source hash,
defines, NVRTC options, arch), compiled once, and a build or load that fails is
remembered per device, warned about once, and reported to the caller, which
falls back to its Triton kernel (``load`` returns ``None``; ``failure`` says why).

NVRTC and the driver API come from ``cuda-bindings`` (an SGLang dependency;
``pip install 'sglang-fp4-indexer[cuda]'`` otherwise). Launches go to torch's
current stream, so CUDA graphs capture them like any torch kernel. Nothing here
imports SGLang.

Inspection, by environment variable (read at each build):

* ``SGLANG_FP4_INDEXER_PTXAS_VERBOSE=1``: build with ``--ptxas-options=-v`` and
  print each build's ptxas log (registers, spills, shared memory) to stderr.
* ``SGLANG_FP4_INDEXER_DUMP_CUBIN=DIR``: write each build's cubin and the exact
  source NVRTC compiled to ``DIR/<name>-<arch>-<key>.cubin`` / ``.cu`` (for
  ``cuobjdump -sass`` / ``nvdisasm``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.util
import os
import re
import struct
import sys
import threading
import warnings
from pathlib import Path
from typing import Mapping

import torch

__all__ = ["ArgBlock", "BuildKey", "KernelSpec", "bindings_missing", "build_key", "compile_cubin", "cuda_arch",
           "current_stream", "failure", "get_function", "launch", "load", "program_text", "ptxas_registers",
           "record_failure", "PTXAS_VERBOSE_ENV", "DUMP_CUBIN_ENV"]

#: Set to 1 to build with ``--ptxas-options=-v`` and print each ptxas log to stderr.
PTXAS_VERBOSE_ENV = "SGLANG_FP4_INDEXER_PTXAS_VERBOSE"
#: Set to a directory to write each build's cubin and compiled source there.
DUMP_CUBIN_ENV = "SGLANG_FP4_INDEXER_DUMP_CUBIN"
#: NVRTC options of every build (besides ``-arch``); ``-lineinfo`` adds line tables only (no code change).
DEFAULT_OPTIONS = ("-std=c++17", "-lineinfo")
_VERBOSE_OPTION = "--ptxas-options=-v"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@functools.lru_cache(maxsize=None)
def bindings_missing() -> str | None:
    """Why NVRTC kernels cannot be built here (``None`` when ``cuda-bindings`` is importable; checked once)."""
    try:
        found = importlib.util.find_spec("cuda.bindings.driver") and importlib.util.find_spec("cuda.bindings.nvrtc")
    except ImportError:
        found = None
    return None if found else "cuda-bindings is not installed (pip install 'sglang-fp4-indexer[cuda]')"


def cuda_arch(device: torch.device | str) -> str:
    """NVRTC target of ``device``: ``sm_XY`` from its compute capability (``sm_90a`` on Hopper, for wgmma)."""
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def _check(result, what: str):
    err = result[0]
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    return result[1] if len(result) == 2 else result[1:]


def _defines_tuple(defines) -> tuple[tuple[str, str], ...]:
    """``defines`` (a mapping or pairs) as ``((name, value text), ...)`` in the given order.

    Raises:
        ValueError: a name that is not a C identifier, or a value with a line break.
    """
    pairs = tuple(defines.items()) if isinstance(defines, Mapping) else tuple(defines)
    out = []
    for name, value in pairs:
        if not isinstance(name, str) or not _IDENT.match(name):
            raise ValueError(f"defines: {name!r} is not a C identifier")
        text = str(int(value)) if isinstance(value, bool) else str(value)
        if "\n" in text:
            raise ValueError(f"defines: the value of {name} holds a line break")
        out.append((name, text))
    return tuple(out)


def program_text(source: str, defines=()) -> str:
    """What NVRTC compiles: one ``#define NAME VALUE`` line per define (in order), then ``source``."""
    return "".join(f"#define {n} {v}\n" for n, v in _defines_tuple(defines)) + source


@dataclasses.dataclass(frozen=True)
class BuildKey:
    """What identifies one NVRTC build: the source's SHA-256, the defines, the NVRTC options and the arch."""

    source_sha256: str
    defines: tuple[tuple[str, str], ...]
    options: tuple[str, ...]
    arch: str


def build_key(source: str, defines=(), arch: str = "sm_90a", options: tuple[str, ...] = DEFAULT_OPTIONS) -> BuildKey:
    """The ``BuildKey`` of compiling ``source`` with ``defines`` and ``options`` for ``arch``.

    Raises:
        ValueError: a bad define (``program_text``), or ``arch`` not of the form ``sm_XY[a]``.
    """
    if not isinstance(arch, str) or not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"arch: expected 'sm_XY' (e.g. 'sm_90a'), got {arch!r}")
    return BuildKey(hashlib.sha256(source.encode()).hexdigest(), _defines_tuple(defines), tuple(options), arch)


def _env_verbose() -> bool:
    return os.environ.get(PTXAS_VERBOSE_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


_LOCK = threading.RLock()
# BuildKey -> (cubin, log), or the RuntimeError the build raised (not retried).
_BUILT: dict[BuildKey, tuple[bytes, str] | RuntimeError] = {}


def compile_cubin(source: str, name: str, arch: str, defines=(), *, verbose: bool | None = None) -> tuple[bytes, str]:
    """Compile ``program_text(source, defines)`` to a cubin for ``arch`` (e.g. ``"sm_90a"``); works without a GPU.

    Built once per ``BuildKey``; a failed build is remembered and raises the same
    error again without recompiling.

    Args:
        source: CUDA C++ text.
        name: its file name (NVRTC's messages, dumps).
        arch: NVRTC target.
        defines: ``#define`` lines prepended, a mapping or ``(name, value)`` pairs.
        verbose: build with ``--ptxas-options=-v`` (its log then reports registers and spills);
            ``None``: as ``SGLANG_FP4_INDEXER_PTXAS_VERBOSE`` says, which also prints the log to stderr.

    Returns:
        ``(cubin, NVRTC/ptxas log)``.

    Raises:
        RuntimeError: ``cuda-bindings`` missing, or the compile failed (its log in the message).
        ValueError: a bad define or arch (``build_key``).
    """
    env_verbose = _env_verbose()
    options = DEFAULT_OPTIONS + ((_VERBOSE_OPTION,) if (env_verbose if verbose is None else verbose) else ())
    key = build_key(source, defines, arch, options)
    with _LOCK:
        done = _BUILT.get(key)
        if done is None:
            try:
                done = _compile(program_text(source, defines), name, key)
            except RuntimeError as e:
                done = e
            _BUILT[key] = done
            if not isinstance(done, RuntimeError):
                if verbose is None and env_verbose:
                    print(f"sglang-fp4-indexer: ptxas log of {name} ({arch}, {dict(key.defines)}):\n{done[1]}",
                          file=sys.stderr)
                _dump(program_text(source, defines), name, key, done[0])
    if isinstance(done, RuntimeError):
        raise done
    return done


def _dump(text: str, name: str, key: BuildKey, cubin: bytes) -> None:
    """Write the cubin and the compiled source where ``SGLANG_FP4_INDEXER_DUMP_CUBIN`` says (nothing when unset)."""
    folder = os.environ.get(DUMP_CUBIN_ENV)
    if not folder:
        return
    tag = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
    stem = Path(folder) / f"{Path(name).stem}-{key.arch}-{tag}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".cubin").write_bytes(cubin)
    stem.with_suffix(".cu").write_text(text)


def _compile(text: str, name: str, key: BuildKey) -> tuple[bytes, str]:
    why = bindings_missing()
    if why:
        raise RuntimeError(why)
    from cuda.bindings import nvrtc

    prog = _check(nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        opts = [f"-arch={key.arch}".encode(), *(o.encode() for o in key.options)]
        err = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        # NVRTC writes into the buffers it is given: a new bytearray each, never a bytes object. (``b" " * 1``,
        # the size of an empty log, is CPython's shared one-byte ``b" "``: writing its NUL there turned every
        # later one-byte encode of a space in the process into a NUL byte, e.g. in the profiler's trace files.)
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        log_text = log.decode(errors="replace").rstrip("\x00 \n")
        if int(err) != 0:
            raise RuntimeError(f"NVRTC could not compile {name} for {key.arch} ({err!r}):\n{log_text}")
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        err = nvrtc.nvrtcGetCUBIN(prog, cubin)[0]
        if int(err) != 0:
            raise RuntimeError(f"nvrtcGetCUBIN failed: {err!r}")
        return bytes(cubin), log_text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def ptxas_registers(log: str) -> tuple[int, int]:
    """``(registers per thread, spill bytes stored)`` from a ptxas ``-v`` log (``compile_cubin(verbose=True)``).

    Raises:
        ValueError: the log has no ptxas ``-v`` report.
    """
    try:
        regs = int(log.split("Used ")[1].split(" registers")[0])
        spills = int(log.split("bytes stack frame, ")[1].split(" bytes spill stores")[0])
    except (IndexError, ValueError):
        raise ValueError("log: no ptxas -v report in it (build with verbose=True)") from None
    return regs, spills


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One CUDA kernel to build and load: ``load(device, spec)``.

    Attributes:
        source: CUDA C++ text (without the defines).
        name: its file name (NVRTC's messages, dumps).
        kernel: the ``extern "C"`` entry point.
        defines: ``(name, value)`` pairs prepended as ``#define`` lines.
        smem: dynamic shared memory per CTA in bytes (above 48 KB the kernel is opted in at load).
        what: how the warning names it, e.g. ``"the CUDA planner"``.
        fallback: what the caller does instead, for the warning, e.g. ``"planning with Triton"``.
    """

    source: str
    name: str
    kernel: str
    defines: tuple = ()
    smem: int = 0
    what: str = "the CUDA kernel"
    fallback: str = "running the Triton kernel"

    def __post_init__(self):
        object.__setattr__(self, "defines", _defines_tuple(self.defines))
        # Hashed on every serving call: once here (the source string is long).
        object.__setattr__(self, "_hash", hash((self.source, self.name, self.kernel, self.defines, self.smem)))

    def __hash__(self) -> int:
        return self._hash


class _Function:
    """A kernel loaded into a device's context: ``launch_packed`` launches it on torch's current stream."""

    def __init__(self, cubin: bytes, kernel: str, smem: int):
        from cuda.bindings import driver

        self.driver = driver
        self.module = _check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.function = _check(driver.cuModuleGetFunction(self.module, kernel.encode()), "cuModuleGetFunction")
        if smem > 48 * 1024:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            err = driver.cuFuncSetAttribute(self.function, attr, smem)[0]
            if int(err) != 0:
                raise RuntimeError(f"cuFuncSetAttribute failed: {err!r}")

    def launch_packed(self, index: int, grid: int, block: int, smem: int, params: int) -> None:
        """Launch on torch's current stream of CUDA device ``index``; ``params`` is the address of the
        ``void*`` array ``cuLaunchKernel`` reads (``ArgBlock.params``).

        Raises:
            RuntimeError: the launch failed.
        """
        stream = current_stream(index)
        if torch.cuda.current_device() == index:
            err = self.driver.cuLaunchKernel(self.function, grid, 1, 1, block, 1, 1, smem, stream, params, 0)[0]
        else:
            with torch.cuda.device(index):
                err = self.driver.cuLaunchKernel(self.function, grid, 1, 1, block, 1, 1, smem, stream, params, 0)[0]
        if int(err) != 0:
            raise RuntimeError(f"cuLaunchKernel failed: {err!r}")


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(index: int) -> int:
    """The ``cudaStream_t`` of torch's current stream on CUDA device ``index``, as an int (what a CUDA graph
    being captured on that stream records)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(index)
    return torch.cuda.current_stream(index).cuda_stream


class ArgBlock:
    """A kernel's parameters packed in place: one buffer laid out as the kernel's parameter list and the
    ``void*`` array ``cuLaunchKernel`` reads, both allocated once; ``pack`` writes a call's values.

    ``format`` holds one ``struct`` code per parameter, in the kernel's order, with C alignment: ``P`` a
    pointer, ``i`` an ``int``, ``q`` a ``long long``. One block serves one launcher in one thread at a time
    (the driver copies the values at the launch, so the block is free again when ``launch_packed`` returns).

    Raises:
        ValueError: a code other than ``P``, ``i`` or ``q``.
    """

    _CTYPES = {"P": ctypes.c_void_p, "i": ctypes.c_int, "q": ctypes.c_longlong}

    def __init__(self, format: str):
        if not format or set(format) - set(self._CTYPES):
            raise ValueError(f"format: expected struct codes P, i, q, got {format!r}")
        self.format = format
        self._struct = struct.Struct("@" + format)
        self.buffer = ctypes.create_string_buffer(max(self._struct.size, 8))  # malloc'd: aligned for any field
        base = ctypes.addressof(self.buffer)
        offsets = [struct.calcsize("@" + format[:i] + "0" + code) for i, code in enumerate(format)]
        self._params = (ctypes.c_void_p * len(format))(*[base + off for off in offsets])
        #: Address of the ``void*`` array to pass as ``cuLaunchKernel``'s ``kernelParams``.
        self.params = ctypes.addressof(self._params)

    def pack(self, *values) -> int:
        """Write one call's parameter values (ints, in order); returns ``params``.

        Raises:
            struct.error: a wrong count, or a value that does not fit its field.
        """
        self._struct.pack_into(self.buffer, 0, *values)
        return self.params

    def values(self) -> tuple:
        """The values last packed (for inspection)."""
        return self._struct.unpack_from(self.buffer, 0)

    def as_ctypes(self, values) -> list:
        """``values`` as the ctypes objects ``launch`` takes (one per parameter, of its code's type)."""
        return [self._CTYPES[code](v) for code, v in zip(self.format, values)]


class _Failure(str):
    """Why a kernel cannot run on a device (what ``_KERNELS`` holds instead of the loaded kernel)."""


_LOADED: dict[tuple, _Function] = {}
# (device index, spec) -> the loaded kernel, or the _Failure that says why it cannot run.
_KERNELS: dict[tuple[int, KernelSpec], object] = {}


def get_function(device: torch.device, cubin: bytes, kernel: str, smem: int = 0) -> _Function:
    """The loaded ``kernel`` of ``cubin`` in ``device``'s context (loaded once per device and cubin).

    Raises:
        RuntimeError: the driver refuses the module, the entry point or the shared-memory size.
    """
    key = (device.index, cubin, kernel, smem)
    fn = _LOADED.get(key)
    if fn is None:
        with _LOCK:
            fn = _LOADED.get(key)
            if fn is None:
                with torch.cuda.device(device):
                    torch.cuda.current_stream(device)  # torch's (primary) context is current in this thread
                    fn = _Function(cubin, kernel, smem)
                _LOADED[key] = fn
    return fn


def _index(device: torch.device | str) -> int:
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def load(device: torch.device | str, spec: KernelSpec) -> _Function | None:
    """``spec`` built for ``device``'s arch and loaded there, or ``None`` where it cannot run (then fall back).

    Built and loaded once per device and spec. A build or load that fails is
    remembered (``failure`` returns why) and warned about once; so is a launch
    failure reported by ``record_failure``.
    """
    index = _index(device)
    got = _KERNELS.get((index, spec))
    if got is None:
        try:
            cuda = torch.device("cuda", index)
            cubin, _ = compile_cubin(spec.source, spec.name, cuda_arch(cuda), spec.defines)
            got = _KERNELS.setdefault((index, spec), get_function(cuda, cubin, spec.kernel, spec.smem))
        except (RuntimeError, ValueError) as e:
            record_failure(index, spec, e, stacklevel=4)
            return None
    return None if isinstance(got, _Failure) else got


def failure(device: torch.device | str, spec: KernelSpec) -> str | None:
    """Why ``spec`` cannot run on ``device`` (``None``: not known to fail; ``load`` builds it)."""
    got = _KERNELS.get((_index(device), spec))
    return str(got) if isinstance(got, _Failure) else None


def record_failure(device: torch.device | str | int, spec: KernelSpec, error: Exception, *, stacklevel: int = 3) -> str:
    """Remember that ``spec`` cannot run on ``device`` (its build, load or launch raised ``error``); warn once.

    Returns:
        The reason, ``"<spec.what> could not be built, loaded or launched (<error>)"`` (what ``failure``
        returns from now on; the first one recorded stays).
    """
    index = device if isinstance(device, int) else _index(device)
    with _LOCK:
        got = _KERNELS.get((index, spec))
        if isinstance(got, _Failure):
            return str(got)
        why = f"{spec.what} could not be built, loaded or launched ({error})"
        _KERNELS[(index, spec)] = _Failure(why)
    warnings.warn(f"sglang-fp4-indexer: {why}; {spec.fallback}", stacklevel=stacklevel)
    return why


def launch(fn: _Function, device: torch.device, grid: int, block: int, smem: int, args: list) -> None:
    """Launch ``fn`` on torch's current stream of ``device``; ``args`` are ctypes values in kernel order (the
    experiments' form; the ops pack theirs once per launcher with ``ArgBlock``).

    Raises:
        RuntimeError: the launch failed.
    """
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(v) for v in args])
    fn.launch_packed(_index(device), grid, block, smem, ctypes.addressof(params))

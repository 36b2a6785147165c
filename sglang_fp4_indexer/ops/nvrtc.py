"""Build CUDA C++ with NVRTC at first use, load it into torch's context, launch it on torch's stream.

Used by the CUDA fast paths (``ops/sm90.py``: the Hopper scorer; the CTA
planner in ``ops/schedule.py``). NVRTC and the driver API come from
``cuda-bindings`` (an SGLang dependency; ``pip install 'sglang-fp4-indexer[cuda]'``
otherwise). Launches go to torch's current stream, so CUDA graphs capture
them like any torch kernel. Nothing here imports SGLang.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import threading

import torch

__all__ = ["bindings_missing", "compile_cubin", "cuda_arch", "get_function", "launch", "ptxas_registers"]


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


@functools.lru_cache(maxsize=None)
def compile_cubin(source: str, name: str, arch: str) -> tuple[bytes, str]:
    """Compile ``source`` to a cubin for ``arch`` (e.g. ``"sm_90a"``); works without a GPU.

    Returns:
        ``(cubin, ptxas log)`` (the log reports registers and spills).

    Raises:
        RuntimeError: ``cuda-bindings`` missing, or the compile failed (its log in the message).
    """
    why = bindings_missing()
    if why:
        raise RuntimeError(why)
    from cuda.bindings import nvrtc

    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        opts = [f"-arch={arch}".encode(), b"-std=c++17", b"--ptxas-options=-v", b"-lineinfo"]
        err = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        log_text = log.decode(errors="replace").rstrip("\x00 \n")
        if int(err) != 0:
            raise RuntimeError(f"NVRTC could not compile {name} for {arch} ({err!r}):\n{log_text}")
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        err = nvrtc.nvrtcGetCUBIN(prog, cubin)[0]
        if int(err) != 0:
            raise RuntimeError(f"nvrtcGetCUBIN failed: {err!r}")
        return bytes(cubin), log_text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def ptxas_registers(log: str) -> tuple[int, int]:
    """``(registers per thread, spill bytes stored)`` from a ptxas ``-v`` log."""
    regs = int(log.split("Used ")[1].split(" registers")[0])
    spills = int(log.split("bytes stack frame, ")[1].split(" bytes spill stores")[0])
    return regs, spills


class _Function:
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


_LOCK = threading.Lock()
_LOADED: dict[tuple, _Function] = {}


def get_function(device: torch.device, cubin: bytes, kernel: str, smem: int = 0) -> _Function:
    """The loaded ``kernel`` of ``cubin`` in ``device``'s context (loaded once per device and cubin)."""
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


def launch(fn: _Function, device: torch.device, grid: int, block: int, smem: int, args: list) -> None:
    """Launch ``fn`` on torch's current stream of ``device``; ``args`` are ctypes values in kernel order.

    Raises:
        RuntimeError: the launch failed.
    """
    driver = fn.driver
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(v) for v in args])
    stream = driver.CUstream(torch.cuda.current_stream(device).cuda_stream)
    with torch.cuda.device(device):
        err = driver.cuLaunchKernel(fn.function, grid, 1, 1, block, 1, 1, smem, stream, ctypes.addressof(params), 0)[0]
    if int(err) != 0:
        raise RuntimeError(f"cuLaunchKernel failed: {err!r}")

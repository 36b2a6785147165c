"""The KV-pool budget per GPU as SGLang sizes it: GPU memory x ``--mem-fraction-static`` - weights per GPU.

SGLang 0.5.23 gives the KV pool what is free after the weights load, less the slack ``(1 -
mem_fraction_static)`` of the memory free before (``mem_cache/kv_cache_configurator._profile_available_bytes``).
With the whole GPU free before loading that is ``memory x fraction - weights``; the CUDA context and communication
buffers taken before loading make SGLang's own figure (its ``KV Cache is allocated`` line) somewhat smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

from .weights import Parallel, WeightBytes, weight_bytes_per_gpu

__all__ = ["GPUS", "gpu_memory", "KvBudget", "kv_budget"]

#: GPUs ``--gpu`` names: total memory in MiB as the CUDA driver reports it (SGLang's
#: ``get_device_memory_capacity``; ``nvidia-smi`` shows the same figure), the compute capability, and the name
#: nvidia-smi gives it (the name a time measured on it is recorded under): ``H100`` is the H100 80GB HBM3 (SXM);
#: an H100 PCIe or NVL reports another name.
GPUS = {
    "H100": (81559, (9, 0), "NVIDIA H100 80GB HBM3"),
    "H20": (97871, (9, 0), "NVIDIA H20"),
    "H200": (143771, (9, 0), "NVIDIA H200"),
    "B200": (183359, (10, 0), "NVIDIA B200"),
}


def gpu_key(name: str) -> str:
    """``name`` as ``GPUS`` keys it: upper case, without an ``NVIDIA`` prefix (``"nvidia h100"`` -> ``"H100"``).

    Raises:
        ValueError: a name not in ``GPUS`` (the message lists them and points to ``--memory-gib``).
    """
    key = name.strip().upper().removeprefix("NVIDIA").strip()
    if key not in GPUS:
        raise ValueError(f"--gpu: {name!r} is not one of {', '.join(GPUS)}; for another GPU give --memory-gib "
                         "with the size SGLang logs in its 'KV Cache is allocated' line")
    return key


#: ``DeviceFacts.name`` of the device ``check`` assumes without a local GPU, ``--gpu`` or ``--capability``.
ASSUMED_GPU = "assumed H200"
#: ``DeviceFacts.name`` of a device given by ``--capability`` alone: no GPU named and none local of that capability.
UNNAMED_GPU = "given"


def local_gpu() -> tuple[tuple[int, int], str] | None:
    """The local CUDA GPU's compute capability and name (``torch.cuda``), or None without one (ROCm counts as none)."""
    import torch

    if torch.cuda.is_available() and not getattr(torch.version, "hip", None):
        return tuple(torch.cuda.get_device_capability()), torch.cuda.get_device_name()
    return None


def gpu_memory(name: str | None) -> tuple[int, tuple[int, int] | None, str]:
    """The GPU's memory in MiB, its compute capability (None for the local GPU) and how it was found.

    ``name`` is one of ``GPUS`` (any case, an ``NVIDIA `` prefix allowed); None: the local CUDA GPU, else an H200
    (assumed, as ``check``'s default device).

    Raises:
        ValueError: a name not in ``GPUS`` (the message lists them and points to ``--memory-gib``).
    """
    if name is not None:
        key = gpu_key(name)
        mib, cap, _ = GPUS[key]
        return mib, cap, f"{key}, {mib} MiB, given as --gpu"
    local = local_gpu()
    if local is not None:
        import torch

        mib = torch.cuda.get_device_properties(0).total_memory // 2**20
        return mib, None, f"{local[1]}, {mib} MiB, the local GPU"
    mib = GPUS["H200"][0]
    return mib, None, f"H200, {mib} MiB, assumed: no local GPU, --gpu to change"


@dataclass(frozen=True)
class KvBudget:
    """A derived KV-pool budget per GPU.

    Attributes:
        bytes: the KV-pool budget in bytes (> 0).
        gpu_mib: the GPU's memory in MiB; ``gpu_text`` how it was found.
        fraction: ``--mem-fraction-static``; ``fraction_how`` where it came from.
        weights: the weight bytes per GPU by part.
    """

    bytes: int
    gpu_mib: int
    gpu_text: str
    fraction: float
    fraction_how: str
    weights: WeightBytes
    parallel: Parallel

    def text(self) -> str:
        """One line: how the budget was derived, in GiB."""
        g = 2**30
        par = self.parallel
        layout = f"TP {par.tp}" + (f", DP attention {par.attn_dp}" if par.attn_dp > 1 else "") + (
            ", with the MTP draft layer" if par.mtp else "")
        return (f"KV pool per GPU: {self.gpu_mib * 2**20 / g:.1f} GiB GPU memory ({self.gpu_text}) x "
                f"{self.fraction:g} --mem-fraction-static ({self.fraction_how}) - {self.weights.total / g:.1f} GiB "
                f"weights per GPU ({self.weights.dtype}, {layout}, from the config's shapes) = {self.bytes / g:.1f} "
                "GiB; SGLang's own figure, its 'KV Cache is allocated' line, is somewhat smaller for the CUDA "
                "context and communication buffers: give it as --memory-gib")


def kv_budget(cfg: dict, par: Parallel, gpu_mib: int, gpu_text: str, fraction: float, fraction_how: str) -> KvBudget:
    """The KV-pool bytes per GPU: ``gpu_mib`` MiB x ``fraction`` - the weights per GPU (``weight_bytes_per_gpu``).

    Raises:
        ValueError: the weights do not fit (one line: the figures and what to change), a fraction outside
            (0, 1], or what ``weight_bytes_per_gpu`` raises.
    """
    if not 0 < fraction <= 1:
        if fraction_how.startswith("--mem-fraction-static"):  # the user's own value
            raise ValueError(f"--sglang-args: --mem-fraction-static {fraction:g}: expected a number in (0, 1]")
        raise ValueError(f"--sglang-args: {fraction_how} is a --mem-fraction-static of {fraction:g} (the memory it "
                         "reserves for these flags exceeds the GPU's), which leaves no KV pool: give "
                         "--mem-fraction-static in --sglang-args, or --memory-gib")
    weights = weight_bytes_per_gpu(cfg, par)
    static = gpu_mib * 2**20 * fraction
    budget = int(static - weights.total)
    if budget <= 0:
        g = 2**30
        raise ValueError(f"model: its weights take {weights.total / g:.1f} GiB per GPU ({weights.dtype}, TP "
                         f"{par.tp}), more than the {static / g:.1f} GiB static memory of a {gpu_mib} MiB GPU at "
                         f"--mem-fraction-static {fraction:g}: raise --tp-size in --sglang-args, use a larger GPU "
                         f"(--gpu){'' if weights.dtype != 'bf16' else ' or an FP8 checkpoint'}, or give --memory-gib")
    return KvBudget(budget, gpu_mib, gpu_text, fraction, fraction_how, weights, par)

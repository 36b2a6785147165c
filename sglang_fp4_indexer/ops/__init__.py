"""The kernels (Triton, and CUDA C++ built by NVRTC), one public op per module (docs/design.md, Module map)."""

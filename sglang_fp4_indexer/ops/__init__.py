"""Triton kernels, one public op per module (DESIGN section 4)."""

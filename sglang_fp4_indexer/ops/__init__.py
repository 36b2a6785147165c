"""Triton kernels, one public op per module (the package layout: README, Layout)."""

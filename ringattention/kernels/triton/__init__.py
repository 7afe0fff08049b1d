"""triton kernels."""

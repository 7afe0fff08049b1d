"""tpu kernels."""

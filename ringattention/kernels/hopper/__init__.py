"""hopper kernels."""

"""Pallas kernels for one ring step, one package per backend; importing this registers them all
with ``ringattention.implementations`` (without importing any kernel):

* ``hopper/``: ``pallas_hopper``, Mosaic GPU, H100 / H200 (FlashAttention-3 style).
* ``triton/``: ``pallas_gpu``, Pallas Triton, NVIDIA GPUs (FlashAttention-2 style).
* ``tpu/``: ``pallas_tpu``, Pallas Mosaic TPU (FlashAttention-2 style).

Each package's ``__init__.py`` is its entry: it registers the step module and maps its files.
Shared by the two GPU backends: ``common.py`` (padding, sentinels, block bounds, input checks:
plain ``jax.numpy``, no Pallas backend) and ``reference.py`` (the float32 reference steps the GPU
kernels are tested against).
"""

# registry order (``implementations.names()``): xla, then these
from ringattention.kernels import tpu, triton, hopper  # noqa: F401, I001

"""Training for ring-attention LLaMA models: ``python -m train --config configs/debug.yaml``
(or the ``ringattention-train`` command).

Importing this package does not import jax, so ``python -m train`` can set XLA flags (virtual CPU
devices) from the config before jax starts. Ring Attention (Liu, Zaharia & Abbeel 2023).
"""

"""What the tests of the Pallas TPU ring step (``implementation="pallas_tpu"``) share: the block
sizes they run with and the TPU interpret mode (``pltpu.InterpretParams``: uninitialised VMEM is NaN,
out-of-bounds reads raise) where this jax has it.

The tests: test_pallas_tpu_ring.py (ring-level, Pallas' generic interpreter), test_pallas_tpu_step.py
(one step, TPU interpret mode), test_pallas_tpu_config.py (block sizes and input checks) and
test_pallas_tpu_lowering.py (lowered, and compiled by the TPU compiler, for TPU).
"""

from jax.experimental.pallas import tpu as pltpu

from ringattention.kernels.tpu.blocks import BlockSizes

SMALL = BlockSizes(128, 128, 128, 128)
TPU_INTERPRET = pltpu.InterpretParams() if hasattr(pltpu, "InterpretParams") else True

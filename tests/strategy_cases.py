"""What the strategy tests (test_strategy_reference.py, test_strategy.py) share: the XLA step's
block sizes and the layouts."""

from ringattention import BlockSizes

BS = BlockSizes(q_chunk=8, kv_chunk=8)  # several chunks per step: SKIP, PARTIAL and FULL all occur
LAYOUTS = ("contiguous", "striped", "zigzag")

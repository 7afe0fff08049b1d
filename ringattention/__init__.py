"""ringattention: exact attention over sequences sharded across a ring of devices, in JAX.

Ring Attention with Blockwise Transformers (Liu et al. 2023), Blockwise Parallel Transformer (Liu &
Abbeel 2023), Striped Attention (Brandon et al. 2023), FlashAttention-2 (Dao 2023); Ulysses x ring
(DeepSpeed-Ulysses, Jacobs et al. 2023; USP, Fang & Zhao 2024); all-gather context parallelism
(Llama 3, Dubey et al. 2024) and a cost model that chooses between them (``strategy``).
"""

from ringattention import implementations, kernels, layouts, masks, remat, strategy, ulysses
from ringattention.blockwise import BlockSizes, blockwise_feedforward
from ringattention.implementations import names as implementation_names
from ringattention.reference import reference_attention
from ringattention.ring import ring_attention
from ringattention.sharded import sharded_attention

__all__ = [
    "BlockSizes",
    "blockwise_feedforward",
    "implementation_names",
    "implementations",
    "kernels",
    "layouts",
    "masks",
    "reference_attention",
    "remat",
    "ring_attention",
    "sharded_attention",
    "strategy",
    "ulysses",
]
__version__ = "0.1.0"

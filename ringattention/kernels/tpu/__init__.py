"""Pallas TPU (Mosaic) ring step: ``implementation="pallas_tpu"``, registered here.

FlashAttention-2 style kernels (Dao 2023) for the inner loop of Ring Attention (Liu, Zaharia &
Abbeel 2023), written to TPU tiling rules. This module is the entry: it registers the step with
``ringattention.implementations`` and imports nothing else; the step module (and with it Pallas
TPU) is imported when a ring first runs it (``Implementation.load``).

Files:

* ``pallas_tpu.py``: the step (``forward_step``, ``backward_step``; contract in
  ``ringattention/implementations.py``): the forward, dq and dk/dv kernels and their calls.
* ``frame.py``: what those kernels share: their static configuration (``_Cfg``: switches, block
  kinds and fetched blocks from the prefetched tables), the float32-accumulating dot, the split of
  a kernel's refs, the masked / unmasked / skipped dispatch, and the specs of positions, segment
  ids and the prefix block.
* ``blocks.py``: ``BlockSizes`` (per TPU generation), input checks, block tables and head views.
* ``features.py``: the elementwise mask and the optional step features (soft cap, prefix,
  bidirectional segments, v's own head dim).
"""

from ringattention.implementations import Implementation, register

register(
    Implementation(
        "pallas_tpu",
        "ringattention.kernels.tpu.pallas_tpu",
        platforms=("tpu",),
        # TPU tiles: sequence blocks are multiples of 128 lanes (blocks.LANES)
        takes_shard=lambda shard: shard % 128 == 0,
        features=frozenset({"softcap", "prefix", "bidirectional", "v_head_dim"}),
    )
)

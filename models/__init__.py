"""Flax (Linen) LLaMA with ring attention: configs, sharding, Hugging Face I/O, chunked loss.

Ring Attention with Blockwise Transformers (Liu, Zaharia & Abbeel 2023); LLaMA (Touvron et al.
2023); The Llama 3 Herd of Models (Grattafiori et al. 2024).
"""

from models.config import PRESETS, LlamaConfig, RopeScaling, get_config
from models.sharding import MeshConfig, make_mesh

__all__ = ["PRESETS", "LlamaConfig", "MeshConfig", "RopeScaling", "get_config", "make_mesh"]

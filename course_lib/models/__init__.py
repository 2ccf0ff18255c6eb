"""Small models the chapters train and inspect.

    small             chapters 05-06  the bracket task and its two-head model, recall-k-back task,
                      RNN/GRU/LSTM and attention recall models (import from course_lib.models.small)
    TinyTransformer   chapter 07  decoder-only transformer with RoPE and a KV cache (transformer.py)
    bench             chapter 07  KV-cache speed-up and memory measurements (bench.py)
    TransformerBlock  chapter 10  one pre-LN block from the course's pieces (block.py)
"""

from course_lib.models.block import TransformerBlock
from course_lib.models.transformer import KVCache, TinyTransformer, kv_cache_bytes, pad_prompts

__all__ = ["TinyTransformer", "TransformerBlock", "KVCache", "kv_cache_bytes", "pad_prompts"]

"""Small models the chapters train and inspect.

    heads             chapter 05  the bracket task and its two-head model (heads.py)
    recall            chapter 06  the recall-k-back task, RNN/GRU/LSTM and attention recall models
                                  (recall.py)
    TinyTransformer   chapter 07  decoder-only transformer with RoPE and a KV cache (transformer.py)
    bench             chapter 07  KV-cache speed-up and memory measurements (bench.py)
    TransformerBlock  chapter 10  one pre-LN block from the course's pieces (block.py)
"""

from course_lib.models.block import TransformerBlock
from course_lib.models.transformer import KVCache, TinyTransformer, kv_cache_bytes, pad_prompts

__all__ = ["TinyTransformer", "TransformerBlock", "KVCache", "kv_cache_bytes", "pad_prompts"]

"""Chapter 07: what the KV cache buys (time) and what it costs (memory).

    cache_speedup(model, new_tokens=(...))   time greedy generation with and without the cache
    cache_memory(model, lengths)             the cache's bytes for n tokens next to the weights'

Timings are wall-clock seconds on this machine, the best of `repeats` runs; they differ from
machine to machine, so notebooks print them in cells marked NBVAL_IGNORE_OUTPUT.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from course_lib.measure import best_time
from course_lib.measure import threads as cpu_threads
from course_lib.models.transformer import TinyTransformer, kv_cache_bytes


def time_generation(model: TinyTransformer, prompt: torch.Tensor, new_tokens: int, use_cache: bool,
                    repeats: int = 3) -> tuple[float, torch.Tensor]:
    """Best-of-`repeats` seconds for model.generate(prompt, new_tokens, use_cache), and its
    tokens."""
    tokens = []

    def run():
        tokens[:] = [model.generate(prompt, new_tokens, use_cache=use_cache)]

    return best_time(run, repeats=repeats, warmup=0), tokens[0]


def cache_speedup(model: TinyTransformer, new_tokens: Sequence[int] = (16, 32, 64, 128),
                  prompt_len: int = 8, repeats: int = 2, seed: int = 0,
                  progress: bool = True, threads: int | None = 1) -> list[dict]:
    """Time generation of each number of new tokens with and without the KV cache.

    Returns one dict per length: new_tokens, seconds_no_cache, seconds_cache, speedup, and
    same_tokens (whether both runs produced identical tokens, which they must). It runs on
    `threads` CPU threads (None: torch's current setting).
    Without the cache, step t pushes all prompt_len + t tokens through every layer, so the total
    work grows like n^2; with it, each step pushes one token, so it grows like n (plus the
    attention over the stored keys). The ratio therefore grows with the generated length.
    """
    if not new_tokens:
        raise ValueError("new_tokens must list at least one length to time")
    longest = prompt_len + max(new_tokens)
    if longest > model.max_len:
        raise ValueError(f"prompt_len={prompt_len} + max(new_tokens)={max(new_tokens)} = {longest} "
                         f"exceeds the model's max_len={model.max_len}")
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.vocab_size, (1, prompt_len), generator=g)
    rows = []
    with cpu_threads(threads):  # tiny matmuls gain nothing from more threads
        model.generate(prompt, 2, use_cache=True)  # warm-up: first calls pay one-off costs
        model.generate(prompt, 2, use_cache=False)
        for n in tqdm(new_tokens, desc="timing generate()", disable=not progress):
            slow, slow_tokens = time_generation(model, prompt, n, use_cache=False, repeats=repeats)
            fast, fast_tokens = time_generation(model, prompt, n, use_cache=True, repeats=repeats)
            rows.append({"new_tokens": int(n), "seconds_no_cache": slow, "seconds_cache": fast,
                         "speedup": slow / fast,
                         "same_tokens": torch.equal(slow_tokens, fast_tokens)})
    return rows


def cache_memory(model: TinyTransformer, lengths: Sequence[int], batch: int = 1,
                 dtype: torch.dtype | None = None) -> list[dict]:
    """Bytes of the KV cache for each n in `lengths`, next to the model's weight bytes.

    cache bytes = 2 (K and V) x layers x batch x heads x n x d_head x bytes per element.
    dtype defaults to the model's parameter dtype.
    """
    element = (dtype or next(model.parameters()).dtype).itemsize
    weights = model.weight_bytes()
    rows = []
    for n in lengths:
        cache = kv_cache_bytes(model.num_layers, model.num_kv_heads, int(n), model.d_head, element,
                               batch)
        rows.append({"n": int(n), "cache_bytes": cache, "weight_bytes": weights,
                     "cache_over_weights": cache / weights})
    return rows

"""Chapter 07: what the KV cache buys (time) and what it costs (memory).

    cache_speedup(model, lengths=(...))   time one decoding step with and without the cache
    cache_memory(model, lengths)          the cache's bytes for n tokens next to the weights'

Generating N tokens repeats one step N times, so the step is what gets timed: with the cache,
one new token goes through the model and attends over the n tokens stored; without it, all
n + 1 tokens go through again. Timings are wall-clock on this machine (`time_call`: the median
of `repeats` runs with the fastest and slowest); they differ from machine to machine, so
notebooks print them in cells marked NBVAL_IGNORE_OUTPUT.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from course_lib.measure import Timing, time_call
from course_lib.measure import threads as cpu_threads
from course_lib.models.transformer import TinyTransformer, kv_cache_bytes


def cache_speedup(model: TinyTransformer, lengths: Sequence[int] = (16, 64, 256),
                  repeats: int = 5, seed: int = 0, progress: bool = True,
                  threads: int | None = 1, sample_seconds: float = 0.02) -> list[dict]:
    """Time one greedy decoding step at each context length n, with and without the KV cache.

    with the cache: one token in, n tokens already cached (what `generate` does per step);
    without: the whole sequence of n + 1 tokens from scratch (`use_cache=False`'s step).
    Counted in token passes the step without the cache does n + 1 times the work. On the clock
    each step also pays a cost that does not depend on n (Python, input checks, dozens of small
    tensor calls per layer), so the measured ratio starts near 1 for short contexts and grows
    with n only once the n tokens' work outweighs that fixed cost.

    Returns one dict per n: n, cached and full (`Timing`s of the two steps, in seconds),
    speedup (the ratio of their medians) and same_logits (whether the two steps' next-token
    logits agree to 1e-4, which they must). Each of the `repeats` timed samples of a step runs
    it as often as fits in about `sample_seconds` and keeps the time per call. Runs on `threads`
    CPU threads (None: torch's current setting).
    """
    lengths = [int(n) for n in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must list context lengths of at least 1 token, got {lengths}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if max(lengths) + 1 > model.max_len:
        raise ValueError(f"lengths go up to n={max(lengths)}, so a step holds {max(lengths) + 1} "
                         f"tokens, more than the model's max_len={model.max_len}")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.vocab_size, (1, max(lengths) + 1), generator=g)
    was_training = model.training
    model.eval()
    steps, same = {}, {}
    with cpu_threads(threads), torch.no_grad():  # tiny matmuls gain nothing from more threads
        for n in lengths:
            seq, new = tokens[:, :n + 1], tokens[:, n:n + 1]  # (1, n + 1); its last token
            cache = model.new_cache(batch=1, capacity=n + 1)
            model(seq[:, :n], cache=cache)                    # prefill: n tokens stored

            def cached(cache=cache, new=new, n=n):
                cache.length = n                              # forget the previous step's token
                return model(new, cache=cache)[:, -1]         # (1, vocab)

            def full(seq=seq):
                return model(seq)[:, -1]                      # (1, vocab): all n + 1 again

            steps[n] = {"cached": cached, "full": full}
            same[n] = bool(torch.allclose(cached(), full(), atol=1e-4))
        # A timed sample runs a step `calls` times in a row, enough for about `sample_seconds`,
        # and keeps the time per call: a step of a few ms is otherwise fast or twice as slow
        # depending on where a busy machine's scheduler cuts its time slices.
        calls = {(n, kind): max(1, round(sample_seconds / time_call(fn, 1, warmup=0).median))
                 for n in lengths for kind, fn in steps[n].items()}
        # Rounds: every cached step, then every full step, `repeats` times. A busy spell of the
        # machine then slows a whole group alike instead of one length, and the cached steps do
        # not run right after a full pass, which pushes the weights out of the CPU's caches
        # (one untimed cached step warms them again).
        samples = {key: [] for key in calls}
        for _ in tqdm(range(repeats), desc="timing decoding steps", disable=not progress):
            for kind in ("cached", "full"):
                steps[lengths[0]][kind]()
                for n in lengths:
                    fn, k = steps[n][kind], calls[n, kind]
                    burst = time_call(lambda fn=fn, k=k: [fn() for _ in range(k)], 1, warmup=0)
                    samples[n, kind].append(burst.median / k)
    model.train(was_training)
    rows = []
    for n in lengths:
        t_cached, t_full = Timing.of(samples[n, "cached"]), Timing.of(samples[n, "full"])
        rows.append({"n": n, "cached": t_cached, "full": t_full,
                     "speedup": t_full.median / t_cached.median, "same_logits": same[n]})
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

"""Chapter 09: a sliding window in generation, with a KV cache that never grows.

Under a window W the query at position p reads the keys of positions p-W+1 .. p and no others.
While generating, a key older than W-1 tokens is never read again, so the cache keeps only the
last W tokens, in a ring buffer: position p lives in slot p mod W, where it overwrites position
p - W. The cache's bytes are fixed by W, whatever the length generated (Mistral's "rolling
buffer cache").

The slots are not in position order once the ring has wrapped. That does not matter: chapter 07's
rotary positions turn each key by its own position before it is stored, a score depends only on
the offset between query and key, and softmax sums over the keys in any order. Only the mask must
know which position each slot holds (`RingKVCache.positions`).

`WindowedTransformer` is chapter 07's `TinyTransformer` with every layer's mask cut to the window.
Its `generate` is TinyTransformer's: with use_cache=True it fills a `RingKVCache`, with
use_cache=False it recomputes the whole sequence under `sliding_window_mask` at every step, and
both give the same tokens.
"""

from __future__ import annotations

import torch

from course_lib.masks import sliding_window_mask
from course_lib.models.transformer import KVStorage, TinyTransformer
from course_lib.validate import check_count


class RingKVCache(KVStorage):
    """The keys and values of the last `window` tokens of every layer, for a batch of sequences.

    k, v: (num_layers, batch, heads, window, d_head), allocated once. `seen` counts the tokens
    written so far; `length` (what `MultiHeadAttention` reads) the slots that hold one, so
    `nbytes()` is at most W tokens' worth.
    """

    def __init__(self, num_layers: int, batch: int, num_heads: int, window: int, d_head: int,
                 dtype: torch.dtype = torch.float32, device=None):
        super().__init__(num_layers, batch, num_heads, check_count(window, "window"), d_head,
                         dtype, device)
        self.seen = 0

    @property
    def window(self) -> int:
        return self.k.shape[3]

    @property
    def length(self) -> int:
        """Slots holding a token: min(seen, window). The attention reads these, then the new."""
        return min(self.seen, self.window)

    def positions(self) -> torch.Tensor:
        """(length,): the position of the token in each held slot, slot s holding the latest
        position p < seen with p mod W = s."""
        slots = torch.arange(self.length, device=self.k.device)
        return self.seen - 1 - (self.seen - 1 - slots) % self.window

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """Return the held keys/values followed by the new ones, then store the new ones.

        k_new, v_new: (batch, heads, t, d_head) -> k, v: (batch, heads, length + t, d_head), in
        the order of `positions()` then the new tokens. Only the last W new tokens are stored
        (each in slot position mod W); `seen` moves on once every layer has appended (`advance`).
        """
        t, held = k_new.shape[2], self.length
        k = torch.cat([self.k[layer, :, :, :held], k_new], dim=2)  # (B, heads, held + t, d_head)
        v = torch.cat([self.v[layer, :, :, :held], v_new], dim=2)
        keep = min(t, self.window)
        new_positions = torch.arange(self.seen + t - keep, self.seen + t, device=self.k.device)
        slots = new_positions % self.window                         # (keep,)
        self.k[layer].index_copy_(2, slots, k_new[:, :, t - keep:])  # overwrites p - W
        self.v[layer].index_copy_(2, slots, v_new[:, :, t - keep:])
        return k, v

    def advance(self, t: int) -> None:
        self.seen += t


class WindowedTransformer(TinyTransformer):
    """TinyTransformer whose every layer attends through a causal sliding window of W keys.

    WindowedTransformer(vocab_size, d_model, num_heads, num_layers, window, max_len=100_000):
    rotary positions need no table, so max_len only bounds a sequence and costs nothing.
    Prompts are not padded here (no `lengths`). `new_cache` returns a `RingKVCache` of W tokens.
    """

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int,
                 window: int, max_len: int = 100_000, num_kv_heads: int | None = None, *,
                 d_mlp: int | None = None):
        super().__init__(vocab_size, d_model, num_heads, num_layers, max_len, num_kv_heads,
                         d_mlp=d_mlp)
        self.window = check_count(window, "window")

    def new_cache(self, batch: int, capacity: int | None = None) -> RingKVCache:
        """An empty ring-buffer cache of `window` tokens (capacity is ignored: W is enough)."""
        p = self.lm_head.weight
        return RingKVCache(self.num_layers, check_count(batch, "batch"), self.num_kv_heads,
                           self.window, self.d_head, p.dtype, p.device)

    def forward(self, idx: torch.Tensor, lengths=None,
                cache: RingKVCache | None = None) -> torch.Tensor:
        """Logits (B, T, vocab_size) for idx (B, T): the whole sequence, or with a cache the new
        tokens only. lengths may only say that nothing is padded (generate passes it)."""
        idx = self._check_idx(idx)
        B, T = idx.shape
        if lengths is not None and not bool((torch.as_tensor(lengths) == T).all()):
            raise ValueError(f"WindowedTransformer does not pad prompts: every length must be "
                             f"T={T}, got {lengths}")
        if cache is not None and not isinstance(cache, RingKVCache):
            raise ValueError(f"cache must be a RingKVCache (model.new_cache), got "
                             f"{type(cache).__name__}")
        if cache is not None and cache.batch != B:
            raise ValueError(f"idx has batch {B} but the cache was made for batch {cache.batch}")
        start = 0 if cache is None else cache.seen
        if start + T > self.max_len:
            raise ValueError(f"sequence of {start + T} tokens is longer than max_len="
                             f"{self.max_len}")
        q_pos = torch.arange(start, start + T, device=idx.device)        # (T,)
        if cache is None:
            mask = sliding_window_mask(T, self.window, device=idx.device)  # (T, T)
        else:
            k_pos = torch.cat([cache.positions(), q_pos])                  # (S,) held, then new
            offset = q_pos[:, None] - k_pos[None, :]                       # (T, S)
            mask = (offset >= 0) & (offset < self.window)                  # the window, by position
        positions = q_pos[None].expand(B, T)                               # (B, T) for RoPE
        return self._through_blocks(idx, mask, positions, cache)           # (B, T, vocab_size)

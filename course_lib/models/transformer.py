"""Chapters 07 and 10: a tiny decoder-only transformer, with and without a KV cache.

The model is nanoGPT-shaped and small enough to read in one sitting: token embedding, then
`num_layers` of chapter 10's `TransformerBlock` (LayerNorm -> causal multi-head attention ->
residual, LayerNorm -> MLP -> residual), a final LayerNorm and a linear map to logits. Order
comes from rotary embeddings (`course_lib.position.apply_rope`) that each block applies to its
queries and keys, so there is no position table.

Generating token t+1 needs the query of token t only, but the keys and values of tokens 0..t.
Without a cache every step recomputes all of them; with a `KVCache` each layer computes K and V
for the one new token, appends them, and attends from the new query over everything stored.
Queries are never cached: no later step asks an old token's question again.

Batches of prompts of different lengths are LEFT-padded: row b of `idx` holds `T - lengths[b]`
pad tokens and then its prompt, so every sequence's next token lands in the same column. Pad
keys are masked out and positions count from each sequence's first real token, so a sequence
generates exactly what it would alone. (With RoPE, scores depend only on position offsets, so
shifted positions would change the scores only by rounding; learned absolute positions would
need the per-sequence count.) `pad_prompts` builds `idx` and `lengths` from lists.

`generate` is greedy unless given a temperature: then it samples (chapter 11,
`course_lib.decoding`: temperature, top-k, top-p, from a seeded generator).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from course_lib.decoding import check_decoding, check_generator, sample_next
from course_lib.masks import causal_mask
from course_lib.models.block import TransformerBlock
from course_lib.validate import check_count, check_kv_heads, check_lengths, check_token_ids


def kv_cache_bytes(num_layers: int, num_heads: int, n: int, d_head: int,
                   bytes_per_element: int = 4, batch: int = 1) -> int:
    """Bytes a KV cache needs for n tokens:
    2 (K and V) x layers x batch x heads x n x d_head x bytes per element."""
    return 2 * num_layers * batch * num_heads * n * d_head * bytes_per_element


class KVStorage:
    """The tensors a cache holds: k and v of shape (num_layers, batch, heads, slots, d_head),
    allocated once, zero-filled. `length` (set by the cache) counts the slots that hold a token.
    `KVCache` appends in position order; chapter 09's `RingKVCache` writes a ring of slots."""

    length: int

    def __init__(self, num_layers: int, batch: int, num_heads: int, slots: int, d_head: int,
                 dtype: torch.dtype = torch.float32, device=None):
        shape = (num_layers, batch, num_heads, slots, d_head)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def nbytes(self) -> int:
        """Bytes holding the `length` tokens stored so far (K and V, every layer)."""
        n_layers, batch, heads, _, d_head = self.k.shape
        return kv_cache_bytes(n_layers, heads, self.length, d_head, self.k.element_size(), batch)


class KVCache(KVStorage):
    """The keys and values every layer has computed so far, for a batch of sequences.

    Storage is allocated once for `capacity` tokens: k and v of shape
    (num_layers, batch, heads, capacity, d_head). `length` counts the tokens stored; `pad[b]` is
    the number of left-padding tokens at the start of sequence b (0 without padding).
    """

    def __init__(self, num_layers: int, batch: int, num_heads: int, capacity: int, d_head: int,
                 dtype: torch.dtype = torch.float32, device=None):
        super().__init__(num_layers, batch, num_heads, capacity, d_head, dtype, device)
        self.length = 0
        self.pad = torch.zeros(batch, dtype=torch.long, device=device)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """Store one layer's keys/values for the new tokens; return all keys/values so far.

        k_new, v_new: (batch, heads, t, d_head) -> k, v: (batch, heads, length + t, d_head).
        `length` itself moves on once every layer has appended (`advance`).
        """
        start, end = self.length, self.length + k_new.shape[2]
        if end > self.capacity:
            raise ValueError(f"the KV cache holds at most {self.capacity} tokens; appending "
                             f"{k_new.shape[2]} to {start} would make {end}")
        self.k[layer, :, :, start:end] = k_new
        self.v[layer, :, :, start:end] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, heads, end, d_head)

    def advance(self, t: int) -> None:
        self.length += t


class TinyTransformer(nn.Module):
    """A small decoder-only language model with rotary positions and a KV cache.

    TinyTransformer(vocab_size, d_model, num_heads, num_layers, max_len): d_model must split into
    num_heads heads of even width (RoPE rotates pairs). max_len is the longest sequence, prompt
    plus generated tokens (and padding), the model accepts. num_kv_heads=g (chapter 09):
    grouped-query attention in every layer, g key/value heads, a KV cache h/g times smaller;
    cached generation stays identical to recomputation. d_mlp: the MLP's hidden width
    (default 4 * d_model). `blocks[i]` is a `TransformerBlock`; after a forward pass,
    `blocks[i].weights` holds its attention weights (B, heads, T, S).
    """

    def __init__(self, vocab_size: int, d_model: int, num_heads: int, num_layers: int,
                 max_len: int, num_kv_heads: int | None = None, *, d_mlp: int | None = None):
        super().__init__()
        vocab_size = check_count(vocab_size, "vocab_size")
        d_model = check_count(d_model, "d_model", minimum=2)
        num_heads = check_count(num_heads, "num_heads")
        num_layers = check_count(num_layers, "num_layers")
        max_len = check_count(max_len, "max_len")
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} does not split into num_heads={num_heads} "
                             "equal heads")
        if (d_model // num_heads) % 2:
            raise ValueError(f"each head has d_head = d_model / num_heads = "
                             f"{d_model // num_heads}, but RoPE rotates pairs of columns: d_head "
                             "must be even")
        self.num_kv_heads = check_kv_heads(num_heads, num_kv_heads)
        self.vocab_size, self.d_model, self.num_heads = vocab_size, d_model, num_heads
        self.num_layers, self.max_len, self.d_head = num_layers, max_len, d_model // num_heads
        self.d_mlp = 4 * d_model if d_mlp is None else check_count(d_mlp, "d_mlp")
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, num_heads, self.d_mlp,
                                                     self.num_kv_heads)
                                    for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    # ------------------------------------------------------------------ input checks

    def _check_idx(self, idx) -> torch.Tensor:
        return check_token_ids(idx, self.vocab_size)

    def _check_lengths(self, lengths, batch: int, T: int) -> torch.Tensor:
        """lengths[b] = real tokens at the end of row b; returns the pad count T - lengths[b]."""
        if lengths is None:
            return torch.zeros(batch, dtype=torch.long)
        return T - check_lengths(lengths, T, shortest=1, batch=batch,
                                 bound=f"T={T} (the width of idx)")

    # ------------------------------------------------------------------ the model

    def new_cache(self, batch: int, capacity: int | None = None) -> KVCache:
        """An empty KV cache for `batch` sequences of up to `capacity` (default max_len) tokens."""
        batch = check_count(batch, "batch")
        capacity = self.max_len if capacity is None else check_count(capacity, "capacity")
        p = self.lm_head.weight
        return KVCache(self.num_layers, batch, self.num_kv_heads, capacity, self.d_head,
                       p.dtype, p.device)

    def forward(self, idx: torch.Tensor, lengths=None,
                cache: KVCache | None = None) -> torch.Tensor:
        """Logits (B, T, vocab_size) for the tokens idx (B, T).

        Without a cache, idx is the whole (left-padded, see `lengths`) sequence. With a cache,
        idx holds the NEW tokens only; their keys and values are appended to the cache, and they
        attend to everything the cache already holds. `lengths` belongs to the first call (the
        prompt) and is remembered by the cache.
        """
        idx = self._check_idx(idx)
        B, T = idx.shape
        start = 0 if cache is None else cache.length
        if start + T > self.max_len:
            raise ValueError(f"sequence of {start + T} tokens ({start} cached + {T} new) is longer "
                             f"than max_len={self.max_len}")
        if cache is not None and cache.batch != B:
            raise ValueError(f"idx has batch {B} but the cache was made for batch {cache.batch}")
        if cache is not None and start > 0:
            if lengths is not None:
                raise ValueError("lengths belongs to the first call with a cache (the prompt); "
                                 "later calls continue every sequence by the new tokens")
            pad = cache.pad
        else:
            pad = self._check_lengths(lengths, B, T).to(idx.device)  # (B,)
            if cache is not None:
                cache.pad = pad

        q_cols = torch.arange(start, start + T, device=idx.device)  # columns of the new tokens
        k_cols = torch.arange(start + T, device=idx.device)  # columns of every key
        positions = (q_cols[None, :] - pad[:, None]).clamp(min=0)  # (B, T): counted per sequence
        causal = causal_mask(start + T, device=idx.device)[start:]  # (T, S): no looking ahead
        real = k_cols[None, :] >= pad[:, None]  # (B, S): padding is never attended to
        # (T, S): a pad query sees itself, so no row is empty
        itself = k_cols[None, :] == q_cols[:, None]
        mask = (causal[None] & (real[:, None, :] | itself[None]))[:, None]  # (B, 1, T, S)
        return self._through_blocks(idx, mask, positions, cache)

    def _through_blocks(self, idx: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                        cache) -> torch.Tensor:
        """Logits (B, T, vocab_size): idx embedded, every block attending under `mask` with
        rotary `positions` (B, T), the final LayerNorm, the head. With a cache, each block
        appends its keys and values, and the cache then moves on by T tokens."""
        x = self.embed(idx)  # (B, T, d_model)
        for layer, block in enumerate(self.blocks):
            x = block(x, mask, positions=positions, cache=cache, layer=layer)
        if cache is not None:
            cache.advance(idx.shape[1])
        return self.lm_head(self.ln_f(x))  # (B, T, vocab_size)

    # ------------------------------------------------------------------ generation

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
                 lengths=None, return_logits: bool = False, *, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None):
        """Decoding: append a next token max_new_tokens times, by default the most likely (greedy).

        idx: (B, T) token ids, or (T,) for one prompt. For prompts of different lengths, left-pad
        them (`pad_prompts`) and pass `lengths`. Returns (B, T + max_new_tokens) ids (or
        (T + max_new_tokens,)), plus the logits each new token was chosen from,
        (B, max_new_tokens, vocab_size), when return_logits=True. use_cache=False recomputes
        the whole sequence at every step; both give the same tokens.

        Sampling (chapter 11): temperature > 0 draws each token with
        `course_lib.decoding.sample_next` (then top_k / top_p cut the distribution) from the
        seeded `generator`; the same seed gives the same tokens. temperature=0 (the default) is
        greedy, and top_k / top_p are refused there, since they would change nothing.
        """
        one = isinstance(idx, torch.Tensor) and idx.ndim == 1
        idx = self._check_idx(idx[None] if one else idx)
        max_new_tokens = check_count(max_new_tokens, "max_new_tokens", minimum=0)
        temperature, top_k, top_p = check_decoding(temperature, top_k, top_p, self.vocab_size)
        if temperature == 0 and (top_k is not None or top_p is not None):
            raise ValueError(f"top_k={top_k} and top_p={top_p} change nothing at temperature=0 "
                             "(greedy always keeps the argmax); pass temperature > 0 to sample")
        if temperature > 0:
            check_generator(generator)
        B, T = idx.shape
        if T + max_new_tokens > self.max_len:
            raise ValueError(f"prompt of T={T} tokens + max_new_tokens={max_new_tokens} = "
                             f"{T + max_new_tokens} is longer than max_len={self.max_len}; "
                             "shorten the prompt or generate fewer tokens")
        pad = self._check_lengths(lengths, B, T)  # (B,); fail before any work

        was_training = self.training
        self.eval()
        steps = []
        cache = self.new_cache(B, T + max_new_tokens) if use_cache else None
        logits = self(idx, lengths, cache)[:, -1]  # (B, vocab): prefill the prompt
        for step in range(max_new_tokens):
            steps.append(logits)
            next_id = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                  generator=generator)[:, None]  # (B, 1); greedy at T = 0
            idx = torch.cat([idx, next_id], dim=1)  # (B, T + step + 1)
            if step == max_new_tokens - 1:
                break
            if use_cache:
                logits = self(next_id, cache=cache)[:, -1]  # only the new token goes through
            else:
                lengths_now = idx.shape[1] - pad  # the padding stays, the real part grew
                logits = self(idx, lengths_now)[:, -1]  # the whole sequence again
        self.train(was_training)

        out = idx[0] if one else idx
        if return_logits:
            chosen = torch.stack(steps, dim=1) if steps else logits.new_zeros(B, 0, self.vocab_size)
            return out, (chosen[0] if one else chosen)
        return out

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0):
    """Left-pad token lists into one (B, T) tensor; returns (idx, lengths) for `generate`."""
    prompts = [list(p) for p in prompts]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError(f"prompts must be a non-empty list of non-empty token lists, got lengths "
                         f"{[len(p) for p in prompts]}")
    T = max(len(p) for p in prompts)
    idx = torch.tensor([[pad_id] * (T - len(p)) + p for p in prompts], dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return idx, lengths

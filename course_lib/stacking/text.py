"""Real English offline: the reference manual CPython ships (`pydoc_data.topics`), characters
as tokens, and the measurements that name what each head of a model trained on it does.

Every Python has `pydoc_data` (it is what `help("if")` prints), so nothing is downloaded. Its
text differs a little between Python versions; a trained model therefore keeps its own
alphabet (`CharTokenizer.chars`), and text with a character outside it is refused by name.
"""

from __future__ import annotations

import string

import torch

from course_lib.stacking.induction import ablate_head, previous_token_score

DELIMITERS = frozenset(" \n\t" + string.punctuation + "“”‘’—–…")  # where words end


def corpus_text() -> str:
    """Every topic of the reference manual, in sorted topic order, separated by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


class CharTokenizer:
    """Characters <-> token ids, for a fixed alphabet `chars` (a string of distinct characters)."""

    def __init__(self, chars: str):
        if not chars or len(set(chars)) != len(chars):
            raise ValueError(f"chars should be a non-empty string of distinct characters, "
                             f"got {len(chars)} characters, {len(set(chars))} distinct")
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    def encode(self, text: str) -> torch.Tensor:
        missing = sorted(set(text) - set(self.index))
        if missing:
            raise ValueError(f"text has characters outside this model's alphabet: {missing}")
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def delimiter_ids(self) -> torch.Tensor:
        return torch.tensor([i for i, c in enumerate(self.chars) if c in DELIMITERS])


def split(ids: torch.Tensor, held_out: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """The first 1 - held_out of the token ids to train on, the rest to measure on."""
    cut = int(len(ids) * (1 - held_out))
    return ids[:cut], ids[cut:]


def text_batch(ids: torch.Tensor, generator: torch.Generator, batch: int = 32,
               n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` random windows of n characters, and each one shifted by one (next-char targets)."""
    if len(ids) < n + 2:
        raise ValueError(f"ids holds {len(ids)} tokens; windows of n={n} need at least {n + 2}")
    start = torch.randint(0, len(ids) - n - 1, (batch,), generator=generator)
    rows = start[:, None] + torch.arange(n + 1)  # (B, n + 1)
    window = ids[rows]
    return window[:, :-1], window[:, 1:]


def repeated_text(ids: torch.Tensor, generator: torch.Generator, batch: int = 32,
                  segment: int = 40) -> torch.Tensor:
    """(batch, 2 * segment): a random stretch of real text, then the same stretch again. In the
    second copy the next character can be read off the first: an induction head does that."""
    start = torch.randint(0, len(ids) - segment, (batch,), generator=generator)
    stretch = ids[start[:, None] + torch.arange(segment)]  # (B, segment)
    return torch.cat([stretch, stretch], dim=1)


def repeat_score(weights: torch.Tensor, segment: int) -> torch.Tensor:
    """On sequences made of a segment twice: mean weight from the second copy's j-th token onto
    the FIRST copy's (j+1)-th, the token after "the earlier occurrence of me":
    (B, heads, 2 * segment, 2 * segment) -> (heads,)."""
    q = torch.arange(segment, 2 * segment - 1)  # queries in the second copy (not the last)
    return weights[:, :, q, q - segment + 1].mean(dim=(0, 2))


def delimiter_score(weights: torch.Tensor, tokens: torch.Tensor,
                    delimiter_ids: torch.Tensor) -> torch.Tensor:
    """Mean weight on the latest space, newline or punctuation mark BEFORE each query (where the
    current word began): (B, heads, n, n), tokens (B, n) -> (heads,). Queries with no delimiter
    before them do not count."""
    n = tokens.shape[1]
    pos = torch.arange(n, device=tokens.device)
    is_delim = torch.isin(tokens, delimiter_ids.to(tokens.device))  # (B, n)
    latest = torch.where(is_delim, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # <= i
    before = torch.cat([torch.full_like(latest[:, :1], -1), latest[:, :-1]], dim=1)  # < i
    has = before >= 0
    index = before.clamp(min=0)[:, None, :, None].expand(-1, weights.shape[1], -1, 1)
    on = weights.gather(3, index)[..., 0]  # (B, heads, n)
    return on.transpose(0, 1)[:, has].mean(dim=-1)  # (heads,)


def current_token_score(weights: torch.Tensor) -> torch.Tensor:
    """Mean weight a query puts on itself: (B, heads, n, n) -> (heads,)."""
    return torch.diagonal(weights, dim1=-2, dim2=-1).mean(dim=(0, 2))


def open_brackets(tokens: torch.Tensor, tokenizer: CharTokenizer) -> torch.Tensor:
    """(B, n): the position of the innermost bracket or quote still open BEFORE each query,
    -1 where nothing is open. ( [ { open; the matching mark closes; a second " closes the
    first."""
    opener = {tokenizer.index[c]: c for c in "([{" if c in tokenizer.index}
    closer = {tokenizer.index[c]: o for c, o in zip(")]}", "([{") if c in tokenizer.index}
    quote = tokenizer.index.get('"')
    target = torch.full(tokens.shape, -1, dtype=torch.long)  # (B, n)
    for b, row in enumerate(tokens.tolist()):
        stack = []  # (position, mark) of what is open
        for i, t in enumerate(row):
            target[b, i] = stack[-1][0] if stack else -1  # what is open before i
            if t == quote:
                if stack and stack[-1][1] == '"':
                    stack.pop()
                else:
                    stack.append((i, '"'))
            elif t in opener:
                stack.append((i, opener[t]))
            elif t in closer and stack and stack[-1][1] == closer[t]:
                stack.pop()
    return target.to(tokens.device)


def bracket_score(weights: torch.Tensor, tokens: torch.Tensor,
                  tokenizer: CharTokenizer) -> torch.Tensor:
    """Mean weight on the innermost still-open bracket or quote BEFORE each query
    (`open_brackets`). Queries with nothing open before them do not count:
    (B, heads, n, n), tokens (B, n) -> (heads,)."""
    target = open_brackets(tokens, tokenizer)
    has = target >= 0
    index = target.clamp(min=0)[:, None, :, None].expand(-1, weights.shape[1], -1, 1)
    on = weights.gather(3, index)[..., 0]  # (B, heads, n)
    return on.transpose(0, 1)[:, has].mean(dim=-1)  # (heads,)


def baseline_weights(batch: int, n: int, window: int | None = None) -> torch.Tensor:
    """Attention that does no job: (batch, 1, n, n), each query spread evenly over every key it
    may see (window=None: uniform over the causal past) or over the last `window` keys (itself
    included). A head's score means something only where it beats these."""
    pos = torch.arange(n)
    allowed = pos[None, :] <= pos[:, None]  # (n_q, n_k): causal
    if window is not None:
        allowed &= pos[None, :] > pos[:, None] - window
    w = allowed.float() / allowed.sum(dim=1, keepdim=True)
    return w.expand(batch, 1, n, n)


@torch.no_grad()
def nats_per_character(model, tokens: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean cross-entropy of next-character prediction, in nats per character."""
    model.eval()
    logits = model(tokens)
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   targets.reshape(-1)))


def ablation_costs(model, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(layers, heads): how many nats per character the loss on (tokens, targets) rises when that
    one head is zeroed (`ablate_head`); negative if the model does better without it."""
    base = nats_per_character(model, tokens, targets)
    costs = torch.zeros(len(model.blocks), model.blocks[0].attn.num_heads)
    for layer in range(costs.shape[0]):
        for head in range(costs.shape[1]):
            with ablate_head(model, layer, head):
                costs[layer, head] = nats_per_character(model, tokens, targets) - base
    return costs


JOBS = ("previous token", "current token", "delimiter", "bracket", "induction")

# Where each job's information should matter, as (where, against): the queries at which zeroing a
# head that really does the job must cost more. A previous-character head tells a query the
# character before it, which helps spell a word: queries inside a word, their previous character
# a letter too, against the rest. A start-of-word head tells a query where its word began, which
# helps with the word's later characters and not with the first character of the next word
# (predicted at the delimiter itself). A bracket head tells what is still open.
JOB_TESTS = {
    "previous token": ("inside a word", "elsewhere"),
    "delimiter": ("later characters of a word", "the first character of a word"),
    "bracket": ("inside an open bracket or quote", "outside"),
}


def job_positions(tokens: torch.Tensor, targets: torch.Tensor,
                  tokenizer: CharTokenizer) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """For each job of `JOB_TESTS`, two boolean (B, n) masks of queries: where the job's
    information should help predict the next character, and what to compare with."""
    if tokens.shape != targets.shape:
        raise ValueError(f"tokens and targets should have the same shape, got "
                         f"{tuple(tokens.shape)} and {tuple(targets.shape)}")
    delims = tokenizer.delimiter_ids().to(tokens.device)
    is_delim = torch.isin(tokens, delims)  # (B, n)
    prev_delim = torch.cat([torch.ones_like(is_delim[:, :1]), is_delim[:, :-1]], dim=1)
    in_word = ~is_delim & ~prev_delim  # a letter after a letter
    next_letter = ~torch.isin(targets, delims)
    inside = open_brackets(tokens, tokenizer) >= 0
    return {"previous token": (in_word, ~in_word),
            "delimiter": (~is_delim & next_letter, is_delim & next_letter),
            "bracket": (inside, ~inside)}


@torch.no_grad()
def job_ablations(model, tokenizer: CharTokenizer, tokens: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
    """(layers, heads, len(JOB_TESTS), 2): the loss rise, in nats per character, of zeroing each
    head, on the queries where each job should matter and on those it is compared with
    (`job_positions`, in `JOB_TESTS` order). NaN where a batch has no such query."""
    model.eval()
    masks = job_positions(tokens, targets, tokenizer)

    def losses():
        logits = model(tokens)
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets,
                                                 reduction="none")  # (B, n)

    base = losses()
    heads = model.blocks[0].attn.num_heads
    out = torch.zeros(len(model.blocks), heads, len(JOB_TESTS), 2)
    for layer in range(len(model.blocks)):
        for head in range(heads):
            with ablate_head(model, layer, head):
                rise = losses() - base
            for j, job in enumerate(JOB_TESTS):
                for side, mask in enumerate(masks[job]):
                    out[layer, head, j, side] = rise[mask].mean() if mask.any() else float("nan")
    return out


def _job_scores(w, r, text_tokens, repeated_tokens, tokenizer):
    return {"previous token": previous_token_score(w), "current token": current_token_score(w),
            "delimiter": delimiter_score(w, text_tokens, tokenizer.delimiter_ids()),
            "bracket": bracket_score(w, text_tokens, tokenizer),
            "induction": repeat_score(r, repeated_tokens.shape[1] // 2)}


@torch.no_grad()
def head_jobs(model, tokenizer: CharTokenizer, text_tokens: torch.Tensor,
              repeated_tokens: torch.Tensor, targets: torch.Tensor | None = None,
              margin: float = 1.5, min_excess: float = 0.1, min_cost: float = 0.01,
              window: int = 3, digits: int = 3) -> list[dict]:
    """Score every head of `model` at each job against what a head with no job would score, and
    name a job only where the head earns it.

    text_tokens (B, n): windows of real text (previous, current, delimiter, bracket);
    repeated_tokens (B, 2m): a stretch of text twice (`repeated_text`, for induction); targets:
    the next characters of text_tokens, for the ablations. Each score is the mean weight on ONE
    position per query. Its baselines are the same score of attention spread evenly over the
    causal past ("uniform") and over the last `window` keys ("window"). A head's candidate is
    the job whose score most exceeds its larger baseline. It is named after it if three tests
    pass, each on numbers rounded to `digits` decimals (what a printout shows):
      "score":   the score is at least `margin` times the baseline and `min_excess` above it;
      "zeroing": zeroing the head costs at least `min_cost` nats per character (needs targets);
      "job":     for a job in `JOB_TESTS`, zeroing costs at least `margin` times as much where the
                 job should matter as where it should not (`job_ablations`).
    Else its job is "no clear job"; "fails" lists the tests it failed. One dict per head:
    {"layer", "head", "job", "candidate", "fails", "cost", a score per job,
    "baselines": {job: (uniform, window)}, "tests": {job: (cost where, cost against)}}.
    """
    model.eval()
    model(text_tokens)
    on_text = [block.weights for block in model.blocks]
    model(repeated_tokens)
    on_repeat = [block.weights for block in model.blocks]
    B, n = text_tokens.shape
    Br, nr = repeated_tokens.shape
    baselines = {}
    for kind in (None, window):
        base = _job_scores(baseline_weights(B, n, kind), baseline_weights(Br, nr, kind),
                           text_tokens, repeated_tokens, tokenizer)
        for job in JOBS:
            baselines.setdefault(job, []).append(round(float(base[job][0]), digits))
    heads = on_text[0].shape[1]
    if targets is not None:
        costs = ablation_costs(model, text_tokens, targets)
        local = job_ablations(model, tokenizer, text_tokens, targets)
    else:
        costs = torch.full((len(model.blocks), heads), float("nan"))
        local = torch.full((len(model.blocks), heads, len(JOB_TESTS), 2), float("nan"))
    rows = []
    for layer, (w, r) in enumerate(zip(on_text, on_repeat)):
        scores = _job_scores(w, r, text_tokens, repeated_tokens, tokenizer)
        for head in range(heads):
            row = {"layer": layer, "head": head,
                   **{job: round(float(scores[job][head]), digits) for job in JOBS},
                   "cost": round(float(costs[layer, head]), digits),
                   "baselines": {job: tuple(baselines[job]) for job in JOBS},
                   "tests": {job: tuple(round(float(c), digits) for c in local[layer, head, j])
                             for j, job in enumerate(JOB_TESTS)}}
            best = max(JOBS, key=lambda job: row[job] - max(baselines[job]))
            base = max(baselines[best])
            where, against = row["tests"].get(best, (None, None))
            checks = {"score": row[best] >= margin * base and row[best] - base >= min_excess,
                      "zeroing": row["cost"] >= min_cost,
                      "job": where is None or where >= margin * against}
            row["candidate"] = best
            row["fails"] = [test for test, ok in checks.items() if not ok]
            row["job"] = "no clear job" if row["fails"] else best
            rows.append(row)
    return rows

"""Chapter 06's pictures: what a running summary must hold, and what cross-attention looks at.

    summary_must_hold(n, k, question_first)   the tokens a summary must still hold after each step
    draw_question_timelines(tokens, k)        of recall-k-back, asked last and asked first
    draw_alignment(weights, source, target)   a decoder's cross-attention weights as a heatmap
    draw_length_curves(runs)                  accuracy against source length, per model

The timelines are computed from the task's own definition (the answer is the token k positions
before the question's slot, course_lib.models.recall), not drawn by hand.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from course_lib.validate import check_count


def summary_must_hold(n: int, k: int, question_first: bool) -> list[dict]:
    """Step by step, the token positions (1..n) a running summary must still hold.

    The recall task of chapter 06: tokens x_1..x_n, and a question Q_k asking for the token k
    positions before the question's slot, x_p with p = n + 1 - k. Asked last
    (x_1 .. x_n, Q_k), any token read so far may be asked, so after x_t the summary must hold all
    of x_1..x_t. Asked first (Q_k, x_1 .. x_n, ?), it knows p from the start and must hold x_p
    alone, once read. Returns one dict per step: `token` ("x3", "Q_5", "?"), `held` (the
    positions held after reading it) and `reads_answer` (True where the answer is read).
    """
    n = check_count(n, "n")
    if not 1 <= check_count(k, "k") <= n:
        raise ValueError(f"k must lie in 1..n={n}, got {k}")
    p = n + 1 - k
    question = {"token": f"Q_{k}", "held": [], "reads_answer": False}
    tokens = [{"token": f"x{t}", "reads_answer": False,
               "held": [p] * (t >= p) if question_first else list(range(1, t + 1))}
              for t in range(1, n + 1)]
    if question_first:
        return [question] + tokens + [{"token": "?", "held": [p], "reads_answer": True}]
    return tokens + [{**question, "held": [p], "reads_answer": True}]


def _draw_timeline(ax, steps: list[dict], labels: list[str], n: int, p: int, title: str) -> None:
    for c, step in enumerate(steps):
        for pos in step["held"]:
            asked = pos == p
            ax.add_patch(plt.Rectangle((c - 0.45, pos - 0.45), 0.9, 0.9, ec="none",
                                       fc="tab:orange" if asked else "#9ecae1",
                                       gid=f"held x{pos} step {c}"))
        if step["reads_answer"]:
            ax.plot(c, p, "*", color="black", ms=11, gid=f"answer step {c}")
        ax.text(c, n + 1.1, str(len(step["held"])), ha="center", va="center", fontsize=7,
                gid=f"count step {c}")
    ax.text(len(steps) - 0.3, n + 1.1, "tokens held", ha="left", va="center", fontsize=7)
    ax.set_xlim(-0.6, len(steps) - 0.4)
    ax.set_ylim(n + 1.6, 0.4)
    ax.set_xticks(range(len(steps)), labels, fontsize=7)
    ax.set_yticks(range(1, n + 1), [f"x{t}" for t in range(1, n + 1)], fontsize=7)
    ax.set_xlabel("reading order: the token read at each step (its value below its name)",
                  fontsize=8)
    ax.set_ylabel("token the summary holds", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(length=0)
    ax.grid(True, color="0.92", lw=0.5)
    ax.set_axisbelow(True)


def draw_question_timelines(tokens, k: int, axes=None):
    """Recall-k-back asked last and asked first, as two timelines over the same tokens.

    tokens: the values of x_1..x_n (a list or a 1-d tensor); k: the distance asked. In each panel
    a column is a step of reading, a row a token; a cell is filled while the summary must hold
    that token (orange: the one that will be asked), the star marks where the answer is read,
    and the number above a column counts the tokens held. Returns the two Axes.
    """
    values = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    n = len(values)
    if n == 0:
        raise ValueError("tokens must hold at least one token, got none")
    last, first = summary_must_hold(n, k, False), summary_must_hold(n, k, True)
    p = n + 1 - k
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.6), sharey=False)
        fig.subplots_adjust(wspace=0.22, left=0.05, right=0.94, bottom=0.16, top=0.86)
    names = [f"{s['token']}\n{values[int(s['token'][1:]) - 1]}" if s["token"].startswith("x")
             else s["token"] for s in last]
    _draw_timeline(axes[0], last, names, n, p,
                   f"question last: after x_t every token so far may be asked\n"
                   f"(it holds {len(last[-2]['held'])} when Q_{k} arrives)")
    _draw_timeline(axes[1], first, [first[0]["token"]] + names[:-1] + ["?"], n, p,
                   f"question first: Q_{k} names x{p} before it comes\n"
                   f"(it holds at most {max(len(s['held']) for s in first)} token)")
    return axes


def draw_alignment(weights, source: list[str], target: list[str], ax=None, title: str = ""):
    """Cross-attention weights (len(target), len(source)) as a heatmap: a row per target word,
    a column per source word, with a colour bar. Returns the Axes."""
    w = torch.as_tensor(weights, dtype=torch.float32)
    if w.shape != (len(target), len(source)):
        raise ValueError(f"weights has shape {tuple(w.shape)}, wanted (len(target), "
                         f"len(source)) = ({len(target)}, {len(source)})")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.42 * len(source) + 2.6, 0.36 * len(target) + 1.6))
    image = ax.imshow(w.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(source)), source, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(target)), target, fontsize=8)
    ax.set_xlabel("source word (encoder state h_j)")
    ax.set_ylabel("target word written (decoder step i)")
    ax.set_title(title, fontsize=9)
    ax.figure.colorbar(image, ax=ax, label="attention weight", fraction=0.046, pad=0.02)
    return ax


def draw_length_curves(runs: list[dict], ax=None, title: str = ""):
    """Word accuracy against source length, one line per (attention, steps): the mean over
    seeds, with the lowest and highest seed as a band. `runs` are rows of the seq2seq record.
    Returns the Axes."""
    if not runs:
        raise ValueError("runs must hold at least one row of the record, got none")
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4))
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["attention"], r["steps"]), []).append(r)
    # additive: large hollow triangles, so they stay visible where the dot product's line lies on
    # top of them (both at 1.0)
    style = {"none": ("tab:grey", "o", 5, None), "additive": ("tab:green", "^", 9, "none"),
             "dot": ("tab:blue", "s", 4, None)}
    steps_all = sorted({s for _, s in groups})
    for (attention, steps), rows in groups.items():
        x = [(lo + hi) / 2 for lo, hi in rows[0]["bins"]]
        acc = torch.tensor([r["word_accuracy"] for r in rows])          # (seeds, bins)
        colour, marker, size, face = style.get(attention, ("black", "x", 5, None))
        dashed = len(steps_all) > 1 and steps == steps_all[0]
        name = "no attention" if attention == "none" else f"{attention} attention"
        ax.plot(x, acc.mean(0), marker + ("--" if dashed else "-"), color=colour, ms=size,
                markerfacecolor=face, label=f"{name}, {steps} steps ({len(rows)} seeds)",
                gid=f"{attention} {steps}")
        ax.fill_between(x, acc.min(0).values, acc.max(0).values, color=colour, alpha=0.15)
    bins = runs[0]["bins"]
    ax.set_xticks([(lo + hi) / 2 for lo, hi in bins], [f"{lo}-{hi}" for lo, hi in bins])
    ax.set_xlabel("source sentence length (words)")
    ax.set_ylabel("word accuracy of the translation")
    ax.set_ylim(0, 1.03)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    return ax

"""Induction on real text: a two-layer attention-only model of chapter 10's reference-manual
characters, and the test that shows it copies.

A stretch of random letters cannot be predicted the first time it is read; if it comes again,
an induction head (`induction.py`) can read each next letter off the first copy. So

    loss on the second copy  <<  loss on the first copy

is the sign that a model has one, whatever text it was trained on. `copy_losses` measures both;
`head_scores` (chapter 10's previous-token and induction scores) finds the heads; ablating them
(`ablate_head`) must take the second copy's advantage away.

The model is trained once, offline (one CPU thread, seeded), and shipped as
`course_lib/data/ch10_induction_text.pt` with its record `ch10_induction_text.json`: the spec,
the steps, the seconds, and a curve measured every `every` steps (training loss, both copies'
losses, the best induction and previous-token scores), so a lecture can draw the moment
induction forms. To make it again (`--quick`: a few steps, into --out):

    python -m course_lib.stacking.induction_text [--quick] [--out DIR]
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.measure import threads
from course_lib.stacking import shipped
from course_lib.stacking import text as text_mod
from course_lib.stacking.induction import AttentionOnlyTransformer, Watch, head_scores
from course_lib.stacking.shipped import DATA, QUICK_STEPS
from course_lib.stacking.text import CharTokenizer
from course_lib.train import train
from course_lib.validate import check_choice, check_count

LETTERS = "abcdefghijklmnopqrstuvwxyz"  # what a random stretch is made of


def random_repeat(generator: torch.Generator, tokenizer: CharTokenizer, batch: int = 64,
                  segment: int = 40, letters: str = LETTERS) -> torch.Tensor:
    """(batch, 2 * segment) token ids: `segment` random letters, then the same letters again.
    Nothing in the text predicts the first copy; the first copy predicts the second."""
    batch, segment = check_count(batch, "batch"), check_count(segment, "segment", minimum=2)
    pool = tokenizer.encode(letters)  # (len(letters),)
    stretch = pool[torch.randint(0, len(pool), (batch, segment), generator=generator)]
    return torch.cat([stretch, stretch], dim=1)  # (B, 2 * segment)


@torch.no_grad()
def copy_losses(model: nn.Module, tokens: torch.Tensor) -> dict[str, float]:
    """Mean next-token loss (nats) inside the first copy and inside the second, on tokens
    (B, 2L) made of a stretch twice: {"first": ..., "second": ...}. The prediction of the second
    copy's first token (from the first copy's last) belongs to neither."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[1] % 2 \
            or tokens.shape[1] < 4:
        raise ValueError(f"tokens has shape {tuple(getattr(tokens, 'shape', ()))}, wanted "
                         "(batch, 2 * segment) with segment >= 2")
    L = tokens.shape[1] // 2
    if not torch.equal(tokens[:, :L], tokens[:, L:]):
        raise ValueError("tokens should be a stretch followed by the same stretch "
                         "(random_repeat makes them)")
    model.eval()
    logits = model(tokens[:, :-1])  # (B, 2L - 1, vocab)
    loss = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")  # (B, 2L-1)
    return {"first": float(loss[:, :L - 1].mean()), "second": float(loss[:, L:].mean())}


def induction_measures(model: nn.Module, tokens: torch.Tensor) -> dict[str, float]:
    """What the training curve keeps: both copies' losses and the best layer-1 induction and
    layer-0 previous-token scores of `head_scores` on tokens (B, 2L)."""
    scores = head_scores(model, tokens)
    return {**copy_losses(model, tokens),
            "induction": float(scores["induction"][-1].max()),
            "previous": float(scores["previous"][0].max())}


# ------------------------------------------------------------------ the shipped model

SPECS: dict[str, dict] = {
    "induction_text": {"task": "text", "task_args": {"n": 256, "held_out": 0.1},
                       "model": "AttentionOnlyTransformer",
                       "model_args": {"vocab_size": None, "d_model": 64, "num_heads": 4,
                                      "num_layers": 2, "max_len": 256},
                       "steps": 3500, "batch": 16, "lr": 1e-2, "seed": 0,
                       "probe": {"batch": 32, "segment": 50, "seed": 1}, "every": 100},
}
COMMAND = "python -m course_lib.stacking.induction_text"


def build(spec: dict, chars: str) -> AttentionOnlyTransformer:
    """The untrained model of `spec`, for the alphabet `chars`."""
    return AttentionOnlyTransformer(**{**spec["model_args"], "vocab_size": len(chars)})


def probe_batch(spec: dict, tokenizer: CharTokenizer) -> torch.Tensor:
    """The fixed repeated random stretches (batch, 2 * segment) the curve and record measure."""
    p = spec["probe"]
    return random_repeat(torch.Generator().manual_seed(p["seed"]), tokenizer, p["batch"],
                         p["segment"])


def held_out_batch(spec: dict, tokenizer: CharTokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """64 fixed windows of the held-out text and their next characters."""
    t = spec["task_args"]
    _, held = text_mod.split(tokenizer.encode(text_mod.corpus_text()), t["held_out"])
    return text_mod.text_batch(held, torch.Generator().manual_seed(123), 64, t["n"])


def measure(model: nn.Module, spec: dict, tokenizer: CharTokenizer) -> dict:
    """What the record keeps: held-out loss, both copies' losses, the best scores."""
    tokens, targets = held_out_batch(spec, tokenizer)
    found = induction_measures(model, probe_batch(spec, tokenizer))
    return {"held_out_loss": round(text_mod.nats_per_character(model, tokens, targets), 4),
            **{key: round(value, 4) for key, value in found.items()}}


def make(name: str = "induction_text", quick: bool = False,
         progress: bool = True) -> tuple[AttentionOnlyTransformer, dict]:
    """Train model `name` from its spec (one thread, seeded); return (model, record)."""
    check_choice(name, "name", sorted(SPECS))
    spec = copy.deepcopy(SPECS[name])
    text = text_mod.corpus_text()
    tokenizer = CharTokenizer.from_text(text)
    train_ids, _ = text_mod.split(tokenizer.encode(text), spec["task_args"]["held_out"])
    steps = QUICK_STEPS if quick else spec["steps"]
    probe = probe_batch(spec, tokenizer)
    torch.manual_seed(spec["seed"])
    model = build(spec, tokenizer.chars)
    n, batch = spec["task_args"]["n"], spec["batch"]
    watch = Watch(model, lambda g: text_mod.text_batch(train_ids, g, batch, n),
                  lambda m: induction_measures(m, probe), spec["every"])
    start = time.perf_counter()
    history = train(model, watch, steps=steps, lr=spec["lr"], seed=spec["seed"],
                    progress=progress, desc=name)
    curve = watch.finish()
    loss = history.smoothed("loss", spec["every"])
    record = {"name": name, "spec": spec, "chars": tokenizer.chars, "steps_done": steps,
              "final_loss": round(loss[-1], 4),
              "curve": {"every": spec["every"], "step": [s for s, _ in curve],
                        # training loss, running mean over the `every` steps before
                        "loss": [round(loss[max(s - 1, 0)], 3) for s, _ in curve],
                        **{key: [round(r[key], 3) for _, r in curve] for key in curve[0][1]}},
              "result": measure(model, spec, tokenizer),
              "parameters": model.num_parameters(),
              "seconds": round(time.perf_counter() - start, 1),
              "made_with": shipped.made_with(),
              "command": f"{COMMAND} {name}"}
    return model, record


def save(model: nn.Module, record: dict, folder: Path = DATA) -> Path:
    return shipped.save(model, record, folder, f"ch10_{record['name']}")


def record(name: str = "induction_text", folder: Path = DATA) -> dict:
    """The JSON record shipped with model `name`."""
    check_choice(name, "name", sorted(SPECS))
    return shipped.read_record(folder, f"ch10_{name}", f"{COMMAND} {name}")


def load(name: str = "induction_text", folder: Path = DATA) -> AttentionOnlyTransformer:
    """Model `name` with its shipped weights, in eval mode, with `.tokenizer`."""
    rec = record(name, folder)
    model = shipped.load_weights(build(rec["spec"], rec["chars"]), folder, f"ch10_{name}")
    model.tokenizer = CharTokenizer(rec["chars"])
    return model


def main(argv: list[str] | None = None) -> int:
    args = shipped.parse(shipped.parser(__name__, __doc__, SPECS), argv, SPECS)
    for name in args.names:
        with threads(1):  # what made_with() records, whatever the machine's core count
            model, rec = make(name, quick=args.quick, progress=sys.stderr.isatty())
        path = save(model, rec, args.out)
        print(f"{name}: {rec['steps_done']} steps in {rec['seconds']} s, {rec['result']} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

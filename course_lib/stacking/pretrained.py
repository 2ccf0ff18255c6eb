"""The small trained models of chapter 10, and the seeded command that makes them.

Training them took about an hour in all on a busy 2-core machine (each record keeps its
seconds), far longer than a lecture may run, so the course ships their weights
(`course_lib/data/ch10_<name>.pt`, a plain state dict) with a record of how each was made
(`ch10_<name>.json`: the configuration, the seed, the steps, the result). To make them again
(one CPU thread, deterministic; the same machine gives the same bits):

    python -m course_lib.stacking.pretrained                  # every model, into course_lib/data
    python -m course_lib.stacking.pretrained text --out DIR   # one model, elsewhere
    python -m course_lib.stacking.pretrained --quick --out DIR   # a few steps each (the test)

    python -m course_lib.stacking.pretrained pairs_gru --seed 1   # a record only, no weights

    induction_1layer, induction_2layer   same width and budget, 1 vs 2 layers
    pairs_transformer, pairs_gru         m (thing, container) pairs, then the question: attention
                                         vs recurrence of about the same size and budget
    pairs_gru_question_first             the same GRU, the question asked before the pairs
    pairs_gru_long                       pairs_gru with ten times the steps (about 20 min)
    text                                 characters of CPython's reference manual

`--seed K` trains with another seed and writes only its record (`ch10_<name>_seed<K>.json`, the
measured results), not weights: for checking how much a result moves with the seed.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch

from course_lib.measure import threads
from course_lib.models import TinyTransformer
from course_lib.models.recall import RecurrentModel
from course_lib.stacking import shipped
from course_lib.stacking import text as text_mod
from course_lib.stacking.induction import induction_batch
from course_lib.stacking.pronoun import PairsTask, accuracy_by_pairs
from course_lib.stacking.shipped import DATA, QUICK_STEPS
from course_lib.train import evaluate, train
from course_lib.validate import check_choice

CURVE_EVERY = 10

_INDUCTION_TASK = {"segment": 8, "gap": 8, "vocab": 32}
_INDUCTION_MODEL = {"vocab_size": 32, "d_model": 32, "num_heads": 4, "max_len": 24}
_PAIRS_TASK = {"max_pairs": 4}
_PAIRS_GRU = {"vocab_size": 39, "num_classes": 39, "d_hidden": 128, "kind": "gru",
              "d_embed": 32}

SPECS: dict[str, dict] = {
    "induction_1layer": {"task": "induction", "task_args": _INDUCTION_TASK,
                         "model": "TinyTransformer",
                         "model_args": {**_INDUCTION_MODEL, "num_layers": 1},
                         "steps": 800, "batch": 64, "lr": 3e-3, "seed": 0},
    "induction_2layer": {"task": "induction", "task_args": _INDUCTION_TASK,
                         "model": "TinyTransformer",
                         "model_args": {**_INDUCTION_MODEL, "num_layers": 2},
                         "steps": 800, "batch": 64, "lr": 3e-3, "seed": 0},
    "pairs_transformer": {"task": "pairs", "task_args": _PAIRS_TASK, "model": "TinyTransformer",
                          "model_args": {"vocab_size": 39, "d_model": 48, "num_heads": 4,
                                         "num_layers": 2, "max_len": 29},
                          "steps": 3000, "batch": 64, "lr": 3e-3, "seed": 0},
    "pairs_gru": {"task": "pairs", "task_args": _PAIRS_TASK, "model": "RecurrentModel",
                  "model_args": _PAIRS_GRU, "steps": 3000, "batch": 64, "lr": 3e-3, "seed": 0},
    "pairs_gru_question_first": {"task": "pairs",
                                 "task_args": {**_PAIRS_TASK, "question_first": True},
                                 "model": "RecurrentModel", "model_args": _PAIRS_GRU,
                                 "steps": 3000, "batch": 64, "lr": 3e-3, "seed": 0},
    # the question-last GRU again with ten times the budget: does it bind the pairs, given time?
    "pairs_gru_long": {"task": "pairs", "task_args": _PAIRS_TASK, "model": "RecurrentModel",
                       "model_args": _PAIRS_GRU, "steps": 30000, "batch": 64, "lr": 3e-3,
                       "seed": 0},
    "text": {"task": "text", "task_args": {"n": 96, "held_out": 0.1}, "model": "TinyTransformer",
             "model_args": {"vocab_size": None, "d_model": 96, "num_heads": 4, "num_layers": 3,
                            "max_len": 256},
             "steps": 2000, "batch": 32, "lr": 2e-3, "seed": 0},
}


def build(spec: dict, chars: str | None = None) -> torch.nn.Module:
    """The untrained model a spec describes (the text model needs its alphabet)."""
    args = dict(spec["model_args"])
    if spec["task"] == "text":
        args["vocab_size"] = len(chars)
    if spec["model"] == "TinyTransformer":
        return TinyTransformer(**args)
    return RecurrentModel(**args)


def _batch_fn(spec: dict, chars: str | None):
    t, batch = spec["task_args"], spec["batch"]
    if spec["task"] == "induction":
        return lambda g: induction_batch(g, batch, **t)
    if spec["task"] == "pairs":
        task = PairsTask(**t)
        return lambda g: task.batch(g, batch)
    tokenizer = text_mod.CharTokenizer(chars)
    train_ids, _ = text_mod.split(tokenizer.encode(text_mod.corpus_text()), t["held_out"])
    return lambda g: text_mod.text_batch(train_ids, g, batch, t["n"])


def measure(name: str, model: torch.nn.Module, spec: dict, chars: str | None = None) -> dict:
    """The numbers a record keeps: accuracy on a fixed test batch (or held-out loss for text)."""
    t = spec["task_args"]
    if spec["task"] == "induction":
        tokens, targets = induction_batch(torch.Generator().manual_seed(123), 512, **t)
        return {"test_accuracy": round(evaluate(model, tokens, targets), 4)}
    if spec["task"] == "pairs":
        task = PairsTask(**t)
        every = accuracy_by_pairs(model, task, 200)
        big = accuracy_by_pairs(model, task, 200, adj="big")
        return {**{f"accuracy_m{m}": round(v, 4) for m, v in every.items()},
                **{f"accuracy_big_m{m}": round(v, 4) for m, v in big.items()}}
    tokenizer = text_mod.CharTokenizer(chars)
    _, held = text_mod.split(tokenizer.encode(text_mod.corpus_text()), t["held_out"])
    tokens, targets = text_mod.text_batch(held, torch.Generator().manual_seed(123), 64, t["n"])
    with torch.no_grad():
        model.eval()
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
    return {"held_out_loss": round(float(loss), 4)}


def make(name: str, quick: bool = False, progress: bool = True, seed: int | None = None):
    """Train model `name` from its spec (with another seed if given); return (model, record)."""
    spec = copy.deepcopy(SPECS[name])
    if seed is not None:
        spec["seed"] = seed
    chars = None
    if spec["task"] == "text":
        chars = text_mod.CharTokenizer.from_text(text_mod.corpus_text()).chars
    steps = QUICK_STEPS if quick else spec["steps"]
    torch.manual_seed(spec["seed"])
    model = build(spec, chars)
    start = time.perf_counter()
    history = train(model, _batch_fn(spec, chars), steps=steps, lr=spec["lr"], seed=spec["seed"],
                    progress=progress, desc=name)
    record = {"name": name, "spec": spec, "chars": chars, "steps_done": steps,
              "final_loss": round(history.smoothed("loss", 50)[-1], 4),
              "curve": {"every": CURVE_EVERY,  # training-batch accuracy, running mean of 20 steps
                        "accuracy": [round(a, 3) for a in
                                     history.smoothed("accuracy")[CURVE_EVERY - 1::CURVE_EVERY]]},
              "result": measure(name, model, spec, chars),
              "parameters": sum(p.numel() for p in model.parameters()),
              "seconds": round(time.perf_counter() - start, 1),
              "made_with": shipped.made_with(),
              "command": f"python -m course_lib.stacking.pretrained {name}"
                         + ("" if seed is None else f" --seed {seed}")}
    return model, record


def save(model: torch.nn.Module, record: dict, folder: Path = DATA,
         seed: int | None = None) -> Path:
    """Write the weights and the record; with `seed`, the record alone (`_seed<k>.json`)."""
    if seed is not None:
        return shipped.save_record(record, folder, f"ch10_{record['name']}_seed{seed}")
    return shipped.save(model, record, folder, f"ch10_{record['name']}")


def record(name: str, folder: Path = DATA, seed: int | None = None) -> dict:
    """The JSON record shipped with model `name` (of another seed's run, if given)."""
    check_choice(name, "name", sorted(SPECS))
    tail, again = ("", "") if seed is None else (f"_seed{seed}", f" --seed {seed}")
    return shipped.read_record(folder, f"ch10_{name}{tail}",
                               f"python -m course_lib.stacking.pretrained {name}{again}")


def load(name: str, folder: Path = DATA) -> torch.nn.Module:
    """Model `name` with its shipped weights, in eval mode (the text model also gets
    `.tokenizer`, its `CharTokenizer`)."""
    rec = record(name, folder)
    model = shipped.load_weights(build(rec["spec"], rec["chars"]), folder, f"ch10_{name}")
    if rec["chars"] is not None:
        model.tokenizer = text_mod.CharTokenizer(rec["chars"])
    return model


def main(argv: list[str] | None = None) -> int:
    parser = shipped.parser(__name__, __doc__, SPECS)
    parser.add_argument("--seed", type=int, default=None,
                        help="train with this seed instead and write its record only")
    args = shipped.parse(parser, argv, SPECS)
    for name in args.names:
        with threads(1):  # what made_with() records, whatever the machine's core count
            model, rec = make(name, quick=args.quick, progress=sys.stderr.isatty(),
                              seed=args.seed)
        path = save(model, rec, args.out, seed=args.seed)
        print(f"{name}: {rec['steps_done']} steps in {rec['seconds']} s, {rec['result']} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

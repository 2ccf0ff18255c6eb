"""Multiple choice that only reasoning decides: no form strategy beats chance by more than an item.

Every `choice_check` of the course (found in course_lib/checks, not listed here) is read from
the files a learner meets, without a kernel: its options (the bullets of the solution
notebook's markdown cell just before the answer cell), its right letter and hint tiers
(hints/<chapter>.md, read by `choice_texts` and `chapter_hints`), and the printout the learner
has just seen (the committed outputs of the exercise's cells before the options).

A strategy that reads the form of the options, not their content, picks one option per item
(a tie shares its credit among the tied options); its score over the course is compared with
chance, the sum over items of 1/k (k options each). A strategy may score at most chance + 1:

* always the same letter, and never a given letter (the letter distribution);
* the longest option, the shortest;
* the most hedged option (HEDGES), the one with the fewest absolutes (ABSOLUTES);
* an option the printout does not contradict (PRINTOUTS: what each item's learner saw, and
  which options those numbers refute); besides, no option a distractor states is refuted by
  the printout at all: a distractor is wrong in how it works, not in what it predicts.

Per item, the options are of comparable length (LENGTH_RATIO_MAX), and no hint tier (all are
shown before the answer is recorded) shares more than HINT_SHARE_MAX of the right option's
content words, nor more of them than of some distractor's.

A new choice item needs an entry in PRINTOUTS: the strings of the output its learner has just
seen (each must occur in the exercise's committed outputs) and, per option the numbers refute,
why.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from course_lib.checks._hints import chapter_hints
from course_lib.checks._predict import choice_texts
from course_tools.exercises import BEGIN_SOLUTION, hints_in

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ROOT / "course_lib" / "checks"

LENGTH_RATIO_MAX = 1.35   # longest option / shortest option, per item
HINT_SHARE_MAX = 0.34     # of the right option's content words one hint tier may hold
HINT_LEAD_MAX = 0.10      # ... more than of the closest distractor's (about a word: noise)

HEDGES = ("most", "mostly", "some", "partly", "part", "not all", "about", "roughly",
          "unevenly", "nearly", "almost", "a little", "somewhat", "can", "may", "might",
          "tends", "tend", "usually", "often", "largely", "close to", "around", "slightly",
          "little", "few", "several", "only part")
ABSOLUTES = ("always", "never", "every", "all", "any", "exactly", "whatever", "only",
             "nothing", "cannot", "can't", "fully", "single", "none", "no", "entirely",
             "completely", "whole", "each", "must", "just")
STOPWORDS = frozenset("""
a an the and or but of to in on at by for from with as is are was were be been being it its
this that these those so than then there their they them which what when where who whom how
into onto out over under up down not no do does did has have had can may will would should
one two same other others each every all any only more most less least very just also here
""".split())

# What each item's learner saw just before the options (strings of the committed outputs) and
# which options those numbers refute ({letter: why}); an empty dict: none of them.
PRINTOUTS: dict[str, dict] = {
    "ch01.temperature_why": {
        "printed": ("scores (one per key): [ 2.  1. -2. -1.]",
                    "returns 10.00 with weights [1.0, 0.0, 0.0, 0.0]",
                    "returns 24.85 with weights [0.255, 0.252, 0.245, 0.247]"),
        "refuted": {},  # a cut-off, an overflow onto key 0 (the best key): both give 10 and ~25
    },
    "ch02.shuffle_why": {
        "printed": ("differ from the original outputs by up to 2.789", "by less than 1e-9"),
        "refuted": {},  # a symmetric grid, row-wise maps: both predict outputs that only move
    },
    "ch03.entropy_why": {
        "printed": ("unscaled 0.59 nats", "scaled 3.69 nats", "log 64 = 4.16"),
        "refuted": {},  # large mean scores, spread from the 64 keys (n = d_k): both fit
    },
    "ch05.flop_why": {
        "printed": ("393,216 FLOPs with 1 head", "3,145,728 with 4 heads", "8x"),
        "refuted": {},  # geometric mean, doubling per head, rates swapped: each gives 8x
    },
    "ch06.ratio_why": {
        "printed": ("this attention keeps 2,048 times the RNN's numbers",),
        "refuted": {},  # W = d = 4096 and 32 layers = 32 heads: each wrong count gives 2,048
    },
    "ch07.blind_why": {
        "printed": ("moves the masked outputs by below 1e-5",),
        "refuted": {},  # a fixed mask, uniform weights: both predict a blind layer
    },
    "ch08.fraction_why": {
        "printed": ("spends 0.5625 of the full FLOPs (36 of the 64 tiles)",),
        "refuted": {},  # 28 + 8 tiles either way: an extra softmax tile, half tiles rounded up
    },
    "ch09.crossover_why": {
        "printed": ("n = 6144 tokens", "scores+blend = 154.6 GFLOP and the rest = 154.6 GFLOP"),
        "refuted": {},  # a fixed length, a head-count dependence: both give 6,144 at d = 1024
    },
    "ch10.head_why": {
        "printed": ("the model scores 0.83 (1.00 with every head)",),
        "refuted": {},  # a leak through the residual, heads that take over: both fit 0.83
    },
    "ch11.values_why": {
        "printed": ("the model scores 1.00 (1.00 as trained; 0.10 with its keys patched",),
        "refuted": {},  # values that never matter, an MLP reading the clean stream: both fit 1.00
    },
}

_OPTION = re.compile(r'^\* `"([a-z])"`: (.*)$')
_ANSWER = re.compile(r'^\s*(\w+)\s*=\s*"([a-z])"', re.M)


@dataclass
class Item:
    check_id: str
    letters: str
    options: dict[str, str]   # letter -> the option's text, as the learner reads it
    right: str
    answer: str | None        # the letter the solution's answer cell holds
    tiers: tuple[str, ...]    # every hint tier a learner may read before answering
    outputs: str              # the committed outputs of the exercise's cells before the options

    @property
    def k(self) -> int:
        return len(self.letters)


def _declared_choices() -> list[tuple[str, str, str]]:
    """(chapter, name, letters) of every `choice_check(...)` call in the chapters' modules."""
    found = []
    for path in sorted(CHECKS.rglob("*.py")):
        m = re.match(r"(ch\d+)", path.relative_to(CHECKS).parts[0])
        if m is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "choice_check"
                    and len(node.args) >= 3):
                name, letters = (ast.literal_eval(a) for a in node.args[1:3])
                found.append((m.group(1), name, letters))
    return found


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        text = out.get("text") or out.get("data", {}).get("text/plain", "")
        parts.append("".join(text) if isinstance(text, list) else text)
    return "".join(parts)


def _options(markdown: str) -> dict[str, str]:
    """The bullets `* `"a"`: text` of an option cell (continuation lines indented), as text."""
    options: dict[str, str] = {}
    letter = None
    for line in markdown.splitlines():
        m = _OPTION.match(line)
        if m:
            letter = m.group(1)
            options[letter] = m.group(2)
        elif letter and line.startswith("  ") and line.strip():
            options[letter] += " " + line.strip()
        else:
            letter = None
    return {k: re.sub(r"[$`*\\]|[;.]$", "", v).strip() for k, v in options.items()}


@cache
def _notebooks() -> dict[str, list[dict]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8"))["cells"]
            for p in sorted((ROOT / "solutions").glob("*.ipynb"))}


def _item(chapter: str, name: str, letters: str) -> Item | None:
    """The item as a learner meets it, or None while no solution notebook holds its answer."""
    grade_id = f"{chapter}_{name}"
    for cells in _notebooks().values():
        at = [i for i, c in enumerate(cells)
              if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id]
        if not at:
            continue
        i, cell = at[0], cells[at[0]]
        md = next(j for j in range(i - 1, -1, -1) if cells[j]["cell_type"] == "markdown")
        start = next((j for j in range(md, -1, -1) if cells[j]["cell_type"] == "markdown"
                      and _source(cells[j]).startswith("## ")), 0)
        texts, right = choice_texts(f"{chapter}.{name}", letters)
        answer = _ANSWER.search(_source(cell).partition(BEGIN_SOLUTION)[2])
        return Item(check_id=f"{chapter}.{name}", letters=letters,
                    options=_options(_source(cells[md])), right=right,
                    answer=answer.group(2) if answer else None,
                    tiers=tuple(dict.fromkeys((*chapter_hints(chapter).get(name, ()),
                                               *hints_in(_source(cell))))),
                    outputs="".join(_output_text(c) for c in cells[start:md]))
    return None


@cache
def _found() -> dict[str, Item | None]:
    return {f"{d[0]}.{d[1]}": _item(*d) for d in _declared_choices()}


def items() -> tuple[Item, ...]:
    return tuple(item for item in _found().values() if item is not None)


def _count(words: tuple[str, ...], text: str) -> int:
    text = text.lower()
    return sum(len(re.findall(rf"(?<![\w']){re.escape(w)}(?![\w'])", text)) for w in words)


def _content(text: str) -> set[str]:
    words = re.findall(r"[a-z]+", text.lower())
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w
            for w in words if len(w) > 2 and w not in STOPWORDS}


def _pick(item: Item, score: Callable[[str], float]) -> float:
    """The credit of the strategy that picks the option of highest `score` (ties share it)."""
    values = {letter: score(text) for letter, text in item.options.items()}
    best = max(values.values())
    tied = [letter for letter, v in values.items() if v == best]
    return 1 / len(tied) if item.right in tied else 0.0


def _uncontradicted(item: Item) -> float:
    refuted = set(PRINTOUTS.get(item.check_id, {}).get("refuted", {}))
    standing = [letter for letter in item.letters if letter not in refuted]
    return 1 / len(standing) if item.right in standing else 0.0


def _strategies() -> dict[str, Callable[[Item], float]]:
    letters = sorted({x for item in items() for x in item.letters})
    found: dict[str, Callable[[Item], float]] = {}
    for x in letters:
        found[f"always {x!r}"] = lambda item, x=x: float(item.right == x)
        found[f"never {x!r}"] = lambda item, x=x: (
            (item.right != x) / (item.k - (x in item.letters)))
    found["the longest"] = lambda item: _pick(item, len)
    found["the shortest"] = lambda item: _pick(item, lambda t: -len(t))
    found["the most hedged"] = lambda item: _pick(item, lambda t: _count(HEDGES, t))
    found["the fewest absolutes"] = lambda item: _pick(item, lambda t: -_count(ABSOLUTES, t))
    found["one the printout does not refute"] = _uncontradicted
    return found


def _ids() -> list[str]:
    return [item.check_id for item in items()]


def test_the_course_has_choice_items_and_each_reads_whole():
    homeless = [cid for cid, item in _found().items() if item is None]
    assert not homeless, f"no solution notebook holds the answer cell of {homeless}"
    assert len(items()) >= 9
    for item in items():
        assert "".join(sorted(item.options)) == item.letters, (
            f"{item.check_id}: the option cell lists {''.join(item.options)!r}, the check "
            f"{item.letters!r}")
        assert item.answer == item.right, (
            f"{item.check_id}: the solution answers {item.answer!r}, the hints mark "
            f"{item.right!r} right")
        assert item.check_id in PRINTOUTS, (
            f"{item.check_id}: declare in PRINTOUTS what its learner saw just before the options"
            f" and which options those numbers refute")


@pytest.mark.parametrize("strategy", list(_strategies()))
def test_no_form_strategy_beats_chance_by_more_than_one_item(strategy):
    pick = _strategies()[strategy]
    credits = {item.check_id: pick(item) for item in items()}
    chance = sum(1 / item.k for item in items())
    score = sum(credits.values())
    won = ", ".join(f"{cid} {c:.2g}" for cid, c in credits.items() if c)
    assert score <= chance + 1, (
        f"picking {strategy} scores {score:.2f} over {len(credits)} items, chance {chance:.2f} "
        f"(at most {chance + 1:.2f}): {won}")


@pytest.mark.parametrize("check_id", _ids())
def test_the_printout_refutes_no_option(check_id):
    item = next(i for i in items() if i.check_id == check_id)
    declared = PRINTOUTS[check_id]
    for text in declared["printed"]:
        assert text in item.outputs, (f"{check_id}: PRINTOUTS says the learner saw {text!r}; "
                                      f"the exercise's outputs do not hold it")
    assert item.right not in declared["refuted"], f"{check_id}: the right option is refuted"
    assert not declared["refuted"], (
        f"{check_id}: the printout refutes {declared['refuted']}: a distractor should predict "
        f"what the learner saw and be wrong in how it works")


@pytest.mark.parametrize("check_id", _ids())
def test_options_are_of_comparable_length(check_id):
    item = next(i for i in items() if i.check_id == check_id)
    lengths = {letter: len(text) for letter, text in item.options.items()}
    ratio = max(lengths.values()) / min(lengths.values())
    assert ratio <= LENGTH_RATIO_MAX, (
        f"{check_id}: option lengths {lengths}, longest/shortest {ratio:.2f} (at most "
        f"{LENGTH_RATIO_MAX})")


@pytest.mark.parametrize("check_id", _ids())
def test_no_hint_tier_restates_the_right_option(check_id):
    item = next(i for i in items() if i.check_id == check_id)
    words = {letter: _content(text) for letter, text in item.options.items()}
    problems = []
    for n, tier in enumerate(item.tiers, 1):
        seen = _content(tier)
        share = {letter: len(w & seen) / len(w) for letter, w in words.items() if w}
        right = share.pop(item.right)
        if right > HINT_SHARE_MAX or right > max(share.values()) + HINT_LEAD_MAX:
            problems.append(f"tier {n} holds {right:.0%} of the right option's content words "
                            f"(at most {HINT_SHARE_MAX:.0%}, and at most {HINT_LEAD_MAX:.0%} "
                            f"more than of a distractor's), the distractors' "
                            f"{', '.join(f'{x} {s:.0%}' for x, s in share.items())}: {tier!r}")
    assert not problems, f"{check_id}:\n" + "\n".join(problems)

"""Chapter 10's shipped models: the weights load, their records match the command that makes
them, and the command's short version runs."""

import json

import pytest
import torch

from course_lib.models import TinyTransformer
from course_lib.models.recall import RecurrentModel
from course_lib.stacking import pretrained
from course_lib.stacking.pronoun import PronounTask
from course_lib.stacking.text import CharTokenizer, corpus_text

NAMES = list(pretrained.SPECS)


@pytest.mark.parametrize("name", NAMES)
def test_shipped_weights_match_their_recorded_configuration(name):
    record = pretrained.record(name)
    assert record["name"] == name
    assert record["spec"] == pretrained.SPECS[name], "the code's spec and the shipped one differ"
    assert record["steps_done"] == record["spec"]["steps"], "shipped weights from a --quick run"
    assert record["command"] == f"python -m course_lib.stacking.pretrained {name}"
    model = pretrained.load(name)  # strict load_state_dict: every tensor present, right shapes
    assert not model.training
    assert sum(p.numel() for p in model.parameters()) == record["parameters"]
    expected = TinyTransformer if record["spec"]["model"] == "TinyTransformer" else RecurrentModel
    assert type(model) is expected
    state = torch.load(pretrained.DATA / f"ch10_{name}.pt", weights_only=True)
    assert all(type(v) is torch.Tensor for v in state.values())  # a plain state dict


def test_shipped_weights_are_small():
    total = sum(p.stat().st_size for p in pretrained.DATA.glob("ch10_*.pt"))
    assert total < 5 * 2**20


def test_the_recorded_results_are_what_the_lecture_relies_on():
    assert pretrained.record("induction_2layer")["result"]["test_accuracy"] > 0.95
    assert pretrained.record("induction_1layer")["result"]["test_accuracy"] < 0.3
    for name in ("pronoun_transformer", "pronoun_gru"):
        assert min(pretrained.record(name)["result"].values()) > 0.9


def test_pronoun_specs_fit_the_task():
    task = PronounTask(**pretrained.SPECS["pronoun_transformer"]["task_args"])
    assert pretrained.SPECS["pronoun_transformer"]["model_args"]["vocab_size"] == task.vocab_size
    assert pretrained.SPECS["pronoun_transformer"]["model_args"]["max_len"] == task.n
    assert pretrained.SPECS["pronoun_gru"]["model_args"]["num_classes"] == task.vocab_size


def test_the_text_model_keeps_its_own_alphabet():
    model = pretrained.load("text")
    tokenizer = model.tokenizer
    assert isinstance(tokenizer, CharTokenizer)
    assert tokenizer.vocab_size == model.vocab_size
    sentence = 'The "if" statement is used for conditional execution'
    assert tokenizer.decode(tokenizer.encode(sentence)) == sentence
    assert tokenizer.chars == "".join(sorted(tokenizer.chars))  # sorted, as from_text makes it
    assert len(set(corpus_text()) & set(tokenizer.chars)) > 0.9 * tokenizer.vocab_size


def test_the_short_version_of_the_command_runs_and_writes_loadable_files(tmp_path, capsys):
    names = ["induction_2layer", "pronoun_gru", "text"]
    assert pretrained.main(["--quick", "--out", str(tmp_path), *names]) == 0
    out = capsys.readouterr().out
    for name in names:
        record = json.loads((tmp_path / f"ch10_{name}.json").read_text())
        assert record["steps_done"] == pretrained.QUICK_STEPS
        assert record["spec"] == pretrained.SPECS[name]
        assert f"{name}: {pretrained.QUICK_STEPS} steps" in out
        pretrained.load(name, tmp_path)


def test_the_command_is_seeded():
    a, rec_a = pretrained.make("induction_1layer", quick=True, progress=False)
    b, rec_b = pretrained.make("induction_1layer", quick=True, progress=False)
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), k
    assert rec_a["result"] == rec_b["result"]


def test_bad_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="name must be one of"):
        pretrained.record("nonsense")
    with pytest.raises(SystemExit):
        pretrained.main(["nonsense", "--out", str(tmp_path)])

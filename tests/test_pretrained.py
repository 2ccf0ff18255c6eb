"""Chapter 10's shipped models: the weights load, their records match the command that makes
them, and the command's short version runs."""

import json

import pytest
import torch

from course_lib.models import TinyTransformer
from course_lib.models.recall import RecurrentModel
from course_lib.stacking import pretrained
from course_lib.stacking.pronoun import PairsTask
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
    attention = pretrained.record("pairs_transformer")["result"]
    gru = pretrained.record("pairs_gru")["result"]
    asked_first = pretrained.record("pairs_gru_question_first")["result"]
    m_max = pretrained.SPECS["pairs_gru"]["task_args"]["max_pairs"]
    assert min(attention[f"accuracy_m{m}"] for m in range(1, m_max + 1)) > 0.9
    assert gru[f"accuracy_big_m{m_max}"] < 0.5 < gru["accuracy_m1"]  # the GRU falls with m ...
    assert min(asked_first[f"accuracy_m{m}"] for m in range(1, m_max + 1)) > 0.9  # or asked first


@pytest.mark.parametrize("name", NAMES)
def test_shipped_weights_reproduce_their_recorded_results(name):
    record = pretrained.record(name)
    model = pretrained.load(name)
    again = pretrained.measure(name, model, record["spec"], record["chars"])
    assert again.keys() == record["result"].keys()
    for key, value in record["result"].items():  # another CPU may flip a near-tie or two
        assert again[key] == pytest.approx(value, abs=0.011 if "accuracy" in key else 2e-3), key


@pytest.mark.parametrize("name", ["pairs_transformer", "pairs_gru", "pairs_gru_question_first"])
def test_the_other_seeds_are_shipped_as_records_of_the_same_spec(name):
    for seed in (1, 2):
        record = pretrained.record(name, seed=seed)
        assert record["spec"] == {**pretrained.SPECS[name], "seed": seed}
        assert record["steps_done"] == record["spec"]["steps"]
        assert record["command"] == f"python -m course_lib.stacking.pretrained {name} --seed {seed}"
        assert record["result"].keys() == pretrained.record(name)["result"].keys()
    assert not list(pretrained.DATA.glob(f"ch10_{name}_seed*.pt"))  # records, not weights


def test_pairs_specs_fit_the_task():
    for name in ("pairs_transformer", "pairs_gru", "pairs_gru_question_first"):
        spec = pretrained.SPECS[name]
        task = PairsTask(**spec["task_args"])
        assert spec["model_args"]["vocab_size"] == task.vocab_size
        assert spec["model_args"].get("max_len", task.n) == task.n
        assert spec["model_args"].get("num_classes", task.vocab_size) == task.vocab_size
    # the same GRU and the same budget, asked the other way round
    gru, first = pretrained.SPECS["pairs_gru"], pretrained.SPECS["pairs_gru_question_first"]
    assert gru["model_args"] == first["model_args"] and gru["steps"] == first["steps"]


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
    names = ["induction_2layer", "pairs_gru", "text"]
    assert pretrained.main(["--quick", "--out", str(tmp_path), *names]) == 0
    out = capsys.readouterr().out
    for name in names:
        record = json.loads((tmp_path / f"ch10_{name}.json").read_text())
        assert record["steps_done"] == pretrained.QUICK_STEPS
        assert record["spec"] == pretrained.SPECS[name]
        assert f"{name}: {pretrained.QUICK_STEPS} steps" in out
        pretrained.load(name, tmp_path)


def test_another_seed_writes_a_record_and_no_weights(tmp_path, capsys):
    assert pretrained.main(["--quick", "--out", str(tmp_path), "--seed", "3", "pairs_gru"]) == 0
    assert not list(tmp_path.glob("*.pt"))
    record = pretrained.record("pairs_gru", tmp_path, seed=3)
    assert record["spec"] == {**pretrained.SPECS["pairs_gru"], "seed": 3}
    assert record["command"] == "python -m course_lib.stacking.pretrained pairs_gru --seed 3"
    with pytest.raises(FileNotFoundError, match="--seed 4"):
        pretrained.record("pairs_gru", tmp_path, seed=4)


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

"""Using a fine-tuned model: --epochs 0, --init of a fine-tuned preset, resume after SIGKILL, --keep best,
kgpt-predict, and output directories that are never silently destroyed."""

import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import TINY, char_tokenizer, commands_in_one_process, one_backend

import kgpt
from kgpt.errors import ConfigError, OutputDirError
from kgpt.jobs import finetune as finetune_lib
from kgpt.jobs import predict as predict_lib
from kgpt.jobs.config import FinetuneConfig

SUBJECTS = ["the sun", "ice", "a dog", "the moon", "salt", "iron", "a cat", "rain", "sand", "a fish", "wood", "gold"]
FACTS = ["is hot", "is cold", "can swim", "is a star", "melts", "rusts", "is wet", "floats"]


def write_data(folder, sizes=(("train", 24), ("dev", 8), ("test", 6))):
    """A small SciTail-format dataset (premise, hypothesis, label); the label depends on the words."""
    os.makedirs(folder / "tsv_format", exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in sizes:
        rows = []
        for _ in range(n):
            subject, fact, other = rng.choice(SUBJECTS), rng.choice(FACTS), rng.choice(FACTS)
            same = bool(rng.integers(2))
            rows.append(f"{subject} {fact}.\t{subject} {fact if same else other}.\t{'entails' if same else 'neutral'}")
        (folder / "tsv_format" / f"scitail_1.0_{split}.tsv").write_text("\n".join(rows) + "\n")
    return str(folder)


def make_preset(path):
    tokenizer = char_tokenizer()
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size(), "max_sequence_length": 64})
    backbone.save_to_preset(str(path))
    tokenizer.save_to_preset(str(path))
    return str(path)


def config(preset, data, out, **overrides):
    fields = dict(
        task="scitail",
        data_dir=data,
        init=preset,
        output_dir=out,
        epochs=2,
        batch_size=8,
        learning_rate=1e-3,
        max_length=64,
        seed=3,
    )
    return FinetuneConfig(**{**fields, **overrides})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One fine-tuning run shared by the tests below: `(preset, data, out, results)`."""
    root = tmp_path_factory.mktemp("trained")
    preset, data = make_preset(root / "preset"), write_data(root / "data")
    out = str(root / "out")
    _, results = finetune_lib.finetune(config(preset, data, out, keep="best", epochs=3))
    return preset, data, out, results


def test_epochs_0_on_the_fine_tuned_preset_reproduces_its_scores_and_predictions(trained, tmp_path, capsys, progress):
    preset, data, out, results = trained
    _, again = finetune_lib.finetune(config(out, data, str(tmp_path / "eval"), epochs=0, batch_size=None))
    lines = capsys.readouterr().out.splitlines()
    assert any("keeping its classification head, evaluating it without training" in line for line in lines)
    assert again["splits"]["dev"]["accuracy"] == results["splits"]["dev"]["accuracy"]
    assert "history" not in again and again["init_dir"] == os.path.abspath(out)
    for split in ("dev", "test"):
        assert (tmp_path / "eval" / "predictions" / f"{split}.tsv").read_text() == open(
            os.path.join(out, "predictions", f"{split}.tsv")
        ).read()


def test_init_must_be_fine_tuned_for_epochs_0_and_for_the_same_task(trained, tmp_path):
    preset, data, out, _ = trained
    with pytest.raises(ValueError, match="epochs=0 evaluates a fine-tuned model, but --init .* is not one"):
        finetune_lib.finetune(config(preset, data, None, epochs=0))
    with pytest.raises(
        ValueError,
        match=r"fine-tuned for task 'scitail', not 'snli': pass --task scitail .* "
        rf"\(it was fine-tuned from {preset}\)",
    ):
        finetune_lib.finetune(config(out, data, None, task="snli"))
    for output_dir in (out, f"file://{os.path.abspath(out)}"):  # --overwrite would have cleared the model
        with pytest.raises(ValueError, match=r"^--init .* is the output directory .*, which the run writes"):
            finetune_lib.finetune(config(out, data, output_dir, epochs=0))


def test_keep_best_records_the_epoch_whose_dev_score_is_kept(trained):
    _, _, out, results = trained
    scores = results["history"]["val_accuracy"]
    assert len(scores) == 3 and results["keep"] == "best"
    best = int(np.argmax(scores))  # the first of equal scores, as a strict improvement keeps
    assert results["kept_epoch"] == best + 1
    assert results["splits"]["dev"]["accuracy"] == pytest.approx(scores[best])
    history = open(os.path.join(out, "history.csv")).read().splitlines()
    assert history[0].startswith("epoch,") and [r.split(",")[0] for r in history[1:]] == ["0", "1", "2"]


@one_backend("tensorflow")
def test_kgpt_predict_agrees_with_from_preset_predict(trained, tmp_path):
    _, data, out, _ = trained
    pairs = [("the sun is hot.", "the sun is hot."), ("ice melts.", "a cat can swim."), ("gold rusts.", "gold rusts.")]
    text, short = tmp_path / "pairs.txt", tmp_path / "short.txt"
    text.write_text("".join(f"{p}\t{h}\n" for p, h in pairs))
    short.write_text("the sun is hot.\tthe sun is hot.\nonly one segment\n")
    dev = os.path.join(data, "tsv_format", "scitail_1.0_dev.tsv")
    before = open(dev).read()
    output = tmp_path / "p.tsv"
    done, bad, cut, same = commands_in_one_process(
        "kgpt.cli.predict",
        [
            [f"--model={out}", f"--input={text}", f"--output={output}"],
            [f"--model={out}", f"--input={short}", f"--output={tmp_path / 'q.tsv'}"],
            [f"--model={out}", f"--data_dir={data}", "--split=dev", "--max_length=8", f"--output={tmp_path / 'd.tsv'}"],
            [f"--model={out}", f"--data_dir={data}", "--split=dev", f"--output={dev}", "--overwrite"],
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = output.read_text().splitlines()
    assert lines[0] == "id\tprediction\tp_entails\tp_neutral"
    rows = [line.split("\t") for line in lines[1:]]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    model = kgpt.GPTTaskModel.from_preset(out)
    expected = model.head.probabilities(model.predict(tuple(map(list, zip(*pairs)))))
    np.testing.assert_allclose(np.array([[float(r[2]), float(r[3])] for r in rows]), expected, atol=1e-4)
    assert [r[1] for r in rows] == model.predict_labels(tuple(map(list, zip(*pairs))))
    # A line with one segment for a two-segment task: one line naming the file and line, exit 1.
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert f"{short}:2: entailment needs 2 text segments, got 1" in bad.stderr
    assert not (tmp_path / "q.tsv").exists()
    # A split of the task's own files: its rows cut to --max_length are counted, as --input's are.
    assert cut.returncode == 0, cut.stderr[-3000:]
    assert re.search(r"dev: (\d+) read, \1 used, \1 truncated \(\d+ tokens cut\)\.", cut.stdout), cut.stdout
    # --output naming the split's own file, with --overwrite: it was replaced by its predictions.
    assert same.returncode == 1 and "Traceback" not in same.stderr, same.stderr[-3000:]
    assert f"--output {dev} is {dev}, a file of the 'dev' split it predicts" in same.stderr
    assert open(dev).read() == before


def test_predict_reads_named_columns_and_reports_bad_rows(tmp_path):
    transform = kgpt.tasks.transforms.Entailment()
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text(
        '{"id": "a7", "premise": "p", "hypothesis": "h", "label": "entails"}\n{"id": "b", "premise": "q"}\n'
    )
    with pytest.raises(kgpt.DataError, match=r"x.jsonl:2: no 'hypothesis' field\.$"):
        predict_lib.read_inputs(str(jsonl), transform)
    # As training reads a table: null named as null, and a number read as its text (it was refused here).
    jsonl.write_text('{"premise": "p", "hypothesis": null}\n')
    with pytest.raises(kgpt.DataError, match=r"x.jsonl:1: 'hypothesis' is null, not text or a number\.$"):
        predict_lib.read_inputs(str(jsonl), transform)
    jsonl.write_text('{"premise": "p", "hypothesis": 5}\n')
    assert predict_lib.read_inputs(str(jsonl), transform).examples == [(("p", "5"), ())]
    jsonl.write_text('{"id": "a7", "premise": "p", "hypothesis": "h", "label": "entails"}\n')
    inputs = predict_lib.read_inputs(str(jsonl), transform)
    assert (
        inputs.examples == [(("p", "h"), ())] and inputs.ids == ["a7"] and inputs.columns == ["premise", "hypothesis"]
    )
    # A built-in single-text model (no recorded columns) on a table with a source and the gold label: every
    # column was joined into the text.
    csv_path = tmp_path / "s.csv"
    csv_path.write_text("id,sentence,source,sentiment\n1,a fine film,web,positive\n")
    with pytest.raises(ConfigError, match=r"s\.csv: its columns sentence, source, sentiment would all be read as text"):
        predict_lib.read_inputs(str(csv_path), kgpt.tasks.transforms.Classification())
    assert predict_lib.read_inputs(str(csv_path), kgpt.tasks.transforms.Classification(), columns=["sentence"]).examples
    tsv = tmp_path / "x.tsv"
    tsv.write_text("index\tq\tctx\tans\n3\tq?\tc\tyes\n")
    inputs = predict_lib.read_inputs(str(tsv), transform, columns=["ctx", "ans"])
    assert inputs.examples == [(("c", "yes"), ())] and inputs.ids == ["3"]
    choice = kgpt.tasks.transforms.MultipleChoice(2)
    assert predict_lib.read_inputs(str(tsv), choice, columns=["ctx", "q", "ans"]).examples == [(("c",), ("q?", "yes"))]
    text = tmp_path / "x.txt"
    text.write_text("a\tb\n\nc\td\n")
    with pytest.raises(kgpt.DataError, match=r"x.txt:2: blank line inside the data"):
        predict_lib.read_inputs(str(text), transform)
    # Multiple choice over 2 answers: a line of 2 fields was read as 2 contexts and no answer.
    text.write_text("the context\tyes\tno\nthe context\tyes\n")
    with pytest.raises(kgpt.DataError) as raised:
        predict_lib.read_inputs(str(text), kgpt.tasks.transforms.MultipleChoice(2))
    assert str(raised.value) == (
        f"{text}:2: 2 field(s); a choice among 2 answers needs at least 3: the context segment(s), then the 2 answers."
    )
    # A model trained on one column: two tab-separated fields were joined into one text without a word.
    text.write_text("a good film\na bad\tfilm\n")
    with pytest.raises(kgpt.DataError) as raised:
        predict_lib.read_inputs(str(text), kgpt.tasks.transforms.Classification(), trained=["review"])
    assert str(raised.value) == (
        f"{text}:2: 2 tab-separated field(s); the model was trained on 1 column(s) (review): give each line 1."
    )
    # A multiple-choice line with one answer too many: read as a second context without a word.
    text.write_text("ctx\tyes\tno\nctx\tyes\tno\tmaybe\n")
    choose = kgpt.tasks.transforms.MultipleChoice(2)
    with pytest.raises(kgpt.DataError, match=rf"^{text}:2: 4 tab-separated field\(s\); the model was trained on 3 "):
        predict_lib.read_inputs(str(text), choose, trained=["question", "a", "b"])
    # A built-in task's model (RACE: an article and a question, 4 answers) records no columns: its transformation
    # keeps the context count, so a line with a fifth answer is not read as a third context.
    race = kgpt.TaskRegistry().get("race").transform
    text.write_text("article\tquestion\ta\tb\tc\td\narticle\tquestion\ta\tb\tc\td\te\n")
    with pytest.raises(kgpt.DataError) as raised:
        predict_lib.read_inputs(str(text), race)
    assert str(raised.value) == (
        f"{text}:2: 7 field(s); the model takes 2 context segment(s), then its 4 answers: give 6."
    )
    text.write_text("article\tquestion\ta\tb\tc\td\n")
    assert predict_lib.read_inputs(str(text), race).examples == [(("article", "question"), ("a", "b", "c", "d"))]
    preprocessor = kgpt.GPTTaskPreprocessor(
        char_tokenizer(), choose, sequence_length=16, columns=["question", "a", "b"]
    )
    with pytest.raises(ValueError, match=r"2 text segment\(s\), where the model was fine-tuned on 1 text column\(s\) "):
        preprocessor.encode(["ctx", "more"], ["yes", "no"])
    preprocessor.encode(["ctx"], ["yes", "no"])


def test_output_directories_are_claimed_and_never_silently_replaced(trained, tmp_path):
    preset, data, out, _ = trained
    # Another task's (or another setting's) outputs are refused, naming what differs.
    with pytest.raises(OutputDirError, match=r"holds a finetune run with other settings \(.*seed: 3 there, 4 now"):
        finetune_lib.finetune(config(preset, data, out, seed=4, keep="best", epochs=3))
    # Files kgpt did not write are refused too; --overwrite writes beside them.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(OutputDirError, match=r"already holds files .*notes.txt"):
        finetune_lib.finetune(config(preset, data, str(mine), epochs=1))
    # A directory in use by a live run is refused.
    from kgpt.jobs.rundir import RunDirectory

    with RunDirectory(str(tmp_path / "busy"), "finetune", {"a": 1}):
        with pytest.raises(OutputDirError, match=r"busy is in use by another kgpt run \(pid"):
            with RunDirectory(str(tmp_path / "busy"), "finetune", {"a": 1}):
                pass


def test_a_model_saved_from_python_into_a_run_folder_is_refused(trained, tmp_path):
    """A run's output directory holds the model the run wrote; saving another over it from Python would replace
    it without a word. The run itself writes there (the fixture's run did), and a new folder takes the preset."""
    _, _, out, _ = trained
    model = kgpt.GPTTaskModel.from_preset(out)
    before = {name: os.path.getmtime(os.path.join(out, name)) for name in ("task.weights.h5", "model.weights.h5")}
    with pytest.raises(
        OutputDirError, match=r"out is the output directory of a kgpt finetune run \(run.json\), which "
    ):
        model.save_to_preset(out)
    assert before == {name: os.path.getmtime(os.path.join(out, name)) for name in before}
    model.save_to_preset(str(tmp_path / "copy"))
    assert kgpt.GPTTaskModel.from_preset(str(tmp_path / "copy")).task_name == "scitail"
    lm_run = tmp_path / "lm_run"
    lm_run.mkdir()
    (lm_run / "run.json").write_text(json.dumps({"job": "pretrain", "settings": {}}))
    backbone = kgpt.GPTBackbone(**TINY)
    for saved in (kgpt.GPTCausalLM(backbone), backbone, model.preprocessor.tokenizer):  # every kind of preset
        with pytest.raises(OutputDirError, match=r"lm_run is the output directory of a kgpt pretrain run"):
            saved.save_to_preset(str(lm_run))
    assert os.listdir(lm_run) == ["run.json"]


def test_a_checkpoint_past_the_fine_tuning_runs_last_step_is_refused_naming_its_file(trained, tmp_path):
    """A resumed run takes no checkpoint past epochs x steps per epoch (here 3 x 3), however it came there."""
    import shutil

    preset, data, out, _ = trained
    copy = tmp_path / "out"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    checkpoints = copy / "checkpoint"
    name = json.loads((checkpoints / "latest.json").read_text())["checkpoint"]
    assert name == "step-000000009"
    state = json.loads((checkpoints / name / "state.json").read_text())
    (checkpoints / name / "state.json").write_text(json.dumps({**state, "step": 12}))
    (checkpoints / name).rename(checkpoints / "step-000000012")
    (checkpoints / "latest.json").write_text(json.dumps({"checkpoint": "step-000000012"}))
    with pytest.raises(kgpt.CheckpointError, match=r"step-000000012.state\.json says step 12, past this run's 9 steps"):
        finetune_lib.finetune(config(preset, data, str(copy), keep="best", epochs=3))


def test_the_same_command_on_an_edited_dev_file_says_its_scores_are_of_other_examples(trained, tmp_path, caplog):
    import shutil

    preset, data, out, _ = trained
    copy = shutil.copytree(data, tmp_path / "data")
    evaluation = config(out, copy, str(tmp_path / "eval"), epochs=0, batch_size=None)
    _, first = finetune_lib.finetune(evaluation)
    dev = pathlib.Path(copy, "tsv_format", "scitail_1.0_dev.tsv")
    dev.write_text("".join(dev.read_text().splitlines(keepends=True)[1:]))  # its first row deleted
    caplog.set_level(logging.WARNING, logger="kgpt")
    _, again = finetune_lib.finetune(evaluation)
    warned = [r.getMessage() for r in caplog.records if "examples differ" in r.getMessage()]
    assert warned == [
        f"Warning: the dev examples differ from those this run scored before (metrics.json: accuracy "
        f"{first['splits']['dev']['accuracy']:.4f}): the file changed; its scores below are of the data as it is now."
    ]
    assert again["splits"]["test"]["data"] == first["splits"]["test"]["data"] != again["splits"]["dev"]["data"]


def test_a_finished_run_whose_checkpoints_went_says_so_before_it_trains_again(trained, tmp_path, caplog):
    import shutil

    preset, data, out, _ = trained
    copy = tmp_path / "out"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    # The pointer gone, the folders there: the run started over without a word.
    (copy / "checkpoint" / "latest.json").unlink()
    with pytest.raises(kgpt.CheckpointError, match=r"checkpoint holds step-000000009 but no latest\.json, which"):
        finetune_lib.finetune(config(preset, data, str(copy), keep="best", epochs=3))
    shutil.rmtree(copy / "checkpoint")  # to free the disk: the same command trained again, replacing the model
    caplog.set_level(logging.WARNING, logger="kgpt")
    finetune_lib.finetune(config(preset, data, str(copy), keep="best", epochs=3))
    assert any("holds a finished run's outputs but no checkpoint" in r.getMessage() for r in caplog.records)


def test_a_missing_or_damaged_weights_file_of_a_checkpoint_is_named(trained, tmp_path):
    """The best epoch's weights, read back when a run resumed after it, gave h5py's words (the step checkpoints'
    were named already): both go through checkpoint.load_weights."""
    from kgpt.train import checkpoint as checkpoint_lib

    _, _, out, _ = trained
    model = kgpt.GPTTaskModel.from_preset(out)
    path = tmp_path / "model.weights.h5"
    with pytest.raises(kgpt.CheckpointError, match=rf"^{path}: the checkpoint is missing\.$"):
        checkpoint_lib.load_weights(model, str(path))
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(1000))  # an HDF5 signature, then nothing
    with pytest.raises(kgpt.CheckpointError, match=rf"^{path} is not a readable Keras weights file \(truncated or"):
        checkpoint_lib.load_weights(model, str(path))


RUN = """
import sys
from kgpt.jobs import finetune
from kgpt.jobs.config import FinetuneConfig
config = FinetuneConfig(**__import__("json").loads(sys.argv[1]))
finetune.finetune(config)
"""


def test_a_run_killed_mid_training_resumes_to_the_same_weights_and_predictions(tmp_path, capsys, progress):
    preset, data = make_preset(tmp_path / "preset"), write_data(tmp_path / "data")
    fields = dict(
        task="scitail",
        data_dir=data,
        init=preset,
        epochs=3,
        batch_size=8,
        learning_rate=1e-3,
        max_length=64,
        seed=5,
        checkpoint_every=2,
        classifier_dropout=0.3,
    )
    reference = tmp_path / "reference"
    finetune_lib.finetune(FinetuneConfig(**fields, output_dir=str(reference)))

    killed = tmp_path / "killed"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-c", RUN, json.dumps({**fields, "output_dir": str(killed)})]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pointer = killed / "checkpoint" / "latest.json"
    deadline = time.time() + 600
    while not pointer.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert pointer.exists() and not (killed / "metrics.json").exists(), "killed before the end"
    step = json.loads(
        (killed / "checkpoint" / json.loads(pointer.read_text())["checkpoint"] / "state.json").read_text()
    )
    assert 0 < step["step"] < 9

    finetune_lib.finetune(FinetuneConfig(**fields, output_dir=str(killed)))
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"Resuming from the checkpoint at step {step['step']}") for line in lines)
    for split in ("dev", "test"):
        assert (killed / "predictions" / f"{split}.tsv").read_bytes() == (
            reference / "predictions" / f"{split}.tsv"
        ).read_bytes()
    a = kgpt.GPTTaskModel.from_preset(str(reference)).get_weights()
    b = kgpt.GPTTaskModel.from_preset(str(killed)).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    history = json.loads((killed / "metrics.json").read_text())["history"]
    assert len(history["loss"]) == 3
    assert (killed / "history.csv").read_text().splitlines()[0] == (reference / "history.csv").read_text().splitlines()[
        0
    ]
    # Another learning rate with this checkpoint: refused, naming the difference.
    with pytest.raises(OutputDirError, match=r"learning_rate: 0.001 there, 0.002 now"):
        finetune_lib.finetune(FinetuneConfig(**{**fields, "learning_rate": 2e-3}, output_dir=str(killed)))


def test_a_non_finite_loss_stops_the_run_before_anything_is_saved(tmp_path):
    preset, data = make_preset(tmp_path / "preset"), write_data(tmp_path / "data", (("train", 32), ("dev", 4)))
    out = tmp_path / "out"
    with pytest.raises(kgpt.train.callbacks.NonFiniteLossError, match=r"The training loss is (nan|inf) at step \d+"):
        finetune_lib.finetune(config(preset, data, str(out), learning_rate=1e30, epochs=2))
    assert not (out / "config.json").exists() and not (out / "metrics.json").exists()


def test_a_run_without_a_dev_split_whose_outputs_are_nan_stops_before_anything_is_saved(tmp_path):
    """As below without a dev split: the weights stay finite, the outputs are NaN; one batch of training examples
    run forward at the last epoch's end shows it, before the last checkpoint."""
    preset, data = make_preset(tmp_path / "preset"), write_data(tmp_path / "data", (("train", 16),))
    out = tmp_path / "out"
    with pytest.raises(
        kgpt.train.callbacks.NonFiniteLossError,
        match=r"The model's outputs on 8 training examples are NaN or infinite after step 2, its weights finite: "
        r"training stopped .*Lower --learning_rate",
    ):
        finetune_lib.finetune(config(preset, data, str(out), learning_rate=1e30, epochs=1))
    assert not (out / "config.json").exists() and not (out / "metrics.json").exists()
    assert not (out / "checkpoint" / "latest.json").exists()


def test_an_update_that_breaks_the_model_at_the_last_step_stops_the_run_before_anything_is_saved(tmp_path):
    """Two steps (the first at the warm-up's learning rate 0): the last one's loss, computed before its update, is
    finite; the dev loss after it is not (test_train_callbacks checks the weights themselves)."""
    sizes = (("train", 16), ("dev", 4))
    preset, data = make_preset(tmp_path / "preset"), write_data(tmp_path / "data", sizes)
    out = tmp_path / "out"
    with pytest.raises(
        kgpt.train.callbacks.NonFiniteLossError, match=r"The validation loss is nan after step 2 .*Lower"
    ):
        finetune_lib.finetune(config(preset, data, str(out), learning_rate=1e30, epochs=1))
    assert not (out / "config.json").exists() and not (out / "metrics.json").exists()
    assert not (out / "checkpoint" / "latest.json").exists()

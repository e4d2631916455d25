"""Fine-tuning end to end on the built-in SciTail task: files, counts, errors, outputs."""

import json
import os
import re

import numpy as np
import pytest
from conftest import TINY, char_tokenizer, one_backend, to_numpy

import kgpt
from kgpt.errors import ConfigError
from kgpt.jobs import finetune as finetune_lib
from kgpt.jobs import finetune_data, finetune_model
from kgpt.jobs.config import FinetuneConfig
from kgpt_tasks import scitail, scitail_demo


def config(preset, tmp_path, **overrides):
    fields = dict(
        task="scitail",
        init=preset,
        output_dir=str(tmp_path / "out"),
        epochs=1,
        batch_size=16,
        learning_rate=1e-3,
        max_length=128,
    )
    return FinetuneConfig(**{**fields, **overrides})


def preprocessor(preset, task, max_length):
    return kgpt.GPTTaskPreprocessor(kgpt.GPTTokenizer.from_preset(preset), task.transform, sequence_length=max_length)


def write_tsv(folder, split, rows):
    os.makedirs(folder / "tsv_format", exist_ok=True)
    path = folder / "tsv_format" / f"scitail_1.0_{split}.tsv"
    path.write_bytes(b"".join(r if isinstance(r, bytes) else (r + "\n").encode() for r in rows))
    return str(path)


def test_embedded_scitail_run_writes_metrics_predictions_and_model(tiny_preset, tmp_path):
    model, results = finetune_lib.finetune(config(tiny_preset, tmp_path))
    out = tmp_path / "out"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics == json.loads(json.dumps(results))
    expected = {s: len(scitail_demo.rows(s)) for s in ("train", "dev", "test")}
    for split, n in expected.items():
        assert metrics["splits"][split]["examples"]["read"] == n
        assert metrics["splits"][split]["examples"]["skipped"] == 0
    for split in ("dev", "test"):
        assert 0.0 <= metrics["splits"][split]["accuracy"] <= 1.0
        lines = (out / "predictions" / f"{split}.tsv").read_text().splitlines()
        assert lines[0] == "id\tprediction\tp_entails\tp_neutral\tlabel" and len(lines) == expected[split] + 1
        rows = [line.split("\t") for line in lines[1:]]
        assert {r[1] for r in rows} <= set(scitail.LABELS)
        # Ids are relative to the data directory, and the probabilities pick the prediction.
        assert rows[0][0] == f"tsv_format/scitail_1.0_{split}.tsv:1"
        for r in rows:
            p = np.array([float(r[2]), float(r[3])])
            assert abs(p.sum() - 1) < 1e-5 and r[1] == scitail.LABELS[int(p.argmax())]
    assert set(metrics["history"]) >= {"loss", "task_loss", "lm_loss", "val_task_accuracy", "val_accuracy"}
    # The task's own metric after the last epoch is the final dev score, in history.csv too.
    assert metrics["history"]["val_accuracy"][-1] == pytest.approx(metrics["splits"]["dev"]["accuracy"])
    assert "val_accuracy" in (out / "history.csv").read_text().splitlines()[0].split(",")
    share = metrics["real_token_share"]
    assert 0 < share["train"] <= 1.0 and share["train_padded_lengths"]
    if not model.jit_compile:  # without XLA every bucket length is used: better than padding to the longest
        assert share["train_padded_to_longest"] < share["train"]
    assert os.listdir(out / "logs")  # TensorBoard
    # The output is a preset that finds its task's plugin again and predicts identically.
    loaded, tokenizer, task = kgpt.load_finetuned(str(out))
    assert (
        task.name == "scitail" and tokenizer.fingerprint() == kgpt.GPTTokenizer.from_preset(tiny_preset).fingerprint()
    )
    split = finetune_data.encode_split(task, "dev", str(out / "data"), loaded.preprocessor)
    np.testing.assert_allclose(loaded.predict(split), model.predict(split), rtol=1e-5, atol=1e-6)
    # ... and on raw text, without the plugin: label names and probabilities.
    texts = (["The sun is a star.", "Ice is cold."], ["The sun is hot.", "A dog barks."])
    standalone = kgpt.GPTTaskModel.from_preset(str(out))
    probabilities = standalone.head.probabilities(standalone.predict(texts))
    assert probabilities.shape == (2, 2) and np.allclose(probabilities.sum(-1), 1.0, atol=1e-5)
    assert standalone.predict_labels(texts) == [scitail.LABELS[i] for i in probabilities.argmax(-1)]


def test_truncation_and_skipped_rows_are_counted(tiny_preset, tmp_path):
    data = tmp_path / "data"
    write_tsv(
        data,
        "train",
        ["a long premise about the sun and the moon\tthe sun is hot\tentails", "short\t \tneutral", "x\ty\tneutral"],
    )
    task = kgpt.TaskRegistry().get("scitail")
    split = finetune_data.encode_split(task, "train", str(data), preprocessor(tiny_preset, task, 20))
    # One character per token: 33 + 11 text tokens, 20 - 3 specials fit.
    assert split.counts == {
        "read": 3,
        "used": 2,
        "skipped": 1,
        "skipped_reasons": {"empty text field": 1},
        "truncated": 1,
        "tokens_cut": 33 + 11 - (20 - 3),
    }
    assert split.view_lengths.tolist() == [[20], [5]]


@pytest.mark.parametrize(
    "row, message",
    [
        ("premise only\tentails", r"scitail_1.0_train.tsv:2: expected 3 tab-separated fields, got 2"),
        ("p\th\tcontradiction", r"scitail_1.0_train.tsv:2: label 'contradiction' is not one of 'entails', 'neutral'"),
        (b"p\xff\th\tentails\n", r"scitail_1.0_train.tsv:2: byte 2 of the line \(0xff\) is not valid UTF-8"),
    ],
)
def test_malformed_rows_name_file_and_line(tiny_preset, tmp_path, row, message):
    data = tmp_path / "data"
    write_tsv(data, "train", ["good premise\tgood hypothesis\tentails", row])
    task = kgpt.TaskRegistry().get("scitail")
    with pytest.raises(kgpt.DataError, match=message):
        finetune_data.encode_split(task, "train", str(data), preprocessor(tiny_preset, task, 64))


def test_snli_format_jsonl_reads_like_the_tsv(tmp_path):
    rows = [("The sun is a star.", "The sun is a star.", "entailment"), ("Ice melts.", "Ice floats.", "neutral")]
    tsv = tmp_path / "tsv"
    write_tsv(tsv, "dev", [f"{p}\t{h}\t{'entails' if g == 'entailment' else g}" for p, h, g in rows])
    snli = tmp_path / "snli" / "snli_format"
    snli.mkdir(parents=True)
    (snli / "scitail_1.0_dev.txt").write_text(
        "".join(json.dumps({"sentence1": p, "sentence2": h, "gold_label": g}) + "\n" for p, h, g in rows)
    )
    from_tsv = [(e.segments, e.label) for e in scitail.read("dev", str(tsv))]
    from_jsonl = [(e.segments, e.label) for e in scitail.read("dev", str(tmp_path / "snli"))]
    assert (
        from_tsv
        == from_jsonl
        == [(("The sun is a star.", "The sun is a star."), "entails"), (("Ice melts.", "Ice floats."), "neutral")]
    )
    (snli / "scitail_1.0_dev.txt").write_text(
        '{"sentence1": "a", "sentence2": "b", "gold_label": "entailment"}\n{oops\n'
    )
    with pytest.raises(kgpt.DataError, match=r"scitail_1.0_dev.txt:2: not valid JSON"):
        list(scitail.read("dev", str(tmp_path / "snli")))


def test_missing_files_list_the_paths_tried(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"No SciTail train file found; tried .*tsv_format/scitail_1.0_train.tsv"
    ):
        list(scitail.read("train", str(tmp_path)))


def test_missing_eval_split_is_reported_not_fatal(tiny_preset, tmp_path, capsys, progress):
    data = scitail_demo.write(str(tmp_path / "data"))
    os.remove(os.path.join(data, "tsv_format", "scitail_1.0_test.tsv"))
    _, results = finetune_lib.finetune(config(tiny_preset, tmp_path, data_dir=data, output_dir=None))
    messages = capsys.readouterr().out.splitlines()
    assert set(results["splits"]) == {"train", "dev"}
    assert any(m.startswith("Split 'test' not evaluated: No SciTail test file found") for m in messages)


def test_a_run_leaves_numpy_global_generator_alone(tiny_preset, tmp_path):
    """kgpt's batch order and new embeddings come from generators seeded by the config: NumPy's global generator
    belongs to the application, and a run neither draws from it nor seeds it."""
    data = scitail_demo.write(str(tmp_path / "data"))
    np.random.seed(1234)
    before = np.random.get_state()
    finetune_lib.finetune(config(tiny_preset, tmp_path, data_dir=data, output_dir=None))
    after = np.random.get_state()
    assert np.array_equal(after[1], before[1]) and after[2:] == before[2:]


def test_transfer_layers_copies_embeddings_and_first_blocks(backbone):
    partial = finetune_model.transfer(backbone, 1)

    def same(a, b):
        return all(np.array_equal(to_numpy(x), to_numpy(y)) for x, y in zip(a.weights, b.weights))

    assert same(partial.token_embedding, backbone.token_embedding)
    assert same(partial.position_embedding, backbone.position_embedding)
    assert same(partial.transformer_layers[0], backbone.transformer_layers[0])
    assert not same(partial.transformer_layers[1], backbone.transformer_layers[1])
    assert finetune_model.transfer(backbone, None) is backbone
    with pytest.raises(ValueError, match=r"transfer_layers must be in 0..2, got 3"):
        finetune_model.transfer(backbone, 3)


def test_special_tokens_are_added_when_missing(backbone):
    tokenizer = kgpt.GPTTokenizer({f"t{i}": i for i in range(backbone.vocabulary_size)}, [])
    grown = kgpt.models.pretrained.with_special_tokens(backbone, tokenizer)
    assert grown.vocabulary_size == backbone.vocabulary_size + 3 == tokenizer.vocabulary_size()
    with pytest.raises(ValueError, match="do not belong together"):
        kgpt.models.pretrained.with_special_tokens(backbone, kgpt.GPTTokenizer({"a": 0}, []))


def test_init_must_be_a_preset_or_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="is neither a kgpt preset .* nor an original GPT-1 checkpoint"):
        finetune_lib.finetune(config(str(tmp_path), tmp_path))


def test_fine_tunes_from_the_original_release_format(tmp_path, capsys, progress):
    # The release's layout: BPE files beside the weight shards, no special-token rows.
    tokenizer = char_tokenizer()
    release = tmp_path / "model"
    tokenizer.save(str(release))
    base = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size() - 3, "max_sequence_length": 128})
    base.save_original(str(release))
    model, results = finetune_lib.finetune(config(str(release), tmp_path, num_heads=TINY["num_heads"]))
    lines = capsys.readouterr().out.splitlines()
    assert any(f"model from original checkpoint {release}" in line for line in lines)
    assert model.backbone.vocabulary_size == tokenizer.vocabulary_size()  # start/delimiter/extract added
    assert 0.0 <= results["splits"]["dev"]["accuracy"] <= 1.0


def run_cli(command, *args):
    from kgpt.cli import train

    return command(train, *args)


def test_cli_fine_tunes_from_a_preset(tiny_preset, tmp_path, command):
    data = scitail_demo.write(str(tmp_path / "data"))
    result = run_cli(
        command,
        "--task=scitail",
        f"--data_dir={data}",
        f"--init={tiny_preset}",
        "--epochs=1",
        f"--output_dir={tmp_path / 'cli'}",
        "--batch_size=32",
        "--lm_coef=0",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test: accuracy" in result.stdout
    assert "lm_coef 0.0" in result.stdout
    assert (tmp_path / "cli" / "metrics.json").exists()


def test_cli_errors(command):
    result = run_cli(command, "--task=scitial")
    assert result.returncode != 0
    assert "Unknown task 'scitial'. Did you mean 'scitail'?" in result.stderr
    result = run_cli(command, "--task=scitail", "--data_dir=somewhere")
    assert result.returncode != 0 and "pass --init PRESET_DIR" in result.stderr


def test_cli_lists_tasks(command):
    result = run_cli(command, "--list_tasks")
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(
        r"scitail\s+scitail\s+entailment\s+classification\s+entails,neutral\s+accuracy\s+88.3 acc", result.stdout
    )


@one_backend("tensorflow")
def test_scratch_baseline_fine_tunes_fresh_weights_beside_the_pretrained_model_and_logs_both(
    tiny_preset, tmp_path, capsys, progress
):
    # A batch larger than the training set: one update an epoch, warned of once for both runs.
    model, results = finetune_lib.finetune(config(tiny_preset, tmp_path, scratch_baseline=True, batch_size=10**4))
    out = tmp_path / "out"
    baseline = json.loads((out / "no_pretraining" / "metrics.json").read_text())
    assert baseline["init"].startswith("fresh weights (no pre-training)")
    assert json.loads((out / "metrics.json").read_text()) == json.loads(json.dumps(results))  # the main run's
    assert (out / "no_pretraining" / "predictions" / "dev.tsv").exists()
    out_text = capsys.readouterr().out
    warned = [line for line in out_text.splitlines() if "training examples" in line]
    assert len(warned) == 1 and re.fullmatch(
        r"Warning: batch_size 10,000 is more than the (\d+) training examples: each epoch is one update on all \1 "
        r"of them\.",
        warned[0],
    ), warned
    table = out_text[out_text.index("Pre-training's effect on scitail") :]
    for split in ("dev", "test"):
        ours, theirs = results["splits"][split]["accuracy"], baseline["splits"][split]["accuracy"]
        assert f"{ours:.4f}" in table and f"{theirs:.4f}" in table and f"{ours - theirs:+.4f}" in table
    # The same shape and vocabulary as the pre-trained model.
    fresh = kgpt.GPTTaskModel.from_preset(str(out / "no_pretraining"))
    assert fresh.backbone.count_params() == model.backbone.count_params()
    # The same command again finds both runs finished (the baseline's folder inside the run's is not foreign).
    _, again = finetune_lib.finetune(config(tiny_preset, tmp_path, scratch_baseline=True, batch_size=10**4))
    assert again["splits"]["dev"] == results["splits"]["dev"]
    assert capsys.readouterr().out.count("this run finished training; evaluating it.") == 2
    assert json.loads((out / "no_pretraining" / "metrics.json").read_text())["splits"] == baseline["splits"]


@pytest.mark.parametrize(
    "overrides, why",
    [
        (dict(init="scratch"), "no pre-training to compare"),
        (dict(pretrained_weights=False), "is the baseline itself"),
        (dict(epochs=0), "trains nothing"),
    ],
)
def test_scratch_baseline_is_refused_where_there_is_nothing_to_compare(tiny_preset, tmp_path, overrides, why):
    with pytest.raises(ConfigError, match=why):
        finetune_lib.finetune(config(tiny_preset, tmp_path, scratch_baseline=True, **overrides))


def test_the_comparison_table_keeps_every_column_apart():
    # Your own files name their split "validation", longer than the column was: "validationaccuracy 0.6319".
    task = kgpt.TaskRegistry().get("scitail")
    scores = {"validation": {"accuracy": 0.6319, "matthews_corrcoef": 0.25, "examples": {"read": 3}}, "test": {}}
    table = finetune_lib.comparison(
        task, {"splits": scores}, {"splits": {"validation": {"accuracy": 0.5, "matthews_corrcoef": 0.0}}}
    )
    rows = [line.split() for line in table.splitlines()[2:]]
    assert rows == [
        ["validation", "accuracy", "0.6319", "0.5000", "+0.1319"],
        ["validation", "matthews_corrcoef", "0.2500", "0.0000", "+0.2500"],
    ]


def test_only_the_demo_runs_the_baseline_unless_asked():
    base = FinetuneConfig(init="demo")
    assert finetune_lib.runs_baseline(base)
    assert not finetune_lib.runs_baseline(FinetuneConfig(init="demo", scratch_baseline=False))
    assert not finetune_lib.runs_baseline(FinetuneConfig(init="demo", pretrained_weights=False))
    assert not finetune_lib.runs_baseline(FinetuneConfig(init="some/preset"))
    assert finetune_lib.runs_baseline(FinetuneConfig(init="some/preset", scratch_baseline=True))


def test_example_ids_a_task_repeats_are_said(caplog):
    def read(split, data_dir):
        return [kgpt.Example(("a cab",), "x", source=f"f.tsv:{i}", uid=str(i % 2)) for i in range(4)]

    task = kgpt.Task("twice", kgpt.tasks.transforms.Classification(), read, labels=("x", "y"))
    preprocessor = kgpt.GPTTaskPreprocessor(char_tokenizer(), task.transform, sequence_length=16)
    with caplog.at_level("WARNING", logger="kgpt"):  # its predictions file named rows 0, 1, 0, 1
        split = finetune_data.encode_split(task, "train", "data", preprocessor)
    assert split.uids == ["0", "1", "0", "1"]
    assert [r.getMessage() for r in caplog.records] == [
        "Warning: train: 2 example id(s) repeat an earlier one (first '0'), as task 'twice' gives them: its "
        "predictions file cannot tell those rows apart."
    ]

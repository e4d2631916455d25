import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import cli, kill_at_step, one_backend

import kgpt
from kgpt.cli import analyze, train
from kgpt.jobs.config import PretrainConfig
from kgpt.jobs.pretrain import corpus_files, pretrain

TEXT = "The keeper climbed the steps of the tower and wrote the date in the notebook.\n" * 30


def tiny_config(tmp_path, **overrides):
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    (corpus / "a.txt").write_text(TEXT, encoding="utf-8")
    values = dict(
        corpus=str(corpus),
        output_dir=str(tmp_path / "out"),
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        dropout=0.0,
        sequence_length=16,
        batch_size=8,
        learning_rate=1e-2,
        warmup_steps=5,
        max_steps=60,
        evaluations=3,
        sample_tokens=5,
    )
    values.update(overrides)
    return PretrainConfig(**values)


def test_pretrain_learns_and_saves(tmp_path, capsys, progress):
    config = tiny_config(tmp_path)
    lm, tokenizer, metrics = pretrain(config)
    lines = capsys.readouterr().out.splitlines()
    assert metrics["train_loss"][-1] < metrics["train_loss"][0] - 1.0
    assert int(keras.ops.convert_to_numpy(lm.optimizer.iterations)) == config.max_steps
    assert metrics["validation_perplexity"][-1] < metrics["validation_perplexity"][0]
    assert metrics["validation_loss"][-1] < metrics["unigram_loss"]
    assert not any("learned nothing" in line for line in lines)
    assert any(line.startswith("Sample: ") for line in lines)
    out = tmp_path / "out"
    assert json.loads((out / "metrics.json").read_text())["tokens"] == metrics["tokens"]
    assert (out / "history.csv").read_text().count("\n") == 4  # header + 3 evaluations
    loaded = kgpt.GPTCausalLM.from_preset(str(out))
    again = kgpt.GPTTokenizer.from_preset(str(out))
    ids = np.asarray([again.encode("the keeper wrote the date")], "int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(lm(x)), atol=1e-6)
    # The output directory is a preset: backbone and tokenizer load from it directly.
    backbone = kgpt.GPTBackbone.from_preset(str(out))
    assert kgpt.GPTTokenizer.from_preset(str(out)).encode("the keeper") == tokenizer.encode("the keeper")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(backbone(x)), keras.ops.convert_to_numpy(lm.backbone(x)), atol=1e-6
    )
    # ... and fine-tuning starts from it (--init).
    from kgpt.jobs.config import FinetuneConfig
    from kgpt.jobs.finetune import finetune

    _, results = finetune(FinetuneConfig(init=str(out), epochs=1, batch_size=32, lm_coef=0.0, max_length=16))
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("Task scitail (entailment") and f"model from preset {out}" in line for line in lines)
    assert "accuracy" in results["splits"]["test"]


def test_every_requested_step_is_trained(tmp_path, capsys, progress):
    config = tiny_config(tmp_path, max_steps=10, evaluations=3, warmup_steps=1, output_dir=None)
    lm, _, metrics = pretrain(config)
    lines = capsys.readouterr().out.splitlines()
    assert int(keras.ops.convert_to_numpy(lm.optimizer.iterations)) == 10
    assert len(metrics["train_loss"]) == 2
    assert any("Evaluating 2 times (every 5 steps)" in line for line in lines)


def test_evaluation_count():
    from kgpt.jobs.pretrain import evaluation_count

    assert [evaluation_count(200, 5), evaluation_count(10, 3), evaluation_count(7, 3), evaluation_count(3, 10)] == [
        5,
        2,
        1,
        3,
    ]
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1, got 0"):
        evaluation_count(0, 3)


def test_missing_corpus(tmp_path):
    with pytest.raises(FileNotFoundError, match="No corpus files match"):
        pretrain(tiny_config(tmp_path, corpus=str(tmp_path / "nothing*.txt")))


def test_non_utf8_names_file_and_byte(tmp_path):
    config = tiny_config(tmp_path)
    bad = os.path.join(config.corpus, "b.txt")
    with open(bad, "wb") as f:
        f.write(b"caf\xe9 au lait")
    with pytest.raises(ValueError, match=r"b\.txt:1: byte 4 of the line \(0xe9\) is not valid UTF-8"):
        pretrain(config)


def test_empty_files_are_counted(tmp_path, capsys, progress):
    # The schedule of test_every_requested_step_is_trained: the same compiled train step (JAX reuses it).
    config = tiny_config(tmp_path, max_steps=10, evaluations=1, warmup_steps=1)
    open(os.path.join(config.corpus, "empty.txt"), "w").close()
    pretrain(config)
    lines = capsys.readouterr().out.splitlines()
    assert any("Skipped 1 empty file(s)" in line and "empty.txt" in line for line in lines)


def test_a_non_finite_loss_stops_pretraining_and_keeps_the_last_good_checkpoint(tmp_path):
    # The first step's loss is always finite (the initial weights): its checkpoint is written; this
    # learning rate then breaks the weights within a few steps.
    config = tiny_config(tmp_path, max_steps=10, evaluations=1, warmup_steps=1, learning_rate=1e30, checkpoint_every=1)
    with pytest.raises(
        kgpt.train.callbacks.NonFiniteLossError,
        match=r"The training loss is (nan|inf) at step (\d+).*the last checkpoint \(.*\) is kept",
    ) as e:
        pretrain(config)
    failed = int(re.search(r"at step (\d+)", str(e.value)).group(1))
    out = tmp_path / "out"
    assert not (out / "config.json").exists() and not (out / "metrics.json").exists()
    latest = json.loads((out / "checkpoint" / "latest.json").read_text())["checkpoint"]
    state = json.loads((out / "checkpoint" / latest / "state.json").read_text())
    assert 1 <= state["step"] < failed


def test_corpus_smaller_than_a_window(tmp_path):
    config = tiny_config(tmp_path, sequence_length=16)
    with open(os.path.join(config.corpus, "a.txt"), "w") as f:
        f.write("far too short")
    with pytest.raises(ValueError, match="fewer than one window of sequence_length=16"):
        pretrain(config)


def run_cli(command, *args, cwd):
    from kgpt.cli import train

    return command(train, *args, cwd=cwd)


@one_backend("jax")
def test_cli_trains_and_writes_outputs(tmp_path, command):
    config = tiny_config(tmp_path)
    result = run_cli(
        command,
        "--task=lm",
        f"--corpus={config.corpus}",
        f"--output_dir={tmp_path / 'cli'}",
        "--num_layers=1",
        "--num_heads=2",
        "--hidden_dim=16",
        "--intermediate_dim=32",
        "--sequence_length=16",
        "--batch_size=4",
        "--max_steps=8",
        "--warmup_steps=2",
        "--evaluations=2",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Training loss:" in result.stdout and "Sample:" in result.stdout
    assert kgpt.GPTBackbone.from_preset(str(tmp_path / "cli")).num_layers == 1


def test_killed_run_resumes_from_its_checkpoint(tmp_path, monkeypatch, capsys):
    config = tiny_config(tmp_path)
    args = [
        "--task=lm",
        f"--corpus={config.corpus}",
        f"--output_dir={tmp_path / 'run'}",
        "--num_layers=1",
        "--hidden_dim=16",
        "--intermediate_dim=32",
        "--num_heads=2",
        "--sequence_length=16",
        "--batch_size=4",
        "--max_steps=200",
        "--evaluations=4",
        "--warmup_steps=10",
        "--learning_rate=0.01",
        "--checkpoint_every=10",
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    first = subprocess.Popen(
        [sys.executable, "-m", "kgpt.cli.train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    saved = kill_at_step(first, tmp_path / "run" / "checkpoint", 20)
    assert 20 <= saved < 200

    # The resumed runs are the same command run in this process (the killed one shows a separate process's
    # checkpoint is enough; test_cli_trains_and_writes_outputs runs the command as its own process).
    code, out, err = cli(monkeypatch, capsys, train, *args)
    assert code in (0, None), err[-3000:]
    resumed = int(re.search(r"Resuming from the checkpoint at step (\d+)", out).group(1))
    assert resumed >= saved  # a later checkpoint may have landed between the read and the kill
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == resumed
    assert metrics["optimizer_steps"] == 200
    assert "Reusing" in out  # the shards were not tokenized again
    # The whole run's record, not only what came after the resume: 4 evaluations, one history row each.
    assert len(metrics["validation_perplexity"]) == 4 and len(metrics["train_loss"]) == 4
    rows = (tmp_path / "run" / "history.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["0", "1", "2", "3"]
    # Rerunning the finished command trains nothing and changes nothing.
    weights = kgpt.GPTBackbone.from_preset(str(tmp_path / "run")).get_weights()
    code, out, err = cli(monkeypatch, capsys, train, *args)
    assert code in (0, None), err[-3000:]
    assert "Resuming from the checkpoint at step 200" in out
    again = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert again["validation_perplexity"] == metrics["validation_perplexity"]
    assert all(
        np.array_equal(a, b) for a, b in zip(weights, kgpt.GPTBackbone.from_preset(str(tmp_path / "run")).get_weights())
    )


def test_a_run_that_learned_no_more_than_token_frequencies_says_so(tmp_path, capsys, progress):
    # A tiny learning rate for 2 steps: the model stays near uniform, far above the unigram loss.
    config = tiny_config(tmp_path, max_steps=2, evaluations=1, warmup_steps=1, learning_rate=1e-6, sample_tokens=0)
    metrics = pretrain(config)[2]
    out = capsys.readouterr().out
    assert metrics["validation_loss"][-1] > metrics["unigram_loss"] > 0
    assert "The model learned nothing beyond token frequencies: its last validation loss" in out
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["unigram_loss"] == metrics["unigram_loss"]


def test_checkpoint_of_other_settings_is_refused(tmp_path):
    config = tiny_config(tmp_path, max_steps=10, evaluations=1, warmup_steps=1, checkpoint_every=5)
    pretrain(config)
    with pytest.raises(
        ValueError,
        match=r"holds a pretrain run with other settings \(batch_size: 8 there, "
        r"4 now\)",
    ):
        pretrain(tiny_config(tmp_path, max_steps=10, evaluations=1, warmup_steps=1, batch_size=4))
    # Two words swapped: the token count matches, the content does not (it resumed silently).
    config = tiny_config(tmp_path, max_steps=10, evaluations=1, warmup_steps=1, checkpoint_every=5)
    corpus = tmp_path / "corpus" / "a.txt"
    swapped = TEXT.replace("keeper", "@").replace("tower", "keeper").replace("@", "tower")
    corpus.write_text(swapped, encoding="utf-8")
    with pytest.raises(
        ValueError, match=r"holds a checkpoint of a run with other settings \(corpus_crc32: '[0-9a-f]{8}' there"
    ):
        pretrain(config)


def test_pretrain_with_a_tokenizer_learned_from_the_corpus(tmp_path):
    config = tiny_config(tmp_path, tokenizer="train", num_merges=20, max_steps=6, evaluations=1, warmup_steps=1)
    lm, tokenizer, _ = pretrain(config)
    assert len(tokenizer.merges) == 20
    assert lm.backbone.vocabulary_size == tokenizer.vocabulary_size() < 200  # not GPT-1's 40,481
    saved = kgpt.GPTTokenizer.from_preset(str(tmp_path / "out"))
    assert saved.merges == tokenizer.merges
    assert kgpt.GPTBackbone.from_preset(str(tmp_path / "out")).vocabulary_size == tokenizer.vocabulary_size()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task=lm", "--hidden_dim=32", "--num_heads=3"], "hidden_dim 32 must be a multiple of num_heads 3"),
        (["--task=lm", "--max_steps=30"], "warmup_steps 50 is more than max_steps 30: .* Pass warmup_steps 3"),
    ],
)
def test_settings_that_cannot_train_end_in_one_line_before_anything_is_built(
    tmp_path, monkeypatch, capsys, args, message
):
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(monkeypatch, capsys, train, *args, f"--output_dir={out}")
    lines = err.strip().splitlines()
    assert code == 1 and re.search(message, lines[-1]) and "Traceback" not in err, err[-2000:]
    assert not out.exists() or os.listdir(out) == []  # no tokenizer learned, no shards built


@pytest.mark.parametrize("layers", ["0,x", "0,0,1"])
def test_analyze_names_a_bad_layers_flag(layers, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(monkeypatch, capsys, analyze, "transfer", f"--layers={layers}", "--init=demo")
    assert code not in (0, None) and "Traceback" not in err
    assert "--layers takes distinct block counts" in err, err[-2000:]


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_corpus_that_is_no_regular_file_is_refused_not_read_forever(device):
    # /dev/zero has no end: the run tokenized it until killed, while its dry run called it empty.
    with pytest.raises(kgpt.DataError, match=f"--corpus {device} is not a regular file"):
        corpus_files(device)


def test_what_a_corpus_folder_holds_besides_its_txt_files_is_named_and_a_glob_reaches_subfolders(tmp_path, caplog):
    books = tmp_path / "books"
    (books / "more").mkdir(parents=True)
    for name in ("a.txt", "B.TXT", "c.txt.gz", ".hidden.txt", "more/d.txt"):
        (books / name).write_text("text\n")
    with caplog.at_level("WARNING"):
        assert corpus_files(str(books)) == [str(books / "a.txt")]
    assert [r.getMessage() for r in caplog.records] == [
        f"Warning: --corpus {books}: 3 other file(s) not read (.hidden.txt, B.TXT, c.txt.gz): a folder gives its "
        f"*.txt files, hidden ones excepted; name a file *.txt (a .gz decompressed) to read it.",
        f"Warning: --corpus {books}: 1 subfolder(s) not read (more/): to read their *.txt files too, pass a pattern "
        f"in quotes, such as '{books}/**/*.txt'.",
    ]
    assert corpus_files(f"{books}/**/*.txt") == [str(books / "a.txt"), str(books / "more" / "d.txt")]


def test_a_blank_prompt_is_refused_and_a_sample_cut_to_the_context_says_so(caplog):
    from conftest import TINY, char_tokenizer

    from kgpt.jobs import pretrain as pretrain_lib

    tokenizer = char_tokenizer()
    for blank in ("", "   "):  # "" took the held-out text's words; spaces gave "no room for a prompt"
        with pytest.raises(kgpt.ConfigError, match=f"^--prompt {blank!r} gives no token: give it some text"):
            pretrain_lib.check_prompt(blank, 5, 16, tokenizer)
    pretrain_lib.check_prompt("", 0, 16, tokenizer)  # no sample, nothing to check
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size(), "max_sequence_length": 8})
    lm = kgpt.GPTCausalLM(backbone)
    with caplog.at_level("INFO", logger="kgpt"):
        pretrain_lib._sample(lm, tokenizer, "ab", None, 8, 20, 1)
    assert caplog.records[-1].getMessage().endswith("\n  (6 of --sample_tokens 20: the context is 8 tokens)")

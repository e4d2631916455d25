"""One error path: a user's mistake ends a command with one line naming the file, line, flag or plugin, and no
traceback (`--verbose` shows it); most of these fail before any model is built.

The commands run in-process through their real entry points (`kgpt.cli.*.run`, absl and all).
"""

import glob
import json
import os
import sys
import textwrap

import numpy as np
import pytest
from conftest import TINY, char_tokenizer, cli

import kgpt
from kgpt.cli import analyze, train
from kgpt.errors import CheckpointError, DataError, RegistryError


def one_line(code, err, prog="kgpt-train"):
    """The message of a one-line error (exit 1, no traceback)."""
    assert code == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(lines) == 1, err[-3000:]
    return lines[0][len(f"{prog}: error: ") :]


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    """A tiny pre-trained preset, one whose tokenizer belongs to another model (3 ids short), and one whose context
    (3 tokens) leaves no room for a task's view."""
    root = tmp_path_factory.mktemp("presets")
    tokenizer = char_tokenizer()
    ids = tokenizer.vocabulary_size()
    for name, size, context in (("good", ids, 64), ("other_tokenizer", ids - 1, 64), ("short_context", ids, 3)):
        backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": size, "max_sequence_length": context})
        tokenizer.save_to_preset(str(root / name))  # first, as a run saves it: beside the model, it must fit it
        backbone.save_to_preset(str(root / name))
    return root


# --- pre-training: the corpus -------------------------------------------------------------------


def corpus(tmp_path, name, data):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "a.txt").write_bytes(data)
    return str(folder)


def test_empty_corpus_names_its_files(monkeypatch, capsys, presets, tmp_path):
    folder = corpus(tmp_path, "empty", b"")
    code, _, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=lm",
        f"--corpus={folder}",
        "--prepare_only",
        f"--tokenizer={presets / 'good'}",
    )
    assert one_line(code, err) == f"All 1 corpus file(s) are empty (no token): {folder}/a.txt."


def test_corpus_byte_that_is_not_utf8_names_file_and_line(monkeypatch, capsys, presets, tmp_path):
    folder = corpus(tmp_path, "latin1", "first line\nsecond caf\xe9 line\n".encode("latin-1"))
    code, _, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=lm",
        f"--corpus={folder}",
        "--prepare_only",
        f"--tokenizer={presets / 'good'}",
    )
    assert one_line(code, err) == (
        f"{folder}/a.txt:2: byte 11 of the line (0xe9) is not valid UTF-8; re-encode the file as UTF-8."
    )


def test_corpus_shorter_than_a_window_names_the_flag(monkeypatch, capsys, presets, tmp_path):
    folder = corpus(tmp_path, "short", b"far too short\n")
    code, _, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=lm",
        f"--corpus={folder}",
        "--max_steps=10",
        "--warmup_steps=1",
        "--sequence_length=32",
        f"--tokenizer={presets / 'good'}",
    )
    message = one_line(code, err)
    assert "fewer than one window of sequence_length=32 + 1" in message and "lower --sequence_length" in message


def test_a_prompt_with_no_room_for_the_sample_is_refused_before_training(monkeypatch, capsys, presets, tmp_path):
    folder = corpus(tmp_path, "text", b"the cat sat on the mat and the dog ran far away\n" * 20)
    code, _, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=lm",
        f"--corpus={folder}",
        "--max_steps=10",
        "--warmup_steps=1",
        "--sequence_length=8",
        f"--tokenizer={presets / 'good'}",
        "--prompt=the cat sat on the mat and the dog ran far away",
    )
    message = one_line(code, err)
    assert message.startswith("--prompt is ") and "--sequence_length=8" in message and "Epoch" not in err
    assert not (tmp_path / "out").exists()


def test_no_sample_with_sample_tokens_0_and_the_preset_is_saved(monkeypatch, capsys, presets, tmp_path, progress):
    """It crashed in generate after training, before the preset was written."""
    folder = corpus(tmp_path, "text", b"the cat sat on the mat and the dog ran far away\n" * 20)
    code, out, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=lm",
        f"--corpus={folder}",
        "--max_steps=2",
        "--evaluations=1",
        "--warmup_steps=1",
        "--sequence_length=8",
        "--batch_size=2",
        "--num_layers=1",
        "--hidden_dim=8",
        "--intermediate_dim=16",
        "--num_heads=2",
        "--validation_tokens=0",
        "--sample_tokens=0",
        f"--tokenizer={presets / 'good'}",
        f"--output_dir={tmp_path / 'out'}",
    )
    assert code in (0, None), err[-3000:]
    assert "Sample:" not in out and (tmp_path / "out" / "model.weights.h5").exists()


def test_changed_shard_is_one_line(monkeypatch, capsys, presets, tmp_path):
    folder = corpus(tmp_path, "text", b"the cat sat on the mat and the dog ran far away\n" * 20)
    args = (
        "--task=lm",
        f"--corpus={folder}",
        "--prepare_only",
        f"--output_dir={tmp_path / 'out'}",
        f"--tokenizer={presets / 'good'}",
    )
    code, _, err = cli(monkeypatch, capsys, train, *args)
    assert code in (0, None), err[-3000:]
    [shard] = glob.glob(str(tmp_path / "out" / "shards" / "*.bin"))
    data = bytearray(open(shard, "rb").read())
    data[3] ^= 1
    open(shard, "wb").write(bytes(data))
    code, _, err = cli(monkeypatch, capsys, train, *args)
    assert one_line(code, err).startswith(f"{shard}: its CRC-32 is not the one index.json records.")


def test_zero_shot_task_without_heuristic_is_refused_before_pretraining(monkeypatch, capsys, tmp_path):
    code, out, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=lm",
        "--zero_shot=scitail",
        "--max_steps=10",
        "--warmup_steps=1",
        f"--output_dir={tmp_path / 'lm'}",
    )
    assert one_line(code, err).startswith("Task 'scitail' offers no zero-shot heuristic; tasks that do: ")
    assert "Tokenized" not in out and not os.path.exists(tmp_path / "lm" / "shards")


def test_zero_shot_task_without_heuristic_in_kgpt_analyze(monkeypatch, capsys, presets, tmp_path):
    code, out, err = cli(
        monkeypatch,
        capsys,
        analyze,
        "zero-shot",
        f"--init={presets / 'good'}",
        "--tasks=scitail",
        f"--output_dir={tmp_path / 'a'}",
    )
    assert one_line(code, err, "kgpt-analyze").startswith("Task 'scitail' offers no zero-shot heuristic")
    assert "Zero-shot with the model" not in out  # refused before the model was loaded


# --- fine-tuning: flags and presets -------------------------------------------------------------


def test_max_length_below_the_minimum_is_refused_before_anything_is_built(monkeypatch, capsys, tmp_path):
    code, _, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=scitail",
        "--init=scratch",
        "--max_length=2",
        f"--output_dir={tmp_path / 'o'}",
    )
    assert one_line(code, err) == "max_length must be an integer >= 4, got 2."
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry run"])
def test_a_model_whose_context_leaves_no_room_for_a_view_is_named(dry, monkeypatch, capsys, presets, tmp_path):
    flags = ("--task=scitail", f"--init={presets / 'short_context'}", f"--output_dir={tmp_path / 'o'}")
    code, _, err = cli(monkeypatch, capsys, train, *flags, *(["--dry_run"] if dry else []))
    assert one_line(code, err) == (
        "The model's context is 3 token(s); fine-tuning needs at least 4 (the start, delimiter and extract tokens "
        "and one of text): start from a model pre-trained with --sequence_length 4 or more."
    )
    if not dry:  # refused after the claim, which is given back: the corrected command is a new run
        assert os.listdir(tmp_path / "o") == [".lock"]


def test_sequence_length_in_fine_tuning_points_to_max_length(monkeypatch, capsys):
    code, _, err = cli(monkeypatch, capsys, train, "--task=scitail", "--init=scratch", "--sequence_length=64")
    assert code == 2 and "Traceback" not in err
    assert (
        "--sequence_length only applies to pre-training (--task lm); remove it (a fine-tuned model's context is "
        "--max_length)."
    ) in err


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--dropout=0.99"], "--dropout"),
        (["--attention_dropout=0", "--initializer_range=0.5"], "--initializer_range, --attention_dropout"),
        (["--hidden_dim=8"], "--hidden_dim"),
    ],
)
def test_a_new_models_settings_with_a_pretrained_init_are_refused_not_ignored(
    flags, named, monkeypatch, capsys, presets
):
    # They once ran with the preset's own dropout, run.json recording the flag's.
    code, _, err = cli(monkeypatch, capsys, train, "--task=scitail", f"--init={presets / 'good'}", *flags, "--dry_run")
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert (
        f"{named} set(s) a new model's size or dropout (--init scratch); --init {presets / 'good'} keeps its own" in err
    )
    # What docs/guide-finetuning.md offers instead, in Python.
    assert kgpt.GPTBackbone.from_preset(str(presets / "good"), dropout=0.0).dropout == 0.0


def test_dropout_of_a_new_model_must_be_a_rate(monkeypatch, capsys):
    code, _, err = cli(monkeypatch, capsys, train, "--task=scitail", "--init=scratch", "--dropout=1", "--dry_run")
    assert "Traceback" not in err and code != 0
    assert "dropout" in err and "[0, 1)" in err, err[-2000:]


def test_an_empty_list_flag_is_refused_not_read_as_left_out(monkeypatch, capsys):
    code, _, err = cli(monkeypatch, capsys, train, "--task=text-classification", "--metrics=", "--dry_run")
    assert code == 2 and "Traceback" not in err
    assert "--metrics is empty: name one or more, comma-separated (or leave the flag out)." in err


def test_the_command_names_a_file_tasks_options_as_flags(monkeypatch, capsys, tmp_path):
    (tmp_path / "t.csv").write_text("review,stars\na,1\nb,2\n")
    base = ("--task=text-classification", "--init=scratch", "--dry_run")
    code, _, err = cli(monkeypatch, capsys, train, *base, f"--train_file={tmp_path / 't.csv'}", "--label_column=stars")
    assert code == 1 and "Traceback" not in err
    assert "--text_columns: name the text column(s) of" in err
    code, _, err = cli(
        monkeypatch,
        capsys,
        train,
        *base,
        f"--train_file={tmp_path / 't.csv'}",
        "--text_columns=text",
        "--label_column=stars",
    )
    assert "no column 'text' (--text_columns); it has 'review', 'stars'" in err
    # Python names them by keyword (test_generic_tasks), here too once the command has ended.
    with pytest.raises(kgpt.ConfigError, match=r"^text_columns: name the text"):
        kgpt.TaskRegistry().get("text-classification").with_files(str(tmp_path / "t.csv"), label_column="stars")


def test_commands_overlapping_in_threads_leave_python_names_behind():
    import threading

    from kgpt import checks

    entered, leave = threading.Barrier(2), threading.Event()

    def command():
        with checks.command_line():
            entered.wait(timeout=30)
            leave.wait(timeout=30)

    other = threading.Thread(target=command)
    other.start()
    with checks.command_line():  # A enters, B enters, A leaves, B leaves: a saved flag left it on for good
        entered.wait(timeout=30)
    assert checks.option("train_file") == "--train_file"  # the other command still runs
    leave.set()
    other.join(timeout=30)
    assert checks.option("train_file") == "train_file" and checks.option("input", "path") == "path"


def test_preset_with_another_models_tokenizer(monkeypatch, capsys, presets, tmp_path):
    preset = presets / "other_tokenizer"
    code, _, err = cli(
        monkeypatch, capsys, train, "--task=scitail", f"--init={preset}", "--epochs=1", f"--output_dir={tmp_path / 'o'}"
    )
    assert one_line(code, err) == (
        f"{preset}: the model has 97 token embeddings but the preset's tokenizer 98 ids (95 without start/delimiter/"
        f"extract): the tokenizer files belong to another model. Save the model's own tokenizer beside it."
    )


def test_preset_naming_a_function_as_its_class(presets, tmp_path):
    preset = tmp_path / "function"
    preset.mkdir()
    for name in os.listdir(presets / "good"):
        if os.path.isfile(presets / "good" / name):
            (preset / name).write_bytes((presets / "good" / name).read_bytes())
    config = json.loads((preset / "config.json").read_text())
    config.update(module="kgpt.layers.decoder_block", class_name="gelu_tanh", registered_name="kgpt>gelu_tanh")
    (preset / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json describes 'kgpt>gelu_tanh', expected 'kgpt>GPTBackbone'"):
        kgpt.GPTBackbone.from_preset(str(preset))
    with pytest.raises(CheckpointError, match="describes 'kgpt>gelu_tanh'"):
        kgpt.models.pretrained.load_pretrained(str(preset))


def test_npy_header_claiming_terabytes_is_named_not_allocated(tmp_path):
    from kgpt.models.converters import original

    path = tmp_path / "params_0.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
        f.write(np.zeros(4, "float32").tobytes())
    with pytest.raises(
        CheckpointError,
        match=r"params_0.npy is not a readable .npy array .*header describes float32 "
        r"of shape \(1099511627776,\) \(4,398,046,511,104 bytes\), the file "
        r"holds 16",
    ):
        original.read_shards(str(tmp_path), [(4,)])


# --- readers ------------------------------------------------------------------------------------


def test_snli_row_without_gold_label_names_file_and_line(tmp_path):
    path = tmp_path / "snli_1.0_train.jsonl"
    rows = [
        {"gold_label": "neutral", "sentence1": "a man", "sentence2": "a person", "pairID": "1"},
        {"sentence1": "a dog", "sentence2": "an animal", "pairID": "2"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=rf"^{path}:2: missing field 'gold_label'\."):
        list(kgpt.TaskRegistry().get("snli").read("train", str(tmp_path)))


def test_story_cloze_quoted_field_keeps_its_newline(tmp_path):
    from kgpt_tasks.qa import STORY_COLUMNS

    path = tmp_path / "val.csv"
    path.write_text(
        ",".join(STORY_COLUMNS)
        + "\n"
        + 'id1,One.,"Two\nthree.",Four.,Five.,Good end.,Bad end.,1\n'
        + "id2,A.,B.,C.,D.,E.,F.,2\n"
    )
    first, second = kgpt.TaskRegistry().get("story-cloze").read("val", str(tmp_path))
    assert first.segments == ("One. Two\nthree. Four. Five.",) and first.source == f"{path}:2"
    assert second.source == f"{path}:4" and second.label == 1


def test_single_class_training_split_warns(tmp_path, capsys, progress):
    from kgpt.jobs import finetune_data

    task = kgpt.Task(
        name="one-class",
        transform=kgpt.tasks.transforms.Classification(),
        labels=("no", "yes"),
        read=lambda split, data_dir: [kgpt.Example((f"text {i}",), "yes", source=f"{split}:{i}") for i in range(3)],
    )
    preprocessor = kgpt.GPTTaskPreprocessor(char_tokenizer(), task.transform, sequence_length=16)
    finetune_data.read_splits(task, str(tmp_path), preprocessor)
    assert (
        "every one of the 3 examples of task 'one-class''s training split 'train' has the label 'yes': the "
        "model can only learn to predict it"
    ) in capsys.readouterr().out


# --- plugins ------------------------------------------------------------------------------------


def plugin(source, name):
    import types

    module = types.ModuleType(name)
    exec(textwrap.dedent(source), module.__dict__)  # noqa: S102 - the test's own plugin source
    return module


def test_hook_with_the_wrong_signature_is_named(tmp_path):
    bad = plugin(
        """
        import kgpt

        @kgpt.hookimpl
        def register_tasks(add, extra):
            pass
    """,
        "kgpt_bad_signature",
    )
    registry = kgpt.TaskRegistry(plugins=[bad], entry_points=[])
    [problem] = registry.problems()
    assert problem == (
        "plugin 'kgpt_bad_signature' (registered directly (kgpt_bad_signature)): @kgpt.hookimpl "
        "register_tasks(add, extra) does not take the arguments kgpt passes (register_tasks(register)); "
        "a hook may take fewer of them, by these names, but no other, so the plugin is not loaded"
    )
    assert registry.broken[0].stage == "hooks"


def test_task_named_like_a_builtin_says_it_is_ignored(capsys, progress):
    claim = plugin(
        """
        import kgpt

        @kgpt.hookimpl
        def register_tasks(register):
            register(kgpt.Task(name="rte", transform=kgpt.tasks.transforms.Classification(), labels=("a", "b"),
                               read=lambda split, data_dir: []))
    """,
        "kgpt_claims_rte",
    )
    registry = kgpt.TaskRegistry(plugins=[claim])
    capsys.readouterr()
    assert registry.entry("rte").builtin
    registry.get("rte")  # said once
    assert capsys.readouterr().out.splitlines() == [
        "Task 'rte' is the built-in one of plugin 'glue'; plugin 'kgpt_claims_rte' (registered directly "
        "(kgpt_claims_rte)) also registers a task 'rte', which is ignored: rename it in that plugin to use it."
    ]


@pytest.fixture
def broken_site(tmp_path, monkeypatch):
    """A distribution whose plugin module fails to import, on sys.path."""
    site = tmp_path / "site"
    info = site / "kgpt_crashes-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kgpt-crashes\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kgpt]\ncrashes = kgpt_test_crashes\n")
    (site / "kgpt_test_crashes.py").write_text("def helper():\n    return 1 / 0\n\n\nhelper()\n")
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("kgpt_test_crashes", None)


def test_verbose_shows_a_broken_plugins_traceback(monkeypatch, capsys, broken_site):
    code, out, err = cli(monkeypatch, capsys, train, "--list_tasks")
    assert code in (0, None) and "failed in import: ZeroDivisionError: division by zero" in out
    assert "Traceback" not in out + err
    code, out, _ = cli(monkeypatch, capsys, train, "--list_tasks", "--verbose")
    assert "Traceback of plugin 'crashes' (entry point crashes = kgpt_test_crashes (kgpt-crashes 0.1)):" in out
    assert 'kgpt_test_crashes.py", line 2, in helper' in out
    code, _, err = cli(monkeypatch, capsys, train, "--task=crashes")
    assert code == 2 and "Traceback" not in err and "Task 'crashes' is unavailable" in err
    from absl import flags

    monkeypatch.setattr(sys, "argv", ["kgpt-train", "--task=crashes", "--verbose"])
    flags.FLAGS.unparse_flags()
    try:  # a mistake shown with its traceback: the error is raised, its cause the plugin's own
        with pytest.raises(RegistryError, match="Task 'crashes' is unavailable") as raised:
            train.run()
    finally:
        flags.FLAGS.unparse_flags()
    assert isinstance(raised.value.__cause__, ZeroDivisionError)


def test_max_length_beyond_the_models_context_is_reported(monkeypatch, capsys, presets, tmp_path):
    (tmp_path / "data").mkdir()
    code, out, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=scitail",
        f"--init={presets / 'good'}",
        "--max_length=1000",
        f"--data_dir={tmp_path / 'data'}",
    )
    assert (
        f"Warning: --max_length 1000 is longer than the model's context (64 tokens, preset {presets / 'good'}): "
        f"views are cut to 64 tokens."
    ) in out
    assert one_line(code, err).startswith("No SciTail train file found")  # then the data, which is missing


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["zero-shot-curve", "--architectures=gru"],
            "--architectures 'gru': unknown 'gru'; choose one or more of transformer, lstm.",
        ),
        (
            ["zero-shot-curve", "--architectures=lstm,lstm", "--dry_run"],
            "--architectures 'lstm,lstm': 'lstm' given more than once; choose one or more of transformer, lstm.",
        ),
        (
            ["ablations", "--rows=nope", "--dry_run"],
            "--rows 'nope': unknown 'nope'; choose one or more of full, no_pretraining, no_aux_lm, lstm.",
        ),
        (
            ["ablations", "--rows="],
            "--rows '': none given; choose one or more of full, no_pretraining, no_aux_lm, lstm.",
        ),
    ],
)
def test_analyze_list_flags_name_an_unknown_value_before_any_work(monkeypatch, capsys, tmp_path, args, message):
    code, out, err = cli(monkeypatch, capsys, analyze, *args, f"--output_dir={tmp_path / 'a'}")
    assert one_line(code, err, "kgpt-analyze") == message
    assert not (tmp_path / "a").exists()


def test_zero_shot_data_directory_that_is_missing_is_refused_before_the_model_loads(
    monkeypatch, capsys, presets, tmp_path
):
    code, out, err = cli(
        monkeypatch,
        capsys,
        analyze,
        "zero-shot",
        f"--init={presets / 'good'}",
        f"--tasks=sst2={tmp_path / 'nowhere'}",
        f"--output_dir={tmp_path / 'a'}",
    )
    assert one_line(code, err, "kgpt-analyze") == (
        f"sst2={tmp_path / 'nowhere'}: no such directory (the task's data directory)."
    )
    assert "Zero-shot with the model" not in out


def test_data_dir_that_is_a_file_says_so(monkeypatch, capsys, presets, tmp_path):
    (tmp_path / "file").write_text("")
    code, _, err = cli(
        monkeypatch, capsys, train, "--task=scitail", f"--init={presets / 'good'}", f"--data_dir={tmp_path / 'file'}"
    )
    assert one_line(code, err) == (
        f"Data directory '{tmp_path / 'file'}' is a file, not a directory (looking for SciTail train file)."
    )


def test_a_plugins_default_data_that_fails_is_named(tmp_path):
    broken = plugin(
        """
        import kgpt

        def write(directory):
            raise KeyError("train.tsv")

        @kgpt.hookimpl
        def register_tasks(register):
            register(kgpt.Task(name="no-data", transform=kgpt.tasks.transforms.Classification(), labels=("a", "b"),
                               read=lambda split, data_dir: [], default_data=write))
            register(kgpt.Task(name="no-dir", transform=kgpt.tasks.transforms.Classification(), labels=("a", "b"),
                               read=lambda split, data_dir: [], default_data=lambda directory: None))
    """,
        "kgpt_bad_data",
    )
    registry = kgpt.TaskRegistry(plugins=[broken], entry_points=[])
    with pytest.raises(
        DataError,
        match=r"^Task 'no-data' of plugin 'kgpt_bad_data' \(registered directly "
        r"\(kgpt_bad_data\)\): default_data\('.*'\) raised KeyError: 'train.tsv'. "
        r"Report it to the plugin's authors, or pass --data_dir.$",
    ):
        registry.get("no-data").write_default_data(str(tmp_path / "a"))
    with pytest.raises(DataError, match=r"default_data\('.*'\) returned None, not the directory it wrote"):
        registry.get("no-dir").write_default_data(str(tmp_path / "b"))


def test_help_into_a_pipe_that_closes_early_is_no_error():
    import subprocess

    process = subprocess.Popen(
        [sys.executable, "-m", "kgpt.cli.train", "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
    )
    process.stdout.close()  # before the help is written: as `| head -1` does once it has its line
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0 and b"Traceback" not in err, err.decode()[-3000:]


def test_out_of_memory_is_one_line_with_what_to_lower(monkeypatch, capsys):
    import keras

    def allocate_too_much(*args, **kwargs):  # the backend's own error: 8 TiB on this device
        keras.ops.convert_to_numpy(keras.ops.ones((1 << 43,), "uint8"))

    monkeypatch.setattr("kgpt.jobs.pretrain.pretrain", allocate_too_much)
    code, _, err = cli(monkeypatch, capsys, train, "--task=lm")
    line = one_line(code, err)
    assert line.startswith("out of memory (") and "8796093022208" in line, line
    assert line.endswith(
        "the run does not fit this device's memory. Lower --batch_size (--gradient_accumulation_steps keeps the "
        "batch each update sees), the sequence length or the model's size."
    ), line
    with pytest.raises(Exception, match="RESOURCE_EXHAUSTED|OOM when allocating"):  # --verbose: the error itself
        cli(monkeypatch, capsys, train, "--task=lm", "--verbose")

"""What a hostile user's paths, plugins and disks do: each is one line naming the flag (or plugin) and the path or
row, or a warning; nothing is read wrongly without a word.

The reading tests need no model; the kgpt-predict ones save a tiny fine-tuned model (untrained) and run it on both
backends.
"""

import errno
import logging
import os
import threading

import pytest
from conftest import TINY, char_tokenizer, cli, commands_in_one_process

import kgpt
from kgpt import checks
from kgpt.data import readers, tables
from kgpt.errors import DataError, ReaderTypeError
from kgpt.jobs import predict as predict_lib
from kgpt.tasks import transforms


@pytest.fixture
def odd_paths(tmp_path):
    """`{kind: path}` of paths that exist (or loop) but are no regular file; none is ever opened."""
    os.mkfifo(tmp_path / "fifo.csv")
    os.symlink("loop2.csv", tmp_path / "loop1.csv")
    os.symlink("loop1.csv", tmp_path / "loop2.csv")
    (tmp_path / "dir.csv").mkdir()
    return {"fifo": str(tmp_path / "fifo.csv"), "loop": str(tmp_path / "loop1.csv"), "dir": str(tmp_path / "dir.csv")}


def without_blocking(fn, fifo):
    """`fn()` in a thread, failing the test if it is still running after a while (it opened the named pipe `fifo`,
    whose open waits for a writer: the writer this opens then lets it go)."""
    outcome = {}

    def call():
        try:
            outcome["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(30)
        pytest.fail(f"{fifo} was opened: the check must not open a named pipe")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


EXPECTED = {
    "fifo": "is not a regular file (a named pipe): write its contents to a file first.",
    "loop": "is not a regular file: a loop of symbolic links (a link to 'loop2.csv').",
    "dir": "is a folder: name a file.",
}


@pytest.mark.parametrize("kind", ["fifo", "loop", "dir"])
def test_a_path_that_is_no_regular_file_is_named_as_such_without_opening_it(odd_paths, kind):
    path, fifo = odd_paths[kind], odd_paths["fifo"]
    with pytest.raises(DataError) as info:
        without_blocking(lambda: tables.read_table(path), fifo)
    assert str(info.value) == f"{path} {EXPECTED[kind]}"
    with pytest.raises(DataError) as info:
        without_blocking(lambda: predict_lib.read_inputs(path, transforms.Classification()), fifo)
    assert str(info.value) == f"path {path} {EXPECTED[kind]}"
    with checks.command_line(), pytest.raises(DataError) as info:
        without_blocking(lambda: predict_lib.read_inputs(path, transforms.Classification()), fifo)
    assert str(info.value) == f"--input {path} {EXPECTED[kind]}"


def test_a_missing_input_or_a_dangling_link_is_no_such_file(tmp_path):
    os.symlink("gone.csv", tmp_path / "dangling.csv")
    with pytest.raises(FileNotFoundError, match=rf"^path {tmp_path}/none\.csv: no such file\.$"):
        predict_lib.read_inputs(str(tmp_path / "none.csv"), transforms.Classification())
    with pytest.raises(FileNotFoundError, match=rf"^{tmp_path}/dangling\.csv \(a link to 'gone\.csv'\): no such file"):
        tables.read_table(str(tmp_path / "dangling.csv"))
    assert readers.check_file(__file__) == __file__
    # `--output -` writes to standard output; `--input -` said "no such file" alone.
    with pytest.raises(FileNotFoundError, match=r"^--input -: no such file \(standard input is not read: pass the"):
        readers.check_file("-", "--input")


# --- a plugin's reader yielding segments as a bare string -------------------------------------------------------------


def test_segments_given_as_a_string_are_refused_naming_the_plugin_and_the_row(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood fun\tyes\n", encoding="utf-8")

    def read(split, data_dir):
        path = readers.find_file(data_dir, [f"{split}.tsv"], f"{split} file")
        for line_no, row in readers.read_tsv_columns(path, ["sentence", "label"]):
            yield kgpt.Example(segments=row["sentence"], label=row["label"], source=f"{path}:{line_no}")

    def choices_as_a_string(split, data_dir):
        yield kgpt.Example(segments=("context",), choices="ab", label=0, source="x.tsv:2")

    class Plugin:
        @kgpt.hookimpl
        def register_tasks(self, register):
            register(kgpt.Task(name="strseg", transform=transforms.Classification(), labels=("no", "yes"), read=read))
            register(kgpt.Task(name="strchoice", transform=transforms.MultipleChoice(2), read=choices_as_a_string))

    registry = kgpt.TaskRegistry(plugins=[Plugin()], entry_points=[])
    path = tmp_path / "train.tsv"
    with pytest.raises(ReaderTypeError) as info:
        registry.get("strseg").examples("train", str(tmp_path))
    assert str(info.value) == (
        f"Task 'strseg' of {registry.get('strseg').plugin}: read('train', ...) yielded an Example whose segments "
        f"must be a tuple (or list) of strings, got str 'good fun' (split 'train' of {tmp_path}, file {path}, "
        f"last row read {path}:2). Report it to the plugin's authors, with the file if it is the cause."
    )
    with pytest.raises(ReaderTypeError, match=r"whose choices must be a tuple \(or list\) of strings, got str 'ab'"):
        registry.get("strchoice").examples("train", str(tmp_path))


# --- the Latin-1 byte of a line is counted from 1, as lines and columns are -------------------------------------------


def test_the_byte_that_is_not_utf8_is_counted_from_one(tmp_path):
    path = tmp_path / "l.csv"
    path.write_bytes(b"id,text\n1,caf\xe9\n")  # 0xe9 is the line's 6th byte
    with pytest.raises(DataError, match=r"l\.csv:2: byte 6 of the line \(0xe9\) is not valid UTF-8\.$"):
        list(readers.read_lines(str(path)))
    path.write_bytes(b"id,text\n1,a\x00b\n")
    with pytest.raises(DataError, match=r"l\.csv:2: byte 4 of the line is a NUL"):
        list(readers.read_lines(str(path)))
    from kgpt.data.text import text_chunks

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"first line\nsecond caf\xe9 line\n")  # 0xe9: the 11th byte of line 2
    with pytest.raises(DataError, match=r"c\.txt:2: byte 11 of the line \(0xe9\) is not valid UTF-8"):
        list(text_chunks(str(corpus)))


# --- kgpt-predict: --max_length past the context in --dry_run, a full disk ---------------------------------------------


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    """`(folder, model preset, input table)`: a tiny text-classification model of context 128, saved untrained."""
    folder = tmp_path_factory.mktemp("predict")
    rows = "".join(f"{'good fun' if i % 2 else 'dull'},{'ab'[i % 2]}\n" for i in range(6))
    (folder / "t.csv").write_text("text,label\n" + rows, encoding="utf-8")
    chars = char_tokenizer()
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": chars.vocabulary_size(), "max_sequence_length": 128})
    backbone.save_to_preset(str(folder / "lm"))
    chars.save_to_preset(str(folder / "lm"))
    task = kgpt.TaskRegistry().get("text-classification")
    task = task.with_files(train_file=str(folder / "t.csv"), text_columns="text", label_column="label")
    kgpt.GPTTaskModel.from_preset(str(folder / "lm"), task=task).save_to_preset(str(folder / "model"))
    return folder, str(folder / "model"), str(folder / "t.csv")


def test_predict_dry_run_warns_of_max_length_past_the_context_as_the_run_does(finetuned, tmp_path):
    folder, model, table = finetuned
    os.mkfifo(tmp_path / "fifo.csv")
    base = ["--model", model, "--output", str(tmp_path / "p.csv")]
    long, fifo = commands_in_one_process(
        "kgpt.cli.predict",
        [
            [*base, "--input", table, "--max_length", "100000", "--dry_run"],
            [*base, "--input", str(tmp_path / "fifo.csv"), "--dry_run"],
        ],
        str(folder),
    )
    warning = (
        f"Warning: --max_length 100000 is longer than the model's context (128 tokens, preset {model}): views are cut "
        f"to 128 tokens."
    )
    assert long.returncode == 0, long.stderr
    assert warning in long.stdout + long.stderr
    assert "no problem found" in long.stdout
    assert fifo.returncode == 1
    assert fifo.stderr.strip().splitlines()[-1] == (
        f"kgpt-predict: error: --input {tmp_path}/fifo.csv is not a regular file (a named pipe): write its contents "
        f"to a file first."
    )


def test_an_output_that_cannot_be_written_names_the_flag_the_path_and_the_reason(finetuned, tmp_path, monkeypatch):
    from kgpt.io import storage

    _, model_dir, table = finetuned
    model = kgpt.GPTTaskModel.from_preset(model_dir)
    inputs = predict_lib.read_inputs(table, model.preprocessor.transform, columns=["text"])

    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(storage, "_write_local", full)
    output = str(tmp_path / "p.csv")
    with pytest.raises(OSError) as info:
        predict_lib.write(model, inputs, output)
    assert str(info.value) == f"output {output}: no space left on device."
    assert info.value.errno == errno.ENOSPC
    with checks.command_line(), pytest.raises(OSError, match=rf"^--output {output}: no space left on device\.$"):
        predict_lib.write(model, inputs, output)
    assert not os.path.exists(output)


def test_view_length_is_the_loadings_own(finetuned, caplog):
    _, model, _ = finetuned
    caplog.set_level(logging.WARNING, logger="kgpt")
    assert predict_lib.view_length(model, None) is None
    assert predict_lib.view_length(model, 64) == 64
    assert not caplog.records
    assert predict_lib.view_length(model, 129) == 128
    assert [r.getMessage() for r in caplog.records] == [
        f"Warning: sequence_length 129 is longer than the model's context (128 tokens, preset {model}): views are "
        f"cut to 128 tokens."
    ]


# --- kgpt-train's table flags: a path that is no regular file, a validation file that is the training file -----------


def reviews_csv(path, rows=8):
    path.write_text(
        "review,sentiment\n" + "".join(f"{'good fun' if i % 2 else 'dull'},{'ab'[i % 2]}\n" for i in range(rows)),
        encoding="utf-8",
    )
    return str(path)


@pytest.mark.parametrize("kind", ["fifo", "loop", "dir"])
@pytest.mark.parametrize("flag", ["train_file", "validation_file"])
def test_a_table_flag_naming_no_regular_file_says_so_without_opening_it(
    monkeypatch, capsys, odd_paths, tmp_path, kind, flag
):
    from kgpt.cli import train

    files = {"train_file": reviews_csv(tmp_path / "t.csv"), flag: odd_paths[kind]}
    args = [f"--{name}={path}" for name, path in files.items()]
    base = ["--task=text-classification", "--init=scratch", "--text_columns=review", "--label_column=sentiment"]
    code, _, err = without_blocking(
        lambda: cli(monkeypatch, capsys, train, *base, *args, "--dry_run"), odd_paths["fifo"]
    )
    assert code == 1 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == f"kgpt-train: error: --{flag} {odd_paths[kind]} {EXPECTED[kind]}"


def test_a_validation_file_that_is_the_training_file_is_a_counted_warning(monkeypatch, capsys, tmp_path):
    from kgpt.cli import train

    data = reviews_csv(tmp_path / "t.csv", rows=6)
    os.symlink("t.csv", tmp_path / "link.csv")
    base = ["--task=text-classification", "--init=scratch", "--text_columns=review", "--label_column=sentiment"]
    for validation, by in ((data, ""), (str(tmp_path / "link.csv"), " (by another path)")):
        code, out, err = cli(
            monkeypatch, capsys, train, *base, f"--train_file={data}", f"--validation_file={validation}", "--dry_run"
        )
        assert not code, err[-3000:]
        assert (
            f"Warning: --validation_file {validation} is the --train_file {data}{by}: validation scores (and --keep "
            f"best) are measured on its 6 training rows. Hold out rows that the model does not train on."
        ) in out
        assert "no problem found" in out
    code, out, _ = cli(monkeypatch, capsys, train, *base, f"--train_file={data}", "--dry_run")
    assert not code and "training rows" not in out

"""What a hostile table does to the readers of your own data (docs/your-data.md, "Errors"): each mistake is a
one-line error naming `file:line`, or a counted warning; nothing is merged, swallowed or cut without a word.

The reading tests need no model; the kgpt-predict and tokenizer ones run a tiny model or a keras-hub
tokenizer, on both backends.
"""

import ast
import csv
import gzip
import json
import logging

import pytest
from conftest import cli, one_backend

import kgpt
from kgpt.data import readers, tables
from kgpt.errors import ConfigError, DataError

REGISTRY = kgpt.TaskRegistry()


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def with_files(kind, train, **options):
    return REGISTRY.get(kind).with_files(train_file=train, **options)


@pytest.fixture
def warnings(caplog):
    """The warnings kgpt logged, as one list of lines."""
    caplog.set_level(logging.WARNING, logger="kgpt")
    return lambda: [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- JSON lines ------------------------------------------------------------------------------------------------------


def test_a_key_given_twice_in_a_json_line_is_refused_at_its_line(tmp_path):
    path = write(tmp_path / "t.jsonl", '{"text": "a", "label": "x"}\n{"text": "a", "text": "b", "label": "y"}\n')
    with pytest.raises(DataError, match=r"^.*t\.jsonl:2: the key 'text' is given twice in one object\.$"):
        list(tables.read_table(path).rows)
    with pytest.raises(DataError, match=r"t\.jsonl:2: the key 'text' is given twice"):
        with_files("text-classification", path, text_columns="text", label_column="label")
    # kgpt-predict wrote it back as Infinity, which is no JSON.
    path = write(tmp_path / "o.jsonl", '{"text": "a", "score": 1.5}\n{"text": "b", "score": 1e400}\n')
    with pytest.raises(DataError, match=r"^.*o\.jsonl:2: the number 1e400 is beyond a double's range\.$"):
        list(tables.read_table(path).rows)
    write(tmp_path / "n.jsonl", '{"text": "a", "meta": {"k": 1, "k": 2}}\n')  # nested: json would keep 2 as well
    with pytest.raises(DataError, match=r"n\.jsonl:1: the key 'k' is given twice"):
        list(readers.read_jsonl(str(tmp_path / "n.jsonl")))


def test_a_json_lines_test_file_labeled_from_its_second_line_is_refused_there(tmp_path):
    # Its first line has no label: the file was read as unlabeled, its later labels ignored and nothing scored.
    train = write(tmp_path / "t.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n')
    test = write(tmp_path / "s.jsonl", '{"text": "a"}\n{"text": "b", "label": "y"}\n')
    task = with_files("text-classification", train, text_columns="text", label_column="label", test_file=test)
    with pytest.raises(DataError, match=r"^.*s\.jsonl:2: has 'label', which the file's first line has not: give"):
        task.examples("test", None)
    write(tmp_path / "s.jsonl", '{"text": "a"}\n{"text": "b"}\n')  # unlabeled throughout: read as before
    assert [e.label for e in task.examples("test", None)[0]] == [None, None]


def test_a_json_boolean_in_a_text_column_is_refused_where_a_number_is_its_text(tmp_path):
    train = write(tmp_path / "t.jsonl", '{"text": 7, "label": true}\n{"text": true, "label": false}\n')
    task = with_files("text-classification", train, text_columns="text", label_column="label")
    with pytest.raises(DataError, match=r"^.*t\.jsonl:2: 'text' is a JSON boolean \(true\), not text: is it a label"):
        task.examples("train", None)
    write(tmp_path / "t.jsonl", '{"text": 7, "label": true}\n{"text": "b", "label": false}\n')
    examples = task.examples("train", None)[0]
    assert [e.segments for e in examples] == [("7",), ("b",)]


# --- labels and answers ----------------------------------------------------------------------------------------------


def test_labels_spelled_two_ways_stay_apart_with_a_counted_warning(tmp_path, warnings):
    rows = ["text,label"] + [f"t{i},pos" for i in range(4)] + ["u1,Pos", "u2, pos ", "v1,neg", "v2,neg"]
    task = with_files(
        "text-classification",
        write(tmp_path / "t.csv", "\n".join(rows) + "\n"),
        text_columns="text",
        label_column="label",
    )
    assert task.labels == ("Pos", "neg", "pos")  # " pos " is "pos": spaces alone are dropped, and said so
    [warning] = [w for w in warnings() if "more than one way" in w]
    assert warning == (
        f"{tmp_path / 't.csv'}: label(s) in column 'label' spelled more than one way: 'pos' (4 rows), "
        f"'Pos' (1 row), ' pos ' (1 row). Surrounding spaces are dropped (one label); a difference in "
        f"case or number format makes separate classes: if they are one, spell them one way in your "
        f"files."
    )
    numbers = [{"text": f"t{i}", "label": 1} for i in range(3)] + [
        {"text": "u", "label": 1.0},
        {"text": "v", "label": "0"},
    ]
    path = tmp_path / "n.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in numbers))
    task = with_files("text-classification", str(path), text_columns="text", label_column="label")
    assert task.labels == ("0", "1", "1.0")
    assert "'1' (3 rows), '1.0' (1 row)." in [w for w in warnings() if "more than one way" in w][-1]


def test_one_spelling_each_gives_no_warning_and_another_spelling_in_dev_is_named(tmp_path, warnings):
    train = write(tmp_path / "t.csv", "text,label\na,pos\nb,neg\nc,pos\nd,neg\n")
    task = with_files(
        "text-classification",
        train,
        text_columns="text",
        label_column="label",
        validation_file=write(tmp_path / "d.csv", "text,label\na,Pos\n"),
    )
    assert not [w for w in warnings() if "more than one way" in w]
    with pytest.raises(
        DataError,
        match=r"d\.csv:2: label 'Pos' is not one of the training file's labels \('neg', "
        r"'pos'\); it spells 'pos' another way\.$",
    ):
        task.examples("validation", None)


def test_an_answer_that_is_an_index_and_another_choices_text_is_counted(tmp_path, warnings):
    rows = ["q\ta\tb\tanswer", "two minus one?\t1\t0\t1", "one minus one?\t1\t0\t0", "one?\t1\t0\t1", "x?\tyes\tno\t1"]
    task = with_files(
        "multiple-choice",
        write(tmp_path / "mc.tsv", "\n".join(rows) + "\n"),
        text_columns="q",
        choice_columns="a,b",
        label_column="answer",
    )
    examples = task.examples("train", None)[0]
    assert [e.label for e in examples] == [1, 0, 1, 1]  # read as indices, as documented
    [warning] = [w for w in warnings() if "index and another" in w]
    assert warning == (
        f"{tmp_path / 'mc.tsv'}: 3 answer(s) in 'answer' are a choice's index and another choice's "
        f"text: read as indices from 0 (0 is 'a'); write them as indices if they were texts (first at "
        f"{tmp_path / 'mc.tsv'}:2)."
    )
    write(tmp_path / "mc.tsv", "q\ta\tb\tanswer\nx?\tsame\tsame\tsame\ny?\tyes\tno\tno\n")
    assert [e.label for e in task.examples("train", None)[0]] == [0, 1]
    assert any(
        w.endswith(
            "1 answer(s) in 'answer' are the text of two or more choices: the first of them taken as "
            f"the answer (first at {tmp_path / 'mc.tsv'}:2)."
        )
        for w in warnings()
    )
    # Numbers as choices, the answer one of them but no index: refused as "out of range" before.
    write(tmp_path / "mc.tsv", "q\ta\tb\tanswer\n2 + 3?\t4\t5\t5\n2 + 2?\t4\t5\t4\nx?\tyes\tno\t7\n")
    with pytest.raises(DataError, match=r"mc\.tsv:4: answer 7 in 'answer' is out of range"):
        task.examples("train", None)
    write(tmp_path / "mc.tsv", "q\ta\tb\tanswer\n2 + 3?\t4\t5\t5\n2 + 2?\t4\t5\t4\n")
    assert [e.label for e in task.examples("train", None)[0]] == [1, 0]
    assert any(
        "2 answer(s) in 'answer' are no choice index (out of range) but a choice's text" in w for w in warnings()
    )
    write(tmp_path / "mc.tsv", "q\ta\tb\tanswer\nx?\tyes\tno\t\u00b2\n")  # a digit to str.isdigit, not to int()
    with pytest.raises(DataError, match=r"mc\.tsv:2: answer '\u00b2' in 'answer' is neither a choice index"):
        task.examples("train", None)


def test_a_regression_value_is_a_plainly_written_finite_number(tmp_path):
    path = tmp_path / "r.csv"
    task = with_files(
        "text-regression", write(path, "text,score\na,1\nb,2\n"), text_columns="text", label_column="score"
    )
    for good, value in (("-1.5e2", -150.0), (" .5 ", 0.5), ("+3", 3.0)):
        write(path, f"text,score\na,{good}\n")
        assert task.examples("train", None)[0][0].label == value
    for bad in ("1_000", "infinity", "nan", "\u0661", "0x10", "true"):  # float() takes the first four
        write(path, f"text,score\na,{bad}\n")
        with pytest.raises(DataError, match=rf"r\.csv:2: 'score' holds '{bad}', not a finite number"):
            task.examples("train", None)
    path = tmp_path / "r.jsonl"
    path.write_text('{"text": "a", "score": NaN}\n')
    task = with_files(
        "text-regression", str(tmp_path / "r.csv"), text_columns="text", label_column="score", validation_file=str(path)
    )
    with pytest.raises(DataError, match=r"r\.jsonl:1: 'score' holds 'NaN', not a finite number"):
        task.examples("validation", None)


@pytest.mark.parametrize("value", ["\x00" * 100, b"\xff" * 100, "\U0010ffff" * 40, "ab'\"" * 30])
def test_a_long_value_is_cut_between_its_characters_not_inside_an_escape(value):
    from kgpt import checks

    text, length = checks.shown(value).rsplit(" (", 1)
    assert len(text) <= 60 and text[-4:-1] == "..." and length == f"{len(value)} characters)"
    start = ast.literal_eval(text[:-4] + text[-1])  # refused for an escape cut in two
    assert len(start) >= 5 and value.startswith(start)


def test_a_huge_label_or_number_is_echoed_as_its_start_and_length(tmp_path):
    digits = "7" * 401
    path = tmp_path / "r.jsonl"
    path.write_text(f'{{"text": "a", "score": 1}}\n{{"text": "b", "score": {digits}}}\n')
    task = with_files("text-regression", str(path), text_columns="text", label_column="score")
    with pytest.raises(DataError, match=r"r\.jsonl:2: 'score' holds '7{50,60}\.\.\.' \(401 characters\), not a") as e:
        task.examples("train", None)
    assert len(str(e.value)) < 200
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n')
    dev = write(tmp_path / "d.jsonl", f'{{"text": "a", "label": {digits}}}\n')
    task = with_files("text-classification", str(path), text_columns="text", label_column="label", validation_file=dev)
    with pytest.raises(DataError, match=r"d\.jsonl:1: label '7+\.\.\.' \(401 characters\) is not one of"):
        task.examples("validation", None)
    write(path, f'{{"text": "b", "score": {digits}e5}}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:1: the number 7+\.\.\. \(403 characters\) is beyond a double"):
        list(tables.read_table(str(path)).rows)
    # The training labels a dev label is not among, a repeated key and a table's columns were echoed whole.
    long, many = "L" * 5000, [f"c{i}" for i in range(100)]
    rows = [f'{{"text": "a", "label": "{long}{i % 2}"}}' for i in range(4)]
    write(path, "\n".join(rows) + "\n")
    write(tmp_path / "d.jsonl", '{"text": "a", "label": "z"}\n')
    task = with_files("text-classification", str(path), text_columns="text", label_column="label", validation_file=dev)
    with pytest.raises(DataError, match=r"d\.jsonl:1: label 'z' is not one of the training file's labels \('L+\.\.\.'"):
        task.examples("validation", None)
    with pytest.raises(DataError) as e:
        task.examples("validation", None)
    assert len(str(e.value)) - len(str(tmp_path)) < 250
    write(path, f'{{"{long}": 1, "{long}": 2}}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:1: the key 'L+\.\.\.' \(5,000 characters\) is given twice") as e:
        list(readers.read_jsonl(str(path)))
    assert len(str(e.value)) - len(str(tmp_path)) < 150
    write(path, ",".join(many) + "\n" + ",".join("x" * 100) + "\n")
    with pytest.raises(
        DataError, match=r"no column 'text' \(text_columns\); it has 'c0', .*'c29', \.\.\. \(100 in all\)\.$"
    ):
        tables.read_table(str(path), "csv").require(["text"], "text_columns")


# --- CSV ------------------------------------------------------------------------------------------------------------


def test_a_json_integer_past_pythons_digit_limit_is_one_line_at_its_line(tmp_path):
    # int() refuses 4,300 digits or more: json.loads raised a bare ValueError.
    digits = "7" * 4301
    path = write(tmp_path / "t.jsonl", f'{{"text": "a", "label": "x"}}\n{{"text": "b", "label": {digits}}}\n')
    with pytest.raises(DataError, match=rf"^{path}:2: the number 7777.* \(4,301 characters\) is beyond a double"):
        list(readers.read_jsonl(path))
    # In Python, such an int as a regression target: OverflowError before, and a ValueError from str() in the message.
    head = kgpt.tasks.heads.RegressionHead()
    with pytest.raises(DataError, match=r"^target 1000.*\(401 characters\) is beyond float32's range"):
        head.target(10**400)
    with pytest.raises(DataError, match=r"^target an integer of about 5,000 digits is beyond float32's range"):
        head.target(10**5000)


def test_a_quote_left_open_to_the_end_names_the_line_it_opens_on(tmp_path):
    path = write(tmp_path / "t.csv", 'text,label\nok,pos\n"a good film,pos\nbad,neg\nok,pos\nfine,neg\n')
    with pytest.raises(
        DataError,
        match=r"^.*t\.csv:3: a quoted field opens here and is never closed \(it runs to "
        r"the end of the file, line 6\)\.$",
    ):
        list(tables.read_table(path).rows)
    write(tmp_path / "t.csv", 'text,label\nok,pos\n"x"y,neg\n')  # other malformed rows: the line of the fault
    with pytest.raises(DataError, match=r"t\.csv:3: malformed CSV \(',' expected after '\"'\)"):
        list(tables.read_table(path).rows)


def test_a_quote_that_swallows_rows_is_counted_by_the_line_it_opens_on(tmp_path, warnings):
    path = write(tmp_path / "t.csv", 'text,label\n"a good film,pos\nbad,neg\nok",pos\nfine,neg\n')
    rows = list(tables.read_table(path).rows)
    assert [line for line, _ in rows] == [2, 5]
    assert warnings() == [
        f"{path}: 1 row(s) hold, inside a quoted field, whole lines with the header's 2 fields "
        f"(5 lines read as 3 rows); the first such quote opens at {path}:2. If a quote was left "
        f"open there, close it."
    ]
    list(tables.read_table(path).rows)
    assert len(warnings()) == 1  # a table read twice in a run (labels, then examples) says it once
    # A text that holds line breaks is no such row: the guide's own example.
    write(tmp_path / "ok.csv", 'review,sentiment\n"Warm, funny\nand moving.",positive\n"one\n\ntwo\nthree",neg\n')
    assert len(list(tables.read_table(str(tmp_path / "ok.csv")).rows)) == 2 and len(warnings()) == 1


def test_a_field_over_pythons_csv_limit_is_read_whole(tmp_path):
    text = "word " * 2_000_000  # 10 MB, over csv's default 131072
    path = tmp_path / "big.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["text", "label"], [text, "pos"], ["short", "neg"]])
    rows = list(tables.read_table(str(path)).rows)
    assert rows[0] == (2, {"text": text, "label": "pos"}) and rows[1][0] == 3


# --- the hostile pass: encodings, headers, column names ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name,data,error",
    [
        (
            "u.csv",
            "text,label\na,b\n".encode("utf-16"),
            r"u\.csv:1: the file is UTF-16 or UTF-32 \(its byte-order mark "
            r"says\), not UTF-8: save it as UTF-8\.$",
        ),
        (
            "z.csv",
            gzip.compress(b"text,label\na,b\n", mtime=0),
            r"z\.csv:1: the file is gzip-compressed, not text: decompress it",
        ),
        (
            "z.jsonl",
            b"PK\x03\x04\x14\x00rest\n",
            r"z\.jsonl:1: the file is a zip archive \(or a spreadsheet\), not text",
        ),
        ("b.tsv", b"text\tlabel\na\tb\n\x80\tc\n", r"b\.tsv:3: byte 1 of the line \(0x80\) is not valid UTF-8"),
        ("j.csv", b"text,label\na,b\n\xef\xbb\xbftext,label\nc,d\n", r"j\.csv:3: a byte-order mark starts this line"),
        (
            "j.tsv",
            b"text\tlabel\na\tb\ntext\tlabel\nc\td\n",
            r"j\.tsv:3: the header row again \(line 1 is the "
            r"first\): were files joined here\? Remove it\.$",
        ),
        ("n.csv", b"text,label\na\x00b,c\n", r"n\.csv:2: byte 2 of the line is a NUL: a binary file, or UTF-16 "),
        ("w.tsv", "text\tlabel\n".encode("utf-16-le"), r"w\.tsv:1: byte 2 of the line is a NUL"),
        ("h.tsv", b"text\tlabel\ttext\nx\ty\tz\n", r"h\.tsv:1: the header names column 'text' twice"),
        ("e.csv", b"\xef\xbb\xbftext,label\na,\n", r"e\.csv:2: empty label in column 'label'"),
        (  # it broke the predictions' TSV (a column p_<label> and the rows) and validation.tsv, exit 0
            "q.csv",
            b'text,label\na,"x\ny"\nb,z\n',
            r"q\.csv:2: label 'x\\ny' in column 'label' holds a tab or line break, which the predictions' TSV",
        ),
    ],
)
def test_files_that_are_not_what_they_claim_are_named_in_one_line(tmp_path, name, data, error):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError, match=error):
        with_files("text-classification", str(tmp_path / name), text_columns="text", label_column="label")


def test_a_tsv_header_naming_a_column_twice_is_refused_by_the_task_readers_too(tmp_path):
    path = write(tmp_path / "g.tsv", "sentence\tlabel\tlabel\nx\t0\t1\n")
    with pytest.raises(DataError, match=r"g\.tsv:1: the header names column 'label' twice"):
        list(readers.read_tsv_columns(path, ["sentence", "label"]))


def test_a_column_name_that_is_almost_right_is_suggested(tmp_path):
    path = write(tmp_path / "t.csv", "Review,Sentiment label\na,b\nc,d\n")
    with pytest.raises(
        DataError,
        match=r"t\.csv: no column 'review' \(text_columns; did you mean 'Review'\?\); "
        r"it has 'Review', 'Sentiment label'\.$",
    ):
        with_files("text-classification", path, text_columns="review", label_column="Sentiment label")
    with pytest.raises(
        DataError,
        match=r"no column 'sentiment_label' \(label_column; did you mean 'Sentiment "
        r"label'\?\)",
    ):
        with_files("text-classification", path, text_columns="Review", label_column="sentiment_label")
    with pytest.raises(DataError, match=r"no column 'stars' \(label_column\); it has"):
        with_files("text-classification", path, text_columns="Review", label_column="stars")
    with pytest.raises(ConfigError, match=r"^text_columns ' , ': an empty name"):
        with_files("text-classification", path, text_columns=" , ", label_column="stars")
    with pytest.raises(ConfigError, match=r"^text_columns: name the text column"):
        with_files("text-classification", path, text_columns=[], label_column="stars")


# --- a task preset saved from Python keeps its columns ----------------------------------------------------------------


@one_backend("tensorflow")
def test_a_task_preset_saved_from_python_predicts_on_the_columns_it_was_trained_on(tiny_preset, tmp_path):
    from kgpt.jobs import dry_run
    from kgpt.jobs import finetune as finetune_lib
    from kgpt.jobs import predict as predict_lib
    from kgpt.jobs.config import FinetuneConfig

    rows = [["id", "text", "note", "label"]] + [
        [str(i), "good fun" if i % 2 else "dull", "a note", "ab"[i % 2]] for i in range(8)
    ]
    train = tmp_path / "t.csv"
    with open(train, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    run = str(tmp_path / "run")
    finetune_lib.finetune(
        FinetuneConfig(
            task="text-classification",
            init=tiny_preset,
            train_file=str(train),
            text_columns=["text"],
            label_column="label",
            output_dir=run,
            epochs=1,
            max_length=16,
            batch_size=4,
        )
    )
    saved = str(tmp_path / "saved")
    kgpt.GPTTaskModel.from_preset(run).save_to_preset(saved)
    assert json.loads((tmp_path / "saved" / "preprocessor.json").read_text())["config"]["columns"] == ["text"]
    assert predict_lib.trained_columns(saved) == ["text"]
    assert kgpt.GPTTaskModel.from_preset(saved).preprocessor.columns == ["text"]
    findings = dict(dry_run.predict(saved, str(tmp_path / "p.csv"), input=str(train)))
    assert findings["input"] == f"{train}: 8 example(s) from column(s) text"
    outputs = []
    for path in (run, saved):  # as kgpt-predict --model PATH --input t.csv reads and writes it
        model = kgpt.GPTTaskModel.from_preset(path)
        inputs = predict_lib.read_inputs(
            str(train), model.preprocessor.transform, columns=predict_lib.columns_for(path, str(train))
        )
        assert inputs.columns == ["text"] and inputs.examples[0] == (("dull",), ())
        predict_lib.write(model, inputs, str(tmp_path / "p.csv"))
        outputs.append((tmp_path / "p.csv").read_text())
    assert outputs[0] == outputs[1]


# --- a tokenizer whose vocabulary gives two tokens one id ---------------------------------------------------------


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_vocabulary_giving_two_tokens_one_id_is_refused_by_name(monkeypatch, capsys, tmp_path, dry_run):
    import keras_hub

    from kgpt.cli import train

    vocabulary = {chr(c): i for i, c in enumerate(range(ord("a"), ord("z") + 1))}
    vocabulary.update({"Ġ": 26, "th": 27, "the": 27})
    folder = tmp_path / "tok"
    keras_hub.tokenizers.BytePairTokenizer(vocabulary={**vocabulary, "the": 28}, merges=["t h", "th e"]).save_to_preset(
        str(folder)
    )
    (folder / "assets" / "tokenizer" / "vocabulary.json").write_text(json.dumps(vocabulary))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the the\n")
    code, _, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task=lm",
        f"--corpus={corpus}",
        f"--tokenizer={folder}",
        "--dry_run" if dry_run else "--prepare_only",
    )
    assert code == 1 and "Traceback" not in err, err[-3000:]
    [line] = [line for line in err.splitlines() if "error" in line.lower()]
    assert line == (
        f"kgpt-train: error: --tokenizer={folder}: {folder}/assets/tokenizer/vocabulary.json: id 27 is "
        f"given to two tokens, 'th' and 'the'; each token needs an id of its own."
    )


def test_a_wordpiece_vocabulary_listing_a_token_twice_is_refused_at_its_line(tmp_path):
    import keras_hub

    from kgpt.tokenizers.loading import load_tokenizer

    folder = tmp_path / "wp"
    keras_hub.tokenizers.WordPieceTokenizer(vocabulary=["[UNK]", "a", "b"]).save_to_preset(str(folder))
    (folder / "assets" / "tokenizer" / "vocabulary.txt").write_text("[UNK]\na\nb\na\n")
    with pytest.raises(
        kgpt.CheckpointError,
        match=r"vocabulary\.txt:4: the token 'a' again \(line 2 has it "
        r"too\)",
    ):
        load_tokenizer(str(folder))

"""Predictions of a fine-tuned model on new text files: what `kgpt-predict` runs.

Inputs, one example per line or row:
- `text`: a plain file; tabs separate an example's segments (for multiple
  choice, the last fields are the answer choices). The id is the line number.
- `csv`, `tsv`, `jsonl`: tables whose header row (JSON lines: keys) names
  the columns (`kgpt.data.tables`: CSV quoted as Python's `csv` module
  writes it, TSV unquoted). `columns` picks the segments, in order (for
  multiple choice, the answer choices last); by default the columns the
  model was trained on (`trained_columns`, for `--task text-classification`
  etc.), else every column but `id`/`index`/`idx`/`label`/`gold_label`. In
  JSON lines, the last column may hold the list of choices.

The output of a text file is a TSV of `id` (the line number, or the table's
`id`/`index`/`idx`), `prediction` (label name, choice index or value) and
`p_<label>` per class or choice. A table's output is the table itself, every
row and column as read, with `prediction` and the `p_<label>` columns added,
as CSV, TSV or JSON lines by the output's extension (by default the
input's). A row that does not fit the model's input transformation is a
`DataError` naming `file:line`.

Example:
```python
model = kgpt.GPTTaskModel.from_preset("runs/reviews")
inputs = kgpt.jobs.predict.read_inputs("new.csv", model.preprocessor.transform, columns=["review"])
kgpt.jobs.predict.write(model, inputs, "labelled.csv")
```
"""

import collections
import contextlib
import json
import logging
import os

from kgpt import checks
from kgpt.data import batching, readers, tables
from kgpt.data.readers import data_lines
from kgpt.errors import ConfigError, DataError, EmptyTextError, StorageError
from kgpt.io import storage
from kgpt.io.presets import read_json, saved_preprocessor
from kgpt.jobs.finetune_outputs import prediction_columns, prediction_rows
from kgpt.jobs.rundir import written_by_run
from kgpt.models.gpt.gpt_task_preprocessor import cut_to_context, segment_columns
from kgpt.parallel import distribute

logger = logging.getLogger(__name__)

FORMATS = ("text", *tables.FORMATS)
ID_COLUMNS = ("id", "index", "idx")
NOT_SEGMENTS = (*ID_COLUMNS, "label", "gold_label")

# `records`: a table's rows as read ({column: value}), written back with the predictions; `fields`: its columns;
# `lines`: a JSON-lines table's rows as written, which JSON-lines predictions extend (numbers keep their spelling).
Inputs = collections.namedtuple(
    "Inputs", "examples ids sources columns format records fields lines", defaults=("text", None, None, None)
)


def guess_format(path):
    """`csv`, `tsv` or `jsonl` by the extension (`kgpt.data.tables.EXTENSIONS`), else `text`."""
    return tables.EXTENSIONS.get(os.path.splitext(path)[1].lower(), "text")


def trained_columns(model_dir):
    """The columns a model fine-tuned on your own tables read (text, then choices); else None.

    Its preprocessor keeps them (`saved_preprocessor`, so a preset saved from
    Python has them too); a run saved before it did has them in `metrics.json`.
    """
    saved = saved_preprocessor(model_dir)
    columns = saved.get("columns") if saved else None
    if isinstance(columns, list) and columns and all(isinstance(c, str) for c in columns):
        return columns
    return segment_columns(_json(os.path.join(model_dir, "metrics.json")).get("inputs"))


def _json(path):
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def columns_for(model_dir, input, format=None, columns=None, transform=None):
    """`columns` when given; else, for a table (not a text file), the columns the model was trained on.

    Given columns are checked: none empty or repeated, and as many as the model
    was trained on (its `trained_columns`, else its transformation's exact
    segment count); a transformation taking answer choices takes them as one
    list column or one column each, so its count is not checked here. A
    mistake raises `ConfigError` naming `columns` (`--columns` in kgpt-predict). `transform` defaults to the
    one saved in `model_dir`.
    """
    if columns is None:
        return None if (format or guess_format(input)) == "text" else trained_columns(model_dir)
    columns = list(columns)
    trained = trained_columns(model_dir)
    known = f" (the model was trained on {', '.join(trained)})" if trained else ""
    if not columns or any(not isinstance(c, str) or not c.strip() for c in columns):
        raise ConfigError(
            f"{checks.option('columns')} {','.join(map(str, columns))!r} names an empty column: name the table "
            f"columns holding the segments{known}, or leave {checks.option('columns')} out for the trained ones."
        )
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise ConfigError(
            f"{checks.option('columns')} names {', '.join(map(repr, repeated))} more than once: name each column once."
        )
    transform = transform if transform is not None else _saved_transform(model_dir)
    counts = _column_counts(transform, trained) if transform is not None and transform.takes_choices else None
    if counts is not None and len(columns) not in counts[2]:
        contexts, k, _ = counts
        raise ConfigError(
            f"{checks.option('columns')} names {len(columns)} column(s) ({', '.join(columns)}); the model takes "
            f"{contexts} context segment(s), then its {k} answers as {k} columns or one list: name "
            f"{contexts + k} or {contexts + 1}."
        )
    if transform is None or transform.takes_choices:
        return columns
    expected = len(trained) if trained else transform.num_segments
    if expected is not None and len(columns) != expected:
        raise ConfigError(
            f"{checks.option('columns')} names {len(columns)} column(s) ({', '.join(columns)}); the model was trained on "
            f"{expected} text segment(s){known}: name {expected}."
        )
    return columns


def _saved_transform(model_dir):
    """The input transformation saved with a fine-tuned model (`saved_preprocessor`); None when it has none."""
    saved = saved_preprocessor(model_dir)
    if not saved or not isinstance(saved.get("transform"), dict):
        return None
    import keras

    try:
        return keras.saving.deserialize_keras_object(saved["transform"])
    except Exception:  # a plugin's transformation not imported here: its count is checked per row
        return None


def read_inputs(path, transform, format=None, columns=None, trained=None):
    """Reads `path` into `Inputs`; examples are `(segments, choices)`.

    Every row is checked against `transform` (segment and choice counts),
    and a text file's line against `trained`, the columns the model was
    trained on (`trained_columns`): a transformation that joins segments
    would join fields the model never saw apart. A bad row raises
    `DataError` naming `path:line`.
    """
    format = format or guess_format(path)
    if format not in FORMATS:
        raise ValueError(f"Unknown input format {format!r}: use one of {', '.join(FORMATS)}.")
    readers.check_file(path, checks.option("input", "path"))
    records = fields = lines = None
    if format == "text":
        if columns:
            raise ConfigError(
                f"{checks.option('columns')} name the columns of a table (.csv, .tsv, .jsonl); a text file's fields are "
                "its tab-separated parts."
            )
        rows = ((n, None, line.split("\t")) for n, line in data_lines(path))
        used = None
    else:
        table = tables.read_table(path, format)
        rows, used = _named_rows(table, columns)
        if columns is None:
            _check_default_columns(path, used, transform)
        records, fields = [], table.columns
        if table.format == "jsonl":
            text, lines = dict(readers.read_lines(path)), []
    examples, ids, sources = [], [], []
    # A multiple-choice line's answers are its last fields: one too many was read as a second context.
    expected = len(trained) if trained and format == "text" else None
    for line_no, uid, values, *record in rows:
        source = f"{path}:{line_no}"
        if expected is not None and len(values) != expected:
            raise DataError(
                f"{source}: {len(values)} tab-separated field(s); the model was trained on {expected} "
                f"column(s) ({', '.join(trained)}): give each line {expected}."
            )
        example = _example(values, transform, source)
        examples.append(example)
        ids.append(uid if uid is not None else str(line_no))
        sources.append(source)
        if records is not None:
            records.append(record[0])
        if lines is not None:
            lines.append(text[line_no])
    if not examples:
        raise DataError(f"{path}: no examples (the file is empty).")
    return Inputs(examples, ids, sources, used, format, records, fields, lines)


def _column_counts(transform, trained=None):
    """`(contexts, answers, allowed)`: the context segments and answers a model takes, and how many table columns
    hold them (the answers as one column each, or as one JSON list); None when the count is open (a
    multiple-choice transformation of any number of contexts, with no `trained` columns)."""
    k = transform.num_views if transform.takes_choices else 0
    contexts = len(trained) - k if trained else transform.num_segments
    if contexts is None and not transform.takes_choices:
        contexts = 1  # Classification joins what it is given: more than one column is the user's to choose
    if contexts is None:
        return None
    return contexts, k, (contexts + k, contexts + 1) if k else (contexts,)


def _check_default_columns(path, used, transform):
    """A `ConfigError` when a table's columns, taken as the segments for a model that recorded none (a built-in
    task's), are not as many as its transformation takes: an extra column (a source, the gold label under another
    name) was read as text."""
    counts = _column_counts(transform)
    if counts is None or len(used) in counts[2]:
        return
    contexts, k, _ = counts
    raise ConfigError(
        f"{path}: its columns {', '.join(used)} would all be read as text, where the model takes {contexts} "
        f"text segment(s){f' and {k} answers' if k else ''}: name them with {checks.option('columns')}."
    )


def _named_rows(table, columns):
    """`(rows, columns used)`; rows are `(line, id or None, [field values], record)`."""
    path, header = table.path, table.columns
    used = list(columns) if columns else [k for k in header if k not in NOT_SEGMENTS]
    if not used:
        raise DataError(
            f"{path}: no text columns (it has only {', '.join(header)}); name them with {checks.option('columns')}."
        )
    if table.format != "jsonl":
        table.require(used, checks.option("columns"))
    id_column = next((c for c in ID_COLUMNS if c in header), None)

    def field(rec, column, n):
        if column == used[-1] and isinstance(rec.get(column), list):  # the answers in one JSON list
            return rec[column]
        return table.text(rec, column, n)  # as training reads it: a number is its text

    def rows():
        for n, rec in table.rows:
            uid = str(rec[id_column]).strip() if id_column and rec.get(id_column) is not None else None
            yield n, uid, [field(rec, c, n) for c in used], rec

    return rows(), used


def _example(fields, transform, source):
    choices = ()
    if transform.takes_choices:
        if fields and isinstance(fields[-1], list):
            fields, choices = fields[:-1], tuple(fields[-1])
        else:
            k, contexts = transform.num_views, transform.num_segments
            if contexts is not None and len(fields) != contexts + k:
                raise DataError(
                    f"{source}: {len(fields)} field(s); the model takes {contexts} context segment(s), then its {k} "
                    f"answers: give {contexts + k}."
                )
            if len(fields) <= k:
                raise DataError(
                    f"{source}: {len(fields)} field(s); a choice among {k} answers needs at least {k + 1}: the "
                    f"context segment(s), then the {k} answers."
                )
            fields, choices = fields[:-k], tuple(fields[-k:])
    segments = tuple(fields)
    for text in (*segments, *choices):
        if not isinstance(text, str):
            raise DataError(f"{source}: a field is {type(text).__name__} {checks.shown(text, 60)}, not text.")
        if not text.strip():
            raise DataError(f"{source}: an empty text field.")
    problem = transform.check(segments, choices)
    if problem:
        raise DataError(f"{source}: {problem}.")
    return segments, choices


def encode(preprocessor, inputs):
    """`inputs` -> an `EncodedSplit` (ids kept); truncation is counted in its `counts`."""
    builder = batching.SplitBuilder("inputs", preprocessor.transform.num_views, preprocessor.sequence_length)
    truncated = tokens_cut = 0
    for (segments, choices), uid, source in zip(inputs.examples, inputs.ids, inputs.sources or inputs.ids):
        try:
            views, cut = preprocessor.encode(segments, choices)
        except EmptyTextError as e:  # a prediction for every row, or a refusal naming it
            raise EmptyTextError(f"{source}: {e}.") from None
        truncated += cut > 0
        tokens_cut += cut
        builder.add(views, uid=uid)
    n = len(inputs.examples)
    return builder.build(
        {"read": n, "used": n, "skipped": 0, "skipped_reasons": {}, "truncated": truncated, "tokens_cut": tokens_cut}
    )


def write(model, inputs, output, batch_size=32, verbose=0, format=None):
    """Predicts every example of `inputs` with `model` and writes them to `output` (`-`: stdout).

    A text file's predictions are a TSV of ids; a table's are its rows with
    `prediction` and `p_<label>` columns added, in `format` (default: by
    `output`'s extension, else the input's). Returns the number of rows written.
    """
    split = encode(model.preprocessor, inputs)
    if split.counts["truncated"]:
        logger.info(
            f"{split.counts['truncated']} of {len(split)} examples are longer than max_length="
            f"{model.preprocessor.sequence_length} tokens per view: {split.counts['tokens_cut']} tokens were cut from the "
            f"end of their longest segments."
        )
    head = model.head
    added = ["prediction", *prediction_columns(head)]
    if inputs.records is not None:
        format = format or output_format(output, inputs.format)
        _check_records(inputs, added, format)
    outputs = distribute.predict_outputs(model.task_predictor(), split, batch_size, verbose=verbose)
    predictions = head.decode(outputs)
    rows = prediction_rows(head, split.uids, predictions, head.probabilities(outputs))
    with writing(output):
        if inputs.records is None:
            tables.write_lines(output, ["\t".join(["id", *added]) + "\n", *(row + "\n" for row in rows)])
            return len(split)
        merged, predicted = [], []
        for record, row, value in zip(inputs.records, rows, predictions):
            values = row.split("\t")[1:]  # after the id: the prediction and its probabilities, as the TSV writes them
            if format == "jsonl":  # typed: a label name stays text, an answer index or a value a number
                values = [head.prediction_name(value), *map(float, values[1:])]
            predicted.append(dict(zip(added, values)))
            merged.append({**record, **predicted[-1]})
        if format == "jsonl" and inputs.lines is not None:
            tables.write_lines(output, list(map(tables.extended_json_line, inputs.lines, predicted)))
            return len(predicted)
        return tables.write_table(output, format, [*inputs.fields, *added], merged)


def _check_records(inputs, added, format):
    """A `DataError` at its line for a row that already has one of the `added` columns (a JSON line's own keys
    count too), or, for a CSV or TSV output, a JSON line whose keys are not the first line's: a column of
    its own would be dropped, and one it lacks has no cell."""
    for record, source in zip(inputs.records, inputs.sources):
        taken = [c for c in added if c in record or c in inputs.fields]
        if taken:
            where = source if inputs.format == "jsonl" else source.rsplit(":", 1)[0]
            raise DataError(
                f"{where}: the input already has column(s) {', '.join(map(repr, taken))}, which the predictions "
                f"would replace; rename them."
            )
        if format != "jsonl" and list(record) != inputs.fields:
            if set(record) == set(inputs.fields):
                continue  # the same keys in another order: written in the first line's order
            other = [k for k in record if k not in inputs.fields]
            lacks = [k for k in inputs.fields if k not in record]
            raise DataError(
                f"{source}: {'keys ' + ', '.join(map(repr, other)) if other else ''}"
                f"{' and ' if other and lacks else ''}{'no ' + ', '.join(map(repr, lacks)) if lacks else ''}, "
                f"where the first line has {', '.join(map(repr, inputs.fields))}: a {format} output has one set of "
                f"columns; write a .jsonl output, which keeps each line as it is."
            )


@contextlib.contextmanager
def writing(output):
    """Within it, an `OSError` (a full disk, a folder removed) is one naming --output and `output`, with the
    system's reason and its `errno`."""
    try:
        yield
    except StorageError:  # a remote location's error names it already
        raise
    except OSError as e:
        raise storage.os_error(f"{checks.option('output')} {output}: {storage.reason(e)}.", e.errno) from e


def view_length(model_dir, max_length):
    """`max_length` as loading `model_dir` with it takes it: past the model's context it is cut to it, with the
    loading's warning (`cut_to_context`); for --dry_run, which loads no model."""
    found = read_json(os.path.join(model_dir, "config.json"), "a backbone config")
    config = found.get("config") if isinstance(found, dict) else None
    context = config.get("max_sequence_length") if isinstance(config, dict) else None
    if max_length is None or not isinstance(context, int):
        return max_length
    return cut_to_context(max_length, context, f"preset {model_dir}", "sequence_length")


def check_model(model_dir, given=None):
    """Raises `ConfigError` naming --model (`given`, default `model_dir`) unless `model_dir` is a fine-tuned
    model's folder; for the command and its --dry_run, before anything loads."""
    from kgpt.models.gpt.gpt_task_model import is_task_preset

    given = model_dir if given is None else given
    run = "pass the --output_dir of a kgpt-train --task NAME run"
    if not os.path.exists(model_dir):
        raise ConfigError(f"--model {given}: no such folder; {run}.")
    if not os.path.isdir(model_dir) or not is_task_preset(model_dir):
        raise ConfigError(f"--model {given} is not a fine-tuned model (no task.json of a GPTTaskModel): {run}.")


def check_output(output, input_format, overwrite=False, input=None, model=None):
    """Refuses an `output` that `write` could not write as asked, in one line naming --output; for the
    command before its model loads and for --dry_run.

    `input_format` is the input's (`"text"` for a text file or a task's
    split, whose predictions are a TSV). The extension must be one the
    output is written in; an existing file needs `overwrite`, and is never
    the `input` file itself nor a file in the `model` folder, whatever
    form (`file://`, a link) names it.
    """
    if output == "-":
        return
    storage.check_path(output, "--output", folder=False)
    local = storage.local_form(output)
    if local is not None and input and os.path.exists(local) and os.path.exists(input):
        if os.path.samefile(local, input):
            raise ConfigError(f"--output {output} is the --input file: name another file, so that the input stays.")
    inside = written_by_run(output, model) if model and os.path.isdir(model) else None
    if inside:  # a file of the model (its config, weights, run outputs); a new file beside them is fine
        raise ConfigError(
            f"--output {output} is {'the --model folder' if inside == '.' else f'{inside} of the --model folder'} "
            f"{model}: name another file, so that the model stays."
        )
    extension = os.path.splitext(output)[1].lower()
    if input_format == "text" and tables.EXTENSIONS.get(extension) != "tsv":
        raise ConfigError(
            f"--output {output}: the predictions of a text file or a task's split are a TSV; name "
            f"the file .tsv (or pass - for standard output)."
        )
    if input_format != "text" and extension not in tables.EXTENSIONS:
        raise ConfigError(
            f"--output {output}: a table's predictions are written as .csv, .tsv or .jsonl, by the "
            f"extension; name the file with one of them (or pass - for standard output)."
        )
    if storage.exists(output) and not overwrite:
        raise ConfigError(f"--output {output} exists: pass --overwrite to replace it.")


def check_output_not_read(output, task, split, data_dir):
    """Refuses an `--output` that is one of the files `task` reads for `split` of `data_dir` (so that
    `--overwrite` never replaces the data it predicts), naming the file.

    The files are the ones the reader names in its examples' sources (`"file:line"`); the split is read
    only when `output` exists.
    """
    local = storage.local_form(output) if output != "-" else None
    if local is None or not os.path.exists(local):
        return
    seen = set()
    for item in task.iter_examples(split, data_dir, {}):
        name = str(item.source).rsplit(":", 1)[0]
        if name in seen:
            continue
        seen.add(name)
        for path in (name, os.path.join(data_dir, name)):
            if os.path.isfile(path) and os.path.samefile(path, local):
                raise ConfigError(
                    f"--output {output} is {path}, a file of the {split!r} split it predicts: name another "
                    f"file, so that the data stays."
                )


def through_link(output):
    """The file `--output` names: a symbolic link's target, written as `open(path, "w")` would (the link
    stays)."""
    return os.path.realpath(output) if os.path.islink(output) else output


def output_format(output, input_format):
    """The table format of `output` by its extension; the input's for `-` or another extension."""
    return tables.EXTENSIONS.get(os.path.splitext(output)[1].lower(), input_format) if output != "-" else input_format

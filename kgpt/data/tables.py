"""Tables of named columns: CSV, TSV and JSON lines, read with `file:line` errors and written back.

- CSV: RFC 4180 as Python's `csv` module reads and writes it (quotes, `""`
  inside quotes, line breaks inside quoted fields); the first row names the
  columns.
- TSV: one row per line, tabs between fields, no quoting (GLUE's format);
  the first row names the columns.
- JSON lines: one JSON object per line; the keys are the columns.

A row whose field count differs from the header's, a blank line inside the
data, a duplicate column name (a key given twice in a JSON object), a quoted
CSV field never closed, or a JSON line that is not an object is a
`DataError` naming `file:line`. Nothing is skipped here. A quoted CSV field
holding whole lines that look like rows (a quote left open, closed rows
later) is warned of, counted, with the line the quote opened on.

Example:
```python
table = kgpt.data.tables.read_table("reviews.csv")
table.require(["review", "stars"], "--text_columns/--label_column")
for line, row in table.rows:
    print(line, row["review"], row["stars"])
```
"""

import csv
import difflib
import json
import logging
import os
import sys

from kgpt import checks
from kgpt.data import readers
from kgpt.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

FORMATS = ("csv", "tsv", "jsonl")
# Python's csv refuses fields over 128 KiB; JSON lines and TSV have no such limit, and a long text is cut to the
# model's length later, counted. 2**31 - 1: the most a C long holds on every platform.
FIELD_LIMIT = 2**31 - 1
EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}


def table_format(path, format=None):
    """`format`, or the one `path`'s extension names; `ConfigError` when neither says."""
    if format is not None:
        if format not in FORMATS:
            raise ConfigError(f"{path}: unknown table format {format!r}; use one of {', '.join(FORMATS)}.")
        return format
    extension = os.path.splitext(path)[1].lower()
    if extension not in EXTENSIONS:
        raise ConfigError(
            f"{path}: cannot tell the format from the extension {extension or '(none)'!r}; name it "
            f".csv, .tsv or .jsonl."
        )
    return EXTENSIONS[extension]


class Table:
    """A table file being read: `path`, `format`, `columns` (the header's, or the first JSON object's keys)
    and `rows`, an iterator of `(line_number, {column: value})` read as it is consumed."""

    def __init__(self, path, format, columns, rows):
        self.path, self.format, self.columns, self.rows = path, format, list(columns), rows

    def require(self, wanted, what):
        """`DataError` naming the file, `what` (e.g. a flag) and the columns it has when one of `wanted` is missing.

        In JSON lines, `columns` are the first object's keys; a later object
        lacking one is reported at its line by `value`.
        """
        missing = [c for c in wanted if c not in self.columns]
        if missing:
            near = [n for c in missing for n in _near(c, self.columns)]
            raise DataError(
                f"{self.path}: no column {checks.listed(missing)} ({what}"
                f"{'; did you mean ' + checks.listed(near) + '?' if near else ''}); it has "
                f"{checks.listed(self.columns, most=30) or 'none'}."
            )

    def value(self, row, column, line):
        """`row[column]` as text; a JSON line lacking it, or holding null, a list or an object there, is a `DataError`."""
        if column not in row:
            raise DataError(f"{self.path}:{line}: no {column!r} field.")
        value = row[column]
        if value is None:
            raise DataError(f"{self.path}:{line}: {column!r} is null, not text or a number.")
        if isinstance(value, (dict, list)):
            raise DataError(f"{self.path}:{line}: {column!r} is a JSON {type(value).__name__}, not text or a number.")
        return value if isinstance(value, str) else json.dumps(value)

    def text(self, row, column, line):
        """`value` of a text column: a number is its text, as in a CSV file, but a JSON boolean is a `DataError`
        (a label column named as text, most likely: no sentence is `true`; a choice may be, and is read with
        `value`)."""
        value = self.value(row, column, line)
        if isinstance(row[column], bool):
            raise DataError(
                f"{self.path}:{line}: {column!r} is a JSON boolean ({value}), not text: is it a label column?"
            )
        return value


def read_table(path, format=None):
    """Opens a table file: a `Table` whose `rows` are read lazily; `FileNotFoundError` if there is no file
    (`readers.check_file`)."""
    format = table_format(path, format)
    readers.check_file(path)
    if format == "tsv":
        rows = _tsv_rows(path)
    elif format == "csv":
        rows = _csv_rows(path)
    else:
        rows = iter(readers.read_jsonl(path))
    header = next(rows, None)
    if header is None:
        raise DataError(f"{path}: the file is empty.")
    if format == "jsonl":  # the first object is a row too
        columns = list(header[1])
        rows = _chain(header, rows)
    else:
        columns = header[1]
        readers.check_header(path, header[0], columns)
        rows = _named(path, header[0], columns, rows)
    return Table(path, format, columns, rows)


def _near(name, columns):
    """Columns `name` may have meant: the same but for case and spaces, else a close spelling."""
    same = [c for c in columns if c.strip().casefold() == name.strip().casefold()]
    return same or difflib.get_close_matches(name, columns, n=1, cutoff=0.75)


def _chain(first, rest):
    yield first
    yield from rest


def _named(path, header_line, columns, rows):
    found = False
    for line_no, fields in rows:
        if len(fields) != len(columns):
            raise DataError(
                f"{path}:{line_no}: {len(fields)} field(s), but the header (line {header_line}) names {len(columns)}."
            )
        if [f.strip() for f in fields] == columns:
            raise DataError(
                f"{path}:{line_no}: the header row again (line {header_line} is the first): were files "
                f"joined here? Remove it."
            )
        found = True
        yield line_no, dict(zip(columns, fields))
    if not found:
        raise DataError(f"{path}: no rows after the header.")


def _tsv_rows(path):
    for line_no, line in readers.data_lines(path):
        yield line_no, [f.strip() if line_no == 1 else f for f in line.split("\t")]


def _csv_rows(path):
    """`(first line of the row, fields)`; blank lines are errors except at the end, as in the other formats."""
    csv.field_size_limit(max(csv.field_size_limit(), FIELD_LIMIT))
    lines = []  # the row's own lines: the reader takes one at a time and ends a row at a line end
    reader = csv.reader(_kept(readers.decoded_lines(path), lines), strict=True)
    blank = width = None
    rows, swallowed = 0, []
    while True:
        start = reader.line_num + 1  # a quoted field may span several lines: the row is named by its first
        lines.clear()
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            opened = _open_quote(start, lines)
            if opened is not None and "end of data" in str(e):
                raise DataError(
                    f"{path}:{opened}: a quoted field opens here and is never closed (it runs to the "
                    f"end of the file, line {reader.line_num})."
                ) from None
            raise DataError(f"{path}:{reader.line_num}: malformed CSV ({e}).") from None
        if not fields:
            blank = blank or start
            continue
        if blank is not None:
            raise DataError(f"{path}:{blank}: blank line inside the data.")
        width = width or len(fields)
        rows += 1
        if _holds_rows(lines, width):
            swallowed.append(_open_quote(start, lines[:-1]) or start)
        yield start, [f.strip() for f in fields] if start == 1 else fields
    if swallowed:
        _warn_once(
            path,
            f"{path}: {len(swallowed)} row(s) hold, inside a quoted field, whole lines with the "
            f"header's {width} fields ({reader.line_num} lines read as {rows} rows); the first such "
            f"quote opens at {path}:{swallowed[0]}. If a quote was left open there, close it.",
        )


def _kept(lines, kept):
    for _, line in lines:
        kept.append(line)
        yield line


def _open_quote(start, lines):
    """The line (from `start`) of the quote still open at the end of `lines`, or None when every quote closes."""
    opened = None
    for n, line in enumerate(lines, start=start):
        if line.count('"') % 2:  # "" inside a quoted field counts twice: the parity is the field's state
            opened = n if opened is None else None
    return opened


def _holds_rows(lines, width):
    """Whether a row's inner lines (inside a quoted field throughout) look like rows: a quote left open."""
    return width > 1 and any('"' not in line and line.count(",") == width - 1 for line in lines[1:-1])


_warned = set()  # a table is read more than once in a run (its labels, then its examples): each note is said once


def _warn_once(path, message):
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def write_table(path, format, columns, rows):
    """Writes `rows` (dicts of `columns`) as a CSV, TSV or JSON-lines table to `path` (`-`: standard output).

    A TSV value holding a tab or a line break is a `DataError` (TSV has no
    quoting: write CSV or JSON lines instead). Returns the rows written.
    """
    rows, lines = list(rows), []
    if format == "jsonl":
        lines = [json.dumps({c: row[c] for c in columns}, ensure_ascii=False) + "\n" for row in rows]
    elif format == "tsv":
        for i, row in enumerate([dict(zip(columns, columns)), *rows]):
            values = [str(row[c]) for c in columns]
            bad = next((v for v in values if "\t" in v or "\n" in v or "\r" in v), None)
            if bad is not None:
                raise DataError(
                    f"{path}: row {i} holds a tab or a line break ({checks.shown(bad, 60)}), which TSV cannot; "
                    f"write a .csv or .jsonl instead."
                )
            lines.append("\t".join(values) + "\n")
    else:
        import io

        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([row[c] for c in columns])
        lines = [buffer.getvalue()]
    write_lines(path, lines)
    return len(rows)


def write_lines(path, lines):
    """Writes `lines` (each ending in a newline) to `path` at once (`-`: standard output)."""
    from kgpt.io.storage import write_text  # atomic: no half-written file is left behind

    text = "".join(lines)
    if path == "-":
        sys.stdout.write(text)
    else:
        write_text(path, text)


def extended_json_line(line, values):
    """A JSON-lines row as it was written, with `values` added as its last keys: its own text (a number's
    spelling, `1.50` or `1e3`, and its keys' order) is kept, where loading and dumping it would rewrite it.

    Example: `extended_json_line('{"x": 1.50}', {"p": 0.5})  # '{"x": 1.50, "p": 0.5}\\n'`
    """
    body = line.rstrip()[:-1].rstrip()  # a JSON object: its closing brace is the line's last character
    return f"{body}{'' if body.endswith('{') else ', '}{json.dumps(values, ensure_ascii=False)[1:]}\n"

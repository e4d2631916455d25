"""Line readers for datasets' distributed files, with `file:line` errors.

Task readers build on these so every malformed row is reported the same way:
`kgpt.DataError("path:line: what is wrong")`. Nothing is skipped here; a task
decides what to skip and yields `kgpt.Skipped` so it is counted.
"""

import contextlib
import contextvars
import errno
import json
import math
import os
import stat

from kgpt import checks
from kgpt.errors import DataError, RepeatedKeyError

# The list `recording` gives the readers, while one step of a task's reader runs. A task's reader is
# plugin code, `read(split, data_dir)`, between kgpt and these functions: there is no argument to pass
# the list through without changing that contract, so it travels in a context variable, set only for
# the duration of the step (nothing is kept from one reading to the next).
_recorder = contextvars.ContextVar("kgpt_opened_files", default=None)


@contextlib.contextmanager
def recording(opened):
    """Within the block, the path of every file these readers open is appended to the list `opened`.

    So that an error a task's own code raises between rows can name the file
    being read (`kgpt.tasks.task`).
    """
    token = _recorder.set(opened)
    try:
        yield opened
    finally:
        _recorder.reset(token)


def record_opened(path):
    """Tells the `recording` block around this call (if any) that `path` is being read."""
    opened = _recorder.get()
    if opened is not None:
        opened.append(path)


def check_file(path, name=None, missing=FileNotFoundError):
    """`path` when it is a regular file (or a link to one); else an error naming `name` (an option, `--input`) and
    `path`: `missing` (a class) when nothing is there, a `DataError` for a folder, a link that loops, or what is not
    a regular file (a named pipe, a device: its reading may never end). Nothing is opened: opening a named pipe
    waits for a writer."""
    what = f"{name} {path}" if name else str(path)
    try:
        mode = os.stat(path).st_mode  # follows links
    except OSError as e:
        link = f" (a link to {os.readlink(path)!r})" if os.path.islink(path) else ""
        if e.errno == errno.ENOENT:
            stdin = " (standard input is not read: pass the rows as a file)" if path == "-" else ""
            raise missing(f"{what}{link}: no such file{stdin}.") from None
        if e.errno == errno.ELOOP:
            raise DataError(f"{what} is not a regular file: a loop of symbolic links{link}.") from None
        raise
    if stat.S_ISDIR(mode):
        raise DataError(f"{what} is a folder: name a file.")
    if not stat.S_ISREG(mode):
        kind = "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise DataError(f"{what} is not a regular file ({kind}): write its contents to a file first.")
    return path


def find_file(data_dir, candidates, what):
    """The first of `candidates` (paths relative to `data_dir`) that exists.

    Raises `FileNotFoundError` listing every path tried.
    """
    if data_dir is None or not os.path.isdir(data_dir):
        there = data_dir is not None and os.path.exists(data_dir)
        problem = "is a file, not a directory" if there else "does not exist"
        raise FileNotFoundError(f"Data directory {data_dir!r} {problem} (looking for {what}).")
    for candidate in candidates:
        path = os.path.join(data_dir, candidate)
        if os.path.isfile(path):
            return path
    tried = ", ".join(os.path.join(data_dir, c) for c in candidates)
    raise FileNotFoundError(f"No {what} found; tried {tried}.")


def read_lines(path):
    """Yields `(line_number, text)` of a UTF-8 file (BOM dropped, line ends stripped)."""
    for line_no, line in decoded_lines(path):
        yield line_no, line.rstrip("\r\n")


def decoded_lines(path):
    """`(line_number, text)` of a UTF-8 file, line ends kept (a quoted CSV field may hold them), BOM dropped.

    Bytes that are not UTF-8 are a `DataError` naming the line; a UTF-16 or
    UTF-32 file (Excel's "Unicode text") is named as such.
    """
    record_opened(path)
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            kind = next((k for magic, k in _NOT_UTF8 if line_no == 1 and raw.startswith(magic)), None)
            if kind:
                raise DataError(f"{path}:1: the file is {kind}.")
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}:{line_no}: byte {e.start + 1} of the line (0x{raw[e.start]:02x}) is not valid UTF-8."
                ) from None
            if line_no > 1 and line.startswith("\ufeff"):
                raise DataError(
                    f"{path}:{line_no}: a byte-order mark starts this line, as it starts a file: were "
                    f"files joined here? Remove it (and a second header row)."
                )
            if "\0" in line:  # valid UTF-8, but no text holds it: Python's csv would read it into a field
                raise DataError(
                    f"{path}:{line_no}: byte {raw.index(0) + 1} of the line is a NUL: a binary file, or "
                    f"UTF-16 without a byte-order mark? Save it as UTF-8 text."
                )
            yield line_no, line


# First bytes that say what a file is when it is not UTF-8 text.
_NOT_UTF8 = (
    (b"\xff\xfe", "UTF-16 or UTF-32 (its byte-order mark says), not UTF-8: save it as UTF-8"),
    (b"\xfe\xff", "UTF-16 (its byte-order mark says), not UTF-8: save it as UTF-8"),
    (b"\x1f\x8b", "gzip-compressed, not text: decompress it first"),
    (b"PK\x03\x04", "a zip archive (or a spreadsheet), not text: extract or export it first"),
)


def check_header(path, line_no, columns):
    """A column named twice in a header row is a `DataError` naming `path:line_no`."""
    seen = set()
    for name in columns:
        if name in seen:
            raise DataError(f"{path}:{line_no}: the header names column {name!r} twice.")
        seen.add(name)


def data_lines(path):
    """Yields `(line_number, line)` of `path` (`read_lines`) without blank lines, which are a `DataError` except at
    the end of the file: the lines of a table or a JSON-lines file."""
    blank = None
    for line_no, line in read_lines(path):
        if not line.strip():
            blank = blank or line_no
            continue
        if blank is not None:
            raise DataError(f"{path}:{blank}: blank line inside the data.")
        yield line_no, line


def read_tsv(path, num_columns):
    """Yields `(line_number, fields)` of a tab-separated file without quoting.

    Args:
        path: the file.
        num_columns: fields every row must have (an int, or a tuple of allowed
            counts); a row with another count is a `DataError`.

    Blank lines are errors too, except at the end of the file.
    """
    allowed = (num_columns,) if isinstance(num_columns, int) else tuple(num_columns)
    for line_no, line in data_lines(path):
        fields = line.split("\t")
        if len(fields) not in allowed:
            want = " or ".join(map(str, allowed))
            raise DataError(f"{path}:{line_no}: expected {want} tab-separated fields, got {len(fields)}.")
        yield line_no, fields


def read_tsv_columns(path, required, skip_malformed=False):
    """Yields `(line_number, {column: value})` of a TSV file whose first row names its columns.

    Args:
        path: the file (GLUE's format: a header row, tabs, no quoting).
        required: column names that must be in the header.
        skip_malformed: yield `(line_number, None)` for a row whose field
            count differs from the header's (for a reader to count as
            skipped) instead of raising `DataError`.
    """
    columns = None
    for line_no, line in data_lines(path):
        fields = line.split("\t")
        if columns is None:
            columns = [f.strip() for f in fields]
            check_header(path, line_no, columns)
            missing = [c for c in required if c not in columns]
            if missing:
                raise DataError(
                    f"{path}:{line_no}: the header lacks column(s) {', '.join(missing)}; it has {', '.join(columns)}."
                )
            continue
        if len(fields) != len(columns):
            if skip_malformed:
                yield line_no, None
                continue
            raise DataError(
                f"{path}:{line_no}: expected {len(columns)} tab-separated fields as in the header, got {len(fields)}."
            )
        yield line_no, dict(zip(columns, fields))
    if columns is None:
        raise DataError(f"{path}: the file is empty (no header row).")


def read_jsonl(path):
    """Yields `(line_number, object)` of a JSON-lines file (blank lines at the end allowed).

    A key given twice in one object is a `DataError`: `json` would keep the
    last value without a word.
    """
    for line_no, line in data_lines(path):
        try:
            obj = json.loads(
                line, object_pairs_hook=checks.unique_keys, parse_float=_finite_float, parse_int=_bounded_int
            )
        except OverflowError as e:
            raise DataError(
                f"{path}:{line_no}: the number {checks.shown(e.args[0], quote=False)} is beyond a double's range."
            ) from None
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{line_no}: not valid JSON ({e.msg} at column {e.colno}).") from None
        except RepeatedKeyError as e:
            raise DataError(
                f"{path}:{line_no}: the key {checks.shown(e.args[0])} is given twice in one object."
            ) from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}.")
        yield line_no, obj


def _finite_float(text):
    """A JSON number as a float; one past a double's range (`1e400`, which `json` reads as infinity and writes back as
    `Infinity`, no JSON) raises `OverflowError` with its text."""
    value = float(text)
    if math.isinf(value):
        raise OverflowError(text)
    return value


def _bounded_int(text):
    """A JSON integer; one of more digits than Python converts (4,300, far past a double's range) raises
    `OverflowError` with its text, as `_finite_float` does, where `int` raised a bare `ValueError`."""
    try:
        return int(text)
    except ValueError:
        raise OverflowError(text) from None


def field(obj, key, source):
    """`obj[key]` as a string, or a `DataError` naming `source` when it is missing."""
    if key not in obj or obj[key] is None:
        raise DataError(f"{source}: missing field {key!r}.")
    return str(obj[key])

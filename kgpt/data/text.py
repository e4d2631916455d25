"""Corpus text as the tokenizer and the shard builder read it: streamed, line-aligned, UTF-8 checked.

Both learning a vocabulary (`GPTTokenizer.train`) and tokenizing a corpus
(`kgpt.data.shards`) read files through `text_chunks`, so both see the same
text, with the same cuts of over-long lines.
"""

from kgpt.errors import DataError

CHUNK_BYTES = 1 << 18  # a few MB already keep every worker of the shard builder busy
LINE_BYTES = 1 << 20  # longer lines are cut


def text_chunks(path, chunk_bytes=CHUNK_BYTES, line_bytes=LINE_BYTES, cuts=None):
    """Yields the UTF-8 text of `path` in pieces of at most about `chunk_bytes` that end at line ends.

    A line longer than `line_bytes` is cut after its last space or tab in that
    length, which changes no token, or, with none, mid-word at a character
    boundary; `cuts` (a `collections.Counter`) counts them as `"at a space"`
    and `"mid-word"`. A byte that is not UTF-8 raises `kgpt.DataError` naming the
    file and its byte offset; an I/O error raises `OSError` naming the file.
    """
    offset, pending = 0, b""
    try:
        with open(path, "rb") as f:
            while True:
                block = f.read(chunk_bytes)
                pending += block
                end = pending.rfind(b"\n") + 1
                if not block:
                    end = len(pending)
                elif not end:
                    if len(pending) < line_bytes:
                        continue  # read on to the line's end
                    end, kind = _cut_point(pending)
                    if cuts is not None:
                        cuts[kind] += 1
                if end:
                    yield _decode(pending[:end], path, offset)
                    offset, pending = offset + end, pending[end:]
                if not block:
                    return
    except OSError as e:
        message = f"cannot read {path}: {e.strerror or e}"
        raise (OSError(e.errno, message) if e.errno else OSError(message)) from e


def _cut_point(data):
    """Where to cut a line with no newline: after its last space or tab, else before its last character."""
    end = max(data.rfind(b" "), data.rfind(b"\t")) + 1
    if end:
        return end, "at a space"
    end = len(data) - 1
    while end > 0 and 0x80 <= data[end] < 0xC0:  # a UTF-8 continuation byte: inside a character
        end -= 1
    return end, "mid-word"


def _decode(raw, path, offset):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line, column = _line_of(path, offset + e.start)
        raise DataError(
            f"{path}:{line}: byte {column} of the line (0x{raw[e.start]:02x}) is not valid UTF-8; re-encode the "
            f"file as UTF-8."
        ) from None


def _line_of(path, position):
    """`(line, byte in the line)` of byte `position`, both from 1 as `kgpt.data.readers` names them (read again on
    this error only)."""
    with open(path, "rb") as f:
        before = f.read(position)
    return before.count(b"\n") + 1, position - before.rfind(b"\n")

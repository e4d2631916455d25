"""Token shards on disk: a corpus tokenized once, then sampled without loading it.

`build_shards(files, tokenizer, directory)` reads each file in line-aligned
chunks of about 256 KiB, tokenizes the chunks in worker processes (one per
core by default, when the tokenizer's corpus encoder allows them;
`kgpt.data.corpus_encoding`) and writes the results in order into flat binary
shards of `uint16` ids (`uint32` for vocabularies over 65,536), `SHARD_TOKENS`
each: the shards are byte for byte those of a one-process build, and with
GPT-1's tokenizer each file's ids are `tokenizer.encode(whole file)`. Lines
longer than `LINE_BYTES` are cut (after their last space, or mid-word when
they have none) and counted. The tokenizer is used only through its interface
(`kgpt.tokenizers.interface`): its fingerprint, vocabulary size and corpus
encoder.

A rerun with the same files and tokenizer checks the shards against their
CRCs and reuses them (a changed shard is an error that names it); anything
else rebuilds them. An interrupted build has no index and is rebuilt. The
shards are read through `kgpt.data.shard_index.ShardIndex`.
"""

import collections
import dataclasses
import itertools
import json
import logging
import os
import shutil
import time

import numpy as np

from kgpt.data.corpus_encoding import Piece, encoded, file_ids, jobs
from kgpt.data.shard_index import INDEX_FILE, INDEX_FORMAT, ShardIndex, ShardWriter, matching_index, token_dtype
from kgpt.data.text import CHUNK_BYTES, LINE_BYTES
from kgpt.errors import ConfigError, DataError, Preempted
from kgpt.io import storage

SHARD_TOKENS = 1 << 24  # 16M tokens: 32 MiB per shard as uint16

logger = logging.getLogger(__name__)


def _source(path):
    stat = os.stat(path)
    return {"path": os.path.abspath(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def default_workers():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class Team:
    """Processes that build one corpus's shards together: this one is `index` of `count`.

    `agree(flag)` is a collective of the run's runtime (`kgpt.parallel.cluster`):
    it returns whether `flag` is true on every process, once all have called it.
    """

    index: int = 0
    count: int = 1
    agree: object = None

    def all(self, flag):
        return flag if self.count == 1 else bool(self.agree(flag))


def build_shards(
    files,
    tokenizer,
    directory,
    shard_tokens=SHARD_TOKENS,
    workers=None,
    chunk_bytes=CHUNK_BYTES,
    line_bytes=LINE_BYTES,
    team=None,
    stop=None,
):
    """Tokenizes `files` into shards in `directory` (or reuses matching ones); returns the `ShardIndex`.

    Args:
        files: UTF-8 text files, concatenated in this order.
        tokenizer: a kgpt tokenizer (`kgpt.tokenizers.interface`): `kgpt.GPTTokenizer` or a keras-hub
            tokenizer in `kgpt.KerasHubTokenizer`.
        directory: where the shards and `index.json` go.
        shard_tokens: tokens per shard file.
        workers: processes that tokenize (default: one per core this
            process may use); the shards are the same for any number.
        chunk_bytes, line_bytes: the reading sizes (see `kgpt.data.text.text_chunks`).
        team: several processes (hosts) building the shards together in one
            `directory` they all see (`Team`): each tokenizes every
            `count`-th chunk into a part file, process 0 joins the parts
            into the shards, byte for byte those one process builds.
        stop: a callable, asked between chunks of a one-process build, that
            returns True once the build should end (a scheduler's SIGTERM):
            it then raises `Preempted`, leaving no index (a rerun builds
            anew). A team's processes must reach each collective together,
            so they finish and stop before training instead.

    Empty files (no tokens) and cut lines and words are counted and
    reported; a corpus with no tokens at all is an error.
    """
    team = team or Team()
    os.makedirs(directory, exist_ok=True)
    sources = [_source(p) for p in files]
    fingerprint = tokenizer.fingerprint()
    index = matching_index(directory, sources, fingerprint)
    if team.all(index is not None):
        logger.info(
            f"Reusing {index.total_tokens:,} tokens in {len(index.shards)} shard(s) in {directory} (CRC-32 checked)."
        )
        return index
    index_path = os.path.join(directory, INDEX_FILE)
    parts = os.path.join(directory, PARTS)
    if team.index == 0:
        if os.path.exists(index_path):
            os.remove(index_path)  # stale: the corpus or tokenizer changed
        shutil.rmtree(parts, ignore_errors=True)
    team.all(True)  # nobody reads the old index or writes a part before this
    workers = default_workers() if workers is None else max(1, int(workers))
    engine = tokenizer.corpus_encoder()
    dtype = token_dtype(tokenizer.vocabulary_size())
    start, cuts = time.perf_counter(), collections.Counter()
    used = {"workers": 1}
    chunks = jobs(files, engine, chunk_bytes, line_bytes, cuts)
    if team.count == 1:
        pieces = encoded(chunks, engine, workers, used)
        index = _write_shards(
            pieces if stop is None else _stopping(pieces, stop, files),
            files,
            sources,
            fingerprint,
            cuts,
            directory,
            dtype,
            shard_tokens,
            engine,
            line_bytes,
        )
    else:
        mine = (job for k, job in enumerate(chunks) if k % team.count == team.index)
        _write_part(encoded(mine, engine, workers, used), parts, team.index, dtype)
        team.all(True)  # every part is written
        if team.index == 0:
            index = _write_shards(
                _read_parts(parts, team.count, dtype),
                files,
                sources,
                fingerprint,
                cuts,
                directory,
                dtype,
                shard_tokens,
                engine,
                line_bytes,
            )
            shutil.rmtree(parts, ignore_errors=True)
        team.all(True)  # the index is written
        if team.index:
            index = matching_index(directory, sources, fingerprint)
            if index is None:
                raise ConfigError(
                    f"{directory} holds no shards of these {len(files)} corpus file(s) as this "
                    f"process sees them (their sizes and modification times are part of the index): "
                    f"every process must see the same files at the same paths."
                )
    seconds = time.perf_counter() - start
    logger.info(
        f"Tokenized {len(files)} file(s) into {index.total_tokens:,} tokens in {len(index.shards)} shard(s) in "
        f"{directory}: {seconds:.1f} s, {index.total_tokens / max(seconds, 1e-9):,.0f} tokens/s with "
        f"{used['workers']} worker(s)"
        + (f" ({workers} allowed; one chunk needs no more)" if used["workers"] < workers else "")
        + (f" on each of {team.count} processes" if team.count > 1 else "")
        + "."
    )
    return index


def _write_shards(pieces, files, sources, fingerprint, cuts, directory, dtype, shard_tokens, engine, line_bytes):
    """Joins `pieces` (in corpus order) into shards and writes the index last; returns the `ShardIndex`."""
    counts = [0] * len(files)
    writer = ShardWriter(directory, dtype, shard_tokens)
    try:
        for source, group in itertools.groupby(
            _counting(pieces, cuts, engine.cut_label), key=lambda piece: piece.source
        ):
            for ids in file_ids(group, engine.newline_id):
                writer.write(ids)
                counts[source] += len(ids)
    finally:
        writer.close()
    sources = [dict(source, tokens=count) for source, count in zip(sources, counts)]
    _report(files, counts, cuts, line_bytes)
    index = ShardIndex(directory, np.dtype(dtype).name, writer.shards, sources, fingerprint, dict(cuts), INDEX_FORMAT)
    if not index.total_tokens:
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise DataError(f"All {len(files)} corpus file(s) are empty (no token): {shown}.")
    index_path = os.path.join(directory, INDEX_FILE)
    tmp = index_path + ".tmp"
    with storage.naming(index_path), open(tmp, "w", encoding="utf-8") as f:
        json.dump(dataclasses.asdict(index) | {"total_tokens": index.total_tokens}, f, indent=1)
    os.replace(tmp, index_path)  # the index appears only once every shard is complete
    return index


PARTS = "parts"  # where the processes of a team write their pieces before process 0 joins them
_PIECE_FIELDS = 6  # source, number of ids, starts_line, ends_line, has_newline, cut_words


def _write_part(pieces, directory, index, dtype):
    """Writes this process's pieces to `directory/part-INDEX.bin` (their ids) and `.npy` (a row of facts each)."""
    os.makedirs(directory, exist_ok=True)
    rows = []
    path = os.path.join(directory, f"part-{index:05d}.bin")
    with storage.naming(path), open(path, "wb") as f:
        for piece in pieces:
            f.write(np.asarray(piece.ids, dtype).tobytes())
            rows.append(
                [piece.source, len(piece.ids), piece.starts_line, piece.ends_line, piece.has_newline, piece.cut_words]
            )
    path = os.path.join(directory, f"part-{index:05d}.npy")
    with storage.naming(path):
        np.save(path, np.asarray(rows, np.int64).reshape(-1, _PIECE_FIELDS))


def _read_parts(directory, count, dtype):
    """Yields every process's pieces in corpus order (chunk k came from process k mod `count`)."""
    rows = [np.load(os.path.join(directory, f"part-{i:05d}.npy")) for i in range(count)]
    ids = [
        np.memmap(os.path.join(directory, f"part-{i:05d}.bin"), dtype=dtype, mode="r")
        if os.path.getsize(os.path.join(directory, f"part-{i:05d}.bin"))
        else np.zeros(0, dtype)
        for i in range(count)
    ]
    at, offset = [0] * count, [0] * count
    for k in range(sum(len(r) for r in rows)):
        i = k % count
        source, n, starts_line, ends_line, has_newline, cut_words = (int(v) for v in rows[i][at[i]])
        yield Piece(
            source,
            np.asarray(ids[i][offset[i] : offset[i] + n]),
            bool(starts_line),
            bool(ends_line),
            bool(has_newline),
            cut_words,
        )
        at[i] += 1
        offset[i] += n


def _stopping(pieces, stop, files):
    """Passes the pieces through until `stop()` is true, then raises `Preempted` naming the file reached."""
    at = 0
    try:
        for piece in pieces:
            at = piece.source
            if stop():
                break
            yield piece
        else:
            return
    except Exception:
        if not stop():
            raise
        # A SIGTERM sent to the whole process group ended the tokenizer's workers too: that is the notice.
    pieces.close()  # ends the workers now, not when the traceback is freed
    raise Preempted(
        f"stopped by SIGTERM while tokenizing the corpus (file {at + 1} of {len(files)}, {files[at]}); no shard "
        f"is kept. Run the same command again to tokenize it anew."
    )


def _counting(pieces, cuts, label):
    """Passes the pieces through, adding up the words the workers cut."""
    for piece in pieces:
        if piece.cut_words:
            cuts[label] += piece.cut_words
        yield piece


def _report(files, counts, cuts, line_bytes):
    empty = [path for path, count in zip(files, counts) if not count]
    if empty:
        logger.info(f"Skipped {len(empty)} empty file(s): {', '.join(empty[:5])}" + (" ..." if len(empty) > 5 else ""))
    lines = {kind: n for kind, n in cuts.items() if kind in ("at a space", "mid-word")}
    if lines:
        logger.info(
            f"Cut lines longer than {line_bytes:,} bytes: "
            + ", ".join(f"{n:,} {kind}" for kind, n in lines.items())
            + " (a cut at a space changes no token)."
        )
    words = {kind: n for kind, n in cuts.items() if kind not in lines}
    for kind, n in words.items():
        logger.info(f"Cut {n:,} {kind} into pieces of that length (the original tokenizes them whole).")

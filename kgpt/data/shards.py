"""Token shards on disk: a corpus tokenized once, then sampled without loading it.

`build_shards(files, tokenizer, directory)` reads each file in line-aligned
chunks of about 256 KiB, tokenizes the chunks in worker processes (one per
core by default) and writes the results in order into flat binary shards of
`uint16` ids (`uint32` for vocabularies over 65,536), `SHARD_TOKENS` each: the
shards are byte for byte those of a one-process build, and each file's ids
are `tokenizer.encode(whole file)`. Lines longer than `LINE_BYTES` are cut
(after their last space, or mid-word when they have none) and counted.

`index.json` is written last: token counts and a CRC-32 per shard, token
counts per source file, the tokenizer's fingerprint and every source's size
and modification time. A rerun with the same files and tokenizer checks the
shards against their CRCs and reuses them (a changed shard is an error that
names it); anything else rebuilds them. An interrupted build has no index
and is rebuilt.

`ShardIndex.windows(...)` is a `tf.data` stream of random contiguous windows
read from memory-mapped shards: memory use does not grow with the corpus.
Batch `k` is a pure function of `(seed, k)`, so a resumed run sees exactly the
batches an uninterrupted one would have.
"""

import collections
import dataclasses
import gc
import itertools
import json
import logging
import multiprocessing
import os
import queue
import shutil
import sys
import time
import warnings
import zlib

import numpy as np

from kgpt._children import die_with_parent
from kgpt.data.text import CHUNK_BYTES, LINE_BYTES, text_chunks
from kgpt.errors import ConfigError, DataError
from kgpt.models.tokenizer import MAX_WORD_CHARS, fix_text

INDEX_FILE = "index.json"
INDEX_FORMAT = 2  # 2: CRC-32 per shard
SHARD_TOKENS = 1 << 24  # 16M tokens: 32 MiB per shard as uint16

logger = logging.getLogger(__name__)


def token_dtype(vocabulary_size):
    return np.uint16 if vocabulary_size <= 1 << 16 else np.uint32


def _source(path):
    stat = os.stat(path)
    return {"path": os.path.abspath(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def default_workers():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# --- encoding -----------------------------------------------------------------

_Piece = collections.namedtuple("_Piece", "source ids starts_line ends_line has_newline cut_words")


def _jobs(files, chunk_bytes, line_bytes, cuts):
    """`(source index, chunk text, whether an earlier chunk of the file had a "<")` for every chunk."""
    for source, path in enumerate(files):
        after_lt = False
        for text in text_chunks(path, chunk_bytes, line_bytes, cuts):
            yield source, text, after_lt
            after_lt = after_lt or "<" in text  # ftfy stops decoding HTML entities after one


def _encode_job(engine, job):
    """A `_Piece`: the ids of one chunk and the newlines around its words."""
    source, text, after_lt = job
    fixed = fix_text(text, after_lt)
    cut = engine.cut_words
    ids = np.asarray(engine.encode_fixed(fixed), token_dtype(len(engine.encoder)))
    lead, trail = fixed[: len(fixed) - len(fixed.lstrip())], fixed[len(fixed.rstrip()) :]
    return _Piece(source, ids, "\n" in lead, "\n" in trail, "\n" in fixed, engine.cut_words - cut)


def _worker(engine, inbox, outbox, parent):
    """A worker process: encodes the jobs it is sent, returning each piece with the words it learned.

    It ends with `parent` (the pid of the process that started it), even
    when that one is killed with SIGKILL and can send no None.
    """
    die_with_parent(parent)
    engine.record()
    while True:
        message = inbox.get()
        if message is None:
            return
        journals, job = message
        for journal in journals:
            engine.learn(journal)
        try:
            piece = _encode_job(engine, job)
        except Exception as e:  # sent back, raised by the parent
            outbox.put(("error", e))
            return
        outbox.put(("piece", (piece, engine.record())))


class _Workers:
    """Processes that encode jobs in turn (job k on worker k mod n) and share what each one learns.

    Each worker returns the words it split and BPE-encoded with its piece;
    those journals go to the other workers with their next jobs, so that a
    word costs spaCy and BPE once in the whole build, as in one process.
    Queues (not bare pipes): their sends never block, so a worker returning a
    piece and this process sending it the next job cannot wait on each other.
    """

    def __init__(self, engine, count):
        # fork shares the loaded vocabulary and caches with the workers at no
        # cost; elsewhere the TextEncoder is pickled (without its caches).
        context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        self.inboxes = [context.Queue() for _ in range(count)]
        self.outboxes = [context.Queue() for _ in range(count)]
        self.processes = []
        gc.freeze()  # the workers' garbage collector would otherwise copy every inherited page
        try:
            with warnings.catch_warnings():
                # JAX warns on any fork once its threads run. The deadlock it means needs the child to wait on
                # a lock a JAX thread held; these workers only run the tokenizer and never call JAX.
                warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
                # The workers die with the thread that starts them here (PR_SET_PDEATHSIG, see
                # kgpt._children): the one running build_shards (kgpt-train's main thread), which
                # closes them before it returns.
                for inbox, outbox in zip(self.inboxes, self.outboxes):
                    process = context.Process(target=_worker, args=(engine, inbox, outbox, os.getpid()), daemon=True)
                    process.start()
                    self.processes.append(process)
        finally:
            gc.unfreeze()
        self.journals = [[] for _ in range(count)]  # what each worker has not been sent yet

    def send(self, k, job):
        w = k % len(self.processes)
        self.inboxes[w].put((self.journals[w], job))
        self.journals[w] = []

    def receive(self, k):
        w = k % len(self.processes)
        while True:
            try:
                kind, value = self.outboxes[w].get(timeout=1)
                break
            except queue.Empty:
                if not self.processes[w].is_alive():
                    raise RuntimeError(f"A tokenizer worker process died (exit code {self.processes[w].exitcode}); "
                                       "if the machine ran out of memory, try fewer workers.") from None
        if kind == "error":
            raise value
        piece, journal = value
        for v, pending in enumerate(self.journals):
            if v != w:
                pending.append(journal)
        return piece

    def close(self):
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(2)
            if process.is_alive():
                process.terminate()
                process.join()
        for box in self.inboxes + self.outboxes:
            box.close()
            box.cancel_join_thread()


def _encoded(jobs, engine, workers, used=None):
    """Yields `_encode_job` of every job, in order, from `workers` processes (this one alone for 1).

    `used["workers"]` becomes the number of processes that did encode: 1 when
    the whole corpus is one chunk, however many were allowed.
    """
    jobs = iter(jobs)
    first = next(jobs, None)
    if first is None:
        return
    # The first chunk is encoded here, so that the workers start with its
    # words cached instead of each finding the common words anew.
    yield _encode_job(engine, first)
    second = next(jobs, None)
    if second is None:
        return
    jobs = itertools.chain([second], jobs)
    if workers <= 1:
        for job in jobs:
            yield _encode_job(engine, job)
        return
    pool = _Workers(engine, workers)
    if used is not None:
        used["workers"] = workers
    try:
        sent = received = 0
        for job in jobs:
            pool.send(sent, job)
            sent += 1
            if sent - received >= 2 * workers:  # bounded: the corpus is never all in memory
                yield pool.receive(received)
                received += 1
        while received < sent:
            yield pool.receive(received)
            received += 1
    finally:
        pool.close()


def _file_ids(pieces, newline_id):
    """Joins the chunks of one file as `encode()` joins its lines: one newline token where whitespace holds one."""
    seen_words = newline = False
    for piece in pieces:
        if not len(piece.ids):
            newline = newline or piece.has_newline
            continue
        if seen_words and (newline or piece.starts_line):
            yield np.asarray([newline_id], piece.ids.dtype)
        yield piece.ids
        seen_words, newline = True, piece.ends_line


def encode_file(tokenizer, path, chunk_bytes=CHUNK_BYTES, line_bytes=LINE_BYTES, cuts=None):
    """Yields int arrays of `path`'s token ids; together they equal `tokenizer.encode(whole text)`.

    (Except where a line longer than `line_bytes` was cut mid-word, counted in `cuts`.)
    """
    engine = tokenizer.text_encoder
    pieces = (_encode_job(engine, job) for job in _jobs([path], chunk_bytes, line_bytes, cuts))
    yield from _file_ids(pieces, engine.newline_id)


# --- the shards -----------------------------------------------------------------

@dataclasses.dataclass
class ShardIndex:
    """The shards of one corpus: read with `tokens(start, stop)` or `windows(...)`."""

    directory: str
    dtype: str
    shards: list  # [{"file": name, "tokens": n, "crc32": c}, ...]
    sources: list  # [{"path", "bytes", "mtime_ns", "tokens"}, ...]
    tokenizer: str  # fingerprint
    cuts: dict = dataclasses.field(default_factory=dict)  # what was cut while reading, with counts
    format: int = 1  # indexes written before CRCs name none

    @property
    def total_tokens(self):
        return sum(s["tokens"] for s in self.shards)

    def arrays(self):
        """Read-only memory maps of the shards."""
        if not hasattr(self, "_maps"):
            self._maps = [
                np.memmap(os.path.join(self.directory, s["file"]), dtype=self.dtype, mode="r", shape=(s["tokens"],))
                for s in self.shards
                if s["tokens"]
            ]
        return self._maps

    def tokens(self, start, stop):
        """Token ids `[start, stop)` of the whole stream as an int32 array (crosses shards)."""
        pieces, base = [], 0
        for array in self.arrays():
            lo, hi = max(start - base, 0), min(stop - base, len(array))
            if lo < hi:
                pieces.append(np.asarray(array[lo:hi], np.int32))
            base += len(array)
        return np.concatenate(pieces) if pieces else np.zeros(0, np.int32)

    def windows(self, sequence_length, batch_size, seed, stop=None, first_batch=0, rows=None, micro_batches=1):
        """Endless `tf.data` stream of `(x, y)` batches of random windows inside `[0, stop)`.

        A window never crosses a shard boundary. Batch `k` depends only on
        `(seed, k)`; `first_batch` starts the stream there (for resuming).
        With `micro_batches` M, each batch of `batch_size` windows comes as M
        consecutive micro-batches of `batch_size / M` (gradient
        accumulation; `first_batch` then counts micro-batches). `rows`
        `(start, stop)` keeps only those rows of each (micro-)batch: a
        process's slice when several train together (`kgpt.parallel.distribute`).
        The windows are the same whatever the slicing.
        """
        import tensorflow as tf

        stop = self.total_tokens if stop is None else stop
        arrays, bases, counts, base = [], [], [], 0
        for array in self.arrays():
            usable = min(len(array), stop - base) - sequence_length  # window starts in this shard
            if usable > 0:
                arrays.append(array)
                bases.append(base)
                counts.append(usable)
            base += len(array)
        if not counts:
            raise ValueError(f"No shard holds a window of sequence_length={sequence_length} + 1 tokens.")
        if batch_size % micro_batches:
            raise ValueError(f"batch_size {batch_size} does not split into {micro_batches} micro-batches.")
        ends = np.cumsum(counts)
        begins = ends - np.asarray(counts)
        length = sequence_length + 1
        micro = batch_size // micro_batches
        start, end = rows or (0, micro)
        if not 0 <= start < end <= micro:
            raise ValueError(f"rows {rows} are not inside a batch of {micro}.")

        def batch(m):
            k, j = divmod(int(m), micro_batches)
            rng = np.random.default_rng([seed, k])
            picks = rng.integers(0, ends[-1], batch_size)[j * micro + start : j * micro + end]
            which = np.searchsorted(ends, picks, side="right")
            offsets = picks - begins[which]
            return np.stack([arrays[w][o : o + length] for w, o in zip(which, offsets)]).astype(np.int32)

        def to_xy(windows):
            windows.set_shape([end - start, length])
            x = {"token_ids": windows[:, :-1], "padding_mask": tf.ones([end - start, sequence_length], tf.int32)}
            return x, windows[:, 1:]

        return (
            tf.data.Dataset.counter(first_batch)
            .map(lambda k: tf.numpy_function(batch, [k], tf.int32), num_parallel_calls=tf.data.AUTOTUNE)
            .map(to_xy)
            .prefetch(tf.data.AUTOTUNE)
        )

    def check(self):
        """Raises `kgpt.DataError` naming the first shard whose size or CRC-32 is not the recorded one."""
        for shard in self.shards:
            path = os.path.join(self.directory, shard["file"])
            expected = shard["tokens"] * np.dtype(self.dtype).itemsize
            if not os.path.isfile(path) or os.path.getsize(path) != expected:
                found = f"{os.path.getsize(path):,} bytes" if os.path.isfile(path) else "missing"
                raise DataError(f"{path}: {found}, but {INDEX_FILE} records {expected:,} bytes. " + _CHANGED)
            if _crc32(path) != shard["crc32"]:
                raise DataError(f"{path}: its CRC-32 is not the one {INDEX_FILE} records. " + _CHANGED)

    @classmethod
    def load(cls, directory):
        with open(os.path.join(directory, INDEX_FILE), encoding="utf-8") as f:
            data = json.load(f)
        fields = {f.name for f in dataclasses.fields(cls)} - {"directory"}
        return cls(directory, **{k: v for k, v in data.items() if k in fields})


_CHANGED = (
    "The shard changed after it was written (a copy, a disk or another program); delete the shards "
    "folder to tokenize the corpus again."
)


def _crc32(path):
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return crc


def _matching_index(directory, sources, fingerprint):
    """The index of shards built from exactly `sources` with this tokenizer, checked; None to rebuild."""
    try:
        index = ShardIndex.load(directory)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    previous = [{k: s[k] for k in ("path", "bytes", "mtime_ns")} for s in index.sources]
    if index.format != INDEX_FORMAT or previous != sources or index.tokenizer != fingerprint:
        return None
    index.check()
    return index


class _ShardWriter:
    """Writes a stream of id arrays into shards of `shard_tokens`, with a CRC-32 each."""

    def __init__(self, directory, dtype, shard_tokens):
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.shards, self._file, self._filled = [], None, shard_tokens

    def write(self, ids):
        while len(ids):
            if self._filled == self.shard_tokens:
                self._open()
            take = ids[: self.shard_tokens - self._filled]
            data = take.astype(self.dtype, copy=False).tobytes()
            self._file.write(data)
            shard = self.shards[-1]
            shard["tokens"] += len(take)
            shard["crc32"] = zlib.crc32(data, shard["crc32"])
            self._filled += len(take)
            ids = ids[len(take) :]

    def _open(self):
        self.close()
        name = f"tokens_{len(self.shards):05d}.bin"
        self.shards.append({"file": name, "tokens": 0, "crc32": 0})
        self._file, self._filled = open(os.path.join(self.directory, name), "wb"), 0

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None


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


def build_shards(files, tokenizer, directory, shard_tokens=SHARD_TOKENS, workers=None,
                 chunk_bytes=CHUNK_BYTES, line_bytes=LINE_BYTES, team=None):
    """Tokenizes `files` into shards in `directory` (or reuses matching ones); returns the `ShardIndex`.

    Args:
        files: UTF-8 text files, concatenated in this order.
        tokenizer: a `GPTTokenizer`.
        directory: where the shards and `index.json` go.
        shard_tokens: tokens per shard file.
        workers: processes that tokenize (default: one per core this
            process may use); the shards are the same for any number.
        chunk_bytes, line_bytes: the reading sizes (see `kgpt.data.text.text_chunks`).
        team: several processes (hosts) building the shards together in one
            `directory` they all see (`Team`): each tokenizes every
            `count`-th chunk into a part file, process 0 joins the parts
            into the shards, byte for byte those one process builds.

    Empty files (no tokens) and cut lines and words are counted and
    reported; a corpus with no tokens at all is an error.
    """
    team = team or Team()
    os.makedirs(directory, exist_ok=True)
    sources = [_source(p) for p in files]
    fingerprint = tokenizer.fingerprint()
    index = _matching_index(directory, sources, fingerprint)
    if team.all(index is not None):
        logger.info(f"Reusing {index.total_tokens:,} tokens in {len(index.shards)} shard(s) in {directory} (CRC-32 checked).")
        return index
    index_path = os.path.join(directory, INDEX_FILE)
    parts = os.path.join(directory, PARTS)
    if team.index == 0:
        if os.path.exists(index_path):
            os.remove(index_path)  # stale: the corpus or tokenizer changed
        shutil.rmtree(parts, ignore_errors=True)
    team.all(True)  # nobody reads the old index or writes a part before this
    workers = default_workers() if workers is None else max(1, int(workers))
    engine = tokenizer.text_encoder
    dtype = token_dtype(tokenizer.vocabulary_size())
    start, cuts = time.perf_counter(), collections.Counter()
    used = {"workers": 1}
    jobs = _jobs(files, chunk_bytes, line_bytes, cuts)
    if team.count == 1:
        index = _write_shards(_encoded(jobs, engine, workers, used), files, sources, fingerprint, cuts, directory,
                              dtype, shard_tokens, engine.newline_id, line_bytes)
    else:
        mine = (job for k, job in enumerate(jobs) if k % team.count == team.index)
        _write_part(_encoded(mine, engine, workers, used), parts, team.index, dtype)
        team.all(True)  # every part is written
        if team.index == 0:
            index = _write_shards(_read_parts(parts, team.count, dtype), files, sources, fingerprint, cuts,
                                  directory, dtype, shard_tokens, engine.newline_id, line_bytes)
            shutil.rmtree(parts, ignore_errors=True)
        team.all(True)  # the index is written
        if team.index:
            index = _matching_index(directory, sources, fingerprint)
            if index is None:
                raise ConfigError(f"{directory} holds no shards of these {len(files)} corpus file(s) as this "
                                  f"process sees them (their sizes and modification times are part of the index): "
                                  f"every process must see the same files at the same paths.")
    seconds = time.perf_counter() - start
    logger.info(f"Tokenized {len(files)} file(s) into {index.total_tokens:,} tokens in {len(index.shards)} shard(s) in "
        f"{directory}: {seconds:.1f} s, {index.total_tokens / max(seconds, 1e-9):,.0f} tokens/s with "
        f"{used['workers']} worker(s)" + (f" ({workers} allowed; one chunk needs no more)" if used["workers"] < workers else "")
        + (f" on each of {team.count} processes" if team.count > 1 else "") + ".")
    return index


def _write_shards(pieces, files, sources, fingerprint, cuts, directory, dtype, shard_tokens, newline_id, line_bytes):
    """Joins `pieces` (in corpus order) into shards and writes the index last; returns the `ShardIndex`."""
    counts = [0] * len(files)
    writer = _ShardWriter(directory, dtype, shard_tokens)
    try:
        for source, group in itertools.groupby(_counting(pieces, cuts), key=lambda piece: piece.source):
            for ids in _file_ids(group, newline_id):
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
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(dataclasses.asdict(index) | {"total_tokens": index.total_tokens}, f, indent=1)
    os.replace(tmp, index_path)  # the index appears only once every shard is complete
    return index


PARTS = "parts"  # where the processes of a team write their pieces before process 0 joins them
_PIECE_FIELDS = 6  # source, number of ids, starts_line, ends_line, has_newline, cut_words


def _write_part(pieces, directory, index, dtype):
    """Writes this process's pieces to `directory/part-INDEX.bin` (their ids) and `.npy` (a row of facts each)."""
    os.makedirs(directory, exist_ok=True)
    rows = []
    with open(os.path.join(directory, f"part-{index:05d}.bin"), "wb") as f:
        for piece in pieces:
            f.write(np.asarray(piece.ids, dtype).tobytes())
            rows.append([piece.source, len(piece.ids), piece.starts_line, piece.ends_line, piece.has_newline,
                         piece.cut_words])
    np.save(os.path.join(directory, f"part-{index:05d}.npy"), np.asarray(rows, np.int64).reshape(-1, _PIECE_FIELDS))


def _read_parts(directory, count, dtype):
    """Yields every process's pieces in corpus order (chunk k came from process k mod `count`)."""
    rows = [np.load(os.path.join(directory, f"part-{i:05d}.npy")) for i in range(count)]
    ids = [np.memmap(os.path.join(directory, f"part-{i:05d}.bin"), dtype=dtype, mode="r")
           if os.path.getsize(os.path.join(directory, f"part-{i:05d}.bin")) else np.zeros(0, dtype)
           for i in range(count)]
    at, offset = [0] * count, [0] * count
    for k in range(sum(len(r) for r in rows)):
        i = k % count
        source, n, starts_line, ends_line, has_newline, cut_words = (int(v) for v in rows[i][at[i]])
        yield _Piece(source, np.asarray(ids[i][offset[i]:offset[i] + n]), bool(starts_line), bool(ends_line),
                     bool(has_newline), cut_words)
        at[i] += 1
        offset[i] += n


def _counting(pieces, cuts):
    """Passes the pieces through, adding up the words the workers cut."""
    for piece in pieces:
        if piece.cut_words:
            cuts[f"words over {MAX_WORD_CHARS:,} characters"] += piece.cut_words
        yield piece


def _report(files, counts, cuts, line_bytes):
    empty = [path for path, count in zip(files, counts) if not count]
    if empty:
        logger.info(f"Skipped {len(empty)} empty file(s): {', '.join(empty[:5])}" + (" ..." if len(empty) > 5 else ""))
    lines = {kind: n for kind, n in cuts.items() if kind in ("at a space", "mid-word")}
    if lines:
        logger.info(f"Cut lines longer than {line_bytes:,} bytes: " + ", ".join(f"{n:,} {kind}" for kind, n in lines.items())
            + " (a cut at a space changes no token).")
    words = {kind: n for kind, n in cuts.items() if kind not in lines}
    for kind, n in words.items():
        logger.info(f"Cut {n:,} {kind} into pieces of that length (the original tokenizes them whole).")

"""A token shards folder's index, and reading the shards without loading them.

`index.json` is written last: token counts and a CRC-32 per shard, token
counts per source file, the tokenizer's fingerprint and every source's size
and modification time. `ShardIndex.windows(...)` is a `tf.data` stream of
random contiguous windows read from memory-mapped shards: memory use does not
grow with the corpus. Batch `k` is a pure function of `(seed, k)`, so a
resumed run sees exactly the batches an uninterrupted one would have.
"""

import dataclasses
import json
import os
import zlib

import numpy as np

from kgpt.errors import DataError
from kgpt.io import storage

INDEX_FILE = "index.json"
INDEX_FORMAT = 2  # 2: CRC-32 per shard


def token_dtype(vocabulary_size):
    return np.uint16 if vocabulary_size <= 1 << 16 else np.uint32


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

    def content_crc32(self):
        """A CRC-32 of the token stream, from its shards' own: what a resumed run checks it still trains on
        (an edit that keeps the token count, such as one word for another, changes it)."""
        shards = json.dumps([[s["tokens"], s.get("crc32")] for s in self.shards])
        return f"{zlib.crc32(shards.encode()):08x}"

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


def matching_index(directory, sources, fingerprint):
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


class ShardWriter:
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
            with storage.naming(self._file.name):
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
            file, self._file = self._file, None
            with storage.naming(file.name):
                file.close()

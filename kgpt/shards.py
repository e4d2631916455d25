"""Token shards on disk: a corpus tokenized once, then sampled without loading it.

`build_shards(files, tokenizer, directory)` streams each file through the
tokenizer (in line-aligned chunks of about 1 MiB) into flat binary shards of
`uint16` ids (`uint32` for vocabularies over 65,536), `SHARD_TOKENS` each,
and writes `index.json` last: token counts per shard and per source file, the
tokenizer's fingerprint and every source's size and modification time. A
rerun with the same files and tokenizer reuses the shards; anything else
rebuilds them. An interrupted build has no index and is rebuilt.

`ShardIndex.windows(...)` is a `tf.data` stream of random contiguous windows
read from memory-mapped shards: memory use does not grow with the corpus.
Batch `k` is a pure function of `(seed, k)`, so a resumed run sees exactly the
batches an uninterrupted one would have.
"""

import dataclasses
import json
import os

import numpy as np

INDEX_FILE = "index.json"
SHARD_TOKENS = 1 << 24  # 16M tokens: 32 MiB per shard as uint16
_CHUNK_BYTES = 1 << 20


def token_dtype(vocabulary_size):
    return np.uint16 if vocabulary_size <= 1 << 16 else np.uint32


def _source(path):
    stat = os.stat(path)
    return {"path": os.path.abspath(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def text_chunks(path, chunk_bytes=_CHUNK_BYTES):
    """Yields the UTF-8 text of `path` in pieces that end at line ends.

    A byte that is not UTF-8 raises `ValueError` naming the file and its byte offset.
    """
    offset = 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(chunk_bytes)
            if not raw:
                return
            if len(raw) == chunk_bytes:
                raw += f.readline()  # finish the line so no word is split
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}: byte {offset + e.start} (0x{raw[e.start]:02x}) is not valid UTF-8; "
                    "re-encode the file as UTF-8."
                ) from None
            offset += len(raw)
            yield text


def encode_file(tokenizer, path, chunk_bytes=_CHUNK_BYTES):
    """Yields int arrays of `path`'s token ids; together they equal `tokenizer.encode(whole text)`.

    The tokenizer turns a whitespace run holding a newline into one `\\n`
    token and drops whitespace at the ends of its input. Every chunk but the
    last ends with a newline, so one `\\n` token goes between any two chunks
    that have words.
    """
    newline = tokenizer.encoder.get("\n</w>")
    seen_words = False
    for text in text_chunks(path, chunk_bytes):
        ids = tokenizer.encode(text)
        if not ids:
            continue
        if seen_words and newline is not None:
            ids = [newline] + ids
        seen_words = True
        yield np.asarray(ids, np.int64)


@dataclasses.dataclass
class ShardIndex:
    """The shards of one corpus: read with `tokens(start, stop)` or `windows(...)`."""

    directory: str
    dtype: str
    shards: list  # [{"file": name, "tokens": n}, ...]
    sources: list  # [{"path", "bytes", "mtime_ns", "tokens"}, ...]
    tokenizer: str  # fingerprint

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

    def windows(self, sequence_length, batch_size, seed, stop=None, first_batch=0):
        """Endless `tf.data` stream of `(x, y)` batches of random windows inside `[0, stop)`.

        A window never crosses a shard boundary. Batch `k` depends only on
        `(seed, k)`; `first_batch` starts the stream there (for resuming).
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
        ends = np.cumsum(counts)
        begins = ends - np.asarray(counts)
        length = sequence_length + 1

        def batch(k):
            rng = np.random.default_rng([seed, int(k)])
            picks = rng.integers(0, ends[-1], batch_size)
            which = np.searchsorted(ends, picks, side="right")
            offsets = picks - begins[which]
            return np.stack([arrays[w][o : o + length] for w, o in zip(which, offsets)]).astype(np.int32)

        def to_xy(windows):
            windows.set_shape([batch_size, length])
            x = {"token_ids": windows[:, :-1], "padding_mask": tf.ones([batch_size, sequence_length], tf.int32)}
            return x, windows[:, 1:]

        return (
            tf.data.Dataset.counter(first_batch)
            .map(lambda k: tf.numpy_function(batch, [k], tf.int32), num_parallel_calls=tf.data.AUTOTUNE)
            .map(to_xy)
            .prefetch(tf.data.AUTOTUNE)
        )

    @classmethod
    def load(cls, directory):
        with open(os.path.join(directory, INDEX_FILE), encoding="utf-8") as f:
            data = json.load(f)
        return cls(directory, data["dtype"], data["shards"], data["sources"], data["tokenizer"])


def _matching_index(directory, sources, fingerprint):
    try:
        index = ShardIndex.load(directory)
    except (OSError, ValueError, KeyError):
        return None
    previous = [{k: s[k] for k in ("path", "bytes", "mtime_ns")} for s in index.sources]
    if previous != sources or index.tokenizer != fingerprint:
        return None
    if not all(os.path.getsize(os.path.join(directory, s["file"])) == s["tokens"] * np.dtype(index.dtype).itemsize
               for s in index.shards):
        return None
    return index


def build_shards(files, tokenizer, directory, shard_tokens=SHARD_TOKENS, log=print):
    """Tokenizes `files` into shards in `directory` (or reuses matching ones); returns the `ShardIndex`.

    Empty files (no tokens) are counted and reported; a corpus with no tokens at
    all is an error.
    """
    os.makedirs(directory, exist_ok=True)
    sources = [_source(p) for p in files]
    fingerprint = tokenizer.fingerprint()
    index = _matching_index(directory, sources, fingerprint)
    if index is not None:
        log(f"Reusing {index.total_tokens:,} tokens in {len(index.shards)} shard(s) in {directory}.")
        return index
    index_path = os.path.join(directory, INDEX_FILE)
    if os.path.exists(index_path):
        os.remove(index_path)  # stale: the corpus or tokenizer changed
    dtype = token_dtype(tokenizer.vocabulary_size())
    shards, out, filled = [], None, 0

    def open_shard():
        name = f"tokens_{len(shards):05d}.bin"
        shards.append({"file": name, "tokens": 0})
        return open(os.path.join(directory, name), "wb")

    empty = []
    try:
        out = open_shard()
        for source, path in zip(sources, files):
            count = 0
            for ids in encode_file(tokenizer, path):
                count += len(ids)
                while len(ids):
                    if filled == shard_tokens:
                        out.close()
                        out, filled = open_shard(), 0
                    take = ids[: shard_tokens - filled]
                    out.write(take.astype(dtype).tobytes())
                    shards[-1]["tokens"] += len(take)
                    filled += len(take)
                    ids = ids[len(take) :]
            source["tokens"] = count
            if not count:
                empty.append(path)
    finally:
        if out is not None:
            out.close()
    if empty:
        log(f"Skipped {len(empty)} empty file(s): {', '.join(empty[:5])}" + (" ..." if len(empty) > 5 else ""))
    index = ShardIndex(directory, np.dtype(dtype).name, shards, sources, fingerprint)
    if not index.total_tokens:
        raise ValueError(f"All {len(files)} corpus file(s) are empty.")
    tmp = index_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(dataclasses.asdict(index) | {"total_tokens": index.total_tokens}, f, indent=1)
    os.replace(tmp, index_path)  # the index appears only once every shard is complete
    log(f"Tokenized {len(files)} file(s) into {index.total_tokens:,} tokens in {len(shards)} shard(s) in {directory}.")
    return index

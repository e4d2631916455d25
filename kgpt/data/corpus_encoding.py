"""Encoding a corpus for the shard builder: line-aligned chunks, in order, in worker processes or here.

Each file is read in line-aligned chunks (`kgpt.data.text.text_chunks`) and
each chunk encoded by the tokenizer's corpus encoder
(`kgpt.tokenizers.interface.CorpusEncoder`), which this module knows only
through that interface. With several workers, chunk k goes to worker k mod n
and the pieces come back in order; the workers share what each one learns.
"""

import collections
import gc
import itertools
import multiprocessing
import os
import queue
import signal
import sys
import warnings

import numpy as np

from kgpt._children import die_with_parent
from kgpt.data.shard_index import token_dtype
from kgpt.data.text import text_chunks

# One encoded chunk: the `kgpt.tokenizers.interface.Chunk` fields and the index of its source file.
Piece = collections.namedtuple("Piece", "source ids starts_line ends_line has_newline cut_words")


def jobs(files, engine, chunk_bytes, line_bytes, cuts):
    """`(source index, chunk text, state)` for every chunk: the state the encoder carries from a file's earlier
    chunks (`engine.follows`)."""
    for source, path in enumerate(files):
        state = None
        for text in text_chunks(path, chunk_bytes, line_bytes, cuts):
            yield source, text, state
            state = engine.follows(state, text)


def encode_job(engine, job):
    """A `Piece`: the ids of one chunk and the newlines around its words."""
    source, text, state = job
    chunk = engine.encode_chunk(text, state)
    return Piece(source, np.asarray(chunk.ids, token_dtype(engine.vocabulary_size)), *chunk[1:])


def _worker(engine, inbox, outbox, parent):
    """A worker process: encodes the jobs it is sent, returning each piece with the words it learned.

    It ends with `parent` (the pid of the process that started it), even
    when that one is killed with SIGKILL and can send no None.
    """
    die_with_parent(parent)
    # Forked with the job's handlers: SIGTERM must end a worker (the parent's `close` and exit send it), and
    # Ctrl-C, which reaches the whole process group, is the parent's to handle. SIGTERM came blocked, so
    # that one sent before this point is not lost to the inherited handler.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    engine.record()
    while True:
        message = inbox.get()
        if message is None:
            return
        journals, job = message
        for journal in journals:
            engine.learn(journal)
        try:
            piece = encode_job(engine, job)
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
        # cost; elsewhere the encoder is pickled (GPT-1's without its caches).
        context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        self.inboxes = [context.Queue() for _ in range(count)]
        self.outboxes = [context.Queue() for _ in range(count)]
        self.processes = []
        gc.freeze()  # the workers' garbage collector would otherwise copy every inherited page
        masked = hasattr(signal, "pthread_sigmask")
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}) if masked else None
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
            if masked:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
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
                    raise RuntimeError(
                        f"A tokenizer worker process died (exit code {self.processes[w].exitcode}); "
                        "if the machine ran out of memory, try fewer workers."
                    ) from None
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


def encoded(jobs, engine, workers, used=None):
    """Yields `encode_job` of every job, in order, from `workers` processes (this one alone for 1).

    `used["workers"]` becomes the number of processes that did encode: 1 when
    the whole corpus is one chunk, however many were allowed.
    """
    jobs = iter(jobs)
    first = next(jobs, None)
    if first is None:
        return
    # The first chunk is encoded here, so that the workers start with its
    # words cached instead of each finding the common words anew.
    yield encode_job(engine, first)
    second = next(jobs, None)
    if second is None:
        return
    jobs = itertools.chain([second], jobs)
    if workers <= 1 or not engine.processes:
        for job in jobs:
            yield encode_job(engine, job)
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


def file_ids(pieces, newline_id):
    """Joins the chunks of one file as the tokenizer's `encode()` joins its lines: one `newline_id` where
    whitespace between words holds a newline (GPT-1's); with `newline_id` None, the chunks' ids as they are."""
    if newline_id is None:
        yield from (piece.ids for piece in pieces if len(piece.ids))
        return
    seen_words = newline = False
    for piece in pieces:
        if not len(piece.ids):
            newline = newline or piece.has_newline
            continue
        if seen_words and (newline or piece.starts_line):
            yield np.asarray([newline_id], piece.ids.dtype)
        yield piece.ids
        seen_words, newline = True, piece.ends_line

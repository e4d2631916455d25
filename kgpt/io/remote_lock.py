"""The claim of a remote output folder, standing in for the POSIX lock an object store lacks."""

import json
import logging
import os
import socket
import threading
import time
import uuid

from kgpt.errors import StorageError
from kgpt.io.storage import exists, join, read_text, remove, write_text

logger = logging.getLogger(__name__)


class RemoteLock:
    """The claim of a remote output folder: a lock object naming its holder's host and pid; a context manager.

    An object store has no record lock that dies with its process, so the
    claim is an object (`.lock`) holding this host, pid and a token,
    refreshed every `refresh_s` by a thread. A present lock is refused while
    it is fresh; it is taken over when it is older than `stale_s` (its
    process died without removing it) or when its holder is a process of
    this host that is gone. Two runs that claim the folder within the same
    instant can both win: the check is read-then-write, which an object
    store cannot make atomic. A run that finds its lock taken over stops
    at its next push.
    """

    def __init__(self, folder, stale_s=120.0, refresh_s=30.0):
        self.path = join(folder, ".lock")
        self.folder, self.stale_s, self.refresh_s = folder, stale_s, refresh_s
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread = None

    def holder(self):
        """The lock's content (a dict), or None when there is none or it is unreadable."""
        if not exists(self.path):
            return None
        try:
            found = json.loads(read_text(self.path))
        except (ValueError, StorageError):
            return {}
        return found if isinstance(found, dict) else {}

    def _stale(self, found):
        age = time.time() - float(found.get("time", 0) or 0)
        if age > self.stale_s:
            return f"not refreshed for {age:.0f} s"
        if found.get("host") == socket.gethostname() and isinstance(found.get("pid"), int):
            try:
                os.kill(found["pid"], 0)
            except ProcessLookupError:
                return f"process {found['pid']} of this host is gone"
            except PermissionError:
                pass
        return None

    def acquire(self):
        """Claims the folder, or raises `StorageError` naming the holder while its lock is fresh."""
        found = self.holder()
        if found is not None:
            why = self._stale(found)
            if why is None:
                raise StorageError(self.in_use(found))
            logger.warning(f"Taking over the lock of {self.folder} ({_describe(found)}): {why}.")
        self._write()
        time.sleep(0.2)  # a claim written at the same moment replaces ours: read back who won
        found = self.holder() or {}
        if found.get("token") != self.token:
            raise StorageError(self.in_use(found))
        self._thread = threading.Thread(target=self._refresh, daemon=True, name="kgpt-lock")
        self._thread.start()

    def in_use(self, found):
        return (
            f"{self.folder} is in use by another kgpt run ({_describe(found)}): wait for it to finish, or pass "
            f"another --output_dir (a lock left by a process that died is taken over after {self.stale_s:.0f} s "
            f"without refresh, or delete {self.path})."
        )

    def _write(self):
        write_text(
            self.path,
            json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": self.token, "time": time.time()})
            + "\n",
        )

    def _refresh(self):
        while not self._stop.wait(self.refresh_s):
            try:
                if (self.holder() or {}).get("token") != self.token:
                    logger.error(
                        f"The lock of {self.folder} was taken over by another run: this run's outputs "
                        f"there are no longer its own."
                    )
                    return
                self._write()
            except StorageError as e:
                logger.warning(f"Could not refresh the lock of {self.folder}: {e}")

    def check(self):
        """Raises `StorageError` when another run has taken the folder over."""
        found = self.holder() or {}
        if found.get("token") != self.token:
            raise StorageError(
                f"{self.folder}: another run took over this run's lock ({_describe(found)}); this "
                f"run stops writing there."
            )

    def release(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            if (self.holder() or {}).get("token") == self.token:
                remove(self.path)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def _describe(found):
    if not found:
        return "an unreadable lock"
    return f"pid {found.get('pid')} on {found.get('host')}"

"""The one place kgpt reaches an output location that may be remote: `gs://`, `file://`, `ram://`, ...

A path without a scheme is the local file system, used directly as ever
(nothing here is imported on that path's way). A path with a scheme
(`SCHEME://...`) goes through TensorFlow's file systems, `tf.io.gfile`
(TensorFlow is installed with kgpt, so JAX runs have it too): `gs://`
everywhere, `s3://` and `hdfs://` where a TensorFlow plugin adds them,
`file://` and the in-memory `ram://`.

A run never writes a remote output directory file by file while it trains:
it works in a local mirror (`Mirror`) that starts as a copy of the remote
folder's kgpt outputs (so a rerun resumes from the remote checkpoint and
memory-maps its shards from local disk), and `Mirror.push` copies what
changed back after every checkpoint, saved preset and `metrics.json`, and at
the end (the run that owns the mirror calls it: `kgpt.jobs.run.Run.publish`).
Pointer files (a checkpoint's `latest.json`, a preset's `metrics.json`) are
copied after the files they name, and each file arrives whole (an object
store's uploads do; elsewhere it is written under a temporary name and
renamed), so the remote folder always holds a whole checkpoint.
`kgpt.io.remote_lock.RemoteLock` stands in for the POSIX lock an object
store lacks.

Example:
```python
with kgpt.io.storage.Mirror("gs://bucket/run") as mirror:   # pulls the remote folder
    kgpt.io.storage.write_text(os.path.join(mirror.local, "notes.txt"), "written locally")
    mirror.push()                                               # pushes what changed (also done at exit)
```
"""

import contextlib
import errno
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import uuid

from kgpt.errors import StorageError

logger = logging.getLogger(__name__)

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# Seconds the first contact with a remote folder may take before the run stops: a host without
# network or credentials must not hang (TensorFlow's GCS client retries for minutes).
TIMEOUT_S = 60.0
# Written after everything else: each names or completes files that must already be there.
POINTERS = ("latest.json", "metrics.json")
_UPLOADING = ".kgpt-upload"
# Object stores whose uploads appear whole or not at all: written in place (a rename there is a second copy).
WHOLE_OBJECTS = ("gs", "s3")


def scheme(path):
    """The scheme of `path` (`"gs"` for `gs://b/x`), or None for a local path."""
    match = _SCHEME.match(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
    return match.group(1).lower() if match else None


def is_remote(path):
    """Whether `path` names a location reached through `tf.io.gfile` rather than the local file system."""
    return scheme(path) is not None


def local_form(path):
    """The local path `path` names: itself without a scheme, `/x` for `file:///x`; None for another scheme.

    For comparing an output with what a run reads: `file:///m` and `/m` are one folder.
    """
    name = scheme(path)
    if name is None:
        return os.fspath(path)
    return os.fspath(path)[len(name) + 3 :] if name == "file" else None


def refuse_url(path, why, otherwise, error=StorageError, flag=None):
    """Raises `error` for a `path` with a URL scheme where kgpt reads or writes a local one, as
    `"[FLAG ]PATH: WHY (WHAT TO DO)."`: the local path a `file://` one stands for, else `otherwise`."""
    name = scheme(path) if path is not None else None
    if name is None:
        return
    label = f"{flag} {path}" if flag else path
    raise error(f"{label}: {why} (" + (f"pass {local_form(path)}" if name == "file" else otherwise) + ").")


def join(path, *names):
    """`os.path.join` for a local path, `/`-joined for a remote one."""
    if not is_remote(path):
        return os.path.join(path, *names)
    return "/".join([os.fspath(path).rstrip("/"), *names])


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def _errors():
    import tensorflow as tf

    return tf.errors


def _first_line(error):
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def _bounded(fn, what, timeout):
    """`fn()` in a thread that the caller stops waiting for after `timeout` s (StorageError naming `what`)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name="kgpt-storage-check")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise StorageError(
            f"{what}: no answer within {timeout:g} s (no network, or the storage service is unreachable from here)."
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")


def check_folder(path, flag="--output_dir", create=True, timeout=None):
    """Checks that the remote folder `path` can be reached (and created); a one-line `StorageError` if not.

    Returns whether the folder exists (with `create=False`, nothing is written
    and a folder not there yet is False).

    An unknown scheme, a bucket that does not exist, missing credentials or
    no network are each told with `flag` and `path`, within `timeout` s.
    """
    name = scheme(path)
    what = f"{flag} {path}"
    try:
        registered = _gfile().get_registered_schemes()
    except AttributeError:  # an older TensorFlow: the first call below tells
        registered = None
    if registered is not None and name not in registered:
        known = ", ".join(f"{s}://" for s in sorted(s for s in registered if s))
        raise StorageError(
            f"{what}: no file system for {name}:// is installed here (TensorFlow has {known}; "
            f"s3:// and others need a TensorFlow file-system plugin)."
        )

    def probe():
        gfile = _gfile()
        if create:
            gfile.makedirs(path)
        elif not gfile.exists(path):
            return False
        if not gfile.isdir(path):
            raise StorageError(f"{what} is not a folder.")
        return True

    errors = _errors()
    try:
        return _bounded(probe, what, TIMEOUT_S if timeout is None else timeout)
    except StorageError:
        raise
    except errors.UnimplementedError as e:
        raise StorageError(f"{what}: {_first_line(e)}.") from None
    except errors.NotFoundError as e:
        raise StorageError(f"{what} cannot be created: {_first_line(e)} (does the bucket exist?).") from None
    except (errors.PermissionDeniedError, errors.UnauthenticatedError) as e:
        raise StorageError(
            f"{what}: access refused ({_first_line(e)}); check the credentials "
            f"(GOOGLE_APPLICATION_CREDENTIALS for gs://)."
        ) from None
    except errors.OpError as e:
        raise StorageError(f"{what} cannot be reached ({type(e).__name__}: {_first_line(e)}).") from None


def check_path(path, flag="--output_dir", folder=True):
    """The checks a run makes of an output path before writing, and its `--dry_run` with it: one `StorageError` line.

    `path` names a folder (`folder=True`) or a file the command writes. A
    remote path must name something after its scheme (`ram://` alone would
    turn into a local `ram:` folder once joined) and a `file://` one must be
    absolute (TensorFlow reads `file://a/b` as host `a`, path `/b`). A local
    path must not start with a `~` the shell left unexpanded, nor pass
    through a file, nor be a file where a folder is wanted (or a folder where
    a file is), and what would be created must be in a writable folder.
    Whether a remote folder can be reached is `check_folder`'s.
    """
    path = os.fspath(path)
    name = scheme(path)
    if name is not None:
        rest = path[len(name) + 3 :]
        if not rest.strip("/"):
            example = "file:///PATH" if name == "file" else f"{name}://NAME"
            raise StorageError(
                f"{flag} {path} names no {'folder' if folder else 'file'}: add one after the scheme ({example})."
            )
        if name == "file" and not rest.startswith("/"):
            raise StorageError(
                f"{flag} {path}: a file:// path must be absolute, file:///PATH with three slashes "
                f"(file://{rest} names host {rest.split('/')[0]!r}); or pass the local path {rest}."
            )
        if name == "file":  # the local path's checks: a folder where a file is wanted failed after the work
            try:
                check_path(rest, flag, folder)
            except StorageError as e:
                raise StorageError(str(e).replace(f"{flag} {rest}", f"{flag} {path}", 1)) from None
        return
    if path.startswith("~") and os.path.expanduser(path) != path:
        raise StorageError(
            f"{flag} {path}: the shell does not expand ~ after '='; pass {os.path.expanduser(path)} "
            f"(or {flag} {path}, with a space)."
        )
    what, local = ("folder" if folder else "file"), os.path.normpath(path)  # `afile/` is no folder either
    if not folder and path.endswith(os.sep):
        raise StorageError(f"{flag} {path} ends with {os.sep}, as a folder does: name a file.")
    parts = local.split(os.sep)
    for i in range(1, len(parts)):  # each folder on the way, from the top
        above = os.sep.join(parts[:i]) or os.sep
        if os.path.exists(above) and not os.path.isdir(above):
            raise StorageError(f"{flag} {path}: {above} is a file, not a folder.")
    if os.path.isdir(local) != folder and os.path.exists(local):
        raise StorageError(f"{flag} {path} is a {'file' if folder else 'folder'}, not a {what}.")
    nearest = local if folder and os.path.isdir(local) else os.path.dirname(os.path.abspath(local))
    while not os.path.exists(nearest):
        nearest = os.path.dirname(nearest)
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise StorageError(f"{flag} {path}: {nearest} is not writable by this user.")


def check_local(path, flag):
    """Raises `StorageError` for an input `path` with a URL scheme: kgpt reads inputs from the local file system.

    Without it `ram://t.csv` would be read as the local relative path
    `ram:/t.csv` and reported missing. Only outputs may be remote
    (`--output_dir gs://...`); `local_copy` brings a remote folder here.
    """
    refuse_url(path, "kgpt reads its inputs from local files", "copy it here first; outputs may be remote", flag=flag)


def _call(what, fn, *args):
    """A gfile call whose failure is a one-line `StorageError` naming `what`."""
    try:
        return fn(*args)
    except _errors().OpError as e:
        raise StorageError(f"{what}: {type(e).__name__}: {_first_line(e)}") from None


def exists(path):
    return _call(path, _gfile().exists, path) if is_remote(path) else os.path.exists(path)


def isdir(path):
    return _call(path, _gfile().isdir, path) if is_remote(path) else os.path.isdir(path)


def listdir(path):
    """The names in folder `path` (without the trailing `/` some object stores give folders)."""
    if not is_remote(path):
        return os.listdir(path)
    return [name.rstrip("/") for name in _call(path, _gfile().listdir, path)]


def read_text(path):
    if not is_remote(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    with _gfile().GFile(path, "r") as f:
        return _call(path, f.read)


def write_text(path, text):
    """Writes `text` to `path` atomically: under a temporary name first, then renamed over the old one (an
    object on `gs://` or `s3://` appears whole, so it is written in place)."""
    if not is_remote(path):
        _write_local(path, text)
        return
    tmp = path if scheme(path) in WHOLE_OBJECTS else f"{path}{_UPLOADING}-{uuid.uuid4().hex[:8]}"

    def put():
        with _gfile().GFile(tmp, "w") as f:
            f.write(text)
        if tmp != path:
            _gfile().rename(tmp, path, overwrite=True)

    _call(path, put)


def write_json(path, data):
    """Writes `data` as indented JSON, atomically as `write_text` does; a NaN or infinite float is written as null.

    Python's `NaN` and `Infinity` are not JSON: strict readers (JavaScript's
    `JSON.parse`, Go's `encoding/json`) refuse the whole file.
    """
    write_text(path, json.dumps(_finite(data), indent=2, allow_nan=False) + "\n")


def _finite(data):
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def _write_local(path, text):
    """A temporary file in the same directory, then `os.replace`: the file is the old one or the new one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        os.fchmod(fd, _mode_of(path))  # mkstemp's 0600 would make every output private
        with naming(path), os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _mode_of(path):
    """The permissions `open(path, "w")` would leave: the file's own if it exists, else 0666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask():
    try:  # Linux tells it without changing it: setting it to read it races with other threads creating files
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o22)
        os.umask(mask)
        return mask


def check_room(folder, nbytes, what):
    """Refuses to begin writing `what` (about `nbytes` bytes) into the local `folder` when its file system has
    less free: an `OSError` with `errno.ENOSPC` naming both, before anything is written."""
    free = shutil.disk_usage(folder).free
    if free < nbytes:
        raise os_error(
            f"{folder}: no space left on device for {what} (it needs about {_megabytes(nbytes)}, "
            f"{_megabytes(free)} free)",
            errno.ENOSPC,
        )


def os_error(text, number):
    """An `OSError` of `errno` `number` that reads `text` alone (`OSError(number, text)` would start it with
    "[Errno 28] ")."""
    error = OSError(text)
    error.errno = number
    return error


def reason(error):
    """The system's reason for the `OSError` `error`, lower-cased for the middle of a sentence ("no space left
    on device"), not h5py's page of HDF5 internals around it."""
    text = os.strerror(error.errno) if error.errno else (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text[:1].lower() + text[1:]


@contextlib.contextmanager
def naming(path):
    """Within it, an `OSError` that names no file (a full disk's, raised by a `write` or `close`) names `path`."""
    try:
        yield
    except OSError as e:
        if e.filename or str(e).startswith(os.fspath(path)):
            raise
        raise os_error(f"{path}: {reason(e)}", e.errno) from e


def _megabytes(nbytes):
    return f"{nbytes / 1e3:,.0f} KB" if nbytes < 1e6 else f"{nbytes / 1e6:,.1f} MB"


def remove(path):
    """Removes the file or folder `path`, if there is one."""
    if not is_remote(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
        return
    gfile = _gfile()
    if _call(path, gfile.isdir, path):
        _call(path, gfile.rmtree, path)
    elif _call(path, gfile.exists, path):
        _call(path, gfile.remove, path)


def is_upload(name):
    """Whether `name` is a file an interrupted upload left under its temporary name."""
    return _UPLOADING in name


def download(remote, local):
    """Copies the remote file or folder `remote` to the local path `local` (replacing it)."""
    gfile = _gfile()
    if _call(remote, gfile.isdir, remote):
        os.makedirs(local, exist_ok=True)
        for name in listdir(remote):
            if not is_upload(name):
                download(join(remote, name), os.path.join(local, name))
        return
    os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
    _call(remote, gfile.copy, remote, local, True)


@contextlib.contextmanager
def local_copy(path, prefix="kgpt-remote-"):
    """Yields a local folder holding a copy of the remote folder `path`, deleted afterwards.

    For reading what a remote run wrote with code that needs local files
    (`GPTCausalLM.from_preset(local)` and the like); a local `path` is
    yielded as it is.
    """
    if not is_remote(path):
        yield path
        return
    if not isdir(path):
        raise StorageError(f"{path}: no such remote folder.")
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        local = os.path.join(scratch, "copy")
        download(path, local)
        yield local


def _signature(path):
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


class Mirror:
    """A local folder standing for the remote folder `remote` while a run writes it; a context manager.

    Entering copies `names` (default: all) from the remote folder into a new
    local folder (`self.local`); `push()` copies every file that changed
    since the last push (pointer files last) and removes remote files that
    were pulled or pushed and are gone locally (an older checkpoint);
    leaving pushes once more and deletes the local folder. Other files in
    the remote folder are left alone.
    """

    def __init__(self, remote, names=None, prefix="kgpt-staged-", lock=None, writer=True):
        self.remote, self.names, self.prefix = os.fspath(remote).rstrip("/"), names, prefix
        self.lock = lock  # a RemoteLock checked before each push: a run that lost its folder stops writing it
        self.writer = writer  # False: a reading copy (the processes of a run other than 0) that never pushes
        self.local = None
        self._sent = {}  # relative path -> the signature it was pushed or pulled with
        self._guard = threading.Lock()

    def __enter__(self):
        self.local = os.path.realpath(tempfile.mkdtemp(prefix=self.prefix))
        try:
            for name in listdir(self.remote):
                if self.names is None or name in self.names:
                    download(join(self.remote, name), os.path.join(self.local, name))
            self._sent = {rel: _signature(os.path.join(self.local, rel)) for rel in self._files()}
        except BaseException:
            shutil.rmtree(self.local, ignore_errors=True)
            raise
        if self.writer:
            logger.info(
                f"Writing {self.remote} through the local folder {self.local} (copied there after each "
                f"checkpoint and save)."
            )
        return self

    def __exit__(self, kind, error, trace):
        try:
            self.push()  # nothing for a reading copy
        except StorageError as e:
            if kind is None:
                raise
            logger.warning(f"Could not copy the last outputs to {self.remote}: {e}")  # the run's own error goes on
        finally:
            shutil.rmtree(self.local, ignore_errors=True)

    def remote_path(self, path):
        """The remote location the local `path` (in `self.local`) stands for, for messages."""
        rel = os.path.relpath(os.path.abspath(path), self.local)
        return self.remote if rel == "." else join(self.remote, *rel.split(os.sep))

    def _files(self):
        found = []
        for folder, _, files in os.walk(self.local):
            for name in files:
                found.append(os.path.relpath(os.path.join(folder, name), self.local).replace(os.sep, "/"))
        return found

    def pull(self, names):
        """Copies `names` (files or folders of the remote folder) over the local ones: what another process wrote."""
        for name in names:
            if exists(join(self.remote, name)):
                download(join(self.remote, name), os.path.join(self.local, name))

    def push(self):
        """Copies changed files to the remote folder (pointer files last), then removes what is gone locally."""
        if not self.writer:
            return
        with self._guard:
            if self.lock is not None:
                self.lock.check()
            current = {}
            for rel in self._files():
                try:
                    current[rel] = _signature(os.path.join(self.local, rel))
                except FileNotFoundError:  # removed while listed (a temporary file)
                    continue
            changed = [rel for rel, sig in current.items() if self._sent.get(rel) != sig and not _temporary(rel)]
            changed.sort(key=lambda rel: (rel.rsplit("/", 1)[-1] in POINTERS, rel))
            gfile = _gfile() if changed or set(self._sent) - set(current) else None
            for rel in changed:
                target = join(self.remote, rel)
                _call(target, gfile.makedirs, target.rsplit("/", 1)[0])
                if scheme(target) in WHOLE_OBJECTS:
                    _call(target, gfile.copy, os.path.join(self.local, rel), target, True)
                else:
                    tmp = f"{target}{_UPLOADING}-{uuid.uuid4().hex[:8]}"
                    _call(target, gfile.copy, os.path.join(self.local, rel), tmp, True)
                    _call(target, gfile.rename, tmp, target, True)
                self._sent[rel] = current[rel]
            for rel in sorted(set(self._sent) - set(current)):
                target = join(self.remote, rel)
                if _call(target, gfile.exists, target):
                    _call(target, gfile.remove, target)
                del self._sent[rel]
            if gfile is not None:
                self._prune_folders(gfile)

    def _prune_folders(self, gfile):
        """Removes remote folders that are gone locally (an old checkpoint's, emptied above)."""
        local_dirs = {os.path.relpath(f, self.local).replace(os.sep, "/") for f, _, _ in os.walk(self.local)}
        for folder, _, _ in reversed(list(_call(self.remote, gfile.walk, self.remote))):
            rel = folder[len(self.remote) :].strip("/")
            if rel and rel not in local_dirs and not _call(folder, gfile.listdir, folder):
                _call(folder, gfile.rmtree, folder)


def _temporary(rel):
    """A file that is no output: one being written under a temporary name (`.NAME.*.tmp`), or a local lock."""
    base = rel.rsplit("/", 1)[-1]
    return (base.endswith(".tmp") and base.startswith(".")) or base == ".lock"

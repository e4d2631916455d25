"""Child processes that end when the process that started them ends, even by SIGKILL.

A child calls `die_with_parent(parent_pid)` first thing: on Linux the kernel
then sends it a signal (`prctl(PR_SET_PDEATHSIG)`) when its parent ends,
however it ends; `parent_pid` (the parent's `os.getpid()`, recorded before
the fork or exec) closes the race of a parent that ended before the call.
On other platforms it does nothing, and a child there outlives a parent
killed with SIGKILL until it finishes on its own.

The signal comes when the *thread* that started the child ends, not the
process: start children from a thread that lives as long as they are
needed (kgpt starts them from the main thread).

libc's `prctl` is looked up when this module is imported, so that a forked
child only calls it: loading a library after a fork of a process with
threads can wait forever on a lock another thread held. Standard library
only (ctypes, 4 ms): `kgpt._quiet`'s stderr filter, a `python -c` child that
does not import kgpt, runs this file by its path.
"""

import functools
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _libc_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):  # no ctypes, or a libc without prctl
        return None
    return lambda option, value: prctl(ctypes.c_int(option), *(ctypes.c_ulong(v) for v in (value, 0, 0, 0)))


_prctl = _libc_prctl()


def die_with_parent(parent_pid, sig=signal.SIGKILL):
    """Asks for `sig` when this process's parent, `parent_pid`, ends; sends it now if it has ended already.

    Returns whether the request was made (False off Linux, or where libc
    has no `prctl`).
    """
    if _prctl is None or _prctl(PR_SET_PDEATHSIG, int(sig)) != 0:
        return False
    if os.getppid() != parent_pid:  # the parent ended before the request: the kernel will send nothing
        os.kill(os.getpid(), sig)
    return True


def ends_with_this_process(sig=signal.SIGKILL):
    """A `preexec_fn` for `subprocess`: the child asks for `sig` when the process that starts it ends.

    Example:
    ```python
    subprocess.run([sys.executable, "-c", "pass"], preexec_fn=ends_with_this_process())
    ```
    """
    return functools.partial(die_with_parent, os.getpid(), sig)

"""kgpt's progress messages: the standard `logging` logger "kgpt" and its children.

Modules report through `logger = logging.getLogger(__name__)`, never through a
`log=` argument. Like any library, kgpt leaves logging to the application: it
adds no handler and sets no level, so a script that configures nothing sees
only warnings (Python's last-resort handler prints WARNING and above to
stderr) and a script that calls `logging.basicConfig(...)` gets kgpt's
messages through its own handlers. The commands print progress through
`to_stdout()`; a script or notebook shows a job's progress the same way with

    import kgpt
    kgpt.log.to_stdout()

(No `logging.NullHandler` either: with one on "kgpt", Python's last-resort
handler would stay silent, and the warnings that count skipped rows would
reach nobody in a script that configures no logging.)
"""

import logging
import sys

logger = logging.getLogger("kgpt")


class _StdoutHandler(logging.StreamHandler):
    """A handler on the current `sys.stdout`, looked up at each message (pytest's capsys replaces it)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _):
        pass


def to_stdout(level=logging.INFO):
    """Prints kgpt's messages of `level` and above to stdout as plain lines, as the commands do.

    The messages then stop at the "kgpt" logger (the root logger's handlers
    do not print them again). Calling it again changes only the level.
    """
    if not any(isinstance(h, _StdoutHandler) for h in logger.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False

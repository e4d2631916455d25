"""kgpt's progress messages: the standard `logging` logger "kgpt" and its children.

Modules report through `logger = logging.getLogger(__name__)`, never through a
`log=` argument. So that a script or notebook shows a job's progress as the
command line does, the "kgpt" logger prints INFO and above, as plain lines, to
whatever `sys.stdout` is at the time (pytest's `capsys` sees them), unless the
application takes over:

    import logging
    logging.getLogger("kgpt").setLevel(logging.WARNING)   # quieter
    kgpt.log.propagate()                                   # to your own handlers instead
"""

import logging
import sys

logger = logging.getLogger("kgpt")


class _StdoutHandler(logging.StreamHandler):
    """A handler on the current `sys.stdout`, looked up at each message (it may be replaced)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _):
        pass


_handler = _StdoutHandler()
_handler.setFormatter(logging.Formatter("%(message)s"))
if not logger.handlers:
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def propagate():
    """Send kgpt's messages to the root logger's handlers instead of printing them."""
    logger.removeHandler(_handler)
    logger.propagate = True

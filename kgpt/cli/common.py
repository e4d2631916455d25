"""What every kgpt command shares: quiet start-up and one way of reporting a user's mistake.

A mistake (a bad row, a missing file, a wrong flag value, a damaged preset, a
busy output directory) ends the command with one line, `kgpt-train: error:
...`, naming the file, flag or plugin, and exit code 1 (2 for flag usage
errors). `--verbose` or `KGPT_TRACEBACK=1` shows the traceback too.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported

from absl import app, flags

flags.DEFINE_bool("verbose", False, "Show the full traceback of errors.")


def user_errors():
    """The exception types that are a user's mistake rather than a bug in kgpt."""
    from kgpt.callbacks import NonFiniteLossError
    from kgpt.errors import ConfigError, DataError
    from kgpt.presets import CheckpointError
    from kgpt.registry import RegistryError
    from kgpt.rundir import OutputDirError

    # Plain ValueErrors and TypeErrors keep their traceback: they are more often bugs than mistakes.
    return (DataError, ConfigError, CheckpointError, RegistryError, OutputDirError, NonFiniteLossError, OSError)


def run(main, prog):
    """`absl.app.run(main)`, with a user's mistakes reported in one line (see the module docstring)."""

    def guarded(argv):
        try:
            return main(argv)
        except app.UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - sorted into mistakes and bugs below
            if not isinstance(e, user_errors()) or flags.FLAGS.verbose or os.environ.get("KGPT_TRACEBACK"):
                raise
            print(f"{prog}: error: {e}", file=sys.stderr)
            sys.exit(1)

    app.run(guarded)

"""What every kgpt command shares: quiet start-up and one way of reporting a user's mistake.

A mistake (a bad row, a missing file, a wrong flag value, a damaged preset, a
busy output directory) ends the command with one line, `kgpt-train: error:
...`, naming the file, flag or plugin, and exit code 1 (2 for flag usage
errors). `--verbose` or `KGPT_TRACEBACK=1` shows the traceback too.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported

from absl import app, flags, logging

from kgpt._quiet import Capture, quiet_stderr

flags.DEFINE_bool("verbose", False, "Show the full traceback of errors, and TensorFlow's start-up log lines.")


def user_errors():
    """The exception types that are a user's mistake rather than a bug in kgpt."""
    from kgpt.callbacks import NonFiniteLossError
    from kgpt.errors import ConfigError, DataError
    from kgpt.presets import CheckpointError
    from kgpt.registry import RegistryError
    from kgpt.rundir import OutputDirError

    # Plain ValueErrors and TypeErrors keep their traceback: they are more often bugs than mistakes.
    return (DataError, ConfigError, CheckpointError, RegistryError, OutputDirError, NonFiniteLossError, OSError)


def start_backends():
    """Imports TensorFlow and the Keras backend and finds the devices, without their start-up noise."""
    with quiet_stderr():
        import keras
        import tensorflow as tf

        tf.config.list_physical_devices()
        if keras.config.backend() == "jax":
            import jax

            jax.devices()


def run(main, prog):
    """`absl.app.run(main)`, with a user's mistakes reported in one line (see the module docstring)."""
    # absl runs libraries' init callbacks between parsing the flags and main; TensorFlow's
    # find the devices there, and print the start-up lines that this capture filters.
    capture = Capture()

    def parse(argv):
        remaining = app.parse_flags_with_usage(argv)
        if not flags.FLAGS.verbose:
            capture.start()
        return remaining

    def guarded(argv):
        capture.stop()
        logging.set_verbosity(logging.WARNING)  # absl INFO lines from JAX/TF start-up
        if not flags.FLAGS.verbose:
            start_backends()
        try:
            return main(argv)
        except app.UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - sorted into mistakes and bugs below
            if not isinstance(e, user_errors()) or flags.FLAGS.verbose or os.environ.get("KGPT_TRACEBACK"):
                raise
            print(f"{prog}: error: {e}", file=sys.stderr)
            sys.exit(1)

    try:
        app.run(guarded, flags_parser=parse)
    finally:
        capture.stop()

"""kgpt's error classes, one place for all: each says when it is raised.

The commands turn each into a one-line message (kgpt.cli.common); the
facade offers the public ones (`kgpt.ConfigError`, ...).
"""


class DataError(ValueError):
    """A malformed input row or file; the message starts with `file:line`."""


class EmptyTextError(DataError):
    """A text with no tokens: empty, or only what the tokenizer drops (control characters, a lone BOM).

    A run's reading leaves such an example out and counts it; a prediction refuses it.
    """


class ReaderTypeError(DataError, TypeError):
    """A task's reader returned or yielded something else than `kgpt.Example`/`Skipped`.

    A `TypeError` too: kgpt raised one for this before naming the plugin.
    """


class RepeatedKeyError(ValueError):
    """A JSON object gives one key twice (`args[0]`: the key); raised by `kgpt.checks.unique_keys`, and turned into
    the reader's own error (`DataError`, `CheckpointError`) naming the file."""


class ConfigError(ValueError):
    """Settings (flags, config fields, arguments) that cannot run; the message names the setting."""


class RegistryError(LookupError):
    """An unknown, conflicting or broken task: raised when a task is asked for by name."""


class MetricError(RegistryError):
    """A task's metric raised (`kgpt.tasks.metrics.score`): the plugin's code failed, not kgpt's."""


class CheckpointError(ValueError):
    """A preset or checkpoint file is missing, corrupt, or does not fit the model."""


class StorageError(OSError):
    """A location that cannot be used: a remote output unreachable, refused or failing, or a remote input."""


class WeightsWriteError(OSError):
    """A `.weights.h5` file failed while being written (the disk filled); its `errno` is the system's.

    h5py may hold the broken file open, and its destructors then crash the
    interpreter's teardown (h5py issue 914): the commands exit without it.
    """


class OutputDirError(ValueError):  # noqa: N818 - named like kgpt's other errors
    """An output directory is in use, or holds outputs this run would destroy."""


class ClusterError(RuntimeError):
    """The processes of a run could not join, disagree, or lost one of them; the message names which."""


class NonFiniteLossError(ArithmeticError):
    """Training produced a NaN or infinite loss; the run stopped before saving anything from it."""


class Preempted(Exception):  # noqa: N818 - an outcome, not an error: the command exits 0 with it
    """Training stopped on SIGTERM after writing a checkpoint at the step it reached; the same command resumes."""

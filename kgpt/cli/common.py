"""What every kgpt command shares: quiet start-up and one way of reporting a user's mistake.

A mistake (a bad row, a missing file, a wrong flag value, a damaged preset, a
busy output directory) ends the command with one line, `kgpt-train: error:
...`, naming the file, flag or plugin, and exit code 1 (2 for flag usage
errors). `--verbose` or `KGPT_TRACEBACK=1` shows the traceback too.
"""

import errno
import logging as std_logging
import os
import sys
import textwrap
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported

from absl import app, flags, logging

from kgpt import checks, log
from kgpt._quiet import LiveFilter, quiet_stderr

flags.DEFINE_bool("verbose", False, "Show the full traceback of errors, and TensorFlow's start-up log lines.")
flags.DEFINE_bool(
    "dry_run",
    False,
    "Check the flags, the files, the first rows of the data, the starting model, the "
    "tokenizer and the output directory, print what would run, and exit without training, predicting "
    "or writing anything (kgpt.jobs.dry_run).",
)


def user_errors():
    """The exception types that are a user's mistake rather than a bug in kgpt."""
    from kgpt.errors import (
        CheckpointError,
        ClusterError,
        ConfigError,
        DataError,
        NonFiniteLossError,
        OutputDirError,
        RegistryError,
    )

    # Plain ValueErrors and TypeErrors keep their traceback: they are more often bugs than mistakes.
    return (
        DataError,
        ConfigError,
        CheckpointError,
        RegistryError,
        OutputDirError,
        NonFiniteLossError,
        OSError,
        ClusterError,
    )


def out_of_memory(e, prog):
    """The one line for a backend's (or Python's) out-of-memory error `e`; None for any other error.

    Not a bug in kgpt but the run's sizes against the device's memory, so it
    is reported as a mistake is, with what to lower.
    """
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    if not (isinstance(e, MemoryError) or type(e).__name__ == "ResourceExhaustedError" or "RESOURCE_EXHAUSTED" in text):
        return None
    keeps = " (--gradient_accumulation_steps keeps the batch each update sees)" if prog == "kgpt-train" else ""
    return (
        f"out of memory ({text[:200]}): the run does not fit this device's memory. Lower --batch_size{keeps}, "
        f"the sequence length or the model's size."
    )


def out_of_space(e, resumes=None):
    """The one line for a full disk (or quota) `e`, with what to do: None for any other error.

    The error names the folder or file (kgpt's own checks do, and so does
    the system's when it knows the path); a rerun after freeing space
    resumes from the last whole checkpoint, which a failed one never
    replaces.
    """
    if not isinstance(e, OSError) or e.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "no space left on device")
    where = resumes() if resumes is not None else None
    resumed = f": it resumes from the last checkpoint ({where})" if where else ""
    return f"{text[:300].rstrip('.')}: free some space and run the same command again{resumed}."


def several_processes(coordinator_address, num_processes, process_id):
    """Whether the flags (or the environment) make this a run of several processes; a bad flag is an error.

    The job joins them (`kgpt.jobs.run.workspace`) once its settings are checked;
    until then no backend may compute anything, so the devices are not
    looked up at start-up (`start_backends`).
    """
    from kgpt.parallel import placement

    found = placement.resolve(coordinator_address, num_processes, process_id)
    return found.several or found.coordinator == "auto"


def refuse_empty_lists(names):
    """A usage error for a list flag among `names` given with nothing in it: absl gives an empty list
    (`--metrics ''`), which would read as the flag left out, the default, without a word."""
    for name in names:
        if flags.FLAGS[name].present and isinstance(flags.FLAGS[name].value, list) and not flags.FLAGS[name].value:
            raise app.UsageError(
                f"--{name} is empty: name one or more, comma-separated (or leave the flag out).", exitcode=2
            )


def start_backends(devices=True):
    """Imports TensorFlow and the Keras backend and finds the devices, without their start-up noise.

    `devices=False` leaves JAX's devices alone: a process that joins others
    (`kgpt.parallel.cluster`) must do so before JAX starts its backend.
    """
    with quiet_stderr():
        import keras
        import tensorflow as tf

        tf.config.list_physical_devices()
        if keras.config.backend() == "jax" and devices:
            import jax

            jax.devices()


def log_to_stderr():
    """Sends kgpt's progress messages to standard error (when the command writes its results to standard output)."""
    handler = std_logging.StreamHandler(sys.stderr)
    handler.setFormatter(std_logging.Formatter("%(message)s"))
    logger = std_logging.getLogger("kgpt")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)


HELP_FLAGS = ("-h", "--help", "--helpshort", "-?")


def _describe(flag):
    default = "" if flag.default is None else f" (default: {flag.default_as_str.strip(chr(39))})"
    text = " ".join(flag.help.split()) + default
    lines = textwrap.wrap(text, width=96, initial_indent="      ", subsequent_indent="      ")
    return [f"  --{flag.name}"] + lines


def print_help(prog, doc, groups, modules):
    """The flags `modules` define, grouped as `groups` (`{title: [flag names]}`); the rest under "Other"."""
    own = {}
    for module in (*modules, __name__):
        own.update({f.name: f for f in flags.FLAGS.get_flags_for_module(module)})
    out = [doc.strip(), ""]
    for title, names in [*groups.items(), ("Other", [n for n in own if not any(n in g for g in groups.values())])]:
        names = [n for n in names if n in own]
        if not names:
            continue
        out.append(f"{title}:")
        for name in names:
            out += _describe(own[name])
        out.append("")
    out.append(f"{prog} --helpfull lists every flag, TensorFlow's and absl's included.")
    print("\n".join(out))


def interrupted_message(prog, resumes=None):
    """The line a command ends with on Ctrl-C: where the run can resume from, when `resumes()` names it."""
    where = resumes() if resumes is not None else None
    if where:
        return f"{prog}: interrupted; the same command resumes from the last checkpoint ({where})."
    return f"{prog}: interrupted."


def command_logger(name):
    """The logger of the command module `kgpt.cli.NAME`: named so even under `python -m`, where the module's
    `__name__` is "__main__", whose messages kgpt's handler (`log.to_stdout`) would not print."""
    return std_logging.getLogger(f"kgpt.cli.{name}")


def run(main, prog, doc=None, groups=None, modules=(), start=None, resumes=None):
    """`absl.app.run(main)`, with a user's mistakes reported in one line (see the module docstring).

    With `groups`, `--help` prints the flags of `main`'s module (and of
    `modules`) grouped (`print_help`) and exits before any job starts.
    `start` runs before the backends start; when it returns True the
    devices are not looked up yet (`several_processes`).

    A job stopped by SIGTERM after saving its checkpoint (`Preempted`) exits
    0 with one line; a job whose run lost another process ends at once
    (`kgpt.parallel.cluster.stop_lost`) rather than wait for it at exit.
    Ctrl-C (`KeyboardInterrupt`) ends it with one line and exit code 130,
    naming the checkpoints a rerun resumes from when `resumes()` returns
    their folder (the traceback only with `--verbose`).
    """
    if groups is not None and any(a in HELP_FLAGS for a in sys.argv[1:]):
        try:
            print_help(prog, doc or "", groups, (main.__module__, *modules))
            sys.stdout.flush()
        except BrokenPipeError:  # `kgpt-train --help | head`: the reader has gone, which is no error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit cannot fail
        sys.exit(0)
    # absl runs libraries' init callbacks between parsing the flags and main; TensorFlow's
    # find the devices there and print start-up lines, and more come at a job's first step:
    # the whole run after parsing goes through the filter.
    capture = LiveFilter()
    log.to_stdout()  # the command prints kgpt's progress; the library leaves logging to the application

    def parse(argv):
        remaining = app.parse_flags_with_usage(argv)
        if not flags.FLAGS.verbose:
            capture.start()
        return remaining

    def guarded(argv):
        logging.set_verbosity(logging.WARNING)  # absl INFO lines from JAX/TF start-up
        from kgpt.parallel import cluster

        cluster.PROG = prog
        try:
            with quiet_stderr():  # deciding may import Keras, and TensorFlow with it
                deferred = start() if start is not None else False
            if not flags.FLAGS.verbose:
                start_backends(devices=not deferred)
            with checks.command_line():
                return main(argv)
        except app.UsageError:
            raise
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - sorted into mistakes and bugs below
            from kgpt.errors import WeightsWriteError
            from kgpt.train import callbacks

            if isinstance(e, callbacks.Preempted):
                print(f"{prog}: {e}", file=sys.stderr)
                sys.exit(0)
            if cluster.lost_process(e):
                cluster.stop_lost(e)
            if isinstance(e, KeyboardInterrupt) and not flags.FLAGS.verbose and not os.environ.get("KGPT_TRACEBACK"):
                line = interrupted_message(prog, resumes)
                if cluster.current().several:  # exiting normally would wait for the other processes at shutdown
                    cluster.fail(line.split(": ", 1)[1], code=130)
                print(line, file=sys.stderr)
                sys.exit(130)
            explained = out_of_memory(e, prog) or out_of_space(e, resumes)
            mistake = (
                (isinstance(e, user_errors()) or explained is not None)
                and not flags.FLAGS.verbose
                and not os.environ.get("KGPT_TRACEBACK")
            )
            if cluster.current().several:  # exiting normally would wait for the other processes at shutdown
                if not mistake:
                    traceback.print_exc()
                where = f"process {cluster.current().process_id}"
                cluster.fail(
                    explained or e
                    if mistake
                    else f"{type(e).__name__} on {where} (its traceback is above); the other "
                    f"processes stop when they notice.",
                    code=130 if isinstance(e, KeyboardInterrupt) else 1,
                )
            if not mistake:
                raise
            print(f"{prog}: error: {explained or e}", file=sys.stderr)
            if isinstance(e, WeightsWriteError):  # h5py's destructors would crash the teardown
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(1)
            sys.exit(1)

    try:
        app.run(guarded, flags_parser=parse)
    except SystemExit as done:
        if done.code in (None, 0):
            from kgpt.parallel import cluster

            capture.stop()
            cluster.end_now()
        raise
    finally:
        capture.stop()

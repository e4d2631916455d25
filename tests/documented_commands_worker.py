"""Runs kgpt command lines with --dry_run in this one process (tests/test_documented_commands.py).

Reads a JSON list of `{"prog", "args", "env", "cwd"}` on standard input (`"dry_run": false` runs a command
without --dry_run, for a mistake found before anything is loaded) and
prints one JSON result per command, `{"code", "error", "log"}`, on the last
line. A command runs as its console script's `main` does, after absl parsed
its flags (reset between commands), so a whole doc's commands cost one
start-up. kgpt-predict defines flags that kgpt-train also defines, so it runs
in a worker of its own: `python documented_commands_worker.py predict`.
"""

import io
import json
import logging
import os
import sys
import traceback

from absl import app, flags

from kgpt import checks


def main():
    group = sys.argv[1]
    if group == "predict":
        from kgpt.cli import predict as module

        mains = {"kgpt-predict": module.main}
    else:
        from kgpt.cli import analyze, train

        mains = {"kgpt-train": train.main, "kgpt-analyze": analyze.main}
    from kgpt.cli import common

    commands = json.load(sys.stdin)
    results = []
    for command in commands:
        results.append(run(mains[command["prog"]], command, common.user_errors()))
    print(json.dumps(results))


def run(main, command, mistakes):
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logger = logging.getLogger("kgpt.jobs.dry_run")  # what the dry run found (kgpt-predict moves "kgpt" to stderr)
    logger.setLevel(logging.INFO)  # the library sets no level: the root's WARNING would hide what it found
    saved = dict(os.environ)
    os.environ.update(command["env"])
    os.chdir(command["cwd"])
    logger.addHandler(handler)
    code, error = 0, None
    try:
        flags.FLAGS.unparse_flags()
        argv = flags.FLAGS(
            [command["prog"], *command["args"], *(["--dry_run"] if command.get("dry_run", True) else [])]
        )
        with checks.command_line():  # as common.run calls main: messages name flags
            main(argv)
    except app.UsageError as e:
        code, error = 2, str(e)
    except flags.Error as e:
        code, error = 2, str(e)
    except mistakes as e:
        code, error = 1, str(e)
    except Exception:  # noqa: BLE001 - a bug: its traceback goes to the test's message
        code, error = 1, traceback.format_exc()
    finally:
        logger.removeHandler(handler)
        os.environ.clear()
        os.environ.update(saved)
    return {"code": code, "error": error, "log": log.getvalue()}


if __name__ == "__main__":
    main()

"""kgpt leaves logging to the application; `kgpt.log.to_stdout()` prints progress as the commands do."""

import subprocess
import sys
import textwrap


def test_import_adds_no_handler_and_to_stdout_prints_progress_once():
    code = textwrap.dedent("""
        import logging, sys
        import kgpt
        logger = logging.getLogger("kgpt.jobs.example")
        assert logging.getLogger("kgpt").handlers == [], logging.getLogger("kgpt").handlers
        logger.info("hidden progress")
        logger.warning("a warning")  # Python's last resort: stderr
        sys.stderr.flush()
        kgpt.log.to_stdout()
        kgpt.log.to_stdout()  # a second call adds no second handler
        logger.info("shown progress")
        kgpt.log.to_stdout(logging.WARNING)
        logger.info("quieted progress")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["shown progress"]
    assert done.stderr.splitlines() == ["a warning"]


def test_an_applications_own_configuration_gets_the_messages():
    code = textwrap.dedent("""
        import logging
        import kgpt
        logging.basicConfig(level=logging.INFO, format="app: %(name)s %(message)s")
        logging.getLogger("kgpt.jobs.example").info("progress")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["app: kgpt.jobs.example progress"] and not done.stdout

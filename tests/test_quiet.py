"""The commands' output carries none of TensorFlow's C++ log lines, and loses nothing else."""

import os
import re
import subprocess
import sys
import textwrap

NOISE_LINE = (
    "E0000 00:00:1795426191.985508   11303 util.cc:131] oneDNN supports DT_INT64 only on platforms with "
    "AVX-512. Falling back to the default Eigen-based implementation if present."
)


def run_python(code):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )


def test_live_filter_drops_noise_and_keeps_every_other_line():
    result = run_python(f"""
        import os, sys
        from kgpt._quiet import LiveFilter
        f = LiveFilter()
        f.start()
        os.write(2, b"before\\n{NOISE_LINE}\\n")
        print("from python", file=sys.stderr)
        os.write(2, b"partial line without a newline")
        f.stop()
        print("after stop", file=sys.stderr)
    """)
    assert result.returncode == 0, result.stderr
    assert "oneDNN" not in result.stderr
    assert result.stderr == "before\nfrom python\npartial line without a newlineafter stop\n"


def test_lines_written_just_before_a_crash_still_come_out():
    result = run_python("""
        import os
        from kgpt._quiet import LiveFilter
        LiveFilter().start()
        os.write(2, b"fatal: the last words\\n")
        os.abort()
    """)
    assert result.returncode != 0
    assert "fatal: the last words" in result.stderr


ABORT_LINE = (
    "F1203 06:13:25.903876   20240 client.h:80] Terminating process because the JAX distributed service detected "
    "fatal errors. This most likely indicates that another task died; absl::Status: UNAVAILABLE: Failed to send "
    "RPC to coordination service. Either the leader task was preempted/died/restarted unexpectedly"
)


def test_jax_abort_for_a_lost_coordinator_comes_out_as_the_noted_line():
    # Lines split across writes are matched whole; the note itself never shows; the abort's stack trace goes.
    result = run_python(f"""
        import os, time
        from kgpt._quiet import LiveFilter, note_lost_coordinator
        LiveFilter().start()
        os.write(2, "a line split ".encode())
        time.sleep(0.2)
        os.write(2, b"in two writes\\n")
        note_lost_coordinator("kgpt-train: error: process 0 of 2 stopped")
        os.write(2, "{ABORT_LINE[:60]}".encode())
        time.sleep(0.2)
        os.write(2, "{ABORT_LINE[60:]}\\n*** Check failure stack trace: ***\\n    @     0x7f2024440634  absl\\n".encode())
        os.abort()
    """)
    assert result.returncode == -6, result.stderr
    assert result.stderr == "a line split in two writes\nkgpt-train: error: process 0 of 2 stopped\n"


def test_the_commands_own_error_line_after_the_abort_report_is_the_one_line():
    result = run_python(f"""
        import os
        from kgpt._quiet import LiveFilter, note_lost_coordinator
        LiveFilter().start()
        note_lost_coordinator("kgpt-train: error: process 0 of 2 stopped (noted)")
        os.write(2, "{ABORT_LINE}\\n*** Check failure stack trace: ***\\n".encode())
        os.write(2, b"kgpt-train: error: process 0 of 2 stopped (its connection closed)\\n    @     0x7f20344a71f5\\n")
        os._exit(1)
    """)
    assert result.returncode == 1
    assert result.stderr == "kgpt-train: error: process 0 of 2 stopped (its connection closed)\n"


def test_jax_abort_lines_stay_without_a_note():
    result = run_python(f"""
        import os
        from kgpt._quiet import LiveFilter
        LiveFilter().start()
        os.write(2, "{ABORT_LINE}\\n*** Check failure stack trace: ***\\n".encode())
        os.abort()
    """)
    assert result.stderr == f"{ABORT_LINE}\n*** Check failure stack trace: ***\n"


def test_a_command_that_starts_the_backend_prints_no_tensorflow_log_lines():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-m", "kgpt.cli.train", "--list_tasks"], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "scitail" in result.stdout
    tf_lines = [
        line
        for line in result.stderr.splitlines()
        if re.match(r"[IWEF]\d{4} |\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] ", line) or "absl::InitializeLog" in line
    ]
    assert not tf_lines, "\n".join(tf_lines)

"""The project's code is formatted and linted by ruff (settings in pyproject.toml), so CI runs it on every change.

`ruff format .` and `ruff check --fix .` repair most of what these report.
"""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def ruff(*args):
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_code_is_formatted():
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, f"run `ruff format .`:\n{result.stdout[-3000:]}{result.stderr[-2000:]}"


def test_the_code_passes_the_linter():
    result = ruff("check", "--output-format", "concise", ".")
    assert result.returncode == 0, f"ruff check (`ruff check --fix .` repairs some):\n{result.stdout[-3000:]}"


def test_the_linter_finds_an_unsorted_import_and_an_unused_name(tmp_path):
    (tmp_path / "bad.py").write_text("import sys\nimport os\n\n\ndef f():\n    x = 1\n    return os.sep\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--config",
            str(ROOT / "pyproject.toml"),
            "--output-format",
            "concise",
            str(tmp_path / "bad.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and "I001" in result.stdout and "F401" in result.stdout and "F841" in result.stdout

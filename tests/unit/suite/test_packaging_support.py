"""A project's own ``make`` run by the suite does not inherit the suite's make variables
(tests/packaging_support.py): checked with a real GNU make."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.packaging_support import ROOT, outer_make_overrides

PRINT_CHILD_ENV = (
    "import json; from tests.packaging_support import child_env; "
    "env = child_env(); "
    "print(json.dumps({k: env.get(k) for k in ('PYTEST_ARGS', 'TESTS', 'MAKEFLAGS', 'KEPT')}))"
)


def test_the_names_set_on_a_make_command_line_are_read_from_makeflags() -> None:
    flags = r"s -- TESTS=x\ y PYTEST_ARGS=-rs\ --timeout=300\ -k\ 'a=b'"
    assert outer_make_overrides(flags) == {"TESTS", "PYTEST_ARGS"}
    assert outer_make_overrides(" -- X=1") == {"X"}
    assert outer_make_overrides("s") == outer_make_overrides("") == set()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_a_child_make_gets_none_of_the_outer_make_variables(tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text(f'all:\n\t@{sys.executable} -c "$$CODE"\n')
    done = subprocess.run(
        ["make", "-s", "PYTEST_ARGS=-rs --timeout=300", "TESTS=tests/a.py tests/b.py"],
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "CODE": PRINT_CHILD_ENV,
            "KEPT": "1",
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        '{"PYTEST_ARGS": null, "TESTS": null, "MAKEFLAGS": null, "KEPT": "1"}'
    )

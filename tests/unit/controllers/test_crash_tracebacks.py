"""The operator never dies of a fatal signal without a word: its entry point turns on
faulthandler, so an abort in C code (uvloop's, say) leaves a Python traceback on stderr."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap


def test_an_abort_leaves_a_traceback_on_stderr() -> None:
    program = textwrap.dedent(
        """
        import os
        from controllers.__main__ import enable_crash_tracebacks

        def where_it_died():
            os.abort()

        enable_crash_tracebacks()
        where_it_died()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in done.stderr
    assert "where_it_died" in done.stderr

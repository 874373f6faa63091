"""docs/controllers.md's table of lines written is what bench.lines_written counts."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from bench import lines_written

DOC = Path(__file__).resolve().parents[3] / "docs" / "controllers.md"


def test_the_documented_counts_are_the_counted_ones() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert lines_written.main() == 0
    table = out.getvalue().strip()
    assert table.count("\n") == 7  # a header, a rule, six rows
    assert table in DOC.read_text()


def test_markers_split_hand_written_lines_from_scaffolded_ones(tmp_path: Path) -> None:
    path = tmp_path / "x.go"
    path.write_text(
        "// preamble\npackage x\n\n// doc\n// hand\n// +kubebuilder:default=1\nA int\n"
        "// end\nB int\n"
    )
    assert lines_written.count_marked(path) == lines_written.Count(5, 4, 2, 2)


def test_python_counts_leave_out_docstrings_and_comments() -> None:
    source = '"""Module."""\n\n# comment\nx = 1  # trailing\n\n\ndef f():\n    """Doc."""\n'
    source += "    return x\n"
    assert lines_written.count_python(source) == lines_written.Count(6, 3, 6, 3)

"""Lines a user writes for the same two controllers here, in kubebuilder (Go) and in kopf.

    python -m bench.lines_written

The two controllers: the mirror controller (ConfigMaps labelled ``app=demo`` mirrored into
Secrets they own, put back when deleted or edited) and a typed Widget (a spec with bounds,
an enum and a CEL rule, a status, a ConfigMap it owns). Ours are the programs of
``docs/controllers.md`` (``mirror.py``, ``widget.py``), each tested as written; the others are
reference texts in ``docs/comparison/`` (written for this comparison, not run here).

Counted: non-blank lines. "code" leaves out documentation (docstrings, comments that are not
markers, YAML ``description:`` lines); kubebuilder's ``+kubebuilder`` markers are code. "by
hand" leaves out what a scaffold wrote: for kubebuilder, the lines outside the ``// hand`` /
``// end`` markers of the reference files (as ``kubebuilder create api`` writes them); for
ours, the lines ``python -m controller_runtime create api`` wrote (found by diffing against a
real scaffold); kopf has no scaffold. The reference files' opening comment and the markers
themselves are not counted.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path

from controller_runtime.scaffold import create_api, init

ROOT = Path(__file__).resolve().parents[1]
COMPARISON = ROOT / "docs" / "comparison"
PROGRAM = re.compile(r'^```python title="(?P<file>[\w.]+)"\n(?P<code>.*?)^```', re.M | re.S)


@dataclass(frozen=True)
class Count:
    total: int
    code: int
    hand: int
    hand_code: int


def _python_doc_lines(source: str) -> set[int]:
    """Line numbers (1-based) of docstrings and comments."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if (
            token.type == tokenize.COMMENT
            and not source.splitlines()[token.start[0] - 1][: token.start[1]].strip()
        ):
            lines.add(token.start[0])
    return lines


def _strip_preamble(lines: list[str], comment: str) -> list[str]:
    at = 0
    while at < len(lines) and lines[at].startswith(comment):
        at += 1
    return lines[at:]


def count_python(source: str, *, scaffold: str = "", preamble: bool = False) -> Count:
    lines = source.splitlines()
    docs = _python_doc_lines(source)
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    if preamble:
        kept = _strip_preamble(lines, "#")
        skip = len(lines) - len(kept)
        numbered = [(n, line) for n, line in numbered if n > skip]
    scaffolded = _scaffolded(lines, scaffold.splitlines()) if scaffold else set()
    code = [(n, line) for n, line in numbered if n not in docs]
    hand = [(n, line) for n, line in numbered if n not in scaffolded]
    return Count(len(numbered), len(code), len(hand), len([x for x in hand if x[0] not in docs]))


def _scaffolded(final: list[str], scaffold: list[str]) -> set[int]:
    """Line numbers of ``final`` that the scaffold wrote, unchanged."""
    matcher = difflib.SequenceMatcher(
        a=[s.strip() for s in scaffold], b=[s.strip() for s in final], autojunk=False
    )
    same: set[int] = set()
    for block in matcher.get_matching_blocks():
        same.update(range(block.b + 1, block.b + block.size + 1))
    return same


def count_marked(path: Path) -> Count:
    """A reference file with ``hand`` / ``end`` marker comments."""
    comment = "#" if path.suffix in (".py", ".yaml") else "//"
    lines = _strip_preamble(path.read_text().splitlines(), comment)
    total = code = hand = hand_code = 0
    by_hand = not any(line.strip() == f"{comment} hand" for line in lines)
    for line in lines:
        text = line.strip()
        if text == f"{comment} hand":
            by_hand = True
            continue
        if text == f"{comment} end":
            by_hand = False
            continue
        if not text:
            continue
        is_doc = (text.startswith(comment) and not text.startswith("// +")) or text.startswith(
            ("description:", '"""')
        )
        total += 1
        code += not is_doc
        hand += by_hand
        hand_code += by_hand and not is_doc
    return Count(total, code, hand, hand_code)


def _hand_only(path: Path) -> Count:
    """The hand-written lines of an excerpt of a scaffolded file: only those count."""
    marked = count_marked(path)
    return Count(marked.hand, marked.hand_code, marked.hand, marked.hand_code)


def _sum(counts: list[Count]) -> Count:
    return Count(
        *(sum(getattr(c, f) for c in counts) for f in ("total", "code", "hand", "hand_code"))
    )


def ours() -> dict[str, Count]:
    programs = {
        m.group("file"): m.group("code")
        for m in PROGRAM.finditer((ROOT / "docs" / "controllers.md").read_text())
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        init(root, domain="example.com", name="my-operator")
        create_api(root, group="shop", version="v1", kind="Widget")
        scaffold = (root / "my_operator/api/widget_v1.py").read_text()
        scaffold += (root / "my_operator/controllers/widget.py").read_text()
    return {
        "mirror": count_python(programs["mirror.py"]),
        "widget": count_python(programs["widget.py"], scaffold=scaffold),
    }


def kubebuilder() -> dict[str, Count]:
    folder = COMPARISON / "kubebuilder"
    return {
        "mirror": _sum(
            [
                count_marked(folder / "configmap_controller.go"),
                _hand_only(folder / "main_options.go"),
            ]
        ),
        "widget": _sum(
            [
                count_marked(folder / "widget_types.go"),
                count_marked(folder / "widget_controller.go"),
            ]
        ),
    }


def kopf() -> dict[str, Count]:
    folder = COMPARISON / "kopf"
    return {
        "mirror": count_python((folder / "mirror.py").read_text(), preamble=True),
        "widget": _sum(
            [
                count_python((folder / "widget.py").read_text(), preamble=True),
                count_marked(folder / "widget-crd.yaml"),
            ]
        ),
    }


def main() -> int:
    print("| controller | framework | lines | code | by hand | by hand, code |")
    print("| --- | --- | --- | --- | --- | --- |")
    results = {"controller-runtime-py": ours(), "kubebuilder (Go)": kubebuilder(), "kopf": kopf()}
    for which in ("mirror", "widget"):
        for framework, counts in results.items():
            c = counts[which]
            print(f"| {which} | {framework} | {c.total} | {c.code} | {c.hand} | {c.hand_code} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What every failing end-to-end test prints besides its own message: the state of the
namespaces it used (their Pods, events and Pod logs) and the operator's, as a section of the
test's report. ``tests/e2e/conftest.py`` adds the section; this module is the pure part
(unit-tested in ``tests/unit/suite/test_e2e_failures.py``): which namespaces a test used, and the
section built from a failed report.

A test used a namespace when ``new_namespace`` made it while the test was being set up or
run, or when one of the test's fixture values is that namespace (a name, or an object with a
``namespace`` attribute): a module-scoped fixture's namespace is made while the module's first
test is set up and reaches the later tests as a fixture value.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence


class NamespaceLog:
    """The namespaces ``new_namespace`` made, by the test that was running."""

    def __init__(self) -> None:
        self.current = ""
        self._made: dict[str, list[str]] = {}

    def begin(self, test: str) -> None:
        """``test`` (a pytest node id) is being set up now."""
        self.current = test

    def made(self, namespace: str) -> None:
        self._made.setdefault(self.current, []).append(namespace)

    def made_by(self, test: str) -> list[str]:
        return list(self._made.get(test, []))

    def everything(self) -> set[str]:
        return {ns for made in self._made.values() for ns in made}


def namespaces_used(
    fixture_values: Iterable[object], made_by_test: Sequence[str], known: Collection[str]
) -> list[str]:
    """The namespaces a test used, in order, each once: those made while it ran, then those
    among ``known`` (every namespace the session made) that a fixture value names."""
    found = list(made_by_test)
    for value in fixture_values:
        named = value if isinstance(value, str) else getattr(value, "namespace", None)
        if isinstance(named, str) and named in known:
            found.append(named)
    return list(dict.fromkeys(found))


def failure_section(
    when: str,
    failed: bool,
    namespaces: Sequence[str],
    operator_namespace: str | None,
    describe: Callable[[str], str],
) -> tuple[str, str] | None:
    """The report section of a test whose setup or call failed: ``describe(namespace)`` of
    each namespace it used, then of ``operator_namespace`` (its Pods' logs are the operator's)
    when the test ran with the operator installed (``None`` when not). ``None`` when there is
    nothing to add (a pass, a teardown, or a test that used no namespace and no operator)."""
    if not failed or when not in ("setup", "call"):
        return None
    shown = list(namespaces)
    if operator_namespace is not None and operator_namespace not in shown:
        shown.append(operator_namespace)
    if not shown:
        return None
    title = "cluster state at the failure: namespace" + ("s " if len(shown) > 1 else " ")
    return title + ", ".join(shown), "\n".join(describe(ns) for ns in shown)

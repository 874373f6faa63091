"""The end-to-end tests' failure sections (tests/e2e/failures.py): which namespaces a failed
test used, and the section of its report that shows them and the operator's namespace."""

from __future__ import annotations

from dataclasses import dataclass

from tests.e2e.failures import NamespaceLog, failure_section, namespaces_used

OPERATOR = "crpy-system"


@dataclass(frozen=True)
class Filled:
    namespace: str
    instance: str


def _log() -> NamespaceLog:
    log = NamespaceLog()
    log.begin("tests/e2e/test_a.py::test_one")
    log.made("bk-111111")  # a module fixture's, made while the first test was set up
    log.made("bkdel-222222")
    log.begin("tests/e2e/test_a.py::test_two")
    log.begin("tests/e2e/test_b.py::test_three")
    log.made("repl-333333")
    return log


def test_the_log_knows_which_test_made_which_namespace() -> None:
    log = _log()
    assert log.made_by("tests/e2e/test_a.py::test_one") == ["bk-111111", "bkdel-222222"]
    assert log.made_by("tests/e2e/test_a.py::test_two") == []
    assert log.made_by("tests/e2e/test_b.py::test_three") == ["repl-333333"]
    assert log.everything() == {"bk-111111", "bkdel-222222", "repl-333333"}


def test_a_later_test_finds_a_module_fixtures_namespace_in_its_fixture_values() -> None:
    log = _log()
    test = "tests/e2e/test_a.py::test_two"
    values = [
        object(),
        "controller-runtime-py/operator:0123abcd",  # the operator fixture's image: not one
        Filled("bk-111111", "db"),
        Filled("elsewhere", "db"),  # never made by new_namespace: not one
    ]
    assert namespaces_used(values, log.made_by(test), log.everything()) == ["bk-111111"]


def test_namespaces_made_by_the_test_come_first_and_each_once() -> None:
    log = _log()
    test = "tests/e2e/test_a.py::test_one"
    values = ["repl-333333", Filled("bk-111111", "db"), "bkdel-222222"]
    assert namespaces_used(values, log.made_by(test), log.everything()) == [
        "bk-111111",
        "bkdel-222222",
        "repl-333333",
    ]


def _describe(namespace: str) -> str:
    return f"state of {namespace}"


def test_a_failed_call_shows_each_namespace_then_the_operators() -> None:
    section = failure_section("call", True, ["bk-1", "bkdel-2"], OPERATOR, _describe)
    assert section == (
        "cluster state at the failure: namespaces bk-1, bkdel-2, crpy-system",
        "state of bk-1\nstate of bkdel-2\nstate of crpy-system",
    )


def test_a_failed_setup_is_shown_too_and_the_operator_namespace_only_once() -> None:
    section = failure_section("setup", True, [OPERATOR], OPERATOR, _describe)
    title = "cluster state at the failure: namespace crpy-system"
    assert section == (title, "state of crpy-system")


def test_without_the_operator_only_the_namespaces_are_shown() -> None:
    section = failure_section("call", True, ["node-1"], None, _describe)
    assert section == ("cluster state at the failure: namespace node-1", "state of node-1")


def test_nothing_is_added_to_a_pass_a_teardown_or_a_test_without_cluster_objects() -> None:
    assert failure_section("call", False, ["bk-1"], OPERATOR, _describe) is None
    assert failure_section("teardown", True, ["bk-1"], OPERATOR, _describe) is None
    assert failure_section("call", True, [], None, _describe) is None

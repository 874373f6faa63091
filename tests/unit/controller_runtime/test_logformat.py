"""The runtime's log formats: the reconcile context on every record logged inside a
reconcile, by any logger; nothing extra outside one; one line per record."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from controller_runtime import Request, configure_logging, reconcile_logger
from controller_runtime.logformat import JsonFormatter, TextFormatter
from controller_runtime.reconcile import CURRENT_RECONCILE, ReconcileContext


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def log_inside_a_reconcile(logger: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
    token = CURRENT_RECONCILE.set(ReconcileContext("mirror", Request("demo", "a"), "r-1"))
    try:
        logger.info("mirrored %s", "a")
    finally:
        CURRENT_RECONCILE.reset(token)


def test_json_lines_carry_the_reconcile_context_from_any_logger() -> None:
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    log_inside_a_reconcile(logging.getLogger("some.library"))  # not a reconcile_logger
    logging.getLogger("outside").warning("no context here")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["msg"] == "mirrored a" and first["logger"] == "some.library"
    assert first["level"] == "info"
    assert {k: first[k] for k in ("controller", "namespace", "object_name", "reconcile_id")} == {
        "controller": "mirror",
        "namespace": "demo",
        "object_name": "a",
        "reconcile_id": "r-1",
    }
    assert "controller" not in second and second["level"] == "warning"


def test_text_shows_the_context_as_key_value_on_the_first_line() -> None:
    out = io.StringIO()
    configure_logging("debug", "text", stream=out)
    log_inside_a_reconcile(reconcile_logger("demo"))
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        token = CURRENT_RECONCILE.set(ReconcileContext("mirror", Request("", "b"), "r-2"))
        try:
            logging.getLogger("demo").exception("failed")
        finally:
            CURRENT_RECONCILE.reset(token)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(
        "demo: mirrored a controller=mirror namespace=demo object_name=a reconcile_id=r-1"
    )
    # A cluster-scoped object has no namespace: the field is left out, not printed empty.
    assert lines[1].endswith("demo: failed controller=mirror object_name=b reconcile_id=r-2")
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: boom"


def test_configuring_twice_does_not_duplicate_output_and_bad_formats_are_refused() -> None:
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    handler = configure_logging("info", "json", stream=out)
    logging.getLogger("x").info("once")
    assert len(out.getvalue().splitlines()) == 1
    assert isinstance(handler.formatter, JsonFormatter)
    with pytest.raises(ValueError, match="'text' or 'json'"):
        configure_logging("info", "yaml")
    assert logging.getLogger().handlers == [handler]  # a refused call changes nothing
    assert isinstance(configure_logging().formatter, TextFormatter)

"""Log output for controllers: text for people, JSON (one object per line) for log pipelines.

Both formats show the reconcile context the runtime attaches to records logged inside a
reconcile: ``controller``, ``namespace``, ``object_name`` and ``reconcile_id`` (``name`` is
reserved by :class:`logging.LogRecord`, hence ``object_name``). :func:`configure_logging`
installs one handler on the root logger with :class:`~controller_runtime.controller.
ReconcileLogFilter`, so records from *any* logger inside a reconcile carry the fields, not only
those from :func:`~controller_runtime.controller.reconcile_logger`.

Text::

    2026-01-02 10:00:00,123 INFO    demo: mirrored controller=configmap namespace=ns ...

JSON::

    {"ts": "2026-01-02T10:00:00.123+00:00", "level": "info", "logger": "demo", "msg": "mirrored",
     "controller": "configmap", "namespace": "ns", "object_name": "a", "reconcile_id": "1f..."}

Nothing here logs object contents; what a message says is up to its author (never log
Secret data).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

import orjson

from controller_runtime.controller import ReconcileLogFilter

__all__ = [
    "CONTEXT_FIELDS",
    "JsonFormatter",
    "LogFormat",
    "ReconcileLogFilter",
    "TextFormatter",
    "configure_logging",
]

CONTEXT_FIELDS = ("controller", "namespace", "object_name", "reconcile_id")
"""The record attributes both formatters show when present (and not empty)."""

LogFormat = Literal["text", "json"]


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ms), ``level``, ``logger``, ``msg``, the context
    fields that are set, and ``exc`` (the formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value not in (None, ""):
                entry[name] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...`` with the context fields that are set."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = " ".join(
            f"{name}={value}"
            for name in CONTEXT_FIELDS
            if (value := getattr(record, name, None)) not in (None, "")
        )
        if not context:
            return text
        # The traceback (if any) follows the first line; the context belongs on that line.
        first, sep, rest = text.partition("\n")
        return f"{first} {context}{sep}{rest}"


def configure_logging(
    level: str | int = "info", fmt: LogFormat | str = "text", *, stream: TextIO | None = None
) -> logging.Handler:
    """Send the root logger to ``stream`` (default: stderr) in ``fmt`` at ``level``.

    Replaces the root logger's handlers (calling it twice does not duplicate output), attaches
    :class:`~controller_runtime.controller.ReconcileLogFilter`, and quietens aiohttp's access
    log (every probe and scrape) to warnings. Returns the handler it installed. ``ValueError``
    for an unknown format or level.
    """
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', not {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ReconcileLogFilter())
    root = logging.getLogger()
    root.setLevel(level.upper() if isinstance(level, str) else level)
    root.handlers[:] = [handler]
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return handler

"""Log output for the operator: text for people, JSON for log pipelines.

Both formats carry the reconcile context the controller attaches to its records
(``controller``, ``namespace``, ``object_name``, ``reconcile_id``) when present.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

CONTEXT_FIELDS = ("controller", "namespace", "object_name", "reconcile_id")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the context fields, exc."""

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
    """``time level logger: message key=value ...``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = " ".join(
            f"{name}={value}"
            for name in CONTEXT_FIELDS
            if (value := getattr(record, name, None)) not in (None, "")
        )
        return f"{text} {context}" if context else text


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Send the root logger to stderr in ``fmt`` (``text`` or ``json``) at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log is noise at info level for probes and scrapes.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

"""Reading the local control plane's audit log: who sent which request, and when the API
server received it.

``ControlPlane(audit_policy=...)`` makes the API server write every request its policy
selects to ``plane.audit_log`` (JSON lines, one event per stage; the log backend in its
default blocking mode, so an event is written before the request is answered, and never
rotated). :func:`audit_events` reads the ``ResponseComplete`` events back as
:class:`AuditEvent`. :data:`WRITES_POLICY` is a policy for the common question "what did each
identity write": every create, update, patch and delete, with the request and response bodies
of Lease writes (their holder and annotations), the rest at ``Metadata`` level.

Caveats: timestamps are the API server's wall clock (on the local control plane, this
machine's: compare them with ``time.time()``, not ``time.monotonic()``), with microseconds.
``requestReceivedTimestamp`` is when the server received the request: a request received
after a moment was *sent* after it, unless it was already on its way (bytes in a socket
buffer are delivered while the sender is stopped, so a request sent before a SIGSTOP is
received during the stop, not after the SIGCONT).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

__all__ = ["WRITES_POLICY", "AuditEvent", "audit_events"]

WRITES_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: RequestResponse
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
  resources: [{group: "coordination.k8s.io", resources: ["leases"]}]
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
"""
"""Every write, with the bodies of Lease writes (holders and annotations)."""


@dataclass(frozen=True)
class AuditEvent:
    """One request as the API server audited it (its ``ResponseComplete`` stage)."""

    verb: str
    user: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    received: datetime
    completed: datetime
    request_object: dict[str, Any] | None
    response_object: dict[str, Any] | None

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def audit_events(path: Path) -> Iterator[AuditEvent]:
    """The completed requests in the audit log at ``path``, in the order written (a line cut
    by a concurrent write is skipped)."""
    with path.open("rb") as lines:
        for line in lines:
            with contextlib.suppress(orjson.JSONDecodeError, KeyError, ValueError):
                event = orjson.loads(line)
                if event.get("stage") != "ResponseComplete":
                    continue
                ref = event.get("objectRef") or {}
                yield AuditEvent(
                    verb=event["verb"],
                    user=(event.get("user") or {}).get("username", ""),
                    resource=ref.get("resource", ""),
                    subresource=ref.get("subresource", ""),
                    namespace=ref.get("namespace", ""),
                    name=ref.get("name", ""),
                    code=int((event.get("responseStatus") or {}).get("code", 0)),
                    received=_time(event["requestReceivedTimestamp"]),
                    completed=_time(event["stageTimestamp"]),
                    request_object=event.get("requestObject"),
                    response_object=event.get("responseObject"),
                )

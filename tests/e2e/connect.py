"""Client connections of the end-to-end tests behave as an application's would: a connection
that is refused, unreachable, timed out, or whose name does not resolve yet is tried again for
a bounded time instead of failing the test on the first attempt.

Why: an object that says it is ready is not yet the thing working. A Pod Ready and listed as
ready in its Service's EndpointSlice is reachable through the Service only once kube-proxy has
rewritten the node's rules, and a new Service's name resolves only once CoreDNS has seen it
(docs/e2e.md, "From ready to reachable", has the numbers).

Two forms of the same rule:

- In a client Pod (bash): :data:`PRELUDE` defines ``retry_connect CMD ARGS...``, which runs the
  command until it succeeds, fails with an error that is not a connection failure (a refused
  password, a TLS verification error: those are answers and are never retried), or
  :data:`RETRY_SECONDS` have passed. ``pods.run_pod`` and ``pods.exec_in`` put the prelude in
  front of every script; :func:`connecting` quotes a command for it. The prelude also defines
  ``tcp_connect HOST PORT`` (open and close a TCP connection, bounded) and ``resolve NAME``
  (``getent hosts``, saying what failed), both for use under ``retry_connect``.
- On the host (Python): :func:`retry_connection` around a call that raises ``OSError``.

Giving up, both say so: ``still failing after N attempts over S s (connection failures retried
for up to B s); last error: ...``. A success after retries prints one line starting with
:data:`NOTE_PREFIX` (on stderr in a Pod), which :func:`split_note` takes out of the output so
that callers compare only the command's own output; the note says how long it took.

Defaults: :data:`RETRY_SECONDS` 60 s, :data:`RETRY_INTERVAL` 0.5 s between attempts. Each
attempt is bounded by the command itself: the prelude sets ``PGCONNECT_TIMEOUT`` (10 s) unless
it is set, so that a dropped SYN ends as ``timeout expired`` instead of the kernel's two minutes.
"""

from __future__ import annotations

import errno
import re
import shlex
import socket
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

RETRY_SECONDS = 60.0
"""How long a connection failure is retried before the test gives up."""
RETRY_INTERVAL = 0.5
"""Seconds between two attempts."""
CONNECT_TIMEOUT_SECONDS = 10
"""``PGCONNECT_TIMEOUT`` of the client Pods: one attempt's bound."""

CONNECTION_FAILURES = (
    "Network is unreachable",
    "No route to host",
    "Connection refused",
    "Connection timed out",
    "timeout expired",  # psql with PGCONNECT_TIMEOUT
    "could not translate host name",  # psql: the name does not resolve (yet)
    "Name or service not known",
    "Temporary failure in name resolution",
    "the database system is starting up",
    "the database system is not yet accepting connections",
)
"""What a client prints when it could not reach its server (yet): the failures retried.
Anything else (authentication, TLS verification, SQL errors) is an answer and ends at once."""

NOTE_PREFIX = "crpy-connect:"
"""First word of the line a retried success prints (taken out by :func:`split_note`)."""

_PATTERN = "|".join(re.escape(failure) for failure in CONNECTION_FAILURES)


def is_connection_failure(output: str) -> bool:
    """True when ``output`` (a client's stdout and stderr) names a connection failure."""
    return re.search(_PATTERN, output, re.IGNORECASE) is not None


def _bash_prelude(budget: float, interval: float) -> str:
    ere = "|".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", f) for f in CONNECTION_FAILURES)
    # Times in microseconds from bash's own clock ($EPOCHREALTIME, bash 5), digits only so
    # that the locale's decimal separator does not matter.
    return f"""
export PGCONNECT_TIMEOUT="${{PGCONNECT_TIMEOUT:-{CONNECT_TIMEOUT_SECONDS}}}"
tcp_connect() {{
  timeout "$PGCONNECT_TIMEOUT" bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2"; local rc=$?
  [ "$rc" -eq 124 ] && echo "tcp_connect $1:$2: Connection timed out" >&2
  return "$rc"
}}
resolve() {{
  getent hosts "$1" && return 0
  echo "could not translate host name \"$1\": Name or service not known" >&2
  return 2
}}
_crpy_now() {{ local t=${{EPOCHREALTIME//[!0-9]/}}; echo "$((10#$t))"; }}
_crpy_seconds() {{ printf '%d.%02d' $(($1 / 1000000)) $(($1 % 1000000 / 10000)); }}
retry_connect() {{
  local budget_us={round(budget * 1_000_000)} started out rc attempts=0 last="" spent fmt
  started=$(_crpy_now)
  while :; do
    attempts=$((attempts + 1))
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" -eq 0 ] || ! grep -qiE {shlex.quote(ere)} <<<"$out"; then break; fi
    last=$(grep -iE {shlex.quote(ere)} <<<"$out" | tail -n 1)
    spent=$(( $(_crpy_now) - started ))
    if [ "$spent" -ge "$budget_us" ]; then
      [ -n "$out" ] && printf '%s\\n' "$out"
      fmt='still failing after %d attempts over %s s'
      fmt+=' (connection failures retried for up to %s s); last error: %s\\n'
      printf "$fmt" "$attempts" "$(_crpy_seconds "$spent")" "{budget:g}" "$last" >&2
      return "$rc"
    fi
    sleep {interval:g}
  done
  [ -n "$out" ] && printf '%s\\n' "$out"
  if [ "$attempts" -gt 1 ]; then
    spent=$(( $(_crpy_now) - started ))
    if [ "$rc" -eq 0 ]; then
      printf '{NOTE_PREFIX} attempts=%d seconds=%s done_at=%s last_error=%s\\n' \\
        "$attempts" "$(_crpy_seconds "$spent")" "$(_crpy_seconds "$(_crpy_now)")" "$last" >&2
    else
      printf '(after %d attempts over %s s; the first %d could not connect: %s)\\n' \\
        "$attempts" "$(_crpy_seconds "$spent")" "$((attempts - 1))" "$last" >&2
    fi
  fi
  return "$rc"
}}
"""


PRELUDE = _bash_prelude(RETRY_SECONDS, RETRY_INTERVAL)
"""Bash defining ``retry_connect`` with the defaults (module docs)."""


def prelude(budget: float = RETRY_SECONDS, interval: float = RETRY_INTERVAL) -> str:
    """:data:`PRELUDE` with another budget or interval (the unit tests use short ones)."""
    return _bash_prelude(budget, interval)


def connecting(*command: str) -> str:
    """``retry_connect`` and ``command``, quoted for bash."""
    return "retry_connect " + " ".join(shlex.quote(part) for part in command)


@dataclass(frozen=True)
class Note:
    """What a retried success reported: attempts, seconds from the first attempt to the
    success, the wall-clock time of the success (``time.time()``'s clock) and the last
    connection error before it."""

    attempts: int
    seconds: float
    done_at: float
    last_error: str


def split_note(output: str) -> tuple[str, Note | None]:
    """``output`` without the line a retried success printed, and that line parsed (``None``
    when the command connected at the first attempt)."""
    note: Note | None = None
    kept = []
    for line in output.splitlines(keepends=True):
        if line.startswith(NOTE_PREFIX):
            fields = dict(
                part.split("=", 1)
                for part in line[len(NOTE_PREFIX) :].strip().split(" ", 3)
                if "=" in part
            )
            note = Note(
                int(fields.get("attempts", "0")),
                float(fields.get("seconds", "0")),
                float(fields.get("done_at", "0")),
                fields.get("last_error", ""),
            )
        else:
            kept.append(line)
    return "".join(kept), note


_T = TypeVar("_T")

_UNREACHABLE = {
    errno.ECONNREFUSED,
    errno.ENETUNREACH,
    errno.EHOSTUNREACH,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
}


def _host_connection_failure(err: BaseException) -> bool:
    if isinstance(err, urllib.error.HTTPError):
        return False  # the server answered
    if isinstance(err, urllib.error.URLError):
        return isinstance(err.reason, BaseException) and _host_connection_failure(err.reason)
    if isinstance(err, (socket.gaierror, TimeoutError)):
        return True
    return isinstance(err, OSError) and err.errno in _UNREACHABLE


def retry_connection(
    call: Callable[[], _T],
    what: str,
    *,
    budget: float = RETRY_SECONDS,
    interval: float = RETRY_INTERVAL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> _T:
    """``call()``, tried again while it raises a connection failure (refused, unreachable,
    timed out, a name that does not resolve) for up to ``budget`` seconds. Any other
    exception propagates at once. Giving up raises ``AssertionError`` naming ``what``, the
    attempts, the seconds and the last error."""
    started = clock()
    attempts = 0
    while True:
        attempts += 1
        try:
            return call()
        except Exception as err:
            if not _host_connection_failure(err):
                raise
            spent = clock() - started
            if spent >= budget:
                raise AssertionError(
                    f"{what}: still failing after {attempts} attempts over {spent:.1f} s "
                    f"(connection failures retried for up to {budget:g} s); "
                    f"last error: {err!r}"
                ) from err
        sleep(interval)


PROBE_INTERVAL = 0.2
"""Seconds between two connections of :func:`probe_script`."""


def probe_script(host: str, port: int) -> str:
    """Bash (after :data:`PRELUDE`) that connects to ``host``:``port`` every
    :data:`PROBE_INTERVAL` seconds until killed, printing ``<unix time> ok`` or
    ``<unix time> fail <error>`` per attempt (read back with :func:`parse_probe`)."""
    target = f"{shlex.quote(host)} {port}"
    return f"""
while :; do
  t=$(_crpy_seconds "$(_crpy_now)")
  if out=$(PGCONNECT_TIMEOUT=2 tcp_connect {target} 2>&1); then echo "$t ok"
  else echo "$t fail ${{out##*: }}"; fi
  sleep {PROBE_INTERVAL:g}
done
"""


@dataclass(frozen=True)
class Sample:
    at: float
    ok: bool
    error: str


def parse_probe(log: str) -> list[Sample]:
    """The attempts :func:`probe_script` printed, in order (other lines ignored)."""
    samples = []
    for line in log.splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[1] in ("ok", "fail"):
            try:
                at = float(parts[0])
            except ValueError:
                continue
            samples.append(Sample(at, parts[1] == "ok", parts[2] if len(parts) > 2 else ""))
    return samples


@dataclass(frozen=True)
class Outage:
    """Connections that failed after ``since``: from the first to the last failure, when
    they worked again, and each error with how often it was seen."""

    first_failure: float | None
    last_failure: float | None
    recovered_at: float | None
    errors: dict[str, int]

    @property
    def seconds(self) -> float:
        if self.first_failure is None or self.recovered_at is None:
            return 0.0
        return self.recovered_at - self.first_failure


def outage(samples: list[Sample], since: float) -> Outage:
    """The outage among ``samples`` taken after ``since``: ``recovered_at`` is the first
    success after the last failure (``None`` when the last attempt failed)."""
    after = [s for s in samples if s.at >= since]
    failures = [s for s in after if not s.ok]
    errors: dict[str, int] = {}
    for failure in failures:
        errors[failure.error] = errors.get(failure.error, 0) + 1
    if not failures:
        return Outage(None, None, after[0].at if after else None, errors)
    last = failures[-1]
    recovered = next((s.at for s in after if s.ok and s.at > last.at), None)
    return Outage(failures[0].at, last.at, recovered, errors)

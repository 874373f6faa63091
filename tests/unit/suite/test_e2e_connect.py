"""The end-to-end tests' bounded retry of client connections (tests/e2e/connect.py): the bash
``retry_connect`` the client Pods run (executed here with the machine's bash against commands
that fail as psql and bash do), and the host-side ``retry_connection``."""

from __future__ import annotations

import errno
import shlex
import shutil
import socket
import subprocess
import urllib.error
from pathlib import Path

import pytest

from tests.e2e.connect import (
    NOTE_PREFIX,
    PRELUDE,
    Note,
    Outage,
    connecting,
    is_connection_failure,
    outage,
    parse_probe,
    prelude,
    probe_script,
    retry_connection,
    split_note,
)
from tests.e2e.pods import exec_script, exec_status

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

UNREACHABLE = (
    'psql: error: connection to server at "db-primary.ns.svc" (10.0.0.12), port 5432 failed: '
    "Network is unreachable"
)


def _bash(
    script: str, *, budget: float = 30, interval: float = 0.05
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", prelude(budget, interval) + script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
    )


def _fails_then(
    tmp_path: Path,
    failures: int,
    error: str,
    output: str = "answer:42",
    *,
    then_fail_with: str | None = None,
) -> str:
    """A command that prints ``error`` on stderr and exits 2 for its first ``failures`` runs,
    then prints ``output`` (or fails with ``then_fail_with``): runs are counted in a file, as
    each is a new process."""
    counter = tmp_path / "runs"
    script = tmp_path / "client.sh"
    last = (
        f"echo {shlex.quote(output)}"
        if then_fail_with is None
        else f"echo {shlex.quote(then_fail_with)} >&2; exit 2"
    )
    script.write_text(
        f"""n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}
if [ "$n" -lt {failures} ]; then echo {shlex.quote(error)} >&2; exit 2; fi
{last}
"""
    )
    return f"bash {script}"


def test_a_connection_failing_then_working_is_retried_and_noted(tmp_path: Path) -> None:
    done = _bash(f"retry_connect {_fails_then(tmp_path, 3, UNREACHABLE)}")
    assert done.returncode == 0, done
    assert done.stdout == "answer:42\n"
    log, note = split_note(done.stdout + done.stderr)
    assert log == "answer:42\n"
    assert note is not None and note.attempts == 4, done.stderr
    assert note.last_error == UNREACHABLE
    assert 0 < note.seconds < 30 and note.done_at > 1e9


def test_a_first_attempt_success_prints_only_the_output(tmp_path: Path) -> None:
    done = _bash(f"retry_connect {_fails_then(tmp_path, 0, UNREACHABLE)}")
    assert (done.returncode, done.stdout, done.stderr) == (0, "answer:42\n", "")
    assert split_note(done.stdout) == ("answer:42\n", None)


@pytest.mark.parametrize(
    "answer",
    [
        'psql: error: FATAL:  password authentication failed for user "shop"',
        "psql: error: SSL error: certificate verify failed",
        'ERROR:  relation "kept" does not exist',
    ],
)
def test_an_answer_from_the_server_is_not_retried(tmp_path: Path, answer: str) -> None:
    done = _bash(f"retry_connect {_fails_then(tmp_path, 5, answer)}")
    assert done.returncode == 2
    assert answer in done.stdout
    assert (tmp_path / "runs").read_text().strip() == "1", "retried an answer"
    assert "still failing" not in done.stderr and NOTE_PREFIX not in done.stderr


def test_an_answer_after_connection_failures_says_how_it_got_there(tmp_path: Path) -> None:
    answer = 'FATAL:  password authentication failed for user "shop"'
    client = _fails_then(tmp_path, 2, UNREACHABLE, then_fail_with=answer)
    done = _bash(f"retry_connect {client}", budget=5)
    assert done.returncode == 2
    assert answer in done.stdout
    assert (tmp_path / "runs").read_text().strip() == "3"
    assert "(after 3 attempts over" in done.stderr, done.stderr
    assert "the first 2 could not connect" in done.stderr
    assert split_note(done.stdout + done.stderr)[1] is None


def test_giving_up_says_it_retried_how_long_and_the_last_error(tmp_path: Path) -> None:
    refused = "bash: connect: Connection refused"
    done = _bash(f"retry_connect {_fails_then(tmp_path, 10_000, refused)}", budget=0.6)
    assert done.returncode == 2
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("still failing after "), done.stderr
    attempts = int(message.split()[3])
    assert attempts >= 2 and str(attempts) == (tmp_path / "runs").read_text().strip()
    seconds = float(message.split(" over ")[1].split()[0])
    assert 0.6 <= seconds < 10
    assert "(connection failures retried for up to 0.6 s)" in message
    assert message.endswith(f"last error: {refused}")
    assert refused in done.stdout


def test_tcp_connect_and_resolve_say_what_failed() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        done = _bash(f"tcp_connect 127.0.0.1 {port} && echo connected")
        assert done.stdout == "connected\n", done
    finally:
        listener.close()
    refused = _bash(f"tcp_connect 127.0.0.1 {port}")
    assert refused.returncode != 0 and is_connection_failure(refused.stderr), refused
    unknown = _bash("resolve no-such-name.invalid")
    assert unknown.returncode == 2 and is_connection_failure(unknown.stderr), unknown


def test_connecting_quotes_for_bash(tmp_path: Path) -> None:
    query = "SELECT 'ssl:' || ssl FROM \"t\" WHERE x = $1; echo injected"
    done = _bash(connecting("printf", "%s\\n", query))
    assert done.stdout == query + "\n"


def test_the_default_prelude_is_valid_bash() -> None:
    done = subprocess.run(
        ["bash", "-n", "-c", PRELUDE], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_failures_retried_and_answers_not() -> None:
    assert is_connection_failure(UNREACHABLE)
    assert is_connection_failure('could not translate host name "db-primary" to address')
    assert is_connection_failure("psql: error: timeout expired")
    assert is_connection_failure("FATAL:  the database system is starting up")
    assert not is_connection_failure("FATAL:  no pg_hba.conf entry for host")
    assert not is_connection_failure("server certificate does not match host name")


def test_split_note_keeps_everything_else() -> None:
    out = f"a\n{NOTE_PREFIX} attempts=3 seconds=1.25 done_at=1700000000.50 last_error=x: y z\nb\n"
    assert split_note(out) == ("a\nb\n", Note(3, 1.25, 1700000000.5, "x: y z"))


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_retry_connection_retries_refusals_until_the_call_works() -> None:
    clock = _Clock()
    errors: list[BaseException] = [
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        urllib.error.URLError(OSError(errno.ENETUNREACH, "Network is unreachable")),
        socket.gaierror(-2, "Name or service not known"),
        TimeoutError("timed out"),
    ]

    def call() -> str:
        if errors:
            raise errors.pop(0)
        return "listed"

    assert retry_connection(call, "listing", clock=clock, sleep=clock.sleep) == "listed"
    assert clock.now == pytest.approx(2.0)


def test_retry_connection_gives_up_saying_so() -> None:
    clock = _Clock()

    def call() -> None:
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    with pytest.raises(AssertionError) as failed:
        retry_connection(
            call, "listing s3://b/p", budget=3, interval=1, clock=clock, sleep=clock.sleep
        )
    message = str(failed.value)
    assert message.startswith("listing s3://b/p: still failing after 4 attempts over 3.0 s")
    assert "retried for up to 3 s" in message and "Connection refused" in message


def test_retry_connection_lets_answers_through_at_once() -> None:
    clock = _Clock()
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        raise urllib.error.HTTPError("http://x", 403, "Forbidden", None, None)  # type: ignore[arg-type]

    with pytest.raises(urllib.error.HTTPError):
        retry_connection(call, "listing", clock=clock, sleep=clock.sleep)
    assert calls == 1


def test_the_probe_prints_one_line_per_attempt_until_killed() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens: every attempt is refused
    script = prelude() + probe_script("127.0.0.1", port)
    process = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(3)]
    process.kill()
    process.wait()
    samples = parse_probe("".join(lines))
    assert len(samples) == 3 and not any(s.ok for s in samples), lines
    assert all(s.error == "Connection refused" for s in samples), lines
    assert samples[0].at <= samples[1].at <= samples[2].at


def test_an_outage_is_measured_from_the_first_failure_to_the_recovery() -> None:
    log = "\n".join(
        [
            "99.0 fail Connection refused",  # before `since`: not this outage
            "100.0 ok",
            "100.2 fail Connection refused",
            "100.4 fail Network is unreachable",
            "noise line",
            "100.6 fail Network is unreachable",
            "100.8 ok",
            "101.0 ok",
        ]
    )
    found = outage(parse_probe(log), since=99.5)
    assert (found.first_failure, found.last_failure, found.recovered_at) == (100.2, 100.6, 100.8)
    assert found.seconds == pytest.approx(0.6)
    assert found.errors == {"Connection refused": 1, "Network is unreachable": 2}
    still = outage(parse_probe("1.0 ok\n2.0 fail No route to host"), since=0)
    assert still.recovered_at is None and still.seconds == 0
    assert outage(parse_probe("1.0 ok\n2.0 ok"), since=0) == Outage(None, None, 1.0, {})


def _exec(script: str) -> str:
    """What ``pods.exec_in`` would print for ``script`` (run here with the machine's bash)."""
    done = subprocess.run(
        ["bash", "-c", exec_script(script)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
    )
    return done.stdout


def test_an_exec_retries_a_server_starting_up_and_gives_the_rows_and_status(
    tmp_path: Path,
) -> None:
    starting = (
        'psql: error: connection to server on socket "/var/run/postgresql/.s.PGSQL.5432" '
        "failed: FATAL:  the database system is starting up"
    )
    log, note = split_note(_exec(f"retry_connect {_fails_then(tmp_path, 2, starting, 't')}"))
    assert exec_status(log) == ("t\n", 0)
    assert note is not None and note.attempts == 3 and note.last_error.endswith("starting up")


def test_an_exec_status_says_how_the_script_ended_or_that_it_did_not() -> None:
    failed = _exec("bash -c 'echo ERROR:  relation marks does not exist >&2; exit 3'")
    assert exec_status(failed) == ("ERROR: relation marks does not exist\n", 3)
    assert exec_status(_exec("echo 'exit:7 is a row'")) == ("exit:7 is a row\n", 0)
    assert exec_status("") == ("", None)  # kubectl failed: nothing ran
    assert exec_status("error: container not found") == ("error: container not found", None)

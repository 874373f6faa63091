"""LineFramer: newline-delimited JSON framing under arbitrary chunking."""

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from informers._framing import DEFAULT_MAX_LINE_BYTES, LineFramer, LineTooLongError

MiB = 1024 * 1024


def feed_all(framer: LineFramer, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(framer.feed(chunk))
    return out


def cut(body: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *sorted(set(cuts)), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(points)]


def test_whole_lines_in_one_chunk() -> None:
    framer = LineFramer()
    lines = framer.feed(b'{"type":"ADDED"}\n{"type":"DELETED"}\n')
    assert lines == [b'{"type":"ADDED"}', b'{"type":"DELETED"}']
    assert framer.buffered_bytes == 0


def test_partial_line_is_held_until_completed() -> None:
    framer = LineFramer()
    assert framer.feed(b'{"a":') == []
    assert framer.buffered_bytes == 5
    assert framer.feed(b"1}\n{") == [b'{"a":1}']
    assert framer.buffered_bytes == 1
    assert framer.feed(b"}\n") == [b"{}"]
    assert framer.buffered_bytes == 0


def test_empty_lines_and_empty_chunks_are_skipped() -> None:
    framer = LineFramer()
    assert framer.feed(b"") == []
    assert framer.feed(b"\n\n{}\n\n\n[]\n") == [b"{}", b"[]"]
    assert framer.feed(b"\n") == []
    assert framer.buffered_bytes == 0


def test_accepts_bytearray_and_memoryview() -> None:
    framer = LineFramer()
    assert framer.feed(bytearray(b"ab\nc")) == [b"ab"]
    assert framer.feed(memoryview(b"d\n")) == [b"cd"]
    assert all(type(x) is bytes for x in framer.feed(bytearray(b"x\n")))


def test_one_byte_chunks() -> None:
    events = [orjson.dumps({"type": "ADDED", "object": {"i": i, "s": "é" * i}}) for i in range(50)]
    body = b"\n".join(events) + b"\n"
    framer = LineFramer()
    assert feed_all(framer, [body[i : i + 1] for i in range(len(body))]) == events
    assert framer.buffered_bytes == 0


def test_reset_drops_partial_line() -> None:
    framer = LineFramer()
    framer.feed(b"partial")
    framer.reset()
    assert framer.buffered_bytes == 0
    assert framer.feed(b"x\n") == [b"x"]


# Mostly short lines, sometimes one of 1-3 MiB (the API server accepts objects up to 3 MiB).
small_line = st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" "))
big_line = st.integers(MiB, 3 * MiB).map(lambda n: b"{" + b"x" * (n - 2) + b"}")
line = st.one_of(small_line, small_line, small_line, big_line)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
@given(
    lines=st.lists(line, max_size=12),
    blank_runs=st.lists(st.integers(0, 3), min_size=12, max_size=12),
    trailing=small_line,
    data=st.data(),
)
def test_any_chunking_of_any_event_sequence(
    lines: list[bytes], blank_runs: list[int], trailing: bytes, data: st.DataObject
) -> None:
    body = b"".join(
        ln + b"\n" + b"\n" * blanks for ln, blanks in zip(lines, blank_runs, strict=False)
    )
    event(f"multi-MiB lines: {sum(len(ln) >= MiB for ln in lines)}")
    body += trailing  # an unfinished last line (possibly empty)
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=40), label="cuts")
    chunks = cut(body, cuts)
    kinds = data.draw(
        st.lists(
            st.sampled_from([bytes, bytearray, memoryview]),
            min_size=len(chunks),
            max_size=len(chunks),
        ),
        label="types",
    )
    framer = LineFramer(max_line_bytes=4 * MiB)
    out: list[bytes] = []
    for chunk, kind in zip(chunks, kinds, strict=True):
        out.extend(framer.feed(kind(chunk)))
    assert out == [ln for ln in lines if ln]
    assert framer.buffered_bytes == len(trailing)


@pytest.mark.timeout(30)
def test_long_line_in_small_chunks_is_linear() -> None:
    # 32 MiB in 4 KiB chunks is 8192 feeds: rescanning the held bytes on each feed would read
    # ~128 GiB and blow the timeout; a linear framer needs well under a second.
    size = 32 * MiB
    chunk = b"y" * 4096
    framer = LineFramer()
    for _ in range(size // len(chunk)):
        assert framer.feed(chunk) == []
    assert framer.buffered_bytes == size
    out = framer.feed(b"z\nnext")
    assert len(out) == 1
    assert len(out[0]) == size + 1
    assert out[0].endswith(b"yz")
    assert framer.buffered_bytes == 4


def test_default_limit_is_64_mib() -> None:
    assert 64 * MiB == DEFAULT_MAX_LINE_BYTES
    assert LineFramer().max_line_bytes == 64 * MiB


def test_line_at_the_limit_is_accepted() -> None:
    framer = LineFramer(max_line_bytes=10)
    assert framer.feed(b"0123456789\n") == [b"0123456789"]
    assert framer.feed(b"01234") == []
    assert framer.feed(b"56789\n") == [b"0123456789"]


def test_partial_line_over_the_limit_raises() -> None:
    framer = LineFramer(max_line_bytes=10)
    framer.feed(b"012345")
    with pytest.raises(LineTooLongError, match="max_line_bytes=10"):
        framer.feed(b"67890")
    assert framer.buffered_bytes == 0  # memory released


def test_complete_line_over_the_limit_raises() -> None:
    framer = LineFramer(max_line_bytes=10)
    with pytest.raises(LineTooLongError, match="11 bytes"):
        framer.feed(b"ok\n01234567890\nok\n")
    framer = LineFramer(max_line_bytes=10)
    framer.feed(b"012345")
    with pytest.raises(LineTooLongError):
        framer.feed(b"67890\n")


def test_trailing_partial_over_the_limit_raises() -> None:
    framer = LineFramer(max_line_bytes=10)
    with pytest.raises(LineTooLongError):
        framer.feed(b"ok\n01234567890")


def test_error_is_a_value_error() -> None:
    assert issubclass(LineTooLongError, ValueError)


def test_rejects_non_positive_limit() -> None:
    with pytest.raises(ValueError, match="max_line_bytes"):
        LineFramer(max_line_bytes=0)

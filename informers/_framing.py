"""Split a newline-delimited JSON watch body into lines.

A watch body is a sequence of JSON objects, each ending in ``\\n`` (Go's ``json.Encoder``), sent
over chunked HTTP with arbitrary chunk boundaries; a single object can be several MiB. aiohttp's
``readline()`` gives up above 128 KiB, so the reader feeds raw chunks here instead.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_LINE_BYTES", "LineFramer", "LineTooLongError"]

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
"""Default bound on one line (64 MiB): far above any object the API server accepts (3 MiB)."""


class LineTooLongError(ValueError):
    """A line grew past the framer's ``max_line_bytes``; the stream must be abandoned."""


class LineFramer:
    """Incremental splitter of a byte stream into ``\\n``-terminated lines.

    Guarantees:

    - :meth:`feed` accepts chunks cut anywhere and returns, in order, every line completed by the
      chunk, as ``bytes`` without the trailing ``\\n``. Empty lines are skipped. ``\\r`` is not
      stripped (JSON decoders accept it as whitespace).
    - Linear time in the bytes fed: each byte is searched for ``\\n`` once (only the new chunk is
      searched; the held partial line is known to contain none) and a long line is accumulated in
      a ``bytearray`` (amortised appends) and copied out once when it completes. A chunk that
      arrives while nothing is held is split in one C call.
    - Bounded memory: at most ``max_line_bytes`` (default 64 MiB) are held for a partial line. A
      line longer than that, complete or partial, raises :class:`LineTooLongError` from
      :meth:`feed`; the partial buffer is dropped and the framer must not be used for that stream
      any more (lines completed earlier in the same chunk are lost with it).
    - :attr:`buffered_bytes` is the size of the partial line held: non-zero at end of stream means
      the stream ended mid-object.

    Not thread-safe; one framer per stream.
    """

    __slots__ = ("_buf", "_max")

    def __init__(self, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if max_line_bytes <= 0:
            raise ValueError(f"max_line_bytes must be positive, got {max_line_bytes}")
        self._max = max_line_bytes
        self._buf = bytearray()

    @property
    def max_line_bytes(self) -> int:
        """The longest line accepted, in bytes (without the ``\\n``)."""
        return self._max

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete line currently held (0 at a line boundary)."""
        return len(self._buf)

    def reset(self) -> None:
        """Drop any partial line, e.g. before reusing the framer for a new stream."""
        self._buf = bytearray()

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``chunk`` and return the lines it completes (possibly none).

        Raises :class:`LineTooLongError` when a line exceeds ``max_line_bytes``.
        """
        if type(chunk) is not bytes:
            chunk = bytes(chunk)
        if not chunk:
            return []
        buf = self._buf
        if chunk.find(b"\n") < 0:
            if len(buf) + len(chunk) > self._max:
                self._overflow(len(buf) + len(chunk), complete=False)
            buf += chunk
            return []

        parts = chunk.split(b"\n")
        tail = parts.pop()
        if buf:
            buf += parts[0]
            if len(buf) > self._max:
                self._overflow(len(buf), complete=True)
            parts[0] = bytes(buf)
            # A fresh bytearray releases a multi-MiB buffer instead of keeping its capacity.
            self._buf = buf = bytearray()
        if tail:
            if len(tail) > self._max:
                self._overflow(len(tail), complete=False)
            buf += tail
        # Only a chunk longer than the limit can carry an over-long line of its own.
        if len(chunk) > self._max:
            for part in parts:
                if len(part) > self._max:
                    self._overflow(len(part), complete=True)
        if b"" in parts:
            return [p for p in parts if p]
        return parts

    def _overflow(self, size: int, *, complete: bool) -> None:
        self._buf = bytearray()
        what = "a line of" if complete else "an unfinished line of at least"
        raise LineTooLongError(
            f"watch stream framing: {what} {size} bytes exceeds max_line_bytes={self._max}; "
            "the object is too large for this framer (raise max_line_bytes) or the stream is "
            "not newline-delimited JSON"
        )

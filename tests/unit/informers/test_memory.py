"""Giving freed memory back: glibc's malloc_trim where there is one, nothing elsewhere."""

from __future__ import annotations

import platform

from informers import memory


def test_on_glibc_the_freed_pages_are_returned_and_elsewhere_nothing_happens() -> None:
    on_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert memory.trim_available() is on_glibc
    blocks = [bytes(4096) for _ in range(4096)]  # 16 MiB through malloc, then freed
    del blocks
    assert isinstance(memory.release_freed_memory(), bool)
    if not on_glibc:
        assert memory.release_freed_memory() is False

"""The one place where resourceVersions are compared.

Rules (KEP-5504, GA in Kubernetes 1.35; apimachinery ``pkg/util/resourceversion``):

- A resourceVersion is *comparable* only if it matches ``[1-9][0-9]*`` (ASCII digits, no leading
  zero). ``"0"`` is never a live resourceVersion and ``""`` means "unset"; neither is comparable.
- Two comparable values compare as decimal integers: the longer string is greater, otherwise the
  comparison is lexical. No integer conversion happens, so values of any length work.
- Comparisons are only meaningful within one group+resource (across namespaces is fine).
  Aggregated API servers may serve opaque values; for those only equality means anything.

Every function here returns ``None`` (or, for :func:`is_newer`, ``True``) when the values are not
comparable. Callers must **fail open** on that: treat the data as fresh enough rather than block
or drop it, and log the condition once rather than per event.
"""

from __future__ import annotations

__all__ = [
    "compare_resource_versions",
    "is_at_least",
    "is_comparable",
    "is_newer",
    "sort_key",
]


def is_comparable(rv: str) -> bool:
    """True when ``rv`` matches ``[1-9][0-9]*`` (ASCII only)."""
    # isdigit() alone would accept non-ASCII digits such as "²"; isascii() rules those out.
    # "".isdigit() is False, so the empty string is covered too.
    return isinstance(rv, str) and rv.isdigit() and rv.isascii() and rv[0] != "0"


def compare_resource_versions(a: str, b: str) -> int | None:
    """Compare two resourceVersions of the same group+resource.

    Returns -1, 0 or 1 when ``a`` is older than, equal to or newer than ``b``, and ``None`` when
    either is not comparable (see the module docstring). Callers must fail open on ``None``.
    """
    # is_comparable() inlined: this runs on every cached event.
    try:
        if not (a.isdigit() and b.isdigit() and a.isascii() and b.isascii()):
            return None
    except AttributeError:  # not a str
        return None
    if a[0] == "0" or b[0] == "0":
        return None
    la, lb = len(a), len(b)
    if la != lb:
        return -1 if la < lb else 1
    if a == b:
        return 0
    return -1 if a < b else 1


def is_at_least(observed: str, wanted: str) -> bool | None:
    """Whether ``observed`` is the same as or newer than ``wanted``; ``None`` if not comparable.

    Callers must fail open on ``None`` (treat the wanted version as reached).
    """
    c = compare_resource_versions(observed, wanted)
    return None if c is None else c >= 0


def is_newer(candidate: str, current: str) -> bool:
    """Whether ``candidate`` should replace ``current``, failing open.

    ``False`` when the two are identical (equality is meaningful even for opaque values) or when
    ``candidate`` is provably older; ``True`` when it is provably newer **or the two are not
    comparable**. This is the rule a cache uses to never regress while never dropping data it
    cannot order.
    """
    if candidate and candidate == current:
        return False
    c = compare_resource_versions(candidate, current)
    return c is None or c > 0


def sort_key(rv: str) -> tuple[int, str] | None:
    """A key that orders comparable resourceVersions exactly as
    :func:`compare_resource_versions` does, or ``None`` when ``rv`` is not comparable.

    Useful for heaps, sorted containers, and for comparing one version against many cheaply.
    """
    if isinstance(rv, str) and rv.isdigit() and rv.isascii() and rv[0] != "0":
        return (len(rv), rv)
    return None

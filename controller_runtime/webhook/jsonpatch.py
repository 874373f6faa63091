"""The JSON patch (RFC 6902) from an object as it was sent to what a defaulter made of it.

:func:`diff` is what the admission server answers a mutating review with: applying its
operations to ``before`` gives ``after``, exactly (a property test checks it against an
independent RFC 6902 implementation). It removes only what the handler removed: a field the
handler does not know about is in both documents and produces no operation, so it survives
(controller-runtime had to drop ``remove`` operations for fields its Go types lacked; a handler
here works on the dict itself, so nothing is lost in a decode/encode round trip).

The patch is small, not minimal: objects are compared key by key, recursively; a list of
the same length is compared element by element, and a list whose length changed is replaced
whole (a change of length has no unambiguous element-wise diff, and the API server applies a
``replace`` of a list as cheaply as a sequence of ``add``/``remove``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Operation", "diff", "escape"]

Operation = dict[str, Any]
"""One RFC 6902 operation: ``{"op": "add" | "remove" | "replace", "path": ..., "value": ...}``."""


def escape(key: str) -> str:
    """A key as one JSON-pointer (RFC 6901) reference token: ``~`` is ``~0``, ``/`` is ``~1``."""
    return key.replace("~", "~0").replace("/", "~1")


def diff(before: Any, after: Any) -> list[Operation]:
    """The operations that turn ``before`` into ``after`` (JSON values: dicts, lists, str,
    int, float, bool, None). Empty when they are equal. Neither argument is modified; the
    operations' values are ``after``'s own parts (not copies): serialise the operations
    before changing ``after`` again."""
    operations: list[Operation] = []
    _diff(before, after, "", operations)
    return operations


def _same(a: Any, b: Any) -> bool:
    # JSON equality: 1 == 1.0 == True in Python, but true, 1 and 1.0 are different JSON.
    if type(a) is not type(b):
        return False
    return bool(a == b)


def _diff(before: Any, after: Any, path: str, out: list[Operation]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in before:
            if key not in after:
                out.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in after.items():
            child = f"{path}/{escape(key)}"
            if key not in before:
                out.append({"op": "add", "path": child, "value": value})
            else:
                _diff(before[key], value, child, out)
        return
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            _diff(old, new, f"{path}/{index}", out)
        return
    if not _equal(before, after):
        # The root ("") is replaced whole too: a valid RFC 6902 operation.
        out.append({"op": "replace", "path": path, "value": after})


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return _same(a, b)

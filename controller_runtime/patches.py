"""Patch bodies, for writes the helpers do not make for you.

- :func:`merge_patch`: the JSON merge patch (RFC 7386) that turns one dict into another, e.g.
  to write only the status fields that changed.
- :func:`add_finalizer_patch`, :func:`remove_finalizer_patch`: the JSON patches (RFC 6902)
  :func:`~controller_runtime.util.ensure_finalizer` and
  :func:`~controller_runtime.util.release_finalizer` send, with the ``test`` operations that
  make them safe against a concurrent change of the list.

Send them with ``client.patch(obj, body, patch_type="merge" | "json")``.
"""

from controller_runtime.util.finalizers import add_finalizer_patch, remove_finalizer_patch
from controller_runtime.util.mutate import merge_patch

__all__ = ["add_finalizer_patch", "merge_patch", "remove_finalizer_patch"]

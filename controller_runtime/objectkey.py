"""How the client and the cache are told which object to address.

Every method that addresses one object by its key (:meth:`Client.get`,
:meth:`LiveReader.get`, :meth:`Client.delete`, :meth:`Client.mutate_with_retry`,
:meth:`Cache.get`) takes ``api_version`` and ``kind`` positionally, then the key in exactly
one of two forms:

- a :class:`~controller_runtime.reconcile.Request` (what a reconcile is handed), positionally:
  ``client.get(TASKS, "Task", request)``;
- keyword-only ``name=`` and ``namespace=``: ``client.get(TASKS, "Task", name="a",
  namespace="ns")``; ``namespace`` is left out (or ``None``) for cluster-scoped kinds.

A bare string or a plain tuple in the key position is refused with a :class:`TypeError`: the
order of ``(name, namespace)`` versus ``Request(namespace, name)`` is exactly what used to be
swapped by mistake, and a swapped key on a watched kind reads as "not found" instead of
failing loudly.
"""

from __future__ import annotations

from controller_runtime.reconcile import Request

__all__ = ["resolve_key"]


def resolve_key(
    key: Request | None, name: str | None, namespace: str | None, *, method: str
) -> tuple[str | None, str]:
    """``(namespace or None, name)`` from either form; ``TypeError`` for anything else.

    ``method`` names the caller in the error message (e.g. ``"Client.get"``).
    """
    if key is not None:
        if not isinstance(key, Request):
            raise TypeError(
                f"{method} takes the key as a Request or as name=/namespace= keywords, "
                f"not {type(key).__name__} {key!r}; write "
                f'{method.rsplit(".", 1)[-1]}(api_version, kind, name="...", namespace="...")'
            )
        if name is not None or namespace is not None:
            raise TypeError(f"{method}: pass either a Request or name=/namespace=, not both")
        return key.namespace or None, key.name
    if not name or not isinstance(name, str):
        raise TypeError(
            f"{method} needs the object's name: a Request, or name= (and namespace= for a "
            "namespaced kind)"
        )
    if namespace is not None and not isinstance(namespace, str):
        raise TypeError(f"{method}: namespace= must be a string, not {namespace!r}")
    return namespace or None, name

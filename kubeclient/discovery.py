"""Discovery: from ``apiVersion`` + ``kind`` to the resource's URL name and scope.

Each group/version's resource list is fetched once and cached; a kind that is not in the
cached list causes one refetch of that group/version (a CRD may have been installed since),
and only then :class:`UnknownKindError`. Concurrent lookups of the same group/version share one
request.

``resolve(..., wait_for_server=True)`` (what the cache does when it starts watching a kind, so
what a manager does while it starts) waits for an API server that cannot be reached or is
overloaded (a transport failure, 429 or 5xx) instead of raising: it retries with backoff (1 s,
doubling to 30 s, jittered) and logs a warning naming the server, the group/version, the
reason and the next delay at each failure, the first one at once (each attempt is a single
request, without the transport's own silent retries). ``wait_timeout`` bounds the wait: after
that many seconds it raises :class:`ServerUnreachableError` with the last failure. Other
errors (403, ...) still raise at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any

from kubeclient.errors import ApiError, NotFoundError
from kubeclient.transport import Transport

log = logging.getLogger(__name__)

WAIT_INITIAL = 1.0
"""First delay (seconds, before jitter) between discovery attempts while the server is
unreachable."""
WAIT_CAP = 30.0
"""Longest delay (seconds, before jitter) between those attempts."""


def server_unreachable(err: ApiError) -> bool:
    """Whether ``err`` says the API server could not be reached or could not answer now
    (a transport failure, 429, or 5xx), as opposed to an answer about the request."""
    return err.status in {0, 429} or err.status >= 500


class UnknownKindError(LookupError):
    """The API server serves no resource of this kind (is the CRD installed?)."""


class ServerUnreachableError(TimeoutError):
    """The API server could not be reached (or answered only 429/5xx) for as long as the
    caller was willing to wait. ``server`` is its address, ``waited`` the seconds waited,
    ``last`` the last failure (``None`` if no attempt ended before the time was up)."""

    def __init__(self, server: str, waited: float, attempts: int, last: ApiError | None) -> None:
        self.server = server
        self.waited = waited
        self.attempts = attempts
        self.last = last
        failure = f"last: {last}" if last is not None else "no answer"
        super().__init__(
            f"cannot reach the API server {server}: gave up after {waited:g}s and {attempts} "
            f"failed attempt(s) ({failure}); check the server address in the kubeconfig, the "
            "network, and that the API server is running"
        )


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """One served resource: enough to build any URL for it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    verbs: frozenset[str] = frozenset()
    subresources: frozenset[str] = frozenset()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """``plural.group`` (``plural`` for the core group): the unit in which
        resourceVersions are comparable."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The URL path; ``namespace=None`` on a namespaced resource means all namespaces."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [prefix]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name is not None:
            parts.append(name)
            if subresource:
                parts.append(subresource)
        return "/".join(parts)


def split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


class Discovery:
    """Cached resource discovery for one API server."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._by_gv: dict[str, dict[str, ResourceInfo]] = {}
        self._pending: dict[str, asyncio.Future[dict[str, ResourceInfo]]] = {}

    async def resolve(
        self,
        api_version: str,
        kind: str,
        *,
        wait_for_server: bool = False,
        wait_timeout: float | None = None,
    ) -> ResourceInfo:
        """The resource serving ``kind`` in ``api_version``; raises :class:`UnknownKindError`.

        ``wait_for_server``: retry (and log) while the API server is unreachable instead of
        raising its :class:`~kubeclient.errors.ApiError` (see the module docs), for at most
        ``wait_timeout`` seconds (then :class:`ServerUnreachableError`; ``None``: until the
        caller is cancelled).
        """
        kinds = self._by_gv.get(api_version)
        if kinds is None or kind not in kinds:
            if wait_for_server:
                kinds = await self._fetch_patiently(api_version, wait_timeout)
            else:
                kinds = await self._fetch(api_version)
        info = kinds.get(kind)
        if info is None:
            raise UnknownKindError(
                f"the API server serves no kind {kind!r} in {api_version!r}; "
                "is its CustomResourceDefinition installed and established?"
            )
        return info

    def invalidate(self, api_version: str | None = None) -> None:
        """Forget cached resource lists (all, or one group/version)."""
        if api_version is None:
            self._by_gv.clear()
        else:
            self._by_gv.pop(api_version, None)

    async def _fetch_patiently(
        self, api_version: str, timeout: float | None
    ) -> dict[str, ResourceInfo]:
        server = self._transport.config.server
        failures = 0
        last: ApiError | None = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        # One request per attempt: this loop retries, and says so at once.
                        return await self._fetch(api_version, max_retries=0)
                    except ApiError as err:
                        if not server_unreachable(err):
                            raise
                        failures += 1
                        last = err
                    delay = min(WAIT_INITIAL * 2 ** (failures - 1), WAIT_CAP)
                    delay *= 1 + random.random() / 2
                    log.warning(
                        "cannot reach the API server %s to discover %s (%s); retrying in "
                        "%.1fs (attempt %d%s)",
                        server,
                        api_version,
                        last,
                        delay,
                        failures,
                        f"; giving up after {timeout:g}s" if timeout is not None else "",
                    )
                    await asyncio.sleep(delay)
        except TimeoutError:
            assert timeout is not None  # only asyncio.timeout raises it here
            raise ServerUnreachableError(server, timeout, failures, last) from last

    async def _fetch(
        self, api_version: str, *, max_retries: int | None = None
    ) -> dict[str, ResourceInfo]:
        pending = self._pending.get(api_version)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[dict[str, ResourceInfo]] = asyncio.get_running_loop().create_future()
        self._pending[api_version] = future
        try:
            kinds = await self._load(api_version, max_retries)
            self._by_gv[api_version] = kinds
            future.set_result(kinds)
            return kinds
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # mark retrieved: waiters may not exist
            raise
        finally:
            del self._pending[api_version]

    async def _load(self, api_version: str, max_retries: int | None) -> dict[str, ResourceInfo]:
        group, version = split_api_version(api_version)
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            listing: Any = await self._transport.get_json(path, max_retries=max_retries)
        except NotFoundError:
            return {}
        resources = listing.get("resources", []) if isinstance(listing, dict) else []
        subresources: dict[str, set[str]] = {}
        for resource in resources:
            name = resource["name"]
            if "/" in name:
                parent, sub = name.split("/", 1)
                subresources.setdefault(parent, set()).add(sub)
        kinds: dict[str, ResourceInfo] = {}
        for resource in resources:
            name = resource["name"]
            if "/" in name:
                continue
            kinds[resource["kind"]] = ResourceInfo(
                group=group,
                version=version,
                kind=resource["kind"],
                plural=name,
                namespaced=bool(resource.get("namespaced")),
                verbs=frozenset(resource.get("verbs", [])),
                subresources=frozenset(subresources.get(name, ())),
            )
        return kinds

"""The controller builder: say what a controller watches, then hand it a reconciler.

::

    controller = await (
        ControllerBuilder(cache)
        .for_("tasks.crpy.io/v1", "Task", predicates=[GenerationChanged()])
        .owns("v1", "ConfigMap")
        .watches("v1", "Secret", EnqueueRequestsFromMapFunc(secret_to_tasks))
        .with_options(max_concurrent_reconciles=4)
        .complete(reconcile)
    )
    await controller.start()

Mapping to controller-runtime's ``builder.ControllerManagedBy(mgr)``: ``For`` → :meth:`for_`,
``Owns`` → :meth:`owns` (``MatchEveryOwner`` → ``only_controller=False``), ``Watches`` →
:meth:`watches`, ``WithEventFilter`` → :meth:`with_event_filter`, ``WithOptions`` →
:meth:`with_options`, ``Named`` → :meth:`named`, ``Complete``/``Build`` → :meth:`complete`.
:meth:`caches` has no counterpart there (controller-runtime's cache starts an informer on
the first read of a kind; this one never watches behind the caller's back, see
:mod:`~controller_runtime.cache`).

The builder takes a :class:`~controller_runtime.cache.Cache` (and optionally a factory of
consistency guards), or anything that offers those and wants the finished controller: a
:class:`ControllerHost`, which is the seam for a manager (``ControllerBuilder(manager)``).

Mistakes are refused when the controller is built, before anything is watched, each with one
line naming the fix, rather than per event later: a predicate or handler passed as a class
(``predicates=[GenerationChanged]``), something that is neither, a reconciler of the wrong
shape (a class, a plain ``def``, a coroutine already called, the wrong number of arguments),
``owns()`` without ``for_()``, and a controller name already in use.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, Self, TypedDict, Unpack

from controller_runtime.cache import Cache, KindInformers
from controller_runtime.consistency import OwnWriteEchoes
from controller_runtime.controller import (
    Controller,
    ControllerOptions,
    check_name,
    check_reconciler,
)
from controller_runtime.handlers import (
    EnqueueRequestForObject,
    EnqueueRequestForOwner,
    EnqueueRequestsFromMapFunc,
    EventHandler,
)
from controller_runtime.predicates import Predicate, PredicateLike
from controller_runtime.ratelimiter import RateLimiter
from controller_runtime.reconcile import ConsistencyGuard, ReconcileFunc, Reconciler, Request
from controller_runtime.resource import Resource, split_target

if TYPE_CHECKING:
    from controller_runtime.sharded_controller import ShardedController
    from controller_runtime.sharding import ShardRing

__all__ = ["ControllerBuilder", "ControllerHost", "GuardFactory", "OptionChanges"]

GuardFactory = Callable[[str], ConsistencyGuard]
"""Makes the consistency guard of the controller with the given name."""


class ControllerHost(Protocol):
    """What the builder needs from a manager: its cache, its guard factory (``None`` for no
    read-your-writes guard), and a place to put the finished controller, which the host then
    starts and stops with everything else it runs."""

    @property
    def cache(self) -> Cache: ...

    @property
    def guard_factory(self) -> GuardFactory | None: ...

    def add(self, controller: Controller) -> None: ...


class _ControllerHold:
    """What the builder's controller holds its kinds in the cache as (until it stops)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"controller {self.name!r}"


class OptionChanges(TypedDict, total=False):
    """Keyword arguments of :meth:`ControllerBuilder.with_options` (fields of
    :class:`~controller_runtime.controller.ControllerOptions`)."""

    max_concurrent_reconciles: int
    reconcile_timeout: float | None
    rate_limiter: RateLimiter[Request] | None
    cache_sync_timeout: float
    skip_name_validation: bool
    skip_own_write_echoes: bool


def _check_predicates(where: str, predicates: Sequence[PredicateLike]) -> tuple[PredicateLike, ...]:
    """``predicates`` as a tuple; ``TypeError`` (one line naming the fix) for anything that
    would fail on every event instead: a class, a non-callable, a function that does not take
    one argument (the delta)."""
    if isinstance(predicates, Predicate) or callable(predicates):
        call = "()" if inspect.isclass(predicates) else ""
        raise TypeError(
            f"{where}: predicates= takes a list: predicates=[{_name(predicates)}{call}]"
        )
    checked = tuple(predicates)
    for predicate in checked:
        if inspect.isclass(predicate):
            raise TypeError(
                f"{where}: the predicate {predicate.__name__} is a class; pass an instance: "
                f"{predicate.__name__}()"
            )
        if not callable(predicate):
            raise TypeError(
                f"{where}: {predicate!r} is not a predicate; pass a Predicate (e.g. "
                "GenerationChanged()) or a function of the delta"
            )
        if not isinstance(predicate, Predicate) and not _takes_one_argument(predicate):
            raise TypeError(
                f"{where}: the predicate {_name(predicate)} must take one argument, the "
                "StoreDelta: def check(delta) -> bool"
            )
    return checked


def _takes_one_argument(fn: Callable[..., object]) -> bool:
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to inspect (some builtins): give it the benefit
        return True
    return True


def _name(obj: object) -> str:
    return str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj))


@dataclasses.dataclass(frozen=True)
class _Watch:
    api_version: str
    kind: str
    handler: EventHandler | None  # None: owned by the for_ kind (needs its scope first)
    predicates: tuple[PredicateLike, ...]
    only_controller: bool = True


class ControllerBuilder:
    """Fluent configuration of one controller; :meth:`complete` builds it.

    Args:
        source: a :class:`~controller_runtime.cache.Cache`, or a :class:`ControllerHost`
            (a manager) providing the cache and the guard factory and receiving the
            controller.
        guard_factory: makes the controller's
            :class:`~controller_runtime.reconcile.ConsistencyGuard` from its name; overrides
            the host's. Default: the host's, or none with a bare cache.

    Every method but :meth:`complete` returns the builder. A builder builds one controller.
    """

    def __init__(
        self, source: Cache | ControllerHost, *, guard_factory: GuardFactory | None = None
    ) -> None:
        if isinstance(source, Cache):
            self._cache = source
            self._host: ControllerHost | None = None
        else:
            self._cache = source.cache
            self._host = source
            guard_factory = guard_factory or source.guard_factory
        self._guard_factory = guard_factory
        self._name: str | None = None
        self._for: _Watch | None = None
        self._watches: list[_Watch] = []
        self._cached: list[tuple[str, str]] = []
        self._filters: list[PredicateLike] = []
        self._options = ControllerOptions()
        self._built = False

    def named(self, name: str) -> Self:
        """Name the controller (default: the ``for_`` kind, lowercased). Names label metrics
        and logs and must be unique in the process."""
        if not name:
            raise ValueError("a controller name must not be empty")
        self._name = name
        return self

    def for_(
        self,
        api_version: str | type[Resource],
        kind: str | None = None,
        *,
        predicates: Sequence[PredicateLike] = (),
    ) -> Self:
        """Reconcile objects of this kind: each change enqueues the object's own key
        (:class:`~controller_runtime.handlers.EnqueueRequestForObject`), if ``predicates``
        pass. At most once per controller. Here and in :meth:`owns` and :meth:`watches`, a
        resource class may stand for ``api_version, kind``: ``for_(Task)``."""
        _, api_version, kind, _ = split_target(api_version, kind, None, method="for_")
        if self._for is not None:
            raise ValueError(
                f"for_() was already called ({self._for.kind}); a controller reconciles one "
                "kind: use watches() for others"
            )
        checked = _check_predicates(f"for_({kind!r})", predicates)
        self._for = _Watch(api_version, kind, EnqueueRequestForObject(), checked)
        return self

    def owns(
        self,
        api_version: str | type[Resource],
        kind: str | None = None,
        *,
        predicates: Sequence[PredicateLike] = (),
        only_controller: bool = True,
    ) -> Self:
        """Also watch objects of this kind that the ``for_`` kind owns: a change enqueues the
        owner named in the object's controller ``ownerReference``
        (:class:`~controller_runtime.handlers.EnqueueRequestForOwner`).
        ``only_controller=False`` enqueues every owner of the ``for_`` kind (controller-
        runtime's ``MatchEveryOwner``). Needs :meth:`for_`."""
        _, api_version, kind, _ = split_target(api_version, kind, None, method="owns")
        checked = _check_predicates(f"owns({kind!r})", predicates)
        self._watches.append(_Watch(api_version, kind, None, checked, only_controller))
        return self

    def watches(
        self,
        api_version: str | type[Resource],
        kind: str | EventHandler,
        handler: EventHandler | None = None,
        *,
        predicates: Sequence[PredicateLike] = (),
    ) -> Self:
        """Also watch objects of this kind, mapping their changes to requests with
        ``handler`` (typically :class:`~controller_runtime.handlers.EnqueueRequestsFromMapFunc`):
        ``watches("v1", "Secret", handler)`` or ``watches(Task, handler)``.
        """
        if not isinstance(api_version, str):
            if handler is not None:
                raise TypeError("watches(cls, handler): the class stands for api_version, kind")
            kind, handler = None, kind  # type: ignore[assignment]
        _, api_version, kind, _ = split_target(api_version, kind, None, method="watches")
        where = f"watches({kind!r})"
        if inspect.isclass(handler) and issubclass(handler, EventHandler):
            fix = (
                f"{handler.__name__}(map_function)"
                if handler is EnqueueRequestsFromMapFunc
                else f"{handler.__name__}(...)"
            )
            raise TypeError(f"{where}: the handler {handler.__name__} is a class; pass {fix}")
        if not isinstance(handler, EventHandler):
            raise TypeError(
                f"{where} takes an EventHandler, got {_name(handler)}; wrap a map function in "
                "EnqueueRequestsFromMapFunc(fn)"
            )
        checked = _check_predicates(where, predicates)
        self._watches.append(_Watch(api_version, kind, handler, checked))
        return self

    def caches(self, api_version: str | type[Resource], kind: str | None = None) -> Self:
        """Cache this kind for the reconciler to read, without reconciling on its changes
        (a configuration object, say): :meth:`complete` watches it, and the controller's
        start waits for its initial list as for the watched kinds. Nothing is enqueued when
        such an object changes; use :meth:`watches` for that."""
        _, api_version, kind, _ = split_target(api_version, kind, None, method="caches")
        self._cached.append((api_version, kind))
        return self

    def with_event_filter(self, *predicates: PredicateLike) -> Self:
        """Predicates applied to every watched kind, before each watch's own."""
        self._filters.extend(_check_predicates("with_event_filter()", predicates))
        return self

    def with_options(
        self, options: ControllerOptions | None = None, /, **changes: Unpack[OptionChanges]
    ) -> Self:
        """Set the controller's options: a whole
        :class:`~controller_runtime.controller.ControllerOptions`, and/or single fields,
        e.g. ``with_options(max_concurrent_reconciles=4)``."""
        self._options = dataclasses.replace(options or self._options, **changes)
        return self

    async def complete(self, reconciler: ReconcileFunc | Reconciler) -> Controller:
        """Build the controller: watch every kind in the cache (starting its informers if
        new), register the handlers on them, and return the controller, not started (a host
        gets it through ``host.add``). Events are queued from now on; nothing is reconciled
        before :meth:`Controller.start`.

        Raises ``ValueError`` for an incomplete or inconsistent configuration or a name in
        use, and what :meth:`Cache.watch` raises for a kind the server does not serve.
        """
        if self._built:
            raise RuntimeError("this builder already built its controller; use a new one")
        check_reconciler(reconciler)
        main = self._for
        owned = [w for w in self._watches if w.handler is None]
        if main is None and owned:
            raise ValueError(
                f"owns({owned[0].kind!r}) needs for_(...): owned objects are mapped to their "
                "owner of the for_ kind; add .for_(api_version, kind) for the owner's kind"
            )
        if main is None and self._name is None:
            raise ValueError(
                "a controller needs for_(api_version, kind), the kind it reconciles (or, "
                "with only watches(), a name: named(...))"
            )
        name = self._name or (main.kind.lower() if main is not None else "")
        if not self._options.skip_name_validation:
            check_name(name)

        # Resolve every kind before anything is registered: an unknown kind fails the build
        # without leaving a half-wired controller behind.
        cache = self._cache
        holder = _ControllerHold(name)
        try:
            main_entry = (
                await cache.watch(main.api_version, main.kind, holder=holder)
                if main is not None
                else None
            )
            entries = [
                await cache.watch(w.api_version, w.kind, holder=holder) for w in self._watches
            ]
            cached = [await cache.watch(av, k, holder=holder) for av, k in self._cached]
            guard = self._guard_factory(name) if self._guard_factory is not None else None
            echoes = None
            if self._options.skip_own_write_echoes and main_entry is not None:
                echoes = OwnWriteEchoes(main_entry.resource)
            controller = Controller(
                name, reconciler, options=self._options, guard=guard, echoes=echoes
            )
        except BaseException:  # nothing built: let go of what was watched for it
            await cache.release_all(holder)
            raise
        # Stopped, the controller lets go of its kinds: informers nobody else holds stop.
        controller.on_stop(lambda: cache.release_all(holder))
        if main is not None and main_entry is not None:
            assert main.handler is not None
            # The echo filter last: it is one empty-dict test for every event not ours.
            for_predicates: tuple[PredicateLike, ...] = main.predicates
            if echoes is not None:
                for_predicates = (*for_predicates, echoes)
                # A delta it held that was not our echo after all has passed every other
                # predicate already: it goes straight to the handler.
                echoes.deliver_to(main.handler.bind(controller.queue))
            self._register(controller, main_entry, main.handler, for_predicates)
        for watch, entry in zip(self._watches, entries, strict=True):
            handler = watch.handler
            if handler is None:
                assert main is not None and main_entry is not None
                handler = EnqueueRequestForOwner(
                    main.api_version,
                    main.kind,
                    only_controller=watch.only_controller,
                    owner_namespaced=main_entry.resource.namespaced,
                )
            self._register(controller, entry, handler, watch.predicates)
        for entry in cached:
            controller.wait_for(entry)
        self._built = True
        if self._host is not None:
            self._host.add(controller)
        return controller

    async def complete_sharded(
        self, reconciler: ReconcileFunc | Reconciler, *, ring: ShardRing | None = None
    ) -> ShardedController:
        """Build the controller sharded over ``ring`` (default: the host's, i.e. the manager's
        ``ManagerOptions.shard_ring``): this replica reconciles only the ``for_`` objects of
        the slots the ring gives it, with one informer and one work queue per slot (see
        :mod:`controller_runtime.sharding` for the guarantees). The ring starts and stops it.

        Only ``for_`` (with predicates and event filters) is supported: secondary watches
        (``owns``/``watches``) would enqueue objects of other replicas' slots, so they raise
        ``ValueError`` for now. The kind must not also be cached unsharded.
        """
        from controller_runtime.sharded_controller import (  # noqa: PLC0415 (import cycle)
            ShardedController,
            ShardedKindInformers,
        )

        if self._built:
            raise RuntimeError("this builder already built its controller; use a new one")
        check_reconciler(reconciler)
        main = self._for
        if main is None:
            raise ValueError("a sharded controller needs for_(...): the kind it shards")
        if self._cached:
            raise ValueError(
                "caches() is not supported by complete_sharded: the slots' controllers would "
                "not wait for those kinds; watch them with manager.cache.watch(...) and wait "
                "for them in the reconciler, or keep that controller leader-elected"
            )
        if self._watches:
            raise ValueError(
                "a sharded controller supports for_() only: owns()/watches() would see "
                "objects of every shard; shard by namespace and scope those watches yourself, "
                "or keep that controller leader-elected"
            )
        ring = ring or getattr(self._host, "shard_ring", None)
        if ring is None:
            raise ValueError(
                "no shard ring: set ManagerOptions(shard_ring=ShardRingConfig(...)) or pass "
                "ring=ShardRing(...)"
            )
        name = self._name or main.kind.lower()
        if not self._options.skip_name_validation:
            check_name(name)
        resource = await self._cache.discovery.resolve(main.api_version, main.kind)
        entry = ShardedKindInformers(resource)
        self._cache.attach(main.api_version, main.kind, entry)
        sharded = ShardedController(
            name,
            reconciler,
            ring=ring,
            cache=self._cache,
            entry=entry,
            api_version=main.api_version,
            kind=main.kind,
            predicates=[*self._filters, *main.predicates],
            options=self._options,
            guard_factory=self._guard_factory,
        )
        ring.add_listener(sharded)
        self._built = True
        return sharded

    def _register(
        self,
        controller: Controller,
        entry: KindInformers,
        handler: EventHandler,
        predicates: tuple[PredicateLike, ...],
    ) -> None:
        controller.watch(entry, handler, [*self._filters, *predicates])

"""Mistakes a controller author makes are refused when the controller is built, before
anything is watched, with one line naming the fix (not once per event, later)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from controller_runtime import (
    Controller,
    ControllerBuilder,
    ControllerOptions,
    EnqueueRequestForObject,
    EnqueueRequestsFromMapFunc,
    GenerationChanged,
    LabelsChanged,
    Request,
    Result,
    StoreDelta,
)
from controller_runtime.cache import Cache


class _Untouchable:
    """An informer factory that fails the test if the builder reaches it: every mistake
    below must be refused before anything is resolved or watched."""

    @property
    def discovery(self) -> Any:
        raise AssertionError("the builder touched the cache before refusing the mistake")

    async def informer(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the builder watched a kind before refusing the mistake")


def builder() -> ControllerBuilder:
    return ControllerBuilder(Cache(_Untouchable()))  # type: ignore[arg-type]


async def reconcile(request: Request) -> Result | None:
    return None


class TaskReconciler:
    async def reconcile(self, request: Request) -> Result | None:
        return None


def one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(error.value)
    assert "\n" not in message, f"not one line: {message!r}"
    return message


# -- predicates and handlers ------------------------------------------------------------------

PLACES: dict[str, Callable[[ControllerBuilder, Any], object]] = {
    "for_": lambda b, p: b.for_("v1", "ConfigMap", predicates=p),
    "owns": lambda b, p: b.owns("v1", "Secret", predicates=p),
    "watches": lambda b, p: b.watches("v1", "Secret", EnqueueRequestForObject(), predicates=p),
    "with_event_filter": lambda b, p: b.with_event_filter(*p),
}


@pytest.mark.parametrize("place", sorted(PLACES))
def test_a_predicate_class_is_refused_naming_the_instance_to_pass(place: str) -> None:
    with pytest.raises(TypeError) as refused:
        PLACES[place](builder(), [LabelsChanged(), GenerationChanged])
    message = one_line(refused)
    assert "GenerationChanged is a class" in message
    assert "GenerationChanged()" in message


@pytest.mark.parametrize("place", ["for_", "owns", "watches"])
def test_a_single_predicate_instead_of_a_list_is_refused(place: str) -> None:
    with pytest.raises(TypeError) as refused:
        PLACES[place](builder(), GenerationChanged())
    assert "predicates=[GenerationChanged()]" in one_line(refused)
    with pytest.raises(TypeError) as refused:
        PLACES[place](builder(), GenerationChanged)
    assert "predicates=[GenerationChanged()]" in one_line(refused)


@pytest.mark.parametrize("place", sorted(PLACES))
def test_something_that_is_not_a_predicate_is_refused(place: str) -> None:
    with pytest.raises(TypeError) as refused:
        PLACES[place](builder(), ["app=demo"])
    assert "'app=demo' is not a predicate" in one_line(refused)


@pytest.mark.parametrize("place", sorted(PLACES))
def test_a_predicate_function_of_the_wrong_shape_is_refused(place: str) -> None:
    def two(old: StoreDelta, new: StoreDelta) -> bool:
        return True

    with pytest.raises(TypeError) as refused:
        PLACES[place](builder(), [two])
    assert "must take one argument, the StoreDelta" in one_line(refused)


def test_predicates_of_the_right_shape_pass() -> None:
    class Spec:
        def __call__(self, delta: StoreDelta) -> bool:
            return True

    for place in PLACES.values():
        place(
            builder(), [GenerationChanged(), lambda d: True, Spec(), GenerationChanged() | Spec()]
        )


@pytest.mark.parametrize(
    ("handler", "fix"),
    [
        (EnqueueRequestForObject, "pass EnqueueRequestForObject(...)"),
        (EnqueueRequestsFromMapFunc, "pass EnqueueRequestsFromMapFunc(map_function)"),
    ],
)
def test_a_handler_class_is_refused_naming_the_instance_to_pass(handler: type, fix: str) -> None:
    with pytest.raises(TypeError) as refused:
        builder().watches("v1", "Secret", handler)  # type: ignore[arg-type]
    message = one_line(refused)
    assert f"the handler {handler.__name__} is a class" in message and fix in message


def test_a_bare_map_function_is_refused_naming_the_wrapper() -> None:
    def to_tasks(obj: Any) -> list[Request]:
        return []

    with pytest.raises(TypeError) as refused:
        builder().watches("v1", "Secret", to_tasks)  # type: ignore[arg-type]
    assert "EnqueueRequestsFromMapFunc(fn)" in one_line(refused)


# -- the reconciler -----------------------------------------------------------------------------


def _plain(request: Request) -> None:
    return None


async def _no_argument() -> None:
    return None


async def _two_arguments(request: Request, extra: int) -> None:
    return None


class _NoReconcile:
    pass


@pytest.mark.parametrize(
    ("reconciler", "fix"),
    [
        (TaskReconciler, "the reconciler TaskReconciler is a class; pass an instance: "),
        (_NoReconcile, "_NoReconcile is a class, not a reconciler"),
        (_plain, "must be a coroutine function (async def)"),
        (_no_argument, "must take one argument, the Request"),
        (_two_arguments, "must take one argument, the Request"),
        (42, "a reconciler is an async function or has an async reconcile method"),
    ],
    ids=["class", "not-a-reconciler-class", "plain-def", "no-argument", "two-arguments", "int"],
)
async def test_a_reconciler_of_the_wrong_shape_is_refused_before_anything_is_watched(
    reconciler: Any, fix: str
) -> None:
    with pytest.raises(TypeError) as refused:
        await builder().for_("v1", "ConfigMap").complete(reconciler)
    assert fix in one_line(refused)


async def test_a_called_reconciler_is_refused_and_its_coroutine_closed() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError) as refused:
            await builder().for_("v1", "ConfigMap").complete(reconcile(Request("ns", "a")))  # type: ignore[arg-type]
        gc.collect()
    assert "(reconcile(...) was called): pass the function itself, complete(reconcile)" in (
        one_line(refused)
    )
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def test_a_sharded_build_checks_the_reconciler_too() -> None:
    with pytest.raises(TypeError, match="is a class"):
        await builder().for_("v1", "ConfigMap").complete_sharded(TaskReconciler)  # type: ignore[arg-type]


def test_reconcilers_of_the_right_shape_pass() -> None:
    class CallableReconciler:
        async def __call__(self, request: Request) -> None:
            return None

    options = ControllerOptions(skip_name_validation=True)
    wrapped = lambda r: reconcile(r)  # noqa: E731, PLW0108 (a lambda is what is tested)
    for good in (reconcile, TaskReconciler(), CallableReconciler(), wrapped):
        Controller("shapes", good, options=options)


# -- what the controller is built from -------------------------------------------------------------


@pytest.mark.parametrize("named", [False, True])
async def test_owns_without_for_names_for_not_named(named: bool) -> None:
    b = builder().owns("v1", "Secret")
    if named:
        b = b.named("secrets")
    with pytest.raises(ValueError) as refused:
        await b.complete(reconcile)
    message = one_line(refused)
    assert "owns('Secret') needs for_(...)" in message and ".for_(api_version, kind)" in message
    assert "named" not in message


async def test_a_controller_without_for_says_what_it_needs() -> None:
    with pytest.raises(ValueError) as refused:
        await builder().complete(reconcile)
    assert one_line(refused).startswith("a controller needs for_(api_version, kind)")


async def test_a_name_in_use_is_refused_and_released_when_its_controller_stops() -> None:
    first = Controller("reused-after-stop", reconcile)
    with pytest.raises(ValueError) as refused:
        await builder().named("reused-after-stop").for_("v1", "ConfigMap").complete(reconcile)
    assert "already runs in this process" in one_line(refused)
    await first.stop()
    second = Controller("reused-after-stop", reconcile)  # the name is free again
    await second.stop()
    # A controller that skipped the check does not release the name of the one that holds it.
    holder = Controller("held", reconcile)
    await Controller("held", reconcile, options=ControllerOptions(skip_name_validation=True)).stop()
    with pytest.raises(ValueError, match="already runs"):
        Controller("held", reconcile)
    await holder.stop()

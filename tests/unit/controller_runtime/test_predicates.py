"""Predicates: each built-in on every event type, combinators, operators, plain functions."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from controller_runtime.predicates import (
    AnnotationsChanged,
    GenerationChanged,
    LabelsChanged,
    LabelSelectorPredicate,
    Predicate,
    PredicateFuncs,
    ResourceVersionChanged,
    and_,
    as_predicate,
    combine,
    not_,
    or_,
)
from informers.labels import LabelSelector
from informers.store import ADDED, DELETED, MODIFIED, Store, StoreDelta, split_uid_change


def obj(
    *,
    generation: int = 1,
    rv: str = "1",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    spec: int = 0,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "a",
        "namespace": "ns",
        "generation": generation,
        "resourceVersion": rv,
    }
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"x": spec}}


def update(old: dict[str, Any], new: dict[str, Any]) -> StoreDelta:
    return StoreDelta(MODIFIED, new, orjson.dumps(old))


def create(o: dict[str, Any]) -> StoreDelta:
    return StoreDelta(ADDED, o)


def delete(o: dict[str, Any]) -> StoreDelta:
    return StoreDelta(DELETED, o, orjson.dumps(o))


def test_generation_changed_passes_spec_updates_only() -> None:
    p = GenerationChanged()
    assert p(update(obj(generation=1, rv="1"), obj(generation=2, rv="2", spec=1)))
    # status-only and metadata-only writes keep the generation
    assert not p(update(obj(generation=1, rv="1"), obj(generation=1, rv="2")))
    assert not p(update(obj(rv="1"), obj(rv="2", labels={"a": "b"})))
    assert p(create(obj())) and p(delete(obj()))


def test_resource_version_changed() -> None:
    p = ResourceVersionChanged()
    assert p(update(obj(rv="1"), obj(rv="2")))
    assert not p(update(obj(rv="7"), obj(rv="7")))
    assert p(create(obj())) and p(delete(obj()))


def test_labels_changed_treats_missing_as_empty() -> None:
    p = LabelsChanged()
    assert p(update(obj(labels={"a": "1"}), obj(labels={"a": "2"})))
    assert p(update(obj(), obj(labels={"a": "1"})))
    assert not p(update(obj(labels={}), obj(rv="2")))
    assert not p(update(obj(labels={"a": "1"}), obj(rv="2", labels={"a": "1"}, generation=5)))
    assert p(create(obj())) and p(delete(obj()))


def test_annotations_changed() -> None:
    p = AnnotationsChanged()
    assert p(update(obj(annotations={"a": "1"}), obj(annotations={})))
    assert not p(update(obj(), obj(annotations={}, generation=2)))
    assert p(create(obj())) and p(delete(obj()))


@pytest.mark.parametrize(
    "selector",
    [
        "app=web,tier!=db",
        LabelSelector.parse("app=web,tier!=db"),
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}],
        },
    ],
)
def test_label_selector_predicate_on_every_event_type(selector: Any) -> None:
    p = LabelSelectorPredicate(selector)
    yes, no = obj(labels={"app": "web"}), obj(labels={"app": "web", "tier": "db"})
    assert p(create(yes)) and not p(create(no))
    assert p(delete(yes)) and not p(delete(no))
    # an update is judged on the new object
    assert p(update(no, yes)) and not p(update(yes, no))
    assert p.generic(create(yes)) and not p.generic(create(no))


def test_label_selector_predicate_rejects_invalid_selectors() -> None:
    with pytest.raises(ValueError):
        LabelSelectorPredicate("a in")


def test_plain_functions_apply_to_every_event_type() -> None:
    p = as_predicate(lambda d: d.obj["spec"]["x"] > 0)
    assert p(create(obj(spec=1))) and not p(create(obj()))
    assert p(update(obj(), obj(spec=1))) and not p(update(obj(spec=1), obj()))
    assert not p(delete(obj()))
    with pytest.raises(TypeError):
        as_predicate(42)  # type: ignore[arg-type]


def test_predicate_funcs_filter_per_event_type() -> None:
    p = PredicateFuncs(delete=lambda d: False)
    assert p(create(obj())) and p(update(obj(), obj(rv="2")))
    assert not p(delete(obj()))
    assert p.generic(create(obj()))
    only_generic = PredicateFuncs(generic=lambda d: False)
    assert not only_generic.generic(create(obj())) and only_generic(create(obj()))


def test_generic_is_used_for_unknown_delta_types() -> None:
    seen: list[str] = []

    class Record(Predicate):
        def generic(self, delta: StoreDelta) -> bool:
            seen.append("generic")
            return False

    assert not Record()(StoreDelta("GENERIC", obj()))  # type: ignore[arg-type]
    assert seen == ["generic"]


def test_and_or_not() -> None:
    gen, labels = GenerationChanged(), LabelsChanged()
    spec_only = update(obj(generation=1), obj(generation=2, rv="2"))
    labels_only = update(obj(), obj(rv="2", labels={"a": "b"}))
    status_only = update(obj(), obj(rv="2"))

    either = or_(gen, labels)
    assert either(spec_only) and either(labels_only) and not either(status_only)
    both = and_(gen, labels)
    assert not both(spec_only) and not both(labels_only)
    assert both(update(obj(), obj(generation=2, labels={"a": "b"})))
    neither = not_(either)
    assert neither(status_only) and not neither(spec_only)
    # the combinators keep per-event-type semantics: creates pass GenerationChanged, so
    # not_(GenerationChanged) rejects them
    assert not not_(gen)(create(obj()))
    assert and_()(create(obj())) and not or_()(create(obj()))


def test_operators_and_mixing_with_functions() -> None:
    gen = GenerationChanged()
    is_web = LabelSelectorPredicate("app=web")
    combined = (gen | LabelsChanged()) & is_web & (lambda d: d.obj["spec"]["x"] < 10)
    web = {"app": "web"}
    assert combined(update(obj(labels=web), obj(generation=2, labels=web)))
    assert not combined(update(obj(labels=web), obj(generation=2, labels=web, spec=10)))
    assert not combined(update(obj(labels=web), obj(rv="2", labels=web)))
    assert (~gen)(update(obj(), obj(rv="2")))
    reversed_and = (lambda d: False) & gen
    assert not reversed_and(create(obj()))
    reversed_or = (lambda d: True) | gen
    assert reversed_or(update(obj(), obj(rv="2")))


def test_combine() -> None:
    assert combine([]) is None
    gen = GenerationChanged()
    assert combine([gen]) is gen
    check = combine([gen, LabelSelectorPredicate("app=web")])
    assert check is not None
    assert not check(update(obj(labels={"app": "web"}), obj(generation=1, labels={"app": "web"})))
    assert check(update(obj(labels={"app": "web"}), obj(generation=2, labels={"app": "web"})))


def test_old_state_is_decoded_only_when_a_predicate_needs_it() -> None:
    delta = update(obj(), obj(rv="2", labels={"app": "web"}))
    assert LabelSelectorPredicate("app=web")(delta)
    assert delta._old is None and delta._old_raw is not None  # not decoded
    assert LabelsChanged()(delta)
    assert delta._old is not None


def _with_uid(o: dict[str, Any], uid: str) -> dict[str, Any]:
    o["metadata"]["uid"] = uid
    return o


@pytest.mark.parametrize("predicate", [GenerationChanged(), LabelsChanged(), AnnotationsChanged()])
def test_an_update_between_two_objects_passes_every_changed_predicate(predicate: Predicate) -> None:
    same = update(_with_uid(obj(rv="1"), "u1"), _with_uid(obj(rv="2"), "u1"))
    replaced = update(_with_uid(obj(rv="1"), "u1"), _with_uid(obj(rv="2"), "u2"))
    assert not predicate(same)
    assert predicate(replaced)


def test_a_uid_change_from_the_store_reaches_predicates_as_delete_then_create() -> None:
    store = Store()
    old = _with_uid(obj(rv="1"), "u1")
    new = _with_uid(obj(rv="5"), "u2")  # same name, same generation: re-created
    store.apply("ADDED", old)
    delta = store.apply("MODIFIED", new)
    assert delta is not None and delta.type == ADDED and delta.has_old
    gone, added = split_uid_change(delta)
    assert (gone.type, gone.obj["metadata"]["uid"]) == (DELETED, "u1")
    assert (added.type, added.obj["metadata"]["uid"], added.old) == (ADDED, "u2", None)
    p = GenerationChanged()
    assert p(gone) and p(added)
    # A relist reports the same pair itself.
    store2 = Store()
    store2.apply("ADDED", old)
    deltas = store2.replace([new], "5")
    assert [(d.type, d.obj["metadata"]["uid"]) for d in deltas] == [
        (DELETED, "u1"),
        (ADDED, "u2"),
    ]
    # A same-UID write stays one MODIFIED.
    newer = _with_uid(obj(rv="9", generation=2), "u2")
    modified = store2.apply("MODIFIED", newer)
    assert modified is not None and modified.type == MODIFIED

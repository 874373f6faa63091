"""Conversion: hub and spokes, and the ConversionReview (``apiextensions.k8s.io/v1``).

One version of a kind is the **hub**; every other served version is a **spoke** that
converts to the hub and back (:class:`Spoke`). A conversion between two spokes goes through
the hub, so N versions need 2(N-1) functions, not N(N-1): controller-runtime's Hub and
Convertible, and its ``NewHubSpokeConverter``.

Each function gets its own deep copy of the object and returns the converted object. Around
it the converter keeps what the API server requires of a conversion
(``apiextensions.k8s.io`` rejects a response that changes anything in ``metadata`` but labels
and annotations): ``apiVersion`` is set to the version converted to, ``kind`` is kept, and
``metadata`` is the original's with the labels and annotations the function returned. Put a
field that one version lacks into an annotation on the way down and take it back on the way
up, to keep a round trip lossless.

A failure (an exception in a function, an unknown version) fails the whole review with its
message (``result.status: Failure``): the API server then fails the request that needed the
conversion, and names the webhook and the message in its error.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from controller_runtime.webhook.admission import MalformedReviewError

__all__ = [
    "CONVERSION_API_VERSION",
    "ConversionError",
    "Converter",
    "HubConverter",
    "Spoke",
    "convert_review",
    "parse_conversion_review",
]

CONVERSION_API_VERSION = "apiextensions.k8s.io/v1"

ConvertFunc = Callable[[dict[str, Any]], dict[str, Any]]


class ConversionError(Exception):
    """A conversion cannot be made (an unknown version, a function that failed)."""


@dataclass(frozen=True)
class Spoke:
    """A version's two conversions: ``to_hub(obj_in_this_version)`` and
    ``from_hub(obj_in_the_hub_version)``."""

    to_hub: ConvertFunc
    from_hub: ConvertFunc


class Converter:
    """Anything :func:`convert_review` can use: :meth:`convert` one object to ``api_version``."""

    def convert(self, obj: dict[str, Any], api_version: str) -> dict[str, Any]:
        raise NotImplementedError

    def versions(self) -> Sequence[str]:
        """The apiVersions (``group/version``) this converter knows."""
        raise NotImplementedError


@dataclass(frozen=True)
class HubConverter(Converter):
    """Hub-and-spoke conversion of one kind: ``HubConverter(hub="shop.example.com/v2",
    spokes={"shop.example.com/v1": Spoke(to_hub=v1_to_v2, from_hub=v2_to_v1)})``.

    Every apiVersion is ``group/version`` and all of them share the group (a CRD's versions
    do)."""

    hub: str
    spokes: Mapping[str, Spoke] = field(default_factory=dict)

    def __post_init__(self) -> None:
        group = self.hub.rpartition("/")[0]
        if not group:
            raise ValueError(f"hub must be group/version, got {self.hub!r}")
        for version in self.spokes:
            if version.rpartition("/")[0] != group:
                raise ValueError(f"spoke {version!r} is not in the hub's group {group!r}")
            if version == self.hub:
                raise ValueError(f"{version!r} is the hub; it cannot be a spoke too")

    def versions(self) -> Sequence[str]:
        return [self.hub, *self.spokes]

    def convert(self, obj: dict[str, Any], api_version: str) -> dict[str, Any]:
        """``obj`` in ``api_version``: through the hub, unless it is already there. ``obj``
        is not modified."""
        source = obj.get("apiVersion")
        if not isinstance(source, str):
            raise ConversionError("the object has no apiVersion")
        if source == api_version:
            return obj
        for version in (source, api_version):
            if version != self.hub and version not in self.spokes:
                raise ConversionError(
                    f"cannot convert {obj.get('kind')} from {source} to {api_version}: "
                    f"{version} is neither the hub ({self.hub}) nor a spoke "
                    f"({', '.join(self.spokes) or 'none'})"
                )
        current = obj
        if source != self.hub:
            current = self._step(self.spokes[source].to_hub, current, self.hub, obj)
        if api_version != self.hub:
            current = self._step(self.spokes[api_version].from_hub, current, api_version, obj)
        return current

    @staticmethod
    def _step(
        function: ConvertFunc, obj: dict[str, Any], api_version: str, original: dict[str, Any]
    ) -> dict[str, Any]:
        converted = function(copy.deepcopy(obj))
        if not isinstance(converted, dict):
            raise ConversionError(
                f"{getattr(function, '__qualname__', function)!r} returned "
                f"{type(converted).__name__}, not an object"
            )
        return _kept_identity(converted, api_version, original)


def _kept_identity(
    converted: dict[str, Any], api_version: str, original: dict[str, Any]
) -> dict[str, Any]:
    converted["apiVersion"] = api_version
    converted["kind"] = original.get("kind")
    metadata = copy.deepcopy(original.get("metadata") or {})
    returned = converted.get("metadata") or {}
    for key in ("labels", "annotations"):
        value = returned.get(key) if isinstance(returned, dict) else None
        if value:
            metadata[key] = value
        else:
            metadata.pop(key, None)
    converted["metadata"] = metadata
    return converted


@dataclass(frozen=True)
class ConversionRequest:
    """A ConversionReview's request: ``uid``, the version asked for, and the objects."""

    uid: str
    desired_api_version: str
    objects: list[dict[str, Any]]


def parse_conversion_review(body: bytes) -> ConversionRequest:
    """The request of an ``apiextensions.k8s.io/v1`` ConversionReview; raises
    :class:`~controller_runtime.webhook.admission.MalformedReviewError` saying what is wrong."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise MalformedReviewError(f"the body is not JSON: {err}") from None
    if not isinstance(review, dict):
        raise MalformedReviewError("the ConversionReview must be an object")
    if review.get("apiVersion") != CONVERSION_API_VERSION or review.get("kind") != (
        "ConversionReview"
    ):
        raise MalformedReviewError(
            f"expected apiVersion {CONVERSION_API_VERSION} kind ConversionReview, got "
            f"{review.get('apiVersion')!r} {review.get('kind')!r} (set the CRD's "
            f"conversion.webhook.conversionReviewVersions to [v1])"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise MalformedReviewError("request must be an object")
    uid, desired, objects = (
        request.get("uid"),
        request.get("desiredAPIVersion"),
        request.get("objects"),
    )
    if not isinstance(uid, str) or not uid:
        raise MalformedReviewError("request.uid is missing")
    if not isinstance(desired, str) or "/" not in desired:
        raise MalformedReviewError(f"request.desiredAPIVersion {desired!r} is not group/version")
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
        raise MalformedReviewError("request.objects must be a list of objects")
    return ConversionRequest(uid, desired, objects)


def convert_review(
    request: ConversionRequest, converters: Mapping[tuple[str, str], Converter]
) -> bytes:
    """The encoded ConversionReview answering ``request``: every object converted by the
    converter of its group and kind (``converters[(group, kind)]``), or a failure naming the
    first object that could not be."""
    converted: list[dict[str, Any]] = []
    failure: str | None = None
    for obj in request.objects:
        group = str(obj.get("apiVersion", "")).rpartition("/")[0]
        kind = str(obj.get("kind", ""))
        converter = converters.get((group, kind))
        name = (obj.get("metadata") or {}).get("name", "")
        if converter is None:
            failure = f"no conversion is registered for {kind}.{group} ({name})"
            break
        try:
            converted.append(converter.convert(obj, request.desired_api_version))
        except Exception as err:
            failure = (
                f"converting {kind} {name!r} from {obj.get('apiVersion')} to "
                f"{request.desired_api_version} failed: {type(err).__name__}: {err}"
            )
            break
    response: dict[str, Any] = {"uid": request.uid}
    if failure is None:
        response["convertedObjects"] = converted
        response["result"] = {"status": "Success"}
    else:
        response["convertedObjects"] = []
        response["result"] = {"status": "Failure", "message": failure}
    return orjson.dumps(
        {"apiVersion": CONVERSION_API_VERSION, "kind": "ConversionReview", "response": response}
    )

"""What an instance's Pods say that its StatefulSet does not: an image that cannot be pulled.

A StatefulSet whose Pod waits in ``ErrImagePull`` or ``ImagePullBackOff`` only reports zero
ready replicas, the same as a Pod that is still starting. :func:`image_problem` reads the
Pods' container statuses so the instance can say which image fails and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}
)
"""Waiting reasons of a container whose image the kubelet cannot get."""

MESSAGE_LIMIT = 300
"""The kubelet's message is cut to this many characters in a condition."""


def image_problem(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """A message naming the first Pod and image that cannot be pulled (the kubelet's waiting
    reason and message), or ``None`` when no container of ``pods`` waits for an image.
    Init containers count too. Pods are taken in name order, so the message is stable."""
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        status = pod.get("status") or {}
        statuses = [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]
        for container in statuses:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason not in IMAGE_PULL_REASONS:
                continue
            name = (pod.get("metadata") or {}).get("name", "?")
            detail = str(waiting.get("message") or "").strip()
            message = (
                f"pod {name}: image {container.get('image', '?')!s} cannot be pulled ({reason})"
            )
            if detail:
                message += f": {detail[:MESSAGE_LIMIT]}"
            return message
    return None

"""image_problem: a Pod whose image cannot be pulled is named with its image and reason."""

from __future__ import annotations

from typing import Any

from controllers.postgres.pods import MESSAGE_LIMIT, image_problem


def _pod(name: str, waiting: dict[str, str] | None, *, init: bool = False) -> dict[str, Any]:
    state = {"waiting": waiting} if waiting is not None else {"running": {}}
    statuses = [{"name": "postgres", "image": "postgres:99", "state": state}]
    key = "initContainerStatuses" if init else "containerStatuses"
    return {"metadata": {"name": name}, "status": {key: statuses}}


def test_no_pods_or_running_pods_have_no_problem() -> None:
    assert image_problem([]) is None
    assert image_problem([_pod("db-0", None)]) is None
    assert image_problem([{"metadata": {"name": "db-0"}}]) is None


def test_a_container_still_creating_is_not_an_image_problem() -> None:
    assert image_problem([_pod("db-0", {"reason": "ContainerCreating"})]) is None


def test_image_pull_backoff_names_pod_image_reason_and_message() -> None:
    message = image_problem(
        [
            _pod("db-1", None),
            _pod("db-0", {"reason": "ImagePullBackOff", "message": 'Back-off pulling "x"'}),
        ]
    )
    assert message == (
        'pod db-0: image postgres:99 cannot be pulled (ImagePullBackOff): Back-off pulling "x"'
    )


def test_every_pull_reason_and_init_containers_count() -> None:
    for reason in ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"):
        found = image_problem([_pod("db-0", {"reason": reason}, init=True)])
        assert found is not None and reason in found, reason


def test_first_pod_by_name_and_message_cut() -> None:
    long = "y" * (MESSAGE_LIMIT * 3)
    found = image_problem(
        [
            _pod("db-2", {"reason": "ErrImagePull", "message": "other"}),
            _pod("db-0", {"reason": "ErrImagePull", "message": long}),
        ]
    )
    assert found is not None and found.startswith("pod db-0:")
    assert len(found) < MESSAGE_LIMIT + 100

"""The operator's APIs as typed classes: what ``manifests/crds/`` is generated from."""

from controllers.api.tasks import Task, TaskSpec, TaskStatus

__all__ = ["Task", "TaskSpec", "TaskStatus"]

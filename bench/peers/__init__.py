"""The peers of the benchmark: a Go controller on sigs.k8s.io/controller-runtime (``go/``) and a
kopf operator (``kopf_task.py``), doing the Task controller's work."""

"""The PostgreSQL API group, its versions, and where its conversion webhook is served."""

from controller_runtime.resource import WebhookConversion

GROUP = "postgres.crpy.io"
VERSION = "v1beta1"
"""The version served, stored, and read by the controllers (the conversion hub)."""
V1ALPHA1 = "v1alpha1"
"""The previous version, still served: objects written in it are converted (PostgresInstance
through the operator's conversion webhook; the other kinds have the same schema in both)."""

CONVERSION = WebhookConversion(
    service_name="crpy-operator-conversion", service_namespace="crpy-system"
)
"""The Service (manifests/webhook-services.yaml) through which the API server asks the operator
to convert PostgresInstances between the versions. It publishes replicas that are not ready
yet: a replica's caches sync only once PostgresInstances stored in another version are
converted, so a readiness-gated Service would deadlock the first replica of an upgrade."""

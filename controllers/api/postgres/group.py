"""The PostgreSQL API group, its versions, and where its conversion webhook is served."""

from controller_runtime.resource import WebhookConversion

GROUP = "postgres.crpy.io"
VERSION = "v1beta1"
"""The version served, stored, and read by the controllers (the conversion hub)."""
V1ALPHA1 = "v1alpha1"
"""The previous version, still served: objects written in it are converted (PostgresInstance
through the operator's conversion webhook; the other kinds have the same schema in both)."""

CONVERSION = WebhookConversion(
    service_name="crpy-operator-webhook", service_namespace="crpy-system"
)
"""The operator's webhook Service (manifests/webhook.yaml), which converts PostgresInstances
between the versions."""

# The Widget controller in kopf: a Widget kept as a ConfigMap it owns, its status written
# through kopf's patch. The CRD (widget-crd.yaml) and the RBAC are written by hand too; a
# second handler puts a deleted or edited ConfigMap back (kopf has no "owns"). Every line is
# written by hand (reference text for docs/controllers.md).
import kopf
import kubernetes


def owned_by_widget(body, **_):
    refs = body.metadata.get("ownerReferences", [])
    return any(r.get("kind") == "Widget" and r.get("controller") for r in refs)


def apply_configmap(widget, namespace):
    name = f"{widget['metadata']['name']}-widget"
    data = {"size": str(widget["spec"]["size"]), "color": widget["spec"].get("color", "red")}
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
    kopf.adopt(configmap, owner=widget)
    api = kubernetes.client.CoreV1Api()
    try:
        api.replace_namespaced_config_map(name, namespace, configmap)
    except kubernetes.client.ApiException as err:
        if err.status != 404:
            raise
        api.create_namespaced_config_map(namespace, configmap)
    return name


@kopf.on.resume("shop.example.com", "v1", "widgets")
@kopf.on.create("shop.example.com", "v1", "widgets")
@kopf.on.update("shop.example.com", "v1", "widgets", field="spec")
def reconcile(body, meta, namespace, patch, **_):
    patch.status["configMap"] = apply_configmap(body, namespace)
    patch.status["observedGeneration"] = meta["generation"]


@kopf.on.update("v1", "configmaps", when=owned_by_widget)
@kopf.on.delete("v1", "configmaps", when=owned_by_widget, optional=True)
def restore(body, namespace, **_):
    owner = next(r for r in body.metadata["ownerReferences"] if r.get("controller"))
    api = kubernetes.client.CustomObjectsApi()
    try:
        widget = api.get_namespaced_custom_object(
            "shop.example.com", "v1", namespace, "widgets", owner["name"]
        )
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            return
        raise
    apply_configmap(widget, namespace)

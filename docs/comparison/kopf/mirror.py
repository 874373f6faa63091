# The mirror controller in kopf: ConfigMaps labelled app=demo mirrored into Secrets they own.
# kopf has no client for other objects and no "owns": the kubernetes client writes the
# Secret, and a second handler puts a deleted or edited Secret back. Run: kopf run mirror.py.
# Every line is written by hand (reference text for docs/controllers.md).
import base64

import kopf
import kubernetes

DEMO = {"app": "demo"}


def owned_by_configmap(body, **_):
    refs = body.metadata.get("ownerReferences", [])
    return any(r.get("kind") == "ConfigMap" and r.get("controller") for r in refs)


@kopf.on.resume("v1", "configmaps", labels=DEMO)
@kopf.on.create("v1", "configmaps", labels=DEMO)
@kopf.on.update("v1", "configmaps", labels=DEMO)
def mirror(body, name, namespace, logger, **_):
    data = {k: base64.b64encode(v.encode()).decode() for k, v in (body.get("data") or {}).items()}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data}
    kopf.adopt(secret, owner=body)
    api = kubernetes.client.CoreV1Api()
    try:
        api.replace_namespaced_secret(name, namespace, secret)
    except kubernetes.client.ApiException as err:
        if err.status != 404:
            raise
        api.create_namespaced_secret(namespace, secret)
    logger.info("mirrored %d keys", len(data))


@kopf.on.update("v1", "secrets", when=owned_by_configmap)
@kopf.on.delete("v1", "secrets", when=owned_by_configmap, optional=True)
def restore(body, namespace, logger, **_):
    owner = next(r for r in body.metadata["ownerReferences"] if r.get("controller"))
    api = kubernetes.client.CoreV1Api()
    try:
        cm = api.read_namespaced_config_map(owner["name"], namespace)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            return
        raise
    if (cm.metadata.labels or {}).get("app") == "demo":
        configmap = kubernetes.client.ApiClient().sanitize_for_serialization(cm)
        mirror(body=kopf.Body(configmap), name=owner["name"], namespace=namespace, logger=logger)

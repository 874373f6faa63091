"""An S3-compatible server for the local node (SeaweedFS ``weed mini``), and a tiny S3 client.

The cluster runs SeaweedFS inside the network namespace of its link (beside CoreDNS, not on
any node, so losing or partitioning a node leaves it up), listening on the link's ``infra``
address (``172.30.255.254`` by default): Pods of every node reach it through the Service
``s3`` in the namespace ``crpy-s3`` (``http://s3.crpy-s3.svc.cluster.local:8333``), the host
through the link. It has no route out (the namespace has none). Its data lives in
``<workdir>/s3``, so it goes with the cluster's work directory; the process is one of the
cluster's, stopped with it and killed by the killed-cluster cleanup like every process of
the namespace.

Credentials: one identity with a generated access key and secret (admin actions on every
bucket), written with mode 0600 to ``<workdir>/s3/identities.json`` (SeaweedFS's format) and
``<workdir>/s3/credentials.env`` (``AWS_ACCESS_KEY_ID=``/``AWS_SECRET_ACCESS_KEY=`` lines).
Nothing here logs the secret. The bucket ``backups`` exists from the start.

Caveats: SeaweedFS's master, volume and filer ports (9333, 9340, 8888 and their gRPC ports)
also listen on the link's address without authentication; only Pods of the local cluster and
the host can reach them. SeaweedFS's admin interface listens on the namespace's loopback.

:class:`S3Client` speaks just enough of the S3 API (AWS Signature Version 4 over HTTP) to
list, read and delete objects: the end-to-end tests look into the bucket through it.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

S3_PORT = 8333
S3_NAMESPACE = "crpy-s3"
S3_SERVICE = "s3"
DEFAULT_BUCKET = "backups"
REGION = "us-east-1"
_S3_XMLNS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class S3Error(RuntimeError):
    """An S3 request failed; the message has the status and the server's error code."""


@dataclass(frozen=True)
class S3Credentials:
    access_key: str
    secret_key: str

    @staticmethod
    def generate() -> S3Credentials:
        return S3Credentials(
            access_key="CRPY" + secrets.token_hex(8).upper(),
            secret_key=secrets.token_urlsafe(30),
        )

    def __repr__(self) -> str:  # never print the secret
        return f"S3Credentials(access_key={self.access_key!r}, secret_key='***')"


@dataclass(frozen=True)
class S3Endpoint:
    """Where the local S3 server is: ``url`` from the host, ``cluster_url`` from Pods."""

    url: str
    cluster_url: str
    bucket: str
    credentials: S3Credentials
    credentials_file: Path

    def client(self) -> S3Client:
        return S3Client(self.url, self.credentials)


def cluster_url() -> str:
    """The endpoint Pods use: the Service's DNS name and port."""
    return f"http://{S3_SERVICE}.{S3_NAMESPACE}.svc.cluster.local:{S3_PORT}"


def identities_json(credentials: S3Credentials) -> str:
    """SeaweedFS's S3 identity file: one identity with every action."""
    return json.dumps(
        {
            "identities": [
                {
                    "name": "crpy-admin",
                    "credentials": [
                        {"accessKey": credentials.access_key, "secretKey": credentials.secret_key}
                    ],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
    )


def weed_command(weed: Path, directory: Path, address: str, bucket: str) -> list[str]:
    """``weed mini`` with only what the cluster needs: S3 on ``address``, no WebDAV, no
    Iceberg or Lance ports (8181 is CoreDNS's readiness port in the same namespace)."""
    return [
        str(weed),
        "mini",
        f"-dir={directory / 'data'}",
        f"-ip={address}",
        f"-ip.bind={address}",
        f"-s3.port={S3_PORT}",
        f"-s3.config={directory / 'identities.json'}",
        f"-s3.localSocket={directory / 's3.sock'}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        "-admin.port.legacy=0",
        f"-bucket={bucket}",
    ]


def write_config(directory: Path, credentials: S3Credentials) -> Path:
    """Write the identity file and the credentials file (both 0600); return the latter."""
    (directory / "data").mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("identities.json", identities_json(credentials)),
        (
            "credentials.env",
            f"AWS_ACCESS_KEY_ID={credentials.access_key}\n"
            f"AWS_SECRET_ACCESS_KEY={credentials.secret_key}\n",
        ),
    ):
        path = directory / name
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(text)
    return directory / "credentials.env"


def service_manifest(address: str) -> str:
    """The namespace ``crpy-s3``, a Service ``s3`` without selector and its EndpointSlice
    pointing at ``address`` (where the server listens): Pods use
    ``s3.crpy-s3.svc.cluster.local:8333``."""
    return f"""apiVersion: v1
kind: Namespace
metadata:
  name: {S3_NAMESPACE}
---
apiVersion: v1
kind: Service
metadata:
  name: {S3_SERVICE}
  namespace: {S3_NAMESPACE}
spec:
  ports:
    - name: s3
      port: {S3_PORT}
      targetPort: {S3_PORT}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {S3_SERVICE}-node
  namespace: {S3_NAMESPACE}
  labels:
    kubernetes.io/service-name: {S3_SERVICE}
addressType: IPv4
ports:
  - name: s3
    port: {S3_PORT}
    protocol: TCP
endpoints:
  - addresses: ["{address}"]
    conditions: {{ready: true}}
"""


class S3Client:
    """Path-style S3 requests signed with AWS Signature Version 4 (region ``us-east-1``).
    Enough for tests: list, get, put and delete objects, list buckets. Raises
    :class:`S3Error` on a non-2xx answer; ``OSError`` when the server cannot be reached."""

    def __init__(self, url: str, credentials: S3Credentials, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.credentials = credentials
        self.timeout = timeout

    def list_buckets(self) -> list[str]:
        root = ElementTree.fromstring(self._request("GET", "/"))
        return [e.text or "" for e in root.iter(f"{_S3_XMLNS}Name")]

    def list_objects(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Every object under ``prefix``: key → size in bytes."""
        objects: dict[str, int] = {}
        token = ""
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            root = ElementTree.fromstring(self._request("GET", f"/{bucket}", query))
            for item in root.iter(f"{_S3_XMLNS}Contents"):
                key = item.findtext(f"{_S3_XMLNS}Key") or ""
                objects[key] = int(item.findtext(f"{_S3_XMLNS}Size") or 0)
            token = root.findtext(f"{_S3_XMLNS}NextContinuationToken") or ""
            if root.findtext(f"{_S3_XMLNS}IsTruncated") != "true" or not token:
                return objects

    def get_object(self, bucket: str, key: str) -> bytes:
        return self._request("GET", f"/{bucket}/{key}")

    def put_object(self, bucket: str, key: str, body: bytes) -> None:
        self._request("PUT", f"/{bucket}/{key}", body=body)

    def delete_object(self, bucket: str, key: str) -> None:
        self._request("DELETE", f"/{bucket}/{key}")

    def _request(
        self, method: str, path: str, query: dict[str, str] | None = None, body: bytes = b""
    ) -> bytes:
        parsed = urllib.parse.urlsplit(self.url)
        quoted_path = urllib.parse.quote(path, safe="/-_.~")
        canonical_query = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
            for k, v in sorted((query or {}).items())
        )
        now = datetime.datetime.now(datetime.UTC)
        stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload_hash = hashlib.sha256(body).hexdigest()
        headers = {"host": parsed.netloc, "x-amz-content-sha256": payload_hash, "x-amz-date": stamp}
        signed = ";".join(sorted(headers))
        canonical = "\n".join(
            [
                method,
                quoted_path,
                canonical_query,
                *(f"{k}:{headers[k]}" for k in sorted(headers)),
                "",
                signed,
                payload_hash,
            ]
        )
        scope = f"{day}/{REGION}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key = f"AWS4{self.credentials.secret_key}".encode()
        for part in (day, REGION, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.credentials.access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}"
        )
        url = f"{self.url}{quoted_path}" + (f"?{canonical_query}" if canonical_query else "")
        request = urllib.request.Request(
            url, data=body if method == "PUT" else None, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                data: bytes = response.read()
                return data
        except urllib.error.HTTPError as err:
            detail = err.read()[:500].decode(errors="replace")
            raise S3Error(f"S3 {method} {path} answered {err.code}: {detail}") from None


def wait_until_serving(client: S3Client, bucket: str, timeout: float) -> bool:
    """True once a signed listing of ``bucket`` succeeds within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.list_objects(bucket)
            return True
        except (OSError, S3Error):
            time.sleep(0.3)
    return False

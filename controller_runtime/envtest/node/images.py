"""Container images of the local node, built from Debian root filesystems, without a registry.

Each image is one layer: a root filesystem made by ``mmdebstrap --variant=minbase bookworm``
(plus packages and files), packed with its config into an OCI image archive that
``ctr -n k8s.io images import`` loads. Archives are cached in ``<cache>/images/`` under a
hash of their inputs' contents (package list, files, the project's sources for the operator;
never a path of the checkout, a file mode or a time): an image is rebuilt only when an input
changes, and every checkout of the same sources shares its archive. An archive of an image
whose inputs changed is removed once unused for a day. Builds run under a file lock per
image.

The images (names as the kubelet sees them):

* ``registry.k8s.io/pause:3.10-crpy`` -- the Pods' sandbox: the static ``pause`` binary.
* ``docker.io/library/postgres:15`` -- Debian's PostgreSQL 15 honouring the official image's
  contract (user ``postgres`` uid/gid 999, ``PGDATA=/var/lib/postgresql/data``,
  ``POSTGRES_*`` variables, ``docker-entrypoint.sh`` and ``/docker-entrypoint-initdb.d``), so
  the operator renders the same Pods for it as for the official image. Debian bookworm has
  PostgreSQL 15 only.
* ``docker.io/crpy/aws-cli:bookworm`` -- Debian's ``awscli`` (``aws s3 cp``) for backup Jobs.
* ``docker.io/controller-runtime-py/operator:<tag>`` -- the operator: Debian's Python 3.11 and
  a virtualenv at ``/opt/operator`` with the library's wheel, the operator's package
  (``controllers/``, from the source tree: it is not in the library's wheel) and their
  dependencies, run as 65532 with ``python -m controllers`` (the contents of the
  Dockerfile's image).

Caveat: building needs root, mmdebstrap and the Debian and PyPI package servers.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controller_runtime.envtest.binaries import BinaryError, Progress, _stderr, cache_root

REPOSITORY_ROOT = Path(__file__).resolve().parents[3]
IMAGE_FILES = Path(__file__).with_name("imagefiles")
_OPERATOR_SOURCES = ("kubeclient", "informers", "controller_runtime", "controllers")
_SITE_PACKAGES = "/opt/operator/lib/python3.11/site-packages"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10-crpy"
POSTGRES_IMAGE = "docker.io/library/postgres:15"
AWS_CLI_IMAGE = "docker.io/crpy/aws-cli:bookworm"
OPERATOR_REPOSITORY = "docker.io/controller-runtime-py/operator"
_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")


class ImageError(RuntimeError):
    """An image could not be built."""


@dataclass(frozen=True)
class ImageSpec:
    """What an image is made of; ``fingerprint`` covers every input."""

    name: str
    packages: tuple[str, ...] = ()
    config: dict[str, object] = field(default_factory=dict)
    essential_hooks: tuple[str, ...] = ()
    customize_hooks: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    """Extra input texts (file contents, source hashes) the image depends on."""
    uploads: tuple[tuple[str, str], ...] = ()
    """Files of :data:`IMAGE_FILES` (name, destination in the image) copied in after the
    packages. Their contents are part of the fingerprint, never their location or mode, so
    every checkout of the same sources shares one cached archive."""
    directories: tuple[tuple[str, int, int], ...] = ()
    """Directories (path, uid, mode) appended to the layer after mmdebstrap, which leaves
    ``/run`` empty."""

    def fingerprint(self) -> str:
        """A hash of the image's contents only: no path of this checkout, no file mode or
        time, so another checkout (or clone) of the same sources reuses the archive."""
        blob = json.dumps(
            [
                self.directories,
                [(name, target, _file_hash(IMAGE_FILES / name)) for name, target in self.uploads],
                self.name,
                self.packages,
                self.config,
                self.essential_hooks,
                self.customize_hooks,
                self.inputs,
            ],
            sort_keys=True,
        ).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def archive_path(self) -> Path:
        safe = self.name.replace("/", "_").replace(":", "_")
        return cache_root() / "images" / f"{safe}-{self.fingerprint()}.tar"


def pause_image(pause_binary: Path) -> tuple[ImageSpec, Path]:
    spec = ImageSpec(
        name=PAUSE_IMAGE,
        config={"Entrypoint": ["/pause"], "User": "65535:65535"},
        inputs=(_file_hash(pause_binary),),
    )
    return spec, pause_binary


def postgres_image() -> ImageSpec:
    return ImageSpec(
        name=POSTGRES_IMAGE,
        packages=("postgresql-15", "postgresql-client-15", "ca-certificates"),
        config={
            "Entrypoint": ["docker-entrypoint.sh"],
            "Cmd": ["postgres"],
            "Env": [
                "PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                "/usr/bin:/sbin:/bin",
                "PG_MAJOR=15",
                "PGDATA=/var/lib/postgresql/data",
                "LANG=C.UTF-8",
            ],
            "StopSignal": "SIGINT",
            "ExposedPorts": {"5432/tcp": {}},
        },
        essential_hooks=(
            # The official image's postgres user, before the package makes one of its own,
            # and no "main" cluster made by the package: the entrypoint runs initdb.
            'echo "postgres:x:999:" >> "$1/etc/group"',
            'echo "postgres:x:999:999:PostgreSQL administrator:/var/lib/postgresql:/bin/bash"'
            ' >> "$1/etc/passwd"',
            'mkdir -p "$1/etc/postgresql-common"',
            'echo "create_main_cluster = false" > "$1/etc/postgresql-common/createcluster.conf"',
        ),
        uploads=(("docker-entrypoint.sh", "/usr/local/bin/docker-entrypoint.sh"),),
        customize_hooks=(
            'chmod 0755 "$1/usr/local/bin/docker-entrypoint.sh"',
            'mkdir -p "$1/docker-entrypoint-initdb.d" "$1/var/lib/postgresql/data"'
            ' "$1/var/run/postgresql"',
            'chown 999:999 "$1/var/lib/postgresql" "$1/var/lib/postgresql/data"',
            'chown 999:999 "$1/var/run/postgresql" && chmod 2777 "$1/var/run/postgresql"',
            'chmod 0700 "$1/var/lib/postgresql/data"',
        ),
        # The server's socket and lock file (the official image's /var/run/postgresql).
        directories=(("run/postgresql", 999, 0o2777),),
    )


def aws_cli_image() -> ImageSpec:
    return ImageSpec(
        name=AWS_CLI_IMAGE,
        packages=("awscli", "ca-certificates"),
        config={"Entrypoint": ["aws"], "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
    )


def operator_image(tag: str) -> ImageSpec:
    requirements = _operator_requirements()
    return ImageSpec(
        name=f"{OPERATOR_REPOSITORY}:{tag}",
        packages=("python3", "python3-venv", "ca-certificates"),
        config={
            "Entrypoint": ["python", "-m", "controllers"],
            "User": "65532:65532",
            "Env": [
                "PATH=/opt/operator/bin:/usr/local/bin:/usr/bin:/bin",
                "PYTHONDONTWRITEBYTECODE=1",
                "PYTHONUNBUFFERED=1",
            ],
            "ExposedPorts": {"8080/tcp": {}, "8081/tcp": {}},
        },
        customize_hooks=(
            # The wheels are fetched on the host (whose pip knows this machine's package
            # servers and certificates) and installed offline in the root filesystem.
            'chroot "$1" python3 -m venv /opt/operator',
            'mkdir -p "$1/tmp/wheels"',
            "sync-in {wheels} /tmp/wheels",
            'chroot "$1" /opt/operator/bin/pip install --quiet --no-cache-dir --no-index '
            "--disable-pip-version-check --find-links /tmp/wheels "
            + " ".join(shlex.quote(r) for r in requirements),
            'chroot "$1" /opt/operator/bin/pip install --quiet --no-cache-dir --no-index '
            "--disable-pip-version-check --no-deps /tmp/wheels/{wheel_name}",
            # The operator is not in the library's wheel: its package from the source tree.
            f'mkdir -p "$1{_SITE_PACKAGES}/controllers"',
            f"sync-in {{controllers}} {_SITE_PACKAGES}/controllers",
            f'chroot "$1" /opt/operator/bin/python -m compileall -q {_SITE_PACKAGES}/controllers',
            'chroot "$1" /opt/operator/bin/python -c "import controllers.app, uvloop"',
            'chroot "$1" /opt/operator/bin/python -m pip uninstall --yes --quiet pip setuptools'
            " || true",
            'rm -rf "$1/tmp/wheels"',
        ),
        inputs=(_sources_hash(),),
    )


def ensure_image(
    spec: ImageSpec,
    *,
    progress: Progress = _stderr,
    single_file: Path | None = None,
) -> Path:
    """The OCI archive of ``spec``, built unless a cached one with the same inputs exists.

    ``single_file`` makes an image of that one file at ``/`` (the pause image) instead of a
    Debian root filesystem.
    """
    archive = spec.archive_path()
    if archive.is_file():
        _touch(archive)
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    with _lock(archive), tempfile.TemporaryDirectory(dir=archive.parent) as work:
        if archive.is_file():
            return archive
        started = time.monotonic()
        layer = Path(work) / "layer.tar"
        if single_file is not None:
            with tarfile.open(layer, "w") as tar:
                tar.add(single_file, arcname=single_file.name)
        else:
            progress(f"building image {spec.name} (Debian root filesystem; first time only)")
            _mmdebstrap(spec, layer, Path(work))
            _append_directories(layer, spec.directories)
        _pack_oci_archive(spec, layer, archive.with_suffix(".tmp"))
        archive.with_suffix(".tmp").replace(archive)
        _prune_unused(archive)
        size = archive.stat().st_size / 2**20
        progress(f"  image {spec.name}: built in {time.monotonic() - started:.0f}s, {size:.0f} MiB")
    return archive


STALE_AFTER_SECONDS = 24 * 3600
"""Another archive of the same image is removed once unused for this long: checkouts of
different sources share the cache, and removing another one's archive at once would make
each rebuild the other's."""


def _touch(archive: Path) -> None:
    with contextlib.suppress(OSError):
        archive.touch()


def _prune_unused(archive: Path) -> None:
    """Remove the other archives of ``archive``'s image not used for a day."""
    now = time.time()
    for stale in archive.parent.glob(f"{archive.name.rsplit('-', 1)[0]}-*.tar"):
        with contextlib.suppress(OSError):
            if stale != archive and now - stale.stat().st_mtime > STALE_AFTER_SECONDS:
                stale.unlink()


def _mmdebstrap(spec: ImageSpec, layer: Path, work: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise ImageError("building images needs mmdebstrap: run scripts/ensure-node-packages.sh")
    # Uploads first: the customize hooks may change the uploaded files' modes.
    hooks = [f"upload {IMAGE_FILES / name} {target}" for name, target in spec.uploads]
    hooks += spec.customize_hooks
    if any("{wheels}" in hook for hook in hooks):
        wheels = work / "wheels"
        wheel = _build_wheel(wheels)
        _download_wheels(wheels, _operator_requirements())
        controllers = _operator_sources(work)
        hooks = [
            hook.format(wheels=wheels, wheel_name=wheel.name, controllers=controllers)
            for hook in hooks
        ]
    command = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        "--format=tar",
        "--quiet",
        *(f"--dpkgopt=path-exclude={pattern}" for pattern in _EXCLUDES),
        *([f"--include={','.join(spec.packages)}"] if spec.packages else []),
        *(f"--essential-hook={hook}" for hook in spec.essential_hooks),
        *(f"--customize-hook={hook}" for hook in hooks),
        '--customize-hook=rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*',
        "bookworm",
        str(layer),
    ]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        try:
            output, _ = process.communicate()
        except BaseException:
            # Interrupted: let mmdebstrap unmount what it mounted in its chroot before it
            # goes (subprocess.run would SIGKILL it and leave the mounts behind).
            process.send_signal(signal.SIGINT)
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
            raise
    if process.returncode != 0:
        tail = "\n".join(output.splitlines()[-30:])
        raise ImageError(f"mmdebstrap for {spec.name} failed ({process.returncode}):\n{tail}")


def _append_directories(layer: Path, directories: Sequence[tuple[str, int, int]]) -> None:
    if not directories:
        return
    with tarfile.open(layer, "a") as tar:
        for path, uid, mode in directories:
            info = tarfile.TarInfo(f"./{path.strip('/')}")
            info.type = tarfile.DIRTYPE
            info.uid = info.gid = uid
            info.mode = mode
            tar.addfile(info)


def _build_wheel(out: Path) -> Path:
    """The project's wheel (built like the Dockerfile does: ``pip wheel --no-deps .``)."""
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    command += ["--wheel-dir", str(out), str(REPOSITORY_ROOT)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(out.glob("controller_runtime_py-*.whl")) if out.is_dir() else []
    if result.returncode != 0 or not wheels:
        raise ImageError(f"building the project's wheel failed:\n{result.stderr[-2000:]}")
    return wheels[0]


def _download_wheels(directory: Path, requirements: Sequence[str]) -> None:
    """Binary wheels of ``requirements`` for Debian bookworm's CPython 3.11 on amd64."""
    platforms = ["manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64"]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:"]
    command += ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
    command += [f"--platform={platform}" for platform in platforms]
    command += ["--dest", str(directory), *requirements]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageError(f"downloading the operator's wheels failed:\n{result.stderr[-2000:]}")


def _pack_oci_archive(spec: ImageSpec, layer: Path, destination: Path) -> None:
    """Write an OCI image layout archive (index, manifest, config, one uncompressed layer)."""
    layer_digest, layer_size = _digest_file(layer)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"WorkingDir": "/", **spec.config},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created_by": f"controller-runtime-py envtest node image {spec.name}"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_digest = hashlib.sha256(config_bytes).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": f"sha256:{config_digest}",
            "size": len(config_bytes),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": f"sha256:{layer_digest}",
                "size": layer_size,
            }
        ],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest = hashlib.sha256(manifest_bytes).hexdigest()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": f"sha256:{manifest_digest}",
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": spec.name,
                    "org.opencontainers.image.ref.name": spec.name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    with tarfile.open(destination, "w") as tar:
        _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_bytes(tar, "index.json", json.dumps(index).encode())
        _add_bytes(tar, f"blobs/sha256/{config_digest}", config_bytes)
        _add_bytes(tar, f"blobs/sha256/{manifest_digest}", manifest_bytes)
        tar.add(layer, arcname=f"blobs/sha256/{layer_digest}")


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _digest_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest(), path.stat().st_size


def _file_hash(path: Path) -> str:
    return _digest_file(path)[0]


def _sources_hash() -> str:
    digest = hashlib.sha256()
    files = [REPOSITORY_ROOT / "pyproject.toml"]
    for package in _OPERATOR_SOURCES:
        files += sorted(
            path
            for path in (REPOSITORY_ROOT / package).rglob("*.py")
            # The local control plane and node are in the image but never run there.
            if "envtest" not in path.relative_to(REPOSITORY_ROOT).parts
        )
    for path in files:
        digest.update(str(path.relative_to(REPOSITORY_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _operator_requirements() -> Sequence[str]:
    """The library's dependencies and the operator's (the dependency group ``operator``)."""
    with open(REPOSITORY_ROOT / "pyproject.toml", "rb") as handle:
        project = tomllib.load(handle)
    deps: list[str] = project["project"]["dependencies"]
    operator: list[str] = project["dependency-groups"]["operator"]
    return [*deps, *operator]


def _operator_sources(work: Path) -> Path:
    """A copy of ``controllers/`` without bytecode caches, to sync into the image."""
    target = work / "controllers"
    shutil.copytree(
        REPOSITORY_ROOT / "controllers", target, ignore=shutil.ignore_patterns("__pycache__")
    )
    return target


@contextlib.contextmanager
def _lock(archive: Path) -> Iterator[None]:
    with open(archive.parent / f".{archive.name.rsplit('-', 1)[0]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def operator_tag() -> str:
    """The operator image's tag: the project's version and a hash of its sources."""
    with open(REPOSITORY_ROOT / "pyproject.toml", "rb") as handle:
        version: str = tomllib.load(handle)["project"]["version"]
    return f"{version}-{_sources_hash()[:8]}"


__all__ = [
    "AWS_CLI_IMAGE",
    "OPERATOR_REPOSITORY",
    "PAUSE_IMAGE",
    "POSTGRES_IMAGE",
    "BinaryError",
    "ImageError",
    "ImageSpec",
    "aws_cli_image",
    "ensure_image",
    "operator_image",
    "operator_tag",
    "pause_image",
    "postgres_image",
]

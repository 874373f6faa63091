"""The node images' cache key depends on their inputs' contents only: another checkout of the
same sources (another path, other file modes and times) must reuse the cached archive."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from controller_runtime.envtest.node import images


def _copy_image_files(tmp_path: Path) -> Path:
    copy = tmp_path / "elsewhere" / "imagefiles"
    shutil.copytree(images.IMAGE_FILES, copy)
    for path in copy.iterdir():
        path.chmod(0o600)
        os.utime(path, (1_000_000, 1_000_000))
    return copy


def test_postgres_fingerprint_ignores_checkout_path_modes_and_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = images.postgres_image().fingerprint()
    monkeypatch.setattr(images, "IMAGE_FILES", _copy_image_files(tmp_path))
    assert images.postgres_image().fingerprint() == here


def test_postgres_fingerprint_follows_the_entrypoint_contents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = images.postgres_image().fingerprint()
    copy = _copy_image_files(tmp_path)
    with open(copy / "docker-entrypoint.sh", "a") as handle:
        handle.write("# changed\n")
    monkeypatch.setattr(images, "IMAGE_FILES", copy)
    assert images.postgres_image().fingerprint() != here


def test_no_spec_field_names_a_path_of_the_checkout() -> None:
    spec = images.postgres_image()
    root = str(images.REPOSITORY_ROOT)
    assert all(root not in hook for hook in spec.customize_hooks + spec.essential_hooks)


def test_another_archive_of_the_image_is_pruned_only_when_unused_for_a_day(
    tmp_path: Path,
) -> None:
    current = tmp_path / "img_x-aaaa.tar"
    recent = tmp_path / "img_x-bbbb.tar"
    old = tmp_path / "img_x-cccc.tar"
    other_image = tmp_path / "img_y-dddd.tar"
    for path in (current, recent, old, other_image):
        path.write_bytes(b"archive")
    long_ago = time.time() - images.STALE_AFTER_SECONDS - 60
    os.utime(old, (long_ago, long_ago))
    os.utime(other_image, (long_ago, long_ago))
    images._prune_unused(current)
    assert current.exists() and recent.exists() and other_image.exists()
    assert not old.exists()

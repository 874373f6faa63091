"""The version policy: which PostgreSQL versions an instance may choose (pure functions).

A :data:`~controllers.postgres.api.POLICY` named ``default`` (cluster-scoped) lists versions,
each enabled or not. An entry ``"15"`` covers every 15.x; an entry ``"15.4"`` covers exactly
that release and wins over ``"15"``. Rules (:func:`evaluate`):

- No policy: nothing can be chosen (new instances wait, with a condition saying so).
- A version not listed, or listed disabled, cannot be *newly* chosen: an instance that already
  runs it keeps running it (the status says it is disabled), but a new instance, or a change
  to it, is refused.
- A change of the major version is refused unless ``spec.allowMajorVersionUpgrade`` is true;
  a minor change within a major rolls in place. A major downgrade is always refused (an older
  major cannot read the data).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_VERSION = re.compile(r"^(\d{1,3})(?:\.(\d{1,3}))?$")
DEFAULT_IMAGE = "postgres:{version}"


@dataclass(frozen=True, order=True)
class Version:
    """A PostgreSQL version as written in a spec: ``"15"`` or ``"15.4"``."""

    major: int
    minor: int | None = None

    def __str__(self) -> str:
        return str(self.major) if self.minor is None else f"{self.major}.{self.minor}"


def parse_version(text: str) -> Version:
    """``"15"`` → ``Version(15)``, ``"15.4"`` → ``Version(15, 4)``; ``ValueError`` otherwise."""
    match = _VERSION.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"version {text!r} is not MAJOR or MAJOR.MINOR (e.g. 16 or 16.2)")
    return Version(int(match[1]), int(match[2]) if match[2] is not None else None)


def server_version(version_num: int) -> Version:
    """A ``server_version_num`` (``150004``) as ``Version(15, 4)``."""
    return Version(version_num // 10000, version_num % 10000)


@dataclass(frozen=True)
class Verdict:
    """What the policy says about an instance's version.

    ``version`` is the version to run: the desired one when ``accepted``, else the running
    one (``None`` when there is none yet: render nothing). ``reason``/``message`` feed the
    ``VersionAccepted`` condition; ``disabled`` is true when the version that runs is one the
    policy does not enable (it keeps running, but could not be chosen today).
    """

    accepted: bool
    version: Version | None
    reason: str
    message: str
    image: str | None = None
    disabled: bool = False


def _entries(policy: dict[str, Any] | None) -> list[dict[str, Any]]:
    spec = (policy or {}).get("spec") or {}
    return [e for e in spec.get("versions") or [] if isinstance(e, dict)]


def lookup(policy: dict[str, Any] | None, version: Version) -> dict[str, Any] | None:
    """The policy entry that covers ``version``: an exact ``MAJOR.MINOR`` entry, else the
    ``MAJOR`` entry, else ``None``."""
    exact = general = None
    for entry in _entries(policy):
        try:
            listed = parse_version(str(entry.get("version", "")))
        except ValueError:
            continue
        if listed == version:
            exact = entry
        elif listed.minor is None and listed.major == version.major:
            general = general or entry
    return exact or general


def is_enabled(policy: dict[str, Any] | None, version: Version) -> bool:
    entry = lookup(policy, version)
    return bool(entry and entry.get("enabled", True))


def image_for(policy: dict[str, Any] | None, version: Version) -> str:
    """The container image of ``version``: the entry's ``image``, else the policy's
    ``defaultImage`` template, else ``postgres:<version>`` (``{version}`` is substituted)."""
    entry = lookup(policy, version) or {}
    if entry.get("image"):
        return str(entry["image"])
    template = ((policy or {}).get("spec") or {}).get("defaultImage") or DEFAULT_IMAGE
    return str(template).replace("{version}", str(version))


# A decision table: one return per verdict, checked in the order they apply.
def evaluate(  # noqa: PLR0911
    policy: dict[str, Any] | None,
    desired_text: str,
    running: Version | None,
    *,
    allow_major_upgrade: bool = False,
) -> Verdict:
    """Decide whether ``desired_text`` may run, given the version that runs now."""

    def keep(reason: str, message: str) -> Verdict:
        if running is None:
            return Verdict(False, None, reason, message)
        return Verdict(
            False,
            running,
            reason,
            f"{message}; version {running} keeps running",
            image_for(policy, running),
            disabled=not is_enabled(policy, running),
        )

    try:
        desired = parse_version(desired_text)
    except ValueError as err:
        return keep("InvalidVersion", str(err))
    if desired == running:
        if is_enabled(policy, desired):
            return Verdict(
                True,
                desired,
                "VersionEnabled",
                f"version {desired} is enabled",
                image_for(policy, desired),
            )
        return Verdict(
            True,
            desired,
            "VersionDisabled",
            f"version {desired} is disabled by the version policy: it keeps running, but "
            "cannot be newly chosen",
            image_for(policy, desired),
            disabled=True,
        )
    if policy is None:
        return keep(
            "NoVersionPolicy",
            "no PostgresVersionPolicy 'default' exists: an administrator must enable versions",
        )
    if not is_enabled(policy, desired):
        listed = lookup(policy, desired) is not None
        why = "is disabled by" if listed else "is not enabled in"
        return keep("VersionDisabled", f"version {desired} {why} the version policy")
    if running is not None and desired.major < running.major:
        return keep(
            "MajorDowngradeRefused",
            f"changing the major version from {running.major} down to {desired.major} is "
            f"refused: PostgreSQL {desired.major} cannot read the data of {running.major}",
        )
    if running is not None and desired.major != running.major and not allow_major_upgrade:
        return keep(
            "MajorUpgradeRefused",
            f"changing the major version from {running.major} to {desired.major} is refused: "
            "set spec.allowMajorVersionUpgrade to true to allow it",
        )
    return Verdict(
        True, desired, "VersionEnabled", f"version {desired} is enabled", image_for(policy, desired)
    )

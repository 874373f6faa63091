"""When the self-managed certificates change: the pure decisions behind
:mod:`controller_runtime.webhook.selfmanaged`, with time and certificates as plain values.

The state (kept in one Secret) is the CA that signs the serving certificate (the *signer*),
the serving certificate, the CA *bundle* injected into the webhook configurations and the
CRDs' conversion, and a *next* CA while one is being introduced. :func:`plan` looks at the
state and the time and names the one step to take; its table, in order of precedence:

====================================================  =====================================
the state                                             the step
====================================================  =====================================
no state, the signer expired, or a state this         ``CREATE``: a new CA, its serving
module never writes                                   certificate, bundle = [CA]
a next CA whose bundle has been injected for          ``SWITCH``: a serving certificate from
``overlap``                                           the next CA, which becomes the signer
                                                      (the bundle keeps both)
the serving certificate ends within                   ``RENEW_SERVING``: a new one from the
``serving_renew_before`` (and before its CA), or      signer (no bundle change: the bundle
lacks a host name                                     trusts the signer already)
a next CA waiting for its overlap                     ``NONE``
the signer ends within ``ca_renew_before``            ``ADD_CA``: a next CA; bundle =
                                                      [next, signer]; serving unchanged
the bundle holds CAs other than the signer, and the   ``DROP_OLD``: bundle = [signer]
switch and the bundle's injection are ``overlap`` old
anything else                                         ``NONE``
====================================================  =====================================

Why it is safe (a property test drives it through arbitrary schedules of checks, replica
reloads and API servers that see the bundle late): a replica only ever serves a certificate
signed by a CA that has been in the injected bundle for ``overlap``, and a CA leaves the
bundle only ``overlap`` after every replica was told to serve a certificate from the next
one. That needs ``overlap`` to be longer than a replica's reload interval plus the time an
API server takes to see a changed configuration (seconds), which :class:`RotationPolicy`
checks against the interval it is given.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace

__all__ = [
    "Authority",
    "Leaf",
    "RotationPolicy",
    "RotationState",
    "Step",
    "next_check",
    "plan",
    "transition",
]

DAY = 86400.0


class Step(enum.Enum):
    NONE = "none"
    CREATE = "create"
    RENEW_SERVING = "renew-serving"
    ADD_CA = "add-ca"
    SWITCH = "switch"
    DROP_OLD = "drop-old"


@dataclass(frozen=True)
class Authority:
    """A CA: an identity (its fingerprint) and the end of its validity (epoch seconds)."""

    id: str
    not_after: float


@dataclass(frozen=True)
class Leaf:
    """A serving certificate: its issuer's id, end of validity, and the names it is for."""

    id: str
    issuer: str
    not_after: float
    hosts: frozenset[str]


@dataclass(frozen=True)
class RotationState:
    """What the Secret holds, as values. ``bundle`` lists CA ids, newest first;
    ``bundle_injected_at`` is when the current bundle was last written to every target
    (``None``: not yet); ``switched_at`` when the signer last changed by ``SWITCH``."""

    signer: Authority
    serving: Leaf
    bundle: tuple[str, ...]
    next_ca: Authority | None = None
    bundle_injected_at: float | None = None
    switched_at: float | None = None


@dataclass(frozen=True)
class RotationPolicy:
    """Validity and timing of the self-managed certificates, in seconds.

    Defaults: the CA is valid 365 days and replaced 30 days before it ends; serving
    certificates are valid 90 days and renewed 30 days before they end; ``overlap`` (10 min)
    is how long a new bundle is injected before a certificate signed by a new CA is served,
    and how long after the switch the old CA stays trusted. A serving certificate never
    outlives its CA.
    """

    ca_validity: float = 365 * DAY
    ca_renew_before: float = 30 * DAY
    serving_validity: float = 90 * DAY
    serving_renew_before: float = 30 * DAY
    overlap: float = 600.0

    def check(self, reload_interval: float) -> None:
        """Raise ``ValueError`` unless the timings can keep the guarantee with replicas that
        reload every ``reload_interval`` seconds."""
        if self.overlap <= 2 * reload_interval:
            raise ValueError(
                f"overlap ({self.overlap}s) must exceed twice the replicas' reload interval "
                f"({reload_interval}s): every replica must have reloaded before a CA goes"
            )
        if self.ca_renew_before <= 3 * self.overlap:
            raise ValueError("ca_renew_before must exceed three overlaps (add, switch, drop)")
        if self.ca_renew_before >= self.ca_validity:
            raise ValueError("ca_renew_before must be shorter than ca_validity")
        if not self.overlap < self.serving_renew_before < self.serving_validity:
            raise ValueError(
                "serving_renew_before must exceed overlap and be shorter than serving_validity"
            )


def plan(  # noqa: PLR0911 (a return per row of the table)
    state: RotationState | None, now: float, policy: RotationPolicy, hosts: frozenset[str]
) -> Step:
    """The one step to take now; see the module docstring's table."""
    if state is None:
        return Step.CREATE
    signer, serving, injected = state.signer, state.serving, state.bundle_injected_at
    if signer.not_after <= now or serving.issuer != signer.id or signer.id not in state.bundle:
        return Step.CREATE  # expired, or a state this module never writes: start over
    if state.next_ca is not None and injected is not None and now - injected >= policy.overlap:
        return Step.SWITCH
    # A serving certificate ends with its CA at the latest: renewing one that already ends
    # with the signer would give the same end, so that waits for the CA's rotation.
    expiring = serving.not_after - now <= policy.serving_renew_before
    if (expiring and serving.not_after < signer.not_after) or not hosts <= serving.hosts:
        return Step.RENEW_SERVING
    if state.next_ca is not None:
        return Step.NONE  # waiting for the injection's overlap
    if signer.not_after - now <= policy.ca_renew_before:
        return Step.ADD_CA
    switched = state.switched_at
    if (
        state.bundle != (signer.id,)
        and switched is not None
        and injected is not None
        and now - max(switched, injected) >= policy.overlap
    ):
        return Step.DROP_OLD
    return Step.NONE


NewAuthority = Callable[[float], Authority]
"""Mint a CA valid until the given time (epoch seconds)."""
NewLeaf = Callable[[Authority, float, frozenset[str]], Leaf]
"""Mint a serving certificate from a CA, valid until the given time, for the host names."""


def transition(
    state: RotationState | None,
    step: Step,
    now: float,
    policy: RotationPolicy,
    hosts: frozenset[str],
    *,
    new_authority: NewAuthority,
    new_leaf: NewLeaf,
) -> RotationState | None:
    """The state after ``step`` (``None`` for ``NONE``: nothing to write). A changed bundle
    resets ``bundle_injected_at``: the driver injects it and records when."""

    def leaf(signer: Authority) -> Leaf:
        return new_leaf(signer, min(now + policy.serving_validity, signer.not_after), hosts)

    if step is Step.NONE:
        return None
    if step is Step.CREATE or state is None:
        signer = new_authority(now + policy.ca_validity)
        return RotationState(signer=signer, serving=leaf(signer), bundle=(signer.id,))
    if step is Step.RENEW_SERVING:
        return replace(state, serving=leaf(state.signer))
    if step is Step.ADD_CA:
        next_ca = new_authority(now + policy.ca_validity)
        return replace(
            state,
            next_ca=next_ca,
            bundle=(next_ca.id, state.signer.id),
            bundle_injected_at=None,
        )
    if step is Step.SWITCH:
        assert state.next_ca is not None
        signer = state.next_ca
        return replace(state, signer=signer, serving=leaf(signer), next_ca=None, switched_at=now)
    if step is Step.DROP_OLD:
        return replace(state, bundle=(state.signer.id,), bundle_injected_at=None)
    raise AssertionError(step)


def next_check(state: RotationState, now: float, policy: RotationPolicy, interval: float) -> float:
    """When to look again: the earliest future moment a step of :func:`plan` could become
    due, and at most ``interval`` from now (the bundle's re-injection)."""
    due = [
        now + interval,
        state.serving.not_after - policy.serving_renew_before,
        state.signer.not_after - policy.ca_renew_before,
        state.signer.not_after,
    ]
    waiting = state.next_ca is not None or state.bundle != (state.signer.id,)
    if waiting and state.bundle_injected_at is not None:
        due.append(state.bundle_injected_at + policy.overlap)
    if waiting and state.switched_at is not None:
        due.append(state.switched_at + policy.overlap)
    return min(t for t in due if t > now)

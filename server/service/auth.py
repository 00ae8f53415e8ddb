"""Who is calling, and may they: bearer tokens and per-verb, per-queue rules.

A policy file (``muster-server --auth-policy FILE``, YAML, re-read when it changes) maps tokens to
users and groups and grants verbs, like Kubernetes RBAC roles or Slurm accounts::

    tokens:
      - {token: "s3cr3t-alice", user: alice, groups: [ml]}
      - {token: "s3cr3t-ops", user: ops, groups: [admins]}
    rules:
      - {subjects: ["group:ml"], verbs: [read, submit, cancel], queues: [ml, default]}
      - {subjects: ["group:admins"], verbs: ["*"]}

Verbs: ``read`` (Get/List/Explain/Watch, Simulate; the jobs, commands and logs of the rule's
queues), ``submit``, ``cancel`` (per queue), ``manage-queues``, ``configure`` (UpdateConfig) and
``backend`` (the backend RPCs). A request carries its token as ``authorization: Bearer <token>``
metadata.

Under mutual TLS a client certificate is an identity only where the policy says so::

    certificates:
      - {cn: rack-a, backend: rack-a}            # may act as backend rack-a, and nothing else
      - {san: hpc-gw.example.org, backend: hpc}  # matched on a subject alternative name
      - {cn: alice, user: alice, groups: [ml]}   # a user: the rules apply as to alice's token

A certificate the policy does not map authenticates nobody (the call needs a token); being signed
by the client CA never makes a backend.

No policy file: every caller is allowed (the loopback development default).
The design leaves room for OIDC: ``Policy.authenticate`` maps a bearer token to a ``Principal``;
a verifier of signed tokens would be another source of principals with the same rules.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Self

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from muster import yamldoc

log = structlog.get_logger("muster.auth")

# "cancel-own": cancel the jobs one submitted (the job's owner), in the rule's queues.
Verb = Literal[
    "read", "submit", "cancel", "cancel-own", "manage-queues", "configure", "backend", "*"
]
VERBS: tuple[str, ...] = ("read", "submit", "cancel", "manage-queues", "configure", "backend")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenEntry(_Model):
    token: str = Field(min_length=8)
    user: str = Field(min_length=1)
    groups: list[str] = []


class Rule(_Model):
    subjects: list[str] = Field(min_length=1)  # "user:NAME", "group:NAME" or "*"
    verbs: list[Verb] = Field(min_length=1)
    queues: list[str] = ["*"]  # for submit / cancel; "*": every queue


class CertificateEntry(_Model):
    """Maps a client certificate (by its subject CN or one of its subject alternative names) to a
    backend or to a user."""

    cn: str | None = Field(default=None, min_length=1)
    san: str | None = Field(default=None, min_length=1)
    backend: str | None = Field(default=None, min_length=1)
    user: str | None = Field(default=None, min_length=1)
    groups: list[str] = []

    @model_validator(mode="after")
    def _one_of_each(self) -> Self:
        if (self.cn is None) == (self.san is None):
            raise ValueError("give exactly one of cn and san")
        if (self.backend is None) == (self.user is None):
            raise ValueError("give exactly one of backend and user")
        if self.backend is not None and self.groups:
            raise ValueError("groups: only a user certificate has groups")
        return self


class PolicyFile(_Model):
    tokens: list[TokenEntry] = []
    certificates: list[CertificateEntry] = []
    rules: list[Rule] = []


class PolicyError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Principal:
    """Who calls. A user (from a token or a mapped user certificate) or a backend identity (from
    a mapped backend certificate: ``backend`` set, ``user`` empty)."""

    user: str
    groups: tuple[str, ...] = ()
    backend: str = ""
    via: Literal["token", "certificate"] = "token"

    @property
    def name(self) -> str:
        """How logs and audit lines name this principal."""
        return f"backend:{self.backend}" if self.backend else self.user

    def matches(self, subject: str) -> bool:
        if self.backend:  # a backend identity is no user: only rules naming it apply
            return subject == f"backend:{self.backend}"
        return (
            subject == "*"
            or subject == f"user:{self.user}"
            or subject in {f"group:{g}" for g in self.groups}
        )


# grpc's auth context keys for the peer certificate's subject CN and its SANs.
CN_KEY = "x509_common_name"
SAN_KEY = "x509_subject_alternative_name"


def certificate_names(auth_context: Mapping[str, Iterable[bytes]]) -> tuple[str, list[str]]:
    """The peer certificate's CN ("" when none) and subject alternative names."""
    cns = list(auth_context.get(CN_KEY) or [])
    sans = auth_context.get(SAN_KEY) or []
    return (cns[0].decode(errors="replace") if cns else ""), [
        s.decode(errors="replace") for s in sans
    ]


def peer_name(auth_context: Mapping[str, Iterable[bytes]]) -> str:
    """How an audit line names a caller the policy does not identify: its certificate's CN under
    mutual TLS, else ``anonymous``."""
    cn, _ = certificate_names(auth_context)
    return f"cert:{cn}" if cn else "anonymous"


def parse_policy(text: str, source: str) -> PolicyFile:
    if not text.strip():
        raise PolicyError(f"{source}: empty policy file (it would refuse every call)")
    try:
        raw = yamldoc.load(text)
        policy = PolicyFile.model_validate(raw)
    except (ValueError, ValidationError) as exc:
        raise PolicyError(f"{source}: {exc}") from None
    if not policy.rules and not policy.certificates:
        raise PolicyError(f"{source}: the policy grants nothing (no rules, no certificates)")
    seen: set[str] = set()
    for i, entry in enumerate(policy.tokens):
        if entry.token in seen:
            raise PolicyError(f"{source}: tokens[{i}]: the same token is listed twice")
        seen.add(entry.token)
    return policy


class Policy:
    """The policy file, re-read when its modification time changes (a broken new version is
    logged and the previous one kept)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._mtime = os.stat(self.path).st_mtime_ns
        self._policy = parse_policy(self.path.read_text(), str(self.path))
        self._index()

    def _index(self) -> None:
        self._tokens = {t.token: Principal(t.user, tuple(t.groups)) for t in self._policy.tokens}
        self._by_cn: dict[str, Principal] = {}
        self._by_san: dict[str, Principal] = {}
        for c in self._policy.certificates:
            who = Principal(
                c.user or "", tuple(c.groups), backend=c.backend or "", via="certificate"
            )
            if c.cn is not None:
                self._by_cn[c.cn] = who
            else:
                assert c.san is not None
                self._by_san[c.san] = who

    def _refresh(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime == self._mtime:
                return
            policy = parse_policy(self.path.read_text(), str(self.path))
        except (OSError, PolicyError) as exc:
            log.warning("auth.policy_reload_failed", error=str(exc))
            return
        self._mtime, self._policy = mtime, policy
        self._index()
        log.info("auth.policy_reloaded", path=str(self.path), tokens=len(self._tokens))

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Principal | None:
        """The principal of a request's ``authorization: Bearer`` token; None: none or unknown."""
        self._refresh()
        token = bearer_token(metadata)
        return self._tokens.get(token) if token else None

    def from_certificate(self, auth_context: Mapping[str, Iterable[bytes]]) -> Principal | None:
        """The principal the policy maps the peer's certificate to (CN first, then SANs); None:
        no certificate, or one the policy does not name."""
        self._refresh()
        cn, sans = certificate_names(auth_context)
        if cn and cn in self._by_cn:
            return self._by_cn[cn]
        for san in sans:
            if san in self._by_san:
                return self._by_san[san]
        return None

    def readable_queues(self, who: Principal) -> frozenset[str] | None:
        """The queues whose jobs ``who`` may read (None: every queue)."""
        queues: set[str] = set()
        for rule in self._policy.rules:
            if ("*" in rule.verbs or "read" in rule.verbs) and any(
                who.matches(s) for s in rule.subjects
            ):
                if "*" in rule.queues:
                    return None
                queues.update(rule.queues)
        return frozenset(queues)

    def allows(self, who: Principal, verb: str, queue: str = "") -> bool:
        """Whether a rule grants ``verb`` (in ``queue``, for the per-queue verbs submit and cancel)."""
        for rule in self._policy.rules:
            if not any(who.matches(s) for s in rule.subjects):
                continue
            if "*" not in rule.verbs and verb not in rule.verbs:
                continue
            if (
                verb in ("submit", "cancel", "cancel-own")
                and "*" not in rule.queues
                and queue not in rule.queues
            ):
                continue
            return True
        return False


def bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str:
    """The request's ``authorization: Bearer`` token ("" when none)."""
    for key, value in metadata:
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :].strip()
    return ""

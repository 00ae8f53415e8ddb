"""Who is calling, and may they: bearer tokens and per-verb, per-queue rules.

A policy file (``muster-server --auth-policy FILE``, YAML, re-read when it changes) maps tokens to
users and groups and grants verbs, like Kubernetes RBAC roles or Slurm accounts::

    tokens:
      - {token: "s3cr3t-alice", user: alice, groups: [ml]}
      - {token: "s3cr3t-ops", user: ops, groups: [admins]}
    rules:
      - {subjects: ["group:ml"], verbs: [read, submit, cancel], queues: [ml, default]}
      - {subjects: ["group:admins"], verbs: ["*"]}

Verbs: ``read`` (Get/List/Explain/Watch, Simulate), ``submit``, ``cancel`` (per queue),
``manage-queues``, ``configure`` (UpdateConfig) and ``backend`` (the backend RPCs, for adapters
that authenticate with a token rather than a client certificate). A request carries its token as
``authorization: Bearer <token>`` metadata. Under mutual TLS a backend's certificate already
identifies it (``server.service``), so backend RPCs on such a connection need no token.

No policy file: every caller is allowed (the loopback development default).
The design leaves room for OIDC: ``Policy.authenticate`` maps a bearer token to a ``Principal``;
a verifier of signed tokens would be another source of principals with the same rules.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = structlog.get_logger("muster.auth")

# "cancel-own": cancel the jobs one submitted (the job's owner), in the rule's queues.
Verb = Literal["read", "submit", "cancel", "cancel-own", "manage-queues", "configure", "backend", "*"]
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


class PolicyFile(_Model):
    tokens: list[TokenEntry] = []
    rules: list[Rule] = []


class PolicyError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    groups: tuple[str, ...] = ()

    def matches(self, subject: str) -> bool:
        return subject == "*" or subject == f"user:{self.user}" or subject in {f"group:{g}" for g in self.groups}


def parse_policy(text: str, source: str) -> PolicyFile:
    try:
        raw = yaml.safe_load(text)
        policy = PolicyFile.model_validate(raw or {})
    except (yaml.YAMLError, ValidationError) as exc:
        raise PolicyError(f"{source}: {exc}") from None
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

    def authenticate(self, metadata: Sequence[tuple[str, str | bytes]]) -> Principal | None:
        """The principal of a request's ``authorization: Bearer`` token; None: none or unknown."""
        self._refresh()
        for key, value in metadata:
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                return self._tokens.get(value[len("Bearer "):].strip())
        return None

    def allows(self, who: Principal, verb: str, queue: str = "") -> bool:
        for rule in self._policy.rules:
            if not any(who.matches(s) for s in rule.subjects):
                continue
            if "*" not in rule.verbs and verb not in rule.verbs:
                continue
            if verb in ("submit", "cancel", "cancel-own") and "*" not in rule.queues and queue not in rule.queues:
                continue
            return True
        return False

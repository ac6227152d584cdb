"""Tenants of the DP-RAG service: names, API keys (stored hashed) and their ledger scopes.

A tenant's budget is a ledger scope (tenant, dataset) with an (epsilon, delta) cap; the
dataset's collection scope (`synthgen.privacy.COLLECTION`) caps all tenants together. A
collection in individual accounting has no collection scope: each of its documents has a
privacy filter over all tenants (`synthgen.privacy.document_filters`), and a tenant's
scope is a quota on how much it may ask. The
registry lives in the ledger's database (table ``tenants``, `ledger_store` migration 5),
so every replica of the service on one PostgreSQL ledger sees the same tenants.

API keys look like ``dpk_<key id>_<secret>``: the key id (8 random bytes, hex) is public and
finds the row; the secret (32 random bytes, URL-safe base64) is never stored, only
HMAC-SHA256(salt, secret) with a per-tenant 16-byte salt, compared in constant time. A
fast hash is the standard for random 256-bit secrets (nothing to brute-force); a slow KDF
protects low-entropy passwords, which these are not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
import secrets
import time
from pathlib import Path

from synthgen.privacy import COLLECTION, PrivacyLedger, Scope
from synthgen.privacy.accounting import check_delta
from synthgen.privacy.document_filters import DocumentFilter, DocumentFilters

KEY_PREFIX = "dpk_"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_KEY = re.compile(r"dpk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")


class AuthError(Exception):
    """A request's API key was refused. `status` is 401 (no or unknown key) or 403."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Tenant:
    """A registered tenant (public fields only: the key's hash never leaves the registry)."""

    name: str
    key_id: str
    created_at: float
    revoked_at: float | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def _digest(salt: str, secret: str) -> str:
    return hmac.new(bytes.fromhex(salt), secret.encode(), hashlib.sha256).hexdigest()


def check_name(name: str) -> str:
    """`name` if it is a valid tenant name (letters, digits, ``_.-``; at most 64; not ``*``)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"tenant names are 1-64 letters, digits, '_', '.', '-' (starting with a letter or "
            f"digit), got {name!r}"
        )
    return name


class TenantRegistry:
    """Adds, lists, revokes and authenticates tenants of a ledger.

    Args:
      ledger: the privacy ledger (its database also holds the tenants).
    """

    def __init__(self, ledger: PrivacyLedger) -> None:
        self.ledger = ledger
        self._store = ledger.store  # one connection per thread, shared with the ledger

    @classmethod
    def open(cls, location: str | Path) -> TenantRegistry:
        return cls(PrivacyLedger(location))

    def add(
        self,
        name: str,
        dataset: str,
        *,
        epsilon: float,
        delta: float,
        collection_epsilon: float | None = None,
        collection_delta: float | None = None,
        individual: bool = False,
        accountant: str | None = None,
    ) -> str:
        """Registers `name` with an (epsilon, delta) cap on `dataset`; returns its API key.

        The key is shown once: only its hash is stored. Collection accounting: the dataset
        must have a collection cap, or `collection_epsilon`/`collection_delta` open one; the
        tenant's delta cap may not exceed the collection's (which the service checks against
        1/n at start). Individual accounting (`individual`, or the dataset already has
        per-document filters): no collection cap, the tenant's cap is a quota, and once the
        filters exist (the first ``retriever serve --accounting individual`` opens them) its
        delta cap must be below 1/n. `accountant` composes the tenant's scope; default
        "pld", and "rdp" for a quota (PLD took 2 s per answer after 200 charges on one
        scope, RDP 0.03 s, a sound and slightly looser bound).

        Raises:
          ValueError: a bad name or cap, a name already registered, no collection cap
            (collection accounting), a collection cap or its options (individual
            accounting), or a delta cap above the collection's or 1/n.
        """
        check_name(name)
        filters = DocumentFilters(self.ledger.store).get(dataset)
        individual = individual or filters is not None
        accountant = accountant or ("rdp" if individual else "pld")
        scope = Scope(name, dataset, float(epsilon), float(delta), accountant)  # validated
        if any(t.name == name for t in self.tenants()):
            raise ValueError(f"tenant {name} exists (revoked tenants keep their name)")
        if individual:
            self._open_quota(scope, filters, collection_epsilon, collection_delta)
        else:
            self._open_capped(scope, collection_epsilon, collection_delta)
        key_id, salt = secrets.token_hex(8), secrets.token_hex(16)
        secret = secrets.token_urlsafe(32)
        with self._store.write() as conn:  # the primary key refuses a concurrent twin
            conn.execute(
                "INSERT INTO tenants (name, key_id, key_salt, key_hash, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (name, key_id, salt, _digest(salt, secret), time.time()),
            )
        return f"{KEY_PREFIX}{key_id}_{secret}"

    def _open_quota(
        self,
        scope: Scope,
        filters: DocumentFilter | None,
        collection_epsilon: float | None,
        collection_delta: float | None,
    ) -> None:
        """Opens `scope` as a quota on a collection in individual accounting."""
        dataset = scope.dataset
        if collection_epsilon is not None or collection_delta is not None:
            raise ValueError(
                f"{dataset} uses per-document filters (individual accounting): it takes no "
                "collection cap (drop --collection-epsilon / --collection-delta)"
            )
        if self.ledger.collection_scope(dataset) is not None:
            raise ValueError(
                f"{dataset} has a collection cap (collection accounting): individual "
                "accounting needs a collection without one; use another collection name"
            )
        if filters is not None:
            try:
                check_delta(scope.delta_cap, filters.documents)
            except ValueError:
                n = filters.documents
                raise ValueError(
                    f"the delta cap of {scope.tenant}: delta must be in (0, 1/n) = "
                    f"(0, {1 / n:.3g}) for n={n} documents, got {scope.delta_cap:g}"
                ) from None
        self.ledger.open_scope(scope)  # an existing scope must have the same caps

    def _open_capped(
        self, scope: Scope, collection_epsilon: float | None, collection_delta: float | None
    ) -> None:
        """Opens `scope` under the collection cap of its dataset (opening that cap if
        `collection_epsilon`/`collection_delta` are given and it has none)."""
        name, dataset = scope.tenant, scope.dataset
        collection = self.ledger.collection_scope(dataset)
        if collection is None:
            if collection_epsilon is None or collection_delta is None:
                raise ValueError(
                    f"{dataset} has no collection cap (all tenants together) yet: pass "
                    "--collection-epsilon and --collection-delta"
                )
            collection = Scope(
                COLLECTION, dataset, float(collection_epsilon), float(collection_delta)
            )
        if scope.delta_cap > collection.delta_cap:
            raise ValueError(
                f"tenant {name}'s delta cap {scope.delta_cap:g} exceeds the collection cap's "
                f"{collection.delta_cap:g} on {dataset}: a tenant's delta is at most the "
                "collection's (which must be below 1/n for n documents)"
            )
        self.ledger.ensure_scope(collection)
        self.ledger.open_scope(scope)  # an existing scope must have the same caps

    def revoke(self, name: str) -> Tenant:
        """Revokes `name`'s key for good; its ledger scope and charges stay.

        Raises:
          KeyError: no such tenant.
        """
        with self._store.write() as conn:
            conn.execute(
                "UPDATE tenants SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
                (time.time(), name),
            )
        return self.get(name)  # KeyError for no such tenant

    def get(self, name: str) -> Tenant:
        tenant = next((t for t in self.tenants() if t.name == name), None)
        if tenant is None:
            raise KeyError(f"no tenant named {name}")
        return tenant

    def tenants(self) -> list[Tenant]:
        """Every tenant, active or revoked, oldest first."""
        with self._store.read() as conn:
            rows = conn.execute(
                "SELECT name, key_id, created_at, revoked_at FROM tenants ORDER BY created_at"
            ).fetchall()
        return [Tenant(*row) for row in rows]

    def authenticate(self, key: str | None) -> Tenant:
        """The active tenant holding `key`.

        Raises:
          AuthError: 401 for a missing, malformed or unknown key; 403 for a wrong secret or
            a revoked tenant. Messages never contain the key.
        """
        if not key:
            raise AuthError("missing API key (Authorization: Bearer dpk_...)", 401)
        match = _KEY.fullmatch(key)
        if match is None:
            raise AuthError("malformed API key", 401)
        key_id, secret = match.groups()
        with self._store.read() as conn:
            row = conn.execute(
                "SELECT name, key_salt, key_hash, created_at, revoked_at FROM tenants "
                "WHERE key_id = ?",
                (key_id,),
            ).fetchone()
        if row is None:
            raise AuthError("unknown API key", 401)
        name, salt, stored, created_at, revoked_at = row
        if not hmac.compare_digest(_digest(salt, secret), stored):
            raise AuthError("invalid API key", 403)
        if revoked_at is not None:
            raise AuthError(f"the key of tenant {name} was revoked", 403)
        return Tenant(name, key_id, created_at, revoked_at)

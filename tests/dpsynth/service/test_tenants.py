"""Tenant registry: keys shown once and stored hashed, 401/403 distinctions, revocation."""

import pytest

from dpsynth.service.tenants import AuthError, TenantRegistry
from synthgen.privacy import COLLECTION, PrivacyLedger


def _registry(location):
    return TenantRegistry(PrivacyLedger(location))


def _add(registry, name, **kw):
    return registry.add(
        name, "records", epsilon=2.0, delta=1e-5, collection_epsilon=4.0, collection_delta=1e-5,
        **kw,
    )  # fmt: skip


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_add_authenticate_revoke(backend, tmp_path, request):
    location = (
        tmp_path / "l.sqlite" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    )
    registry = _registry(location)
    key = _add(registry, "alice")
    assert key.startswith("dpk_") and len(key) == 4 + 16 + 1 + 43
    assert registry.authenticate(key).name == "alice"
    scope = registry.ledger.get_scope("alice", "records")
    assert (scope.epsilon_cap, scope.delta_cap) == (2.0, 1e-5)
    assert registry.ledger.collection_scope("records").epsilon_cap == 4.0
    other = _registry(location)  # another replica sees the same tenants
    assert other.authenticate(key).name == "alice"
    with pytest.raises(AuthError) as wrong:
        registry.authenticate(key[:-1] + ("A" if key[-1] != "A" else "B"))
    assert wrong.value.status == 403 and key not in str(wrong.value)
    registry.revoke("alice")
    with pytest.raises(AuthError, match="revoked") as revoked:
        other.authenticate(key)
    assert revoked.value.status == 403
    assert not registry.get("alice").active
    assert registry.ledger.get_scope("alice", "records") == scope  # the budget stays


@pytest.mark.parametrize(
    "key", [None, "", "Bearer x", "dpk_xyz", "dpk_" + "0" * 16 + "_" + "A" * 43]
)
def test_missing_malformed_or_unknown_keys_are_401(tmp_path, key):
    registry = _registry(tmp_path / "l.sqlite")
    _add(registry, "alice")
    with pytest.raises(AuthError) as refused:
        registry.authenticate(key)
    assert refused.value.status == 401


def test_names_caps_and_the_collection_cap_are_validated(tmp_path):
    registry = _registry(tmp_path / "l.sqlite")
    with pytest.raises(ValueError, match="collection cap"):
        registry.add("alice", "records", epsilon=1.0, delta=1e-5)
    for bad in ("*", "", "a b", "-x", "x" * 65):
        with pytest.raises(ValueError, match="tenant names"):
            _add(registry, bad)
    with pytest.raises(ValueError, match="epsilon_cap"):
        registry.add("alice", "records", epsilon=-1.0, delta=1e-5, collection_epsilon=1.0,
                     collection_delta=1e-5)  # fmt: skip
    _add(registry, "alice")
    with pytest.raises(ValueError, match="exists"):
        _add(registry, "alice")
    with pytest.raises(KeyError):
        registry.revoke("nobody")
    # a second tenant reuses the existing collection cap without new collection options
    registry.add("bob", "records", epsilon=1.0, delta=1e-5)
    assert [t.name for t in registry.tenants()] == ["alice", "bob"]
    assert registry.ledger.get_scope(COLLECTION, "records").epsilon_cap == 4.0


def test_a_tenant_delta_above_the_collections_is_refused(tmp_path):
    registry = _registry(tmp_path / "l.sqlite")
    with pytest.raises(ValueError, match="exceeds the collection cap"):
        registry.add(
            "alice", "records", epsilon=1.0, delta=1e-4, collection_epsilon=4.0,
            collection_delta=1e-5,
        )  # fmt: skip
    assert registry.ledger.scopes() == [] and registry.tenants() == []  # nothing opened
    _add(registry, "bob")  # opens the collection cap at delta 1e-5
    with pytest.raises(ValueError, match="exceeds the collection cap"):
        registry.add("carol", "records", epsilon=1.0, delta=2e-5)
    assert [t.name for t in registry.tenants()] == ["bob"]

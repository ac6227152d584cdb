import pytest

from dpsynth.service.tenants import TenantRegistry
from synthgen.privacy import PrivacyLedger
from tests.dpsynth.service.harness import make_world


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """A private and a public fictional medical collection with exact indexes."""
    return make_world(tmp_path_factory.mktemp("service-world"))


@pytest.fixture
def alice_ledger(tmp_path):
    """(ledger, registry, alice's key): one tenant, alice, on "records" at epsilon 5, delta
    1e-5, the collection's cap the same."""
    book = PrivacyLedger(tmp_path / "ledger.sqlite")
    registry = TenantRegistry(book)
    key = registry.add(
        "alice", "records", epsilon=5.0, delta=1e-5, collection_epsilon=5.0, collection_delta=1e-5
    )
    return book, registry, key

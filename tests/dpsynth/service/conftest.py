import pytest

from tests.dpsynth.service.harness import make_world


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """A private and a public fictional medical collection with exact indexes."""
    return make_world(tmp_path_factory.mktemp("service-world"))

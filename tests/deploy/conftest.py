"""Fixtures of the deployment tests."""

from tests.support.fixtures import peer_procs  # noqa: F401

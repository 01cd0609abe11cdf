"""Fixtures of the fleet tests: the shared PostgreSQL server (``postgres_server``, from
``tests/service/conftest.py``; skipped without it unless ``ATTNFUZZ_TEST_POSTGRES_REQUIRED=1``)."""

from tests.service.conftest import postgres_server  # noqa: F401  (fixture)

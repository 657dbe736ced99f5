"""Fixtures shared by the integration tests."""

from tests.integration.private_kafka import private_kafka
from tests.integration.service_harness import service

__all__ = ["private_kafka", "service"]

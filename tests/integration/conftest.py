"""Fixtures shared by the integration tests."""

from tests.integration.private_kafka import private_kafka

__all__ = ["private_kafka"]

"""message-history: Mastra's MessageHistory processor as a Kafka/MongoDB stream service."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("message-history")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

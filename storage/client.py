"""The one way the service's code connects to MongoDB: the settings' URI and timeouts, tz-aware dates."""

from __future__ import annotations

from datetime import UTC
from typing import TYPE_CHECKING, Any, Final

from bson.codec_options import CodecOptions
from pymongo import AsyncMongoClient

from storage.errors import storage_errors

if TYPE_CHECKING:
    from message_history.settings import Settings

CODEC: Final[CodecOptions[dict[str, Any]]] = CodecOptions(document_class=dict, tz_aware=True, tzinfo=UTC)
"""How every collection of ours reads: plain dicts, dates as aware UTC datetimes."""


def mongo_client(
    settings: Settings, *, appname: str, operation_timeout_ms: int | None = None
) -> AsyncMongoClient[dict[str, Any]]:
    """A client (not connected yet: PyMongo connects on first use) named `appname` in the server's logs.

    Server selection and connecting wait `mongodb_timeout_ms`; each operation too, unless a command whose
    operations are longer (a batch of deletes) gives `operation_timeout_ms`.
    """
    timeout = settings.mongodb_timeout_ms
    with storage_errors("connect"):  # a malformed URI is refused here
        return AsyncMongoClient(
            settings.mongodb_uri.get_secret_value(),
            appname=appname,
            tz_aware=True,
            serverSelectionTimeoutMS=timeout,
            connectTimeoutMS=timeout,
            timeoutMS=operation_timeout_ms or timeout,
        )

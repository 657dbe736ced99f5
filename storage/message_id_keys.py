"""The deployment's message-id keys: the secret that makes a derived id's alternate unpredictable.

A derived message id (`schemas.ids`) is public, so another tenant could store a message under it first; the
persist path then saves that message under its alternate, an HMAC of the derived id under this key
(docs/security.md#derived-ids-and-the-deployment-key). The key must be the same for every instance and every
restart, or a redelivered turn would get another alternate and be stored twice:

* `MESSAGE_HISTORY_MESSAGE_ID_KEY` (a secret) when it is set;
* else the deployment's own key, made once at random and kept in MongoDB (`message_history_keys`, beside
  Mastra's collections; Mastra never reads it): `{_id: "message-ids", key: <base64, 32 bytes>, createdAt}`.
  The first instance to start inserts it (an upsert by `_id`; a racing second one finds it), every later one
  reads it. So a deployment that configures nothing is protected too.

`MESSAGE_HISTORY_MESSAGE_ID_PREVIOUS_KEYS` (comma-separated) keeps a rotated-out key readable: a turn whose
alternate was made under it finds its stored row again (looked up in its own thread only).
"""

from __future__ import annotations

import base64
import contextlib
import secrets
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from pymongo.errors import DuplicateKeyError

from message_history.errors import FatalStorageError
from storage.client import CODEC
from storage.errors import storage_errors

if TYPE_CHECKING:
    from pymongo.asynchronous.database import AsyncDatabase

    from message_history.settings import Settings

KEYS: Final = "message_history_keys"
_MESSAGE_IDS: Final = "message-ids"


def configured_keys(settings: Settings) -> tuple[bytes | None, tuple[bytes, ...]]:
    """(the configured key or None, the previous keys), as bytes."""
    key = settings.message_id_key
    previous = settings.message_id_previous_keys
    current = key.get_secret_value().encode() if key is not None and key.get_secret_value() else None
    older = (
        tuple(k.strip().encode() for k in previous.get_secret_value().split(",") if k.strip())
        if previous is not None
        else ()
    )
    return current, older


async def message_id_keys(
    db: AsyncDatabase[Any] | None, settings: Settings, *, create: bool = True
) -> tuple[bytes, ...]:
    """The current key first, then the previous ones. Without a configured key: the deployment's stored key
    (made on first use unless `create` is False: a dry run writes nothing, and with no stored key no id was
    ever made with one); `db` None (a storage that is not MongoDB, so lives as long as this process): a key
    of this process."""
    current, older = configured_keys(settings)
    if current is None:
        stored = await stored_key(db, create=create) if db is not None else None
        current = stored if stored is not None else secrets.token_bytes(32)
    return (current, *older)


async def stored_key(db: AsyncDatabase[Any], *, create: bool = True) -> bytes | None:
    """The deployment's key in `message_history_keys`, inserted at random when there is none yet (None when
    there is none and not `create`)."""
    collection = db.get_collection(KEYS, codec_options=CODEC)
    fresh = base64.b64encode(secrets.token_bytes(32)).decode()
    with storage_errors(f"provision the message-id key in {KEYS}"):
        if create:
            # another instance may insert it between our look and our insert (a duplicate key): read theirs
            with contextlib.suppress(DuplicateKeyError):
                await collection.update_one(
                    {"_id": _MESSAGE_IDS},
                    {"$setOnInsert": {"key": fresh, "createdAt": datetime.now(UTC)}},
                    upsert=True,
                )
        doc = await collection.find_one({"_id": _MESSAGE_IDS})
    if doc is None and not create:
        return None
    text = doc.get("key") if doc is not None else None
    if not isinstance(text, str) or not text:
        raise FatalStorageError(
            f"{KEYS}: the message-id key document has no key; delete it to make a new one"
        )
    return base64.b64decode(text)

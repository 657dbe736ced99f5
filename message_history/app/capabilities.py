"""What a storage can do beyond `BatchHistoryStorage`, decided once when the paths are wired (issue 32).

The paths take these as constructor arguments instead of probing their storage per batch: the recall
path's byte reads (`RawRecallStorage`: `MongoHistoryStorage`), the persist write that takes the batch's
reads (`ReadsForSaves`: `MongoHistoryStorage`) and the id-and-thread look-up (`MessageHomes`: replay's
storage). `app/service.py` and `app/replay/command.py` wire them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from consumers.collect import ReadsForSaves
from consumers.persist import MessageHomes
from consumers.prefetch import RawRecallStorage


@dataclass(frozen=True, slots=True)
class StorageCapabilities:
    """The storage itself under each capability it has; None for each it lacks."""

    raw_rows: RawRecallStorage | None = None
    save_reads: ReadsForSaves | None = None
    homes: MessageHomes | None = None


def storage_capabilities(storage: object) -> StorageCapabilities:
    """The capabilities of `storage`, probed here once."""
    return StorageCapabilities(
        raw_rows=storage if isinstance(storage, RawRecallStorage) else None,
        save_reads=storage if isinstance(storage, ReadsForSaves) else None,
        homes=storage if isinstance(storage, MessageHomes) else None,
    )

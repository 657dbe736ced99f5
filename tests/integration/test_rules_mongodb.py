"""The MessageHistory rule tables (tests/rule_cases.py) over `MongoHistoryStorage` on the real server.

tests/unit/test_processor.py plays the same tables over the in-memory storage; here the storage is MongoDB in
@mastra/mongodb's layout, so the two storages are held to one behaviour.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio
from pymongo.asynchronous.database import AsyncDatabase

from storage.mongodb import MongoHistoryStorage
from storage.protocol import HistoryStorage
from tests.rule_cases import (
    PERSIST_CASES,
    RECALL_CASES,
    TAKEN_CASES,
    PersistCase,
    RecallCase,
    TakenCase,
    run_persist_case,
    run_process_input_case,
    run_process_output_case,
    run_recall_case,
    run_taken_case,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest_asyncio.fixture
async def history_storage(mongo_db: AsyncDatabase[dict[str, Any]]) -> HistoryStorage:
    """A `MongoHistoryStorage` on a fresh database, indexes created."""
    storage = MongoHistoryStorage(mongo_db)
    await storage.ensure_indexes()
    return storage


@pytest.mark.parametrize("case", RECALL_CASES, ids=[c.id for c in RECALL_CASES])
async def test_recall_rules(history_storage: HistoryStorage, case: RecallCase) -> None:
    """recall() over MongoDB builds the context each recall rule prescribes."""
    await run_recall_case(history_storage, case)


@pytest.mark.parametrize("case", RECALL_CASES, ids=[c.id for c in RECALL_CASES])
async def test_process_input_rules(history_storage: HistoryStorage, case: RecallCase) -> None:
    """process_input() over MongoDB puts the same recalled messages into the MessageList."""
    await run_process_input_case(history_storage, case)


@pytest.mark.parametrize("case", PERSIST_CASES, ids=[c.id for c in PERSIST_CASES])
async def test_persist_rules(history_storage: HistoryStorage, case: PersistCase) -> None:
    """persist_turn() over MongoDB stores exactly what each persistence rule prescribes."""
    await run_persist_case(history_storage, case)


@pytest.mark.parametrize("case", PERSIST_CASES, ids=[c.id for c in PERSIST_CASES])
async def test_process_output_result_rules(history_storage: HistoryStorage, case: PersistCase) -> None:
    """process_output_result() over MongoDB stores what persist_turn() stores."""
    await run_process_output_case(history_storage, case)


@pytest.mark.parametrize("case", TAKEN_CASES, ids=[c.id for c in TAKEN_CASES])
async def test_a_derived_id_another_thread_holds_yields_to_its_alternate(
    history_storage: HistoryStorage, case: TakenCase
) -> None:
    """persist_turn() over MongoDB, given the keys and the request id, saves a derived id another thread
    holds under its alternate; otherwise refuses the turn (`MessageIdTakenError`), as in memory."""
    await run_taken_case(history_storage, case)

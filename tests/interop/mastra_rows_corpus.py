"""Regenerate tests/unit/data/mastra_rows.jsonl: `mastra_messages` rows as @mastra/mongodb writes them.

The native row codec's differential test (tests/unit/test_row_codec_native.py) runs on these raw documents
without a database or Node. They come from Mastra's own `MongoDBStore` (tests/interop/mastra-mongodb, the
pinned version) on a fresh database of the local stack: `saveMessages` of messages with every part kind
(tests/memory_cases.py), of the interop conversation, and the output step of Mastra's `MessageHistory`
(`processOutputResult`) on a few turns; then read back raw with the recall projection, one base64 line per
document. Rerun after bumping @mastra/mongodb:

    eval "$(deploy/local/stack env)"; .venv/bin/python -m tests.interop.mastra_rows_corpus
"""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path

from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from schemas.messages import format_timestamp
from storage.documents import MESSAGES
from storage.recalled_rows import MESSAGE_PROJECTION
from tests.interop.test_mastra_mongodb_interop import Mastra, at, conversation
from tests.memory_cases import random_messages

OUT = Path(__file__).resolve().parents[1] / "unit" / "data" / "mastra_rows.jsonl"


def main() -> None:
    uri = os.environ["MONGODB_URI"]
    db_name = f"codec_corpus_{secrets.token_hex(4)}"
    mastra = Mastra(uri, db_name)
    client: MongoClient[RawBSONDocument] = MongoClient(uri, document_class=RawBSONDocument)
    try:
        mastra.init()
        for seed in range(4):
            thread, resource = f"t-corpus-{seed}", f"r-corpus-{seed}"
            sent = random_messages(100 + seed, 40)
            for i, message in enumerate(sent):
                message["id"] = f"{thread}-m{i:03d}"
                message["threadId"], message["resourceId"] = thread, resource
            info = {
                "id": thread, "resourceId": resource, "title": "", "metadata": {},
                "createdAt": format_timestamp(at(0)), "updatedAt": format_timestamp(at(0)),
            }  # fmt: skip
            mastra.save(sent, info)
        mastra.save([m.wire() for m in conversation("t-corpus-conv", "r-corpus-conv")])
        for turn in range(3):
            text = f'turn {turn}: naïve café 😀 "quoted" \\ back\tslash\n'
            mastra.persist(
                {
                    "threadId": "t-corpus-turns",
                    "resourceId": "r-corpus-turns",
                    "recall": 10,
                    "input": [
                        {
                            "id": f"u{turn}",
                            "role": "user",
                            "createdAt": format_timestamp(at(10 * turn)),
                            "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
                        }
                    ],
                    "response": [
                        {
                            "id": f"a{turn}",
                            "role": "assistant",
                            "createdAt": format_timestamp(at(10 * turn + 1)),
                            "content": {"format": 2, "parts": [{"type": "text", "text": text.upper()}]},
                        }
                    ],
                    "finishReason": "stop",
                }
            )
        docs = client[db_name][MESSAGES].find({}, MESSAGE_PROJECTION).sort([("thread_id", 1), ("id", 1)])
        lines = [base64.b64encode(doc.raw).decode() for doc in docs]
    finally:
        client.drop_database(db_name)
        client.close()
    OUT.write_text("".join(f"{line}\n" for line in lines))
    print(f"wrote {len(lines)} documents to {OUT}")


if __name__ == "__main__":
    main()

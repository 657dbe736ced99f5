"""Re-record tests/data/mastra_versions/: the rows real published Mastra versions write, one file per version.

For each version in `VERSIONS` this installs `@mastra/core`, `@mastra/memory` and `@mastra/mongodb` (exact
pins) into `.cache/mastra-versions/<label>/` (git-ignored), runs tests/interop/record_mastra_rows.mjs there
(its imports resolve to that version) against a fresh database, and dumps the stored `mastra_threads` and
`mastra_messages` documents as canonical extended JSON (every BSON type kept: Date, Int32/64, ObjectId).
The database is dropped afterwards. The recorded files are the corpus; this need not run in CI:

    set -a; source /tmp/stack.env; set +a   # or: eval "$(deploy/local/stack env)"
    .venv/bin/python -m tests.interop.record_mastra_rows [label ...]

The 1.x packages declare `engines.node >= 22.13`; they run on Node 20 for this (as tests/interop's do).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from bson import json_util
from pymongo import MongoClient

ROOT: Final = Path(__file__).resolve().parents[2]
OUT: Final = ROOT / "tests" / "data" / "mastra_versions"
CACHE: Final = ROOT / ".cache" / "mastra-versions"
SCRIPT: Final = Path(__file__).with_name("record_mastra_rows.mjs")

# label -> exact versions (@mastra/mongodb's peer range of @mastra/core decides the pairs)
VERSIONS: Final[dict[str, dict[str, str]]] = {
    # the first @mastra/mongodb on npm; ISO-string dates, JSON-string thread metadata, insert not upsert;
    # its store still writes v1 messages (format 'v1')
    "0.10": {"@mastra/core": "0.10.15", "@mastra/memory": "0.10.3", "@mastra/mongodb": "0.10.3"},
    # the last 0.x
    "0.24": {"@mastra/core": "0.24.9", "@mastra/memory": "0.15.13", "@mastra/mongodb": "0.14.10"},
    # 1.0 (the only 1.0 @mastra/mongodb published is 1.0.0-beta.6, peer `>=1.0.0-0 <2`)
    "1.0": {"@mastra/core": "1.0.4", "@mastra/memory": "1.0.0", "@mastra/mongodb": "1.0.0-beta.6"},
    # the versions the service follows (tests/interop/mastra-mongodb)
    "1.71": {"@mastra/core": "1.71.0", "@mastra/memory": "1.31.0", "@mastra/mongodb": "1.19.0"},
}
ZOD: Final = "3.25.76"
CANONICAL: Final = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL, tz_aware=True)


def install(label: str) -> Path:
    """The version's directory with its packages installed (once: kept while package.json is unchanged)."""
    folder = CACHE / label
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {
        "name": f"mastra-rows-{label}",
        "private": True,
        "type": "module",
        "dependencies": {**VERSIONS[label], "zod": ZOD},
    }
    text = json.dumps(manifest, indent=2) + "\n"
    package = folder / "package.json"
    if not package.exists() or package.read_text() != text or not (folder / "node_modules").is_dir():
        package.write_text(text)
        npm = shutil.which("npm")
        assert npm is not None, "npm is not on PATH"
        verb = [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"]
        subprocess.run(verb, cwd=folder, check=True)
    shutil.copyfile(SCRIPT, folder / "record.mjs")
    return folder


def dump(client: MongoClient[dict[str, Any]], db_name: str, collection: str) -> list[dict[str, Any]]:
    """The collection's documents, in a stable order (thread, date, id); `_id` kept as stored."""
    docs = list(client[db_name][collection].find({}))
    key = "id" if collection == "mastra_threads" else "thread_id"
    return sorted(docs, key=lambda d: (str(d.get(key)), str(d.get("createdAt")), str(d.get("id"))))


def record(label: str, uri: str) -> Path:
    folder = install(label)
    db_name = f"mastra_rows_{label.replace('.', '_')}_{secrets.token_hex(4)}"
    client: MongoClient[dict[str, Any]] = MongoClient(uri, tz_aware=True)
    try:
        node = shutil.which("node")
        assert node is not None, "node is not on PATH"
        run = subprocess.run(
            [node, "record.mjs", db_name, label],
            cwd=folder,
            env={**os.environ, "MONGODB_URI": uri},
            capture_output=True,
            timeout=300,
            check=False,
        )
        if run.returncode != 0:
            raise SystemExit(f"{label}: {run.stderr.decode(errors='replace')[-4000:]}")
        corpus = {
            "mastra": {**VERSIONS[label]},
            "threads": dump(client, db_name, "mastra_threads"),
            "messages": dump(client, db_name, "mastra_messages"),
        }
    finally:
        client.drop_database(db_name)
        client.close()
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"mastra-{label}.json"
    out.write_text(json_util.dumps(corpus, json_options=CANONICAL, indent=1, ensure_ascii=False) + "\n")
    print(f"{label}: {len(corpus['threads'])} threads, {len(corpus['messages'])} messages -> {out}")
    return out


def main(labels: list[str]) -> None:
    uri = os.environ["MONGODB_URI"]
    for label in labels or list(VERSIONS):
        record(label, uri)


if __name__ == "__main__":
    main(sys.argv[1:])

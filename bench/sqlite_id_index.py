"""Give a local FerretDB v1 on SQLite the `_id` index its own queries can use.

FerretDB 1.24 creates each collection's unique `_id_` index on the expression `_ferretdb_sjson->"_id"`, but
pushes `{_id: <string>}` filters down as `WHERE _ferretdb_sjson->'$._id' = ?`. SQLite only uses an expression
index for the same expression, so every lookup and every upsert by `_id` scans the whole table: a bulk of 50
upserts took 151 ms at 1,000 rows and 2,680 ms at 20,000 (the same 39 ms at both with this index). MongoDB
finds by `_id` through its index, so without this the persist lines would measure FerretDB's scan, growing
with the collection, and a long persist soak would never finish.

The fix is one more SQLite index per table, on the pushed-down expression, created directly in the server's
database file (SQLite's WAL lets a second connection do this while FerretDB runs). FerretDB does not know of
it and does not need to: SQLite keeps it up to date, and dropping the collection drops it. Only a FerretDB
process on this machine started with `-sqlite-url file:<dir>/` is touched; anything else is left alone.
"""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

# What FerretDB 1.24's SQLite backend writes in its WHERE clause for an `_id` filter (metadata.IDColumn).
_PUSHED_DOWN_ID = "_ferretdb_sjson->'$._id'"
_SUFFIX = "__id_pushdown"


def sqlite_dir(pid: int | None) -> Path | None:
    """The SQLite directory of the FerretDB process `pid`, from its `-sqlite-url file:<dir>/` argument."""
    if pid is None:
        return None
    try:
        argv = [part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return None
    for flag, value in itertools.pairwise(argv):
        if flag.lstrip("-") == "sqlite-url" and value.startswith("file:"):
            path = Path(value.removeprefix("file:").split("?", 1)[0])
            return path if path.is_dir() else None
    return None


def add_id_indexes(data_dir: Path, database: str) -> list[str]:
    """Index the pushed-down `_id` expression on every collection of `database`; the tables indexed."""
    path = data_dir / f"{database}.sqlite"
    if not path.is_file():
        return []
    connection = sqlite3.connect(path, timeout=30)
    try:
        tables = [str(row[0]) for row in connection.execute("SELECT table_name FROM _ferretdb_collections")]
        for table in tables:
            index = _quote(table + _SUFFIX)
            connection.execute(f"CREATE INDEX IF NOT EXISTS {index} ON {_quote(table)} ({_PUSHED_DOWN_ID})")
        connection.commit()
    finally:
        connection.close()
    return tables


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'

"""The ledger's two databases behind one small interface: SQLite (a file, the embedded default) and PostgreSQL
(a server several machines and processes write to at once, psycopg 3).

The ledger writes SQLite's dialect: `?` parameters, INSERT OR IGNORE, INTEGER PRIMARY KEY ids, REAL times.
The PostgreSQL side translates those few forms, and gives every insert its id back with RETURNING. Both run
each write in its own transaction (SQLite: BEGIN IMMEDIATE; PostgreSQL: a transaction per block), so several
writers never interleave half a record.
"""
from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path
from typing import Any, Iterator, Protocol

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class DatabaseError(RuntimeError):
    """The database refused a statement or could not be reached; the message says which and why."""


class Database(Protocol):
    """What the ledger needs of a database."""

    location: str  # what to show a person: a file path, or the URL without its password

    def execute(self, sql: str, args: tuple = ()) -> Any:
        """Run one statement (SQLite dialect); returns a cursor (fetchone, fetchall, iteration, description)."""

    def insert(self, sql: str, args: tuple = ()) -> int:
        """Run one INSERT; returns the new row's id."""

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """A block whose statements commit together or not at all."""

    def columns(self, table: str) -> set[str]:
        """The table's column names."""

    def close(self) -> None:
        """Close the connection."""


def is_postgres(location: str | Path) -> bool:
    """Whether a --ledger value names a PostgreSQL server rather than a SQLite file."""
    return str(location).startswith(POSTGRES_SCHEMES)


def without_password(url: str) -> str:
    """A PostgreSQL URL fit for messages and names: its password replaced by ***."""
    return re.sub(r"://([^:/@]+):[^@/]*@", r"://\1:***@", url)


class SQLiteDatabase:
    """One SQLite file in WAL mode, autocommit outside explicit transactions."""

    def __init__(self, path: Path, readonly: bool = False) -> None:
        self.location = str(path)
        try:
            if readonly:  # a reader beside a running loop (the dashboard): SQLite itself refuses every write
                self.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30,
                                          isolation_level=None, check_same_thread=False)
            else:
                self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=FULL")  # a committed probe survives power loss, not just kill -9
        except sqlite3.DatabaseError as err:
            raise DatabaseError(str(err)) from None

    def execute(self, sql: str, args: tuple = ()) -> Any:
        try:
            return self.db.execute(sql, args)
        except sqlite3.DatabaseError as err:
            raise DatabaseError(str(err)) from None

    def script(self, sql: str) -> None:
        """Several statements without parameters (the schema)."""
        try:
            self.db.executescript(sql)
        except sqlite3.DatabaseError as err:
            raise DatabaseError(str(err)) from None

    def insert(self, sql: str, args: tuple = ()) -> int:
        return int(self.execute(sql, args).lastrowid or 0)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.execute("ROLLBACK")
            raise
        self.execute("COMMIT")

    def columns(self, table: str) -> set[str]:
        return {row[1] for row in self.execute(f"PRAGMA table_info({table})")}

    def close(self) -> None:
        self.db.close()


class PostgresDatabase:
    """A PostgreSQL database reached by URL (psycopg 3, the optional extra `infragent[postgres]`)."""

    def __init__(self, url: str, readonly: bool = False) -> None:
        self.location = without_password(url)
        try:
            import psycopg
        except ImportError:
            raise DatabaseError("a PostgreSQL ledger needs psycopg 3: pip install 'infragent[postgres]'") from None
        self._errors = psycopg.Error
        try:
            self.db = psycopg.connect(url, autocommit=True, connect_timeout=30)
            if readonly:
                self.db.execute("SET default_transaction_read_only = on")
        except psycopg.Error as err:
            raise DatabaseError(f"cannot connect: {_one_line(err)}") from None

    def execute(self, sql: str, args: tuple = ()) -> Any:
        try:
            return self.db.execute(_dialect(sql), args)
        except self._errors as err:
            raise DatabaseError(_one_line(err)) from None

    def script(self, sql: str) -> None:
        """Several statements without parameters (the schema), in one transaction."""
        with self.transaction():
            for statement in filter(str.strip, sql.split(";")):
                self.execute(statement)

    def insert(self, sql: str, args: tuple = ()) -> int:
        return int(self.execute(sql + " RETURNING id", args).fetchone()[0])

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            with self.db.transaction():
                yield
        except self._errors as err:
            raise DatabaseError(_one_line(err)) from None

    def columns(self, table: str) -> set[str]:
        rows = self.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ?", (table,))
        return {r[0] for r in rows}

    def close(self) -> None:
        self.db.close()


def postgres_schema(sqlite_schema: str) -> str:
    """The SQLite schema in PostgreSQL's types: 64-bit serial ids, double-precision times, bytes as BYTEA."""
    sql = sqlite_schema.replace("INTEGER PRIMARY KEY", "BIGSERIAL PRIMARY KEY")
    sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
    sql = re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)
    return sql.replace("BLOB", "BYTEA")


def _dialect(sql: str) -> str:
    """SQLite's forms the ledger uses, in PostgreSQL's: %s parameters, ON CONFLICT DO NOTHING."""
    if sql.startswith("INSERT OR IGNORE INTO"):
        sql = sql.replace("INSERT OR IGNORE INTO", "INSERT INTO", 1) + " ON CONFLICT DO NOTHING"
    return sql.replace("%", "%%").replace("?", "%s")


def _one_line(err: Exception) -> str:
    """A server's multi-line message as one line."""
    return " ".join(str(err).split())

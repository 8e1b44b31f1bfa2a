"""Opening the database of calls: the engine, and the schema migrated to this code's newest revision.

The control plane calls :func:`open_database` at start-up, so nobody migrates by hand. Alembic's API runs
programmatically on the opened connection, with the scripts shipped in ``migrations/``. A database whose revision
these scripts do not know was migrated by a newer gateway: it is left untouched and start-up refuses
(:class:`DatabaseTooNewError`). On PostgreSQL an advisory lock makes control-plane processes starting together
migrate one after the other.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gateway.records.errors import DatabaseError, DatabaseTooNewError

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_MIGRATION_LOCK = 0x6761_7465  # pg_advisory_xact_lock key: "gate"

# The async driver of each engine a URL may name without one.
_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg"}


def sqlite_url(path: Path) -> str:
    """The URL of a SQLite database file (the embedded default: ``GATEWAY_STATE_DIR``/calls.db)."""
    return f"sqlite+aiosqlite:///{path}"


def async_url(url: str) -> str:
    """``url`` with the async driver of its engine (``postgresql://`` -> ``postgresql+asyncpg://``)."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError as exc:
        raise DatabaseError(f"GATEWAY_DATABASE_URL is not a database URL: {exc}") from None
    driver = _DRIVERS.get(parsed.drivername)
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    if parsed.drivername not in ("sqlite+aiosqlite", "postgresql+asyncpg"):
        raise DatabaseError(
            f"GATEWAY_DATABASE_URL names {parsed.drivername!r}: use sqlite:///PATH or postgresql://USER@HOST/DB"
        )
    return parsed.render_as_string(hide_password=False)


def alembic_config(connection: sa.Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def known_revisions() -> tuple[set[str], str]:
    """Every revision the shipped scripts know, and the newest."""
    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    assert head is not None
    return {rev.revision for rev in script.walk_revisions()}, head


def current_revision(connection: sa.Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def migrate(connection: sa.Connection, target: str = "head") -> tuple[str | None, str]:
    """Upgrade the schema to ``target`` on a sync connection; (revision before, revision after)."""
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
    known, head = known_revisions()
    before = current_revision(connection)
    if before is not None and before not in known:
        raise DatabaseTooNewError(before, head)
    command.upgrade(alembic_config(connection), target)
    return before, current_revision(connection) or ""


class Database:
    """The engine of the database of calls, migrated; ``aclose()`` disposes of its connections."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    async def revision(self) -> str | None:
        async with self.engine.connect() as connection:
            return await connection.run_sync(current_revision)

    async def aclose(self) -> None:
        await self.engine.dispose()


def create_engine(url: str) -> AsyncEngine:
    url = async_url(url)
    options: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        path = make_url(url).database
        if path and path != ":memory:":
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, **options)

        @sa.event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            # WAL: the history API reads while the writer writes; a busy database waits a while before failing.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_async_engine(url, pool_size=5, max_overflow=5, pool_timeout=10, **options)


async def open_database(url: str, *, target: str = "head") -> Database:
    """Open the database at ``url`` and migrate its schema to ``target`` (the newest by default).

    Raises :class:`DatabaseTooNewError` for a database a newer gateway migrated, :class:`DatabaseError` when it
    cannot be reached or migrated (the message names the URL without its password).
    """
    engine = create_engine(url)
    shown = make_url(async_url(url)).render_as_string(hide_password=True)
    try:
        async with engine.begin() as connection:
            before, after = await connection.run_sync(migrate, target)
    except DatabaseError:
        await engine.dispose()
        raise
    except (SQLAlchemyError, OSError) as exc:
        await engine.dispose()
        raise DatabaseError(f"cannot open the database of calls at {shown}: {exc}") from exc
    if before != after:
        log.info("database of calls at %s migrated from %s to %s", shown, before or "empty", after)
    else:
        log.info("database of calls at %s is at revision %s", shown, after)
    return Database(engine)

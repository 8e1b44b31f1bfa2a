"""Alembic's environment for the database of calls: run only programmatically, by
:func:`gateway.records.database.open_database`, on the connection it hands over (never from an ini file)."""

from __future__ import annotations

from alembic import context

from gateway.records.schema import metadata

connection = context.config.attributes["connection"]
# Batch mode: SQLite alters a table by copying it; PostgreSQL alters in place.
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

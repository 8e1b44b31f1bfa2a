"""The database of calls: ended calls, their transcripts and tool calls, kept for ``GATEWAY_RETENTION_DAYS``.

The control plane owns it (SQLAlchemy 2 async; SQLite by default, PostgreSQL in a cluster). The schema is migrated
at start-up with Alembic (:func:`open_database`); records are written off the call path by a :class:`RecordWriter`
(bounded, retried); :mod:`gateway.records.history` answers the ops API's history queries.
"""

from gateway.records.database import Database, open_database, sqlite_url
from gateway.records.errors import DatabaseError, DatabaseTooNewError
from gateway.records.history import HistoryQuery, SortKey
from gateway.records.models import CallRecord, ToolCallLine
from gateway.records.retention import RetentionJob
from gateway.records.writer import RecordWriter

__all__ = [
    "CallRecord",
    "Database",
    "DatabaseError",
    "DatabaseTooNewError",
    "HistoryQuery",
    "RecordWriter",
    "RetentionJob",
    "SortKey",
    "ToolCallLine",
    "open_database",
    "sqlite_url",
]

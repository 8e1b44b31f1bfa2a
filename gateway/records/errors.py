"""Errors of the database of calls.

    DatabaseError                 the database cannot be opened or migrated (start-up refuses to go on)
    └── DatabaseTooNewError       it was migrated by a newer gateway: its revision is unknown to this code

Write failures at run time are not raised to callers: the :class:`gateway.records.RecordWriter` counts them,
logs them and retries.
"""

from __future__ import annotations


class DatabaseError(Exception):
    """The database of calls cannot be used; the message says why and what to do."""


class DatabaseTooNewError(DatabaseError):
    """The database's schema revision is not one this code knows: a newer gateway migrated it."""

    def __init__(self, revision: str, head: str) -> None:
        self.revision = revision
        self.head = head
        super().__init__(
            f"the database of calls is at schema revision {revision!r}, which this gateway does not know (its newest "
            f"is {head!r}): a newer gateway migrated it. Run that version, or point GATEWAY_DATABASE_URL at another "
            "database; this one is left untouched"
        )

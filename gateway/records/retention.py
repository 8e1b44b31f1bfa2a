"""Retention: records of calls that ended more than ``GATEWAY_RETENTION_DAYS`` ago are deleted, by a job the
control plane owns (one process of a fleet at a time, through the state store's lease), and their recordings'
files with them (once their records are gone, so a record never points at a deleted file)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway.observability import DB_RECORDS_EXPIRED_TOTAL
from gateway.records.database import Database
from gateway.records.history import delete_ended_before
from gateway.records.outbox import delete_settled_before

log = logging.getLogger(__name__)

DAY_S = 86_400.0


class RetentionJob:
    """Deletes expired records every ``interval_s`` (``run()``) or once (``sweep()``)."""

    def __init__(
        self,
        database: Database,
        *,
        retention_days: float,
        interval_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        lease: Callable[[float], Awaitable[bool]] | None = None,
        recordings_dir: Path | None = None,
    ) -> None:
        self.database = database
        self.retention_days = retention_days
        self.interval_s = interval_s
        self._clock = clock
        self._lease = lease
        self.recordings_dir = recordings_dir

    async def sweep(self) -> int:
        """Delete the records that ended before the retention window; how many."""
        cutoff = self._clock() - self.retention_days * DAY_S
        paths: list[str] = []
        deleted = await delete_ended_before(self.database, cutoff, recordings=paths)
        if paths and self.recordings_dir is not None:
            await asyncio.to_thread(remove_recordings, self.recordings_dir, paths)
        # The event webhooks' delivery log goes with the records (rows still to deliver stay).
        await delete_settled_before(self.database, cutoff)
        if deleted:
            DB_RECORDS_EXPIRED_TOTAL.inc(deleted)
            log.info("retention: deleted %d call records older than %g days", deleted, self.retention_days)
        return deleted

    async def run(self) -> None:
        while True:
            try:
                if self._lease is None or await self._lease(self.interval_s * 2):
                    await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("retention sweep of the database of calls failed; next try in %.0f s", self.interval_s)
            await asyncio.sleep(self.interval_s)


def remove_recordings(directory: Path, paths: list[str]) -> int:
    """Delete recording files named relative to ``directory`` (never outside it); how many were there."""
    root = directory.resolve()
    removed = 0
    for relative in paths:
        path = (root / relative).resolve()
        if not path.is_relative_to(root):
            log.warning("retention: recording path %r is outside the recordings directory; left alone", relative)
            continue
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("retention: recording %s cannot be deleted: %s", path, exc)
    return removed

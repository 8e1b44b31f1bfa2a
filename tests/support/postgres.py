"""A PostgreSQL server for tests: Debian's `postgresql`, on 127.0.0.1 and a free port, in its own temp dir.

The server refuses to run as root, and CI runs as root: the directory is given to the ``postgres`` user and
``initdb``/``pg_ctl`` run as that user (``runuser``). Trust authentication on loopback only; the superuser is
``gw``. ``pg_ctl`` starts and stops it (waiting for it to accept connections or to be gone); a test may stop it
mid-test (``stop()``) and start it again (``start()``) on the same data and port.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.peers import unavailable
from tests.support.procs import free_ports

__all__ = ["PostgresServer", "postgres_bin"]

USER = "gw"


def postgres_bin() -> Path:
    """The newest installed server's bin directory, or skip (fail under CI=true) naming the package."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        unavailable("PostgreSQL is not installed (apt-get install postgresql; `make test` does this as root)")
    return Path(found[-1]).parent


class PostgresServer:
    """``with PostgresServer() as pg: pg.url("db")``; ``pg.stop()`` / ``pg.start()`` in between."""

    def __init__(self, *, name: str = "pg") -> None:
        self.bin = postgres_bin()
        self.port = free_ports(1)[0]
        self.dir = Path(tempfile.mkdtemp(prefix=f"gateway-{name}-"))
        self.data = self.dir / "data"
        self._as_postgres: list[str] = []
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                unavailable("PostgreSQL's `postgres` user does not exist (apt-get install postgresql)")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self._as_postgres = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", USER, "--no-sync", "-E", "UTF8", "--locale=C")
        self.running = False

    def _run(self, program: str, *args: str, timeout: float = 60.0) -> str:
        argv = [*self._as_postgres, str(self.bin / program), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresServer:
        options = f"-k {self.dir} -h 127.0.0.1 -p {self.port} -c fsync=off -c full_page_writes=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "-t", "60", "start")
        self.running = True
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate``: as if it crashed); ``pg_ctl`` waits until it is gone."""
        if self.running:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
            self.running = False

    def create_database(self, name: str) -> str:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name)
        return self.url(name)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

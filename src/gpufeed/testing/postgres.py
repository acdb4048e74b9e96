"""A throwaway PostgreSQL server for tests and benchmarks.

:class:`PostgresServer` runs ``initdb`` and ``pg_ctl`` from the machine's
PostgreSQL (``PATH``, else ``/usr/lib/postgresql/*/bin``) on a temporary
folder and a free port on 127.0.0.1, with ``trust`` authentication for the
user ``gpufeed``. PostgreSQL refuses to run as root, so as root every command
runs as the package's ``postgres`` user (``runuser -u postgres --``) with the
folder given to it. Durability settings are off (``fsync``,
``synchronous_commit``, ``full_page_writes``): this server holds test data only.

Used by the test suite's fixtures (``tests/conftest.py``) and by
``gpufeed bench catalog``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PostgresServer", "find_pg_bin", "PostgresMissing"]

_START_TIMEOUT_S = 60


class PostgresMissing(RuntimeError):
    """No PostgreSQL server programs (``initdb``, ``pg_ctl``) on this machine."""


def find_pg_bin() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl``.

    Raises:
        PostgresMissing: neither ``PATH`` nor ``/usr/lib/postgresql/*/bin`` has them.
    """
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(folder, "initdb"), os.X_OK):
            return Path(folder)
    raise PostgresMissing("PostgreSQL is not installed (no initdb on PATH nor in /usr/lib/postgresql/*/bin); "
                          "install the postgresql package")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One PostgreSQL server on a temporary folder; :meth:`start` it, :meth:`close` it.

    Args:
        user: the superuser made by ``initdb`` (connections need no password).
        durable: keep PostgreSQL's durability settings (``fsync``,
            ``synchronous_commit``); off by default, as tests need no durability.

    Attributes:
        port: its TCP port on 127.0.0.1 (0 until started).
        folder: its data folder.
    """

    def __init__(self, user: str = "gpufeed", *, durable: bool = False) -> None:
        self.bin = find_pg_bin()
        self.user = user
        self.durable = durable
        self.port = 0
        self.folder = Path(tempfile.mkdtemp(prefix="gpufeed-pg-"))
        self._as: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses root: run it as its package's user
            pw = pwd.getpwnam("postgres")
            os.chown(self.folder, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._dbs = 0

    def _run(self, *args: str, timeout_s: float = _START_TIMEOUT_S) -> None:
        cmd = [*self._as, str(self.bin / args[0]), *args[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        if out.returncode != 0:
            log = self.folder / "log"
            tail = log.read_text(errors="replace")[-2000:] if os.access(log, os.R_OK) else ""
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}\n{tail}")

    def start(self) -> "PostgresServer":
        """Make the cluster (first time) and start the server; returns ``self``."""
        data = self.folder / "data"
        if not data.exists():
            self._run("initdb", "-D", str(data), "-A", "trust", "-U", self.user, "-E", "UTF8",
                      "--locale=C.UTF-8" if _has_c_utf8() else "--locale=C", "--no-sync")
        self.port = self.port or _free_port()
        opts = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not self.durable:
            opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run("pg_ctl", "-D", str(data), "-o", opts, "-l", str(self.folder / "log"), "-w", "start")
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown: open connections are cut); :meth:`start` starts it again."""
        self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "fast", "-w", "stop")

    def url(self, dbname: str = "postgres") -> str:
        """The connection URL of database ``dbname``."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, prefix: str = "db") -> str:
        """Create an empty database; returns its URL."""
        import psycopg

        self._dbs += 1
        name = f"{prefix}_{os.getpid()}_{self._dbs}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0 ENCODING \'UTF8\'')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop the database ``url`` names (its connections are cut)."""
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        """Stop the server (if running) and delete its folder."""
        try:
            self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop", timeout_s=30)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        for _ in range(3):
            shutil.rmtree(self.folder, ignore_errors=True)
            if not self.folder.exists():
                break
            time.sleep(0.1)

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _has_c_utf8() -> bool:
    out = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False).stdout.lower()
    return "c.utf8" in out or "c.utf-8" in out

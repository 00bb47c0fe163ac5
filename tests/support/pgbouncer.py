"""A real PgBouncer (Debian's package) in transaction mode in front of the test server.

Started per test on a free port with a pool of one server connection, so every client
transaction shares that connection: anything lcm left behind in a session (a prepared
statement, a SET) would surface at once in another client's transaction.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from tests.support.pg_cluster import free_port


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None)


def why_not_available() -> str | None:
    """Why a PgBouncer cannot be started here (None: it can)."""
    if pgbouncer_binary() is None:
        return "pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "pgbouncer refuses to run as root and runuser is missing"
    return None


class Bouncer:
    """PgBouncer on 127.0.0.1:<port>, database ``lcm`` mapped to a fresh server database."""

    def __init__(self, server_url: str, *, pool_size: int = 1, max_client_conn: int = 200):
        self.server = make_url(server_url)
        self.dbname = "lcm_pgb_" + uuid.uuid4().hex[:10]
        self.root = Path(tempfile.mkdtemp(prefix="lcm-pgbouncer-"))
        self.port = free_port()
        self._admin("CREATE DATABASE " + self.dbname)
        user = self.server.username or "postgres"
        (self.root / "users.txt").write_text(f'"{user}" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"lcm = host={self.server.host or '127.0.0.1'} port={self.server.port or 5432} dbname={self.dbname}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = trust\n"
            "log_connections = 0\nlog_disconnections = 0\n"
            f"auth_file = {self.root / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\n"
            f"max_client_conn = {max_client_conn}\n"
            "listen_backlog = 4096\n"
            f"admin_users = {user}\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n")
        cmd = [str(pgbouncer_binary()), str(self.root / "pgbouncer.ini")]
        if shutil.which("prlimit"):  # room for every client and server connection (the default is 1,024 files)
            cmd = [str(shutil.which("prlimit")), f"--nofile={max_client_conn + 256}", *cmd]
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            for f in self.root.iterdir():
                shutil.chown(f, "postgres", "postgres")
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # stderr to a file, never a pipe: nobody reads a pipe while PgBouncer runs, and once its
        # log lines fill the pipe's 64 KiB, PgBouncer blocks in write() and stops serving.
        self._stderr = open(self.root / "stderr.log", "wb")  # closed in close()
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._stderr)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                said = (self.root / "stderr.log").read_text(errors="replace")
                raise RuntimeError(f"pgbouncer exited: {said} {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("pgbouncer did not listen within 20 s: " + self.log())

    def show(self, what: str) -> list[dict[str, object]]:
        """``SHOW <what>`` on PgBouncer's admin console (POOLS, CLIENTS, STATS, ...)."""
        import psycopg

        user = self.server.username or "postgres"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} dbname=pgbouncer user={user} connect_timeout=10",
                             autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            cur = conn.execute(f"SHOW {what}")
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def url(self) -> str:
        """The URL lcm is given: the pooler, not the server."""
        user = self.server.username or "postgres"
        return f"postgresql+psycopg://{user}@127.0.0.1:{self.port}/lcm"

    @property
    def direct_url(self) -> str:
        """The same database on the server itself (for the upgrade and for checks)."""
        return self.server.set(database=self.dbname).render_as_string(hide_password=False)

    def _admin(self, sql: str) -> None:
        admin = create_engine(self.server.set(database="postgres"), poolclass=NullPool,
                              isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(sql)
        finally:
            admin.dispose()

    def close(self) -> None:
        self._stderr.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._admin(f"DROP DATABASE IF EXISTS {self.dbname} WITH (FORCE)")
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def running_bouncer(server_url: str, **kw: int) -> Iterator[Bouncer]:
    bouncer = Bouncer(server_url, **kw)
    try:
        yield bouncer
    finally:
        bouncer.close()

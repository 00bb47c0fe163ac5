"""A private PostgreSQL cluster for tests that stop, restart or replicate a server (the shared
test server is never touched): ``initdb`` + ``pg_ctl`` as the ``postgres`` user on a free
loopback port, and a streaming replica of it made with ``pg_basebackup -R``."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def pg_bin(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cannot_run_a_cluster() -> str | None:
    """Why this machine cannot run a private cluster, or None."""
    if os.geteuid() != 0 or not pg_bin("initdb") or not pg_bin("pg_basebackup") or not shutil.which("runuser"):
        return "needs root, runuser and PostgreSQL's initdb/pg_ctl/pg_basebackup to run a private cluster"
    return None


def _as_postgres(*cmd: str | None, timeout: int = 120) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *map(str, cmd)], check=True, capture_output=True,
                   timeout=timeout)


class Cluster:
    """A throwaway PostgreSQL cluster run as the ``postgres`` user (trust auth, loopback only).
    ``replica_of``: instead of ``initdb``, a streaming copy of that running cluster."""

    def __init__(self, replica_of: Cluster | None = None, settings: dict[str, str] | None = None) -> None:
        self.settings = dict(settings or {})
        self.root = Path(tempfile.mkdtemp(prefix="lcm-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        shutil.chown(self.root, "postgres", "postgres")
        if replica_of is None:
            _as_postgres(pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                         "--no-sync", "-E", "UTF8")
        else:
            _as_postgres(pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(replica_of.port), "-U", "postgres",
                         "-D", str(self.data), "-R", "-X", "stream", "-c", "fast", timeout=300)
        self.start()

    def _ctl(self, *args: str) -> None:
        _as_postgres(pg_bin("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args)

    def start(self) -> None:
        extra = "".join(f" -c {k}={v}" for k, v in self.settings.items())
        self._ctl("-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off{extra}",
                  "-l", str(self.root / "log"), "start")

    @property
    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def stop(self) -> None:
        self._ctl("-m", "fast", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def close(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)

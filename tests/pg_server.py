"""A private PostgreSQL server for the tests: `initdb` + `pg_ctl` in a temporary folder, on 127.0.0.1.

`PostgresServer.start()` makes a cluster with one password-protected superuser (scram-sha-256, so
the password really is checked), listening on a free loopback port and on a Unix socket in its own
folder (nothing under /var/run is touched), small and bounded (`max_connections`, `shared_buffers`);
`stop()` stops it (`pg_ctl stop -m immediate`) and removes the folder. `fresh_database()` creates an
empty database per test and returns its URL. `shut_down()` and `start_again()` stop the server
(`pg_ctl stop -m fast`: every connection is cut) and start it on the same port and data folder.

The binaries are found on PATH or under /usr/lib/postgresql/<version>/bin (Debian's `postgresql`
package). `initdb` refuses to run as root: as root, the cluster belongs to the `postgres` user
(created by that package) and its commands run through `runuser`. No binaries: `missing()` says why,
and the fixtures skip with that reason.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from waiting import wait_for

USER, PASSWORD = "hermes", "pg-test-" + uuid.uuid4().hex[:12]


def binaries() -> Path | None:
    """The folder of initdb and pg_ctl: the newest Debian version's, or PATH's."""
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found and shutil.which("pg_ctl") else None


def _version(folder: str) -> float:
    try:
        return float(Path(folder).parent.name)
    except ValueError:
        return 0.0


def missing() -> str | None:
    """Why no server can be started here, or None."""
    if binaries() is None:
        return "PostgreSQL is not installed (no initdb/pg_ctl; apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` user to own a cluster"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'hermes-kernel[postgres]')"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="hermes-pg-"))
        self.data = self.folder / "data"
        self.port = _free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:  # initdb will not run as root: the cluster is the postgres user's
            owner = pwd.getpwnam("postgres")
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, tool: str, *args: str) -> None:
        folder = binaries()
        assert folder is not None
        subprocess.run([*self._as, str(folder / tool), *args], check=True, capture_output=True, timeout=60)

    def start(self) -> PostgresServer:
        secret = self.folder / "password"
        secret.write_text(PASSWORD)
        if self._as:
            shutil.chown(secret, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", USER, f"--pwfile={secret}", "--auth=scram-sha-256",
                  "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync")  # fmt: skip
        secret.unlink()
        self._options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self.folder} "
                   "-c max_connections=60 -c shared_buffers=16MB -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off")  # fmt: skip
        self.start_again()
        return self

    def start_again(self) -> None:
        """Start the server (again) on the same port and data folder; returns once it answers."""
        self._run("pg_ctl", "-D", str(self.data), "-o", self._options, "-l", str(self.folder / "log"),
                  "-w", "-t", "60", "start")  # fmt: skip
        self._wait_ready()

    def shut_down(self, mode: str = "fast") -> None:
        """`pg_ctl stop -m fast`: sessions are ended, the server is down until `start_again`."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def _wait_ready(self, timeout: float = 30.0) -> None:
        import psycopg

        def answers() -> bool:
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                return False

        wait_for(answers, timeout, "PostgreSQL to take connections", interval=0.05)

    def url(self, database: str = "postgres", *, password: bool = True) -> str:
        credentials = f"{USER}:{PASSWORD}" if password else USER
        return f"postgresql://{credentials}@127.0.0.1:{self.port}/{database}"

    def fresh_database(self) -> str:
        """A new empty database; its URL (password included)."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            if self.data.exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def without_database_environment(monkeypatch: Any, folder: Path) -> None:
    """A test's environment without this machine's HERMES_*, FEISHU_* and PG* variables, run in
    `folder` (for the tests that check what the configuration and the environment give)."""
    for name in list(os.environ):
        if name.startswith(("HERMES_", "FEISHU_", "PG")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(folder)

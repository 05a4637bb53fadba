"""A throwaway PostgreSQL server for the tests that need one: initdb in a temporary directory,
started with pg_ctl on a Unix socket there (no TCP port, nothing shared), stopped afterwards.

Run as root (CI, this machine), the server runs as the ``postgres`` user, as PostgreSQL requires;
otherwise as the current user. Without PostgreSQL's server binaries the tests that use it skip
with how to get them: ``apt-get install postgresql`` (Debian/Ubuntu), or point
``FIRSTPASS_TEST_DSN`` at a server you run yourself (each test creates and drops its own
database there).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SKIP_HOW = (
    "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: apt-get install postgresql "
    "(Debian/Ubuntu), or set FIRSTPASS_TEST_DSN to a server the tests may create databases on"
)


@dataclass(frozen=True)
class PgServer:
    """A running server: ``dsn(db)`` reaches database ``db`` on it."""

    base_dsn: str

    def dsn(self, database: str) -> str:
        sep = "&" if "?" in self.base_dsn else "?"
        return f"{self.base_dsn}{sep}dbname={database}"


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _as_user(cmd: list[str], user: str | None) -> list[str]:
    if user is None:
        return cmd
    runuser = shutil.which("runuser")
    return [runuser, "-u", user, "--", *cmd] if runuser else ["su", user, "-c", " ".join(cmd)]


class LocalPg:
    """A server of our own in a temporary directory, on a Unix socket there: ``start``,
    ``stop`` (immediate: like a crash), ``start`` again on the same data, ``remove``."""

    def __init__(self) -> None:
        initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            pytest.skip(SKIP_HOW)
        self._pg_ctl = pg_ctl
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root without a 'postgres' user to run PostgreSQL as")
            self.user = "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="firstpass-pg-"))
        self.data = self.root / "data"
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        init = self._run(
            [initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        )
        if init.returncode != 0:
            self.remove()
            pytest.fail(f"initdb failed: {init.stderr.strip()[-500:]}")
        self.server = PgServer(base_dsn=f"postgresql://postgres@/?host={self.root}")

    def _run(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            _as_user(cmd, self.user), capture_output=True, text=True, timeout=120, check=False
        )

    def start(self) -> None:
        opts = f"-k {self.root} -c listen_addresses='' -c fsync=off -c max_connections=200"
        log = self.root / "log"
        done = self._run(
            [self._pg_ctl, "-D", str(self.data), "-o", opts, "-l", str(log), "-w", "start"]
        )
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
            pytest.fail(f"pg_ctl start failed: {done.stderr.strip()[-300:]} {tail}")

    def stop(self) -> None:
        """Stop at once (``-m immediate``: no checkpoint, clients cut off, as in a crash)."""
        self._run([self._pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One server for the session (initdb costs seconds); tests take fresh databases on it."""
    external = os.environ.get("FIRSTPASS_TEST_DSN")
    if external:
        yield PgServer(base_dsn=external)
        return
    pg = LocalPg()
    try:
        pg.start()
        yield pg.server
    finally:
        pg.stop()
        pg.remove()


@pytest.fixture
def pg_private() -> Iterator[LocalPg]:
    """A server of this test's own, started, for tests that stop and restart it."""
    if os.environ.get("FIRSTPASS_TEST_DSN"):
        pytest.skip("this test restarts its own PostgreSQL; it needs initdb and pg_ctl")
    pg = LocalPg()
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()
        pg.remove()


@pytest.fixture
def pg_database(pg_server: PgServer) -> Iterator[str]:
    """A fresh, empty database on the session's server; its DSN. Dropped afterwards."""
    import psycopg

    name = f"fp_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_server.dsn(name)
    finally:
        with psycopg.connect(pg_server.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def chain_file(dsn: str, replica: str, out: Path) -> Path:
    """The replica's receipt lines in seq order, as a file for the file verifier; seqs checked
    to be 1..n."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT seq, line FROM firstpass_receipts WHERE replica = %s ORDER BY seq", (replica,)
        ).fetchall()
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1))
    out.write_bytes(b"".join(bytes(line) for _, line in rows))
    return out

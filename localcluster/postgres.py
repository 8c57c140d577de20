"""PostgreSQL (Debian's binaries) with one database, for Optuna studies shared by workers.

initdb and postgres refuse to run as root, so as root they run as the `postgres` user
(subprocess's `user=`, what `runuser -u postgres` does) with a data directory that user owns,
made outside DIR: DIR may sit under a folder only root can enter (pytest's tmp_path does).
The data directory's path is kept in `workdir/datadir` so `down` can remove it. Access is
`trust` on 127.0.0.1 only: a development database, not a production one.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from .procs import Proc, free_port, spawn, wait_until

__all__ = ["start_postgres", "remove_postgres_data"]


def _bindir() -> Path:
    found = shutil.which("pg_ctl") or shutil.which("initdb")
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    if found:
        return Path(found).parent
    raise FileNotFoundError(
        "PostgreSQL is not installed: run `apt-get install -y --no-install-recommends "
        "postgresql` (scripts/setup.sh does)")


def _ready(bindir: Path, host: str, port: int, database: str) -> bool:
    done = subprocess.run([str(bindir / "pg_isready"), "-h", host, "-p", str(port),
                           "-d", database, "-U", "postgres"], capture_output=True)
    return done.returncode == 0


def start_postgres(workdir: str | Path, *, host: str = "127.0.0.1", port: int | None = None,
                   database: str = "optuna", driver: str = "psycopg",
                   timeout: float = 60.0) -> Proc:
    """Initialise and start a PostgreSQL server; returns once `database` accepts connections.

    The returned Proc's `.url` is an SQLAlchemy URL for Optuna's `--storage`
    (`postgresql+psycopg://postgres@127.0.0.1:PORT/optuna`; `driver=""` gives the plain
    libpq form). `.stop()` shuts the server down; `remove_postgres_data(workdir)` deletes it.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    bindir = _bindir()
    user = "postgres" if os.geteuid() == 0 else None
    datadir = Path(tempfile.mkdtemp(prefix="paged-postgres-"))
    (workdir / "datadir").write_text(str(datadir))
    if user:
        entry = pwd.getpwnam(user)
        os.chown(datadir, entry.pw_uid, entry.pw_gid)
    log = workdir / "postgres.log"
    init = subprocess.run([str(bindir / "initdb"), "-D", str(datadir / "data"), "-U", "postgres",
                           "--auth=trust", "--encoding=UTF8", "--no-sync"],
                          capture_output=True, text=True, user=user, group=user,
                          extra_groups=[] if user else None, cwd=datadir)
    if init.returncode != 0:
        raise RuntimeError(f"initdb failed:\n{init.stdout}\n{init.stderr}")
    port = port or free_port(host)
    proc = spawn("postgres", [
        str(bindir / "postgres"), "-D", str(datadir / "data"), "-h", host, "-p", str(port),
        "-k", str(datadir), "-c", "fsync=off", "-c", "max_connections=100"],
        log, user=user, cwd=datadir)
    wait_until(lambda: _ready(bindir, host, port, "postgres"), timeout, "postgres", proc, log)
    made = subprocess.run([str(bindir / "createdb"), "-h", host, "-p", str(port), "-U",
                           "postgres", database], capture_output=True, text=True)
    if made.returncode != 0 and "already exists" not in made.stderr:
        proc.stop()
        raise RuntimeError(f"createdb {database} failed: {made.stderr}")
    scheme = f"postgresql+{driver}" if driver else "postgresql"
    proc.url = f"{scheme}://postgres@{host}:{port}/{database}"
    return proc


def remove_postgres_data(workdir: str | Path) -> None:
    marker = Path(workdir) / "datadir"
    if marker.exists():
        shutil.rmtree(marker.read_text().strip(), ignore_errors=True)
        marker.unlink()

"""`python -m bot admin backup PATH` and `admin restore PATH`.

SQLite: the online backup API (`sqlite3.Connection.backup`) copies the database in one step,
inside one read transaction, so the copy is the database as of one moment even while the
service writes to it (in WAL mode a reader does not block writers). The copy is made in a
scratch file next to PATH, set back to a rollback journal (one self-contained file), checked
with `PRAGMA quick_check` and only then renamed to PATH.

PostgreSQL: `pg_dump --format=custom`, which reads every table in one snapshot transaction;
restored with `pg_restore --clean --if-exists --single-transaction --exit-on-error`, so a
failed restore leaves the database as it was. The password travels in PGPASSWORD, never on a
command line (which `ps` shows) nor in a message.

Beside PATH goes PATH.json, a manifest: the format, the schema revision (alembic_version), the
size and SHA-256 of PATH. `admin restore` reads the revision from the backup itself (the
manifest may be lost or be another backup's) and checks the SHA-256 when the manifest is there.

Restore refuses (exit status 2):
- a database a service is using: a replica whose heartbeat is younger than TAKEOVER_AFTER_S
  (the age at which replicas judge each other dead, bot/db/replicas.py), or a chat lease not
  yet expired; `--force` overrides (for a service known to be gone);
- a backup whose revision this release does not know (made by a newer release): restore it
  with that release. A backup of an older revision is restored and then migrated up to this
  release's head, as `python -m bot db upgrade` would, because the service refuses nothing
  older but needs the head schema, and the migrations are tested on both databases from every
  revision up;
- a backup of the other kind of database (an SQLite file into PostgreSQL or the reverse).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic.script import ScriptDirectory
from sqlalchemy import func, inspect, select, text
from sqlalchemy.engine import URL, make_url

from bot.db import migrate, replicas
from bot.db.dialect import db_now
from bot.db.engine import make_engine, make_sessionmaker, safe_url
from bot.db.models import ChatLease
from bot.reports.admin import AdminError

SQLITE_MAGIC = b"SQLite format 3\x00"
PGDUMP_MAGIC = b"PGDMP"
FORMAT_SQLITE = "sqlite"
FORMAT_PGDUMP = "pg_dump-custom"
# How long the backup waits for SQLite's write lock where it needs one (the service's own
# busy timeout, bot/db/engine.py).
SQLITE_TIMEOUT_S = 15.0
PG_TOOLS_HINT = (
    "install the PostgreSQL client tools (Debian/Ubuntu: `apt-get install postgresql-client`; "
    "their major version must be at least the server's)"
)
TOOL_TIMEOUT_S = 6 * 3600.0


class BackupRefused(AdminError):
    """The backup or restore must not go ahead as asked (exit status 2): the message says why
    and what to do."""


@dataclass(frozen=True)
class Manifest:
    """PATH.json: what a backup holds."""

    format: str
    revision: str | None
    created_at: str
    database: str  # the URL with its password masked
    bytes: int
    sha256: str


def manifest_path(path: Path) -> Path:
    """Where the manifest of the backup at `path` is written."""
    return path.with_name(path.name + ".json")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _scratch(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.partial")


# --- SQLite ------------------------------------------------------------------------------------


def _sqlite_file(url: str | URL) -> Path:
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        raise BackupRefused(f"cannot back up or restore SQLite database {database or ':memory:'!r}")
    return Path(database).expanduser().resolve()


def _sqlite_revision(path: Path) -> str | None:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return _one_revision(conn.execute("SELECT version_num FROM alembic_version").fetchall())
    except sqlite3.OperationalError:  # no alembic_version: a database never migrated
        return None
    finally:
        conn.close()


def _one_revision(rows: Sequence[Sequence[Any]]) -> str | None:
    return str(rows[0][0]) if rows else None


def sqlite_backup(source: Path, target: Path) -> str | None:
    """Copy the SQLite database at `source` to `target` (consistently, while it is in use);
    returns its schema revision."""
    if not source.is_file():
        raise AdminError(
            f"no database at {source}: check DATABASE_URL / DATA_DIR (nothing to back up)"
        )
    scratch = _scratch(target)
    scratch.unlink(missing_ok=True)
    src = sqlite3.connect(source, timeout=SQLITE_TIMEOUT_S)
    try:
        dst = sqlite3.connect(scratch)
        try:
            src.backup(dst)  # pages=-1: every page in one step, one read transaction
            # The copy carries the source's WAL flag; a rollback journal keeps it one file.
            dst.execute("PRAGMA journal_mode=DELETE")
            check = dst.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise AdminError(f"the copy of {source} fails SQLite's quick_check: {check}")
        finally:
            dst.close()
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
    finally:
        src.close()
    os.replace(scratch, target)
    return _sqlite_revision(target)


def sqlite_restore(backup: Path, target: Path) -> None:
    """Replace the contents of the SQLite database at `target` with the backup's (the backup
    API again, backup -> target: one write transaction, so readers see before or after)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    src = sqlite3.connect(f"{backup.as_uri()}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(target, timeout=SQLITE_TIMEOUT_S)
        try:
            # Out of WAL, so that the page size may follow the backup's; that needs the file
            # to itself, so with --force beside a running service it stays in WAL (same page
            # size: both made by SQLite's default).
            with contextlib.suppress(sqlite3.OperationalError):
                dst.execute("PRAGMA journal_mode=DELETE")
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=WAL")
        finally:
            dst.close()
    finally:
        src.close()


# --- PostgreSQL --------------------------------------------------------------------------------


def _pg_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BackupRefused(f"{name} is not installed (or not on PATH): {PG_TOOLS_HINT}")
    return found


def _pg_env(url: str | URL) -> dict[str, str]:
    """libpq's environment for the URL: the password never goes on a command line."""
    u = make_url(url)
    env = dict(os.environ)
    for key, value in (
        ("PGHOST", u.host),
        ("PGPORT", str(u.port) if u.port else None),
        ("PGUSER", u.username),
        ("PGPASSWORD", u.password),
        ("PGDATABASE", u.database),
    ):
        if value:
            env[key] = str(value)
    query = dict(u.query)
    for option, key in (("sslmode", "PGSSLMODE"), ("ssl", "PGSSLMODE"), ("host", "PGHOST")):
        given = query.get(option)
        if isinstance(given, str) and given:
            env[key] = "require" if (option == "ssl" and given == "true") else given
    return env


def _run_tool(args: list[str], url: str | URL, what: str) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            args,
            env=_pg_env(url),
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise AdminError(f"{what} took over {TOOL_TIMEOUT_S:.0f} s and was stopped") from err
    if done.returncode != 0:
        raise _tool_error(done.stderr, url, what)
    return done


def _tool_error(stderr: str, url: str | URL, what: str) -> AdminError:
    message = " ".join(stderr.split())
    password = make_url(url).password
    if password:
        message = message.replace(str(password), "***")
    if "server version mismatch" in message or "unsupported version" in message:
        return BackupRefused(
            f"{what} failed on {safe_url(url)}: {message}. The client tools are older than the "
            f"server or the backup: {PG_TOOLS_HINT}"
        )
    role = re.search(r'role "([^"]+)" does not exist', message)
    if role is not None and what == "pg_restore":
        message += (
            f". The backup grants to role {role.group(1)}, which this server lacks: create it "
            f"first (`python -m bot db readonly-role {role.group(1)}` for the read-only role of "
            "admin sql), then restore again (pg_restore changed nothing)"
        )
    return AdminError(f"{what} failed on {safe_url(url)}: {message}")


def pg_backup(url: str, target: Path) -> str | None:
    """pg_dump the database at `url` to `target` (custom format); returns its revision."""
    tool = _pg_tool("pg_dump")
    scratch = _scratch(target)
    try:
        _run_tool([tool, "--format=custom", f"--file={scratch}"], url, "pg_dump")
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
    os.replace(scratch, target)
    return pg_dump_revision(target)


def pg_dump_revision(path: Path) -> str | None:
    """The alembic_version row stored in a pg_dump archive (None if it holds none)."""
    tool = _pg_tool("pg_restore")
    done = _run_tool(
        [tool, "--data-only", "--table=alembic_version", "--file=-", str(path)],
        "postgresql://",
        "pg_restore (reading the backup's schema revision)",
    )
    rows: list[list[str]] = []
    copying = False
    for line in done.stdout.splitlines():
        if re.match(r"COPY \S*alembic_version \(version_num\) FROM stdin;", line):
            copying = True
        elif copying and line == "\\.":
            break
        elif copying:
            rows.append([line])
    return _one_revision(rows)


def _pg_dump_tables(path: Path) -> set[str]:
    """The tables a pg_dump archive creates (its table of contents)."""
    done = _run_tool(
        [_pg_tool("pg_restore"), "--list", str(path)], "postgresql://", "pg_restore --list"
    )
    return {m.group(1) for m in re.finditer(r"^\d+; \d+ \d+ TABLE \S+ (\S+) ", done.stdout, re.M)}


async def _drop_tables(url: str, names: set[str]) -> None:
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            for name in sorted(names):
                quoted = conn.dialect.identifier_preparer.quote(name)
                await conn.execute(text(f"DROP TABLE IF EXISTS {quoted} CASCADE"))
    finally:
        await engine.dispose()


async def pg_restore(backup: Path, url: str) -> None:
    """Replace the database at `url` with the backup: tables of a later schema that the backup
    lacks are dropped first (the migration up would otherwise find them), then pg_restore
    drops and recreates everything in the backup in one transaction."""
    tool = _pg_tool("pg_restore")
    extra = set(await _table_names(url)) - await asyncio.to_thread(_pg_dump_tables, backup)
    if extra:
        await _drop_tables(url, extra)
    database = make_url(url).database or ""
    try:
        await asyncio.to_thread(
            _run_tool,
            [
                tool,
                "--clean",
                "--if-exists",
                "--no-owner",
                "--single-transaction",
                "--exit-on-error",
                f"--dbname={database}",
                str(backup),
            ],
            url,
            "pg_restore",
        )
    except AdminError as err:
        if not extra:
            raise
        raise type(err)(
            f"{err} (before it, the table(s) {', '.join(sorted(extra))} of a newer schema than "
            "the backup's were dropped)"
        ) from err


# --- the checks --------------------------------------------------------------------------------


async def _table_names(url: str) -> list[str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            names: list[str] = await conn.run_sync(lambda c: inspect(c).get_table_names())
            return names
    finally:
        await engine.dispose()


@dataclass(frozen=True)
class InUse:
    """Signs that a service works on a database now."""

    replicas: int  # heartbeats younger than the takeover age
    leases: int  # chat leases not yet expired

    @property
    def busy(self) -> bool:
        return self.replicas > 0 or self.leases > 0


async def in_use(url: str, alive_after_s: float) -> InUse:
    """Live replicas and unexpired chat leases in the database at `url` (none when it has no
    such tables, or, for SQLite, no file yet)."""
    if make_url(url).get_backend_name() == "sqlite" and not _sqlite_file(url).is_file():
        return InUse(0, 0)
    names = set(await _table_names(url))
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as db:
            alive = await replicas.alive(db, alive_after_s) if "replicas" in names else 0
            leases = 0
            if "chat_leases" in names:
                count = await db.scalar(
                    select(func.count())
                    .select_from(ChatLease)
                    .where(ChatLease.lease_until > db_now(db))
                )
                leases = int(count or 0)
            return InUse(alive, leases)
    finally:
        await engine.dispose()


def _known_revisions(url: str) -> tuple[str, set[str]]:
    scripts = ScriptDirectory.from_config(migrate.alembic_config(url))
    head = scripts.get_current_head()
    if head is None:
        raise AdminError("this release has no migrations (migrations/versions is empty)")
    return head, {rev.revision for rev in scripts.walk_revisions()}


def backup_format(path: Path) -> str:
    """FORMAT_SQLITE or FORMAT_PGDUMP, from the file's first bytes."""
    with path.open("rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head.startswith(SQLITE_MAGIC):
        return FORMAT_SQLITE
    if head.startswith(PGDUMP_MAGIC):
        return FORMAT_PGDUMP
    raise BackupRefused(
        f"{path} is neither an SQLite database nor a pg_dump custom-format archive: "
        "give a file written by `python -m bot admin backup`"
    )


def _backup_source(path: Path) -> tuple[Path, str]:
    path = path.expanduser()
    if not path.is_file():
        raise BackupRefused(f"no backup at {path}")
    return path, backup_format(path)


def _check_manifest(path: Path) -> None:
    side = manifest_path(path)
    if not side.is_file():
        return
    try:
        recorded = json.loads(side.read_text(encoding="utf-8")).get("sha256")
    except (ValueError, AttributeError):
        return  # not ours: the backup's own contents are checked anyway
    if isinstance(recorded, str) and recorded != _sha256(path):
        raise BackupRefused(
            f"{path} does not match the SHA-256 its manifest {side} recorded: the file was "
            "changed or cut short since the backup. Use another backup (or delete the "
            "manifest if you know this file is good)"
        )


# --- the commands ------------------------------------------------------------------------------


BACKUP_PREFIX = "bot-"
SUFFIXES = {FORMAT_SQLITE: ".sqlite3", FORMAT_PGDUMP: ".pgdump"}


def _backup_target(path: Path, kind: str, now: datetime) -> Path:
    """The file to write: PATH, or a new time-stamped name in the directory PATH."""
    path = path.expanduser()
    if path.is_dir():
        return path / f"{BACKUP_PREFIX}{now:%Y%m%dT%H%M%SZ}{SUFFIXES[kind]}"
    if not path.parent.is_dir():
        raise BackupRefused(f"{path.parent} does not exist: create it first")
    return path


def prune(directory: Path, kind: str, keep: int) -> list[Path]:
    """Delete all but the `keep` newest time-stamped backups of this kind in `directory` (and
    their manifests); returns the backups deleted. Names sort by time."""
    found = sorted(directory.glob(f"{BACKUP_PREFIX}*{SUFFIXES[kind]}"))
    gone = found[: max(len(found) - keep, 0)]
    for old in gone:
        old.unlink(missing_ok=True)
        manifest_path(old).unlink(missing_ok=True)
    return gone


def _write_manifest(
    path: Path, kind: str, revision: str | None, url: str, started: datetime
) -> Manifest:
    manifest = Manifest(
        format=kind,
        revision=revision,
        created_at=started.isoformat(),
        database=safe_url(url),
        bytes=path.stat().st_size,
        sha256=_sha256(path),
    )
    side = manifest_path(path)
    scratch = _scratch(side)
    scratch.write_text(json.dumps(manifest.__dict__, indent=2) + "\n", encoding="utf-8")
    os.replace(scratch, side)
    return manifest


@dataclass(frozen=True)
class Written:
    """What `backup` did."""

    path: Path
    manifest: Manifest
    pruned: list[Path]


async def backup(url: str, path: Path, *, keep: int | None = None) -> Written:
    """Write a backup of the database at `url` to `path` (a file, or a new time-stamped file in
    the directory `path`), and its manifest beside it; with `keep`, then delete all but the
    `keep` newest time-stamped backups in that directory."""
    started = datetime.now(UTC)
    sqlite = make_url(url).get_backend_name() == "sqlite"
    kind = FORMAT_SQLITE if sqlite else FORMAT_PGDUMP
    directory = await asyncio.to_thread(lambda: path.expanduser().is_dir())
    if keep is not None and not directory:
        raise BackupRefused(
            f"--keep deletes older time-stamped backups in a directory, and {path} is not one: "
            "give a directory, or leave --keep out"
        )
    path = await asyncio.to_thread(_backup_target, path, kind, started)
    if sqlite:
        revision = await asyncio.to_thread(sqlite_backup, _sqlite_file(url), path)
    else:
        revision = await asyncio.to_thread(pg_backup, url, path)
    manifest = await asyncio.to_thread(_write_manifest, path, kind, revision, url, started)
    pruned = await asyncio.to_thread(prune, path.parent, kind, keep) if keep is not None else []
    return Written(path, manifest, pruned)


@dataclass(frozen=True)
class Restored:
    """What `restore` did."""

    revision: str | None  # the backup's
    head: str
    migrated: bool  # migrated up from an older revision
    forced: InUse | None  # the signs of a service that --force overrode


async def restore(url: str, path: Path, *, force: bool, alive_after_s: float) -> Restored:
    """Replace the database at `url` with the backup at `path` (checks first; see the module)."""
    path, kind = await asyncio.to_thread(_backup_source, path)
    sqlite_target = make_url(url).get_backend_name() == "sqlite"
    if (kind == FORMAT_SQLITE) != sqlite_target:
        what = "an SQLite database" if kind == FORMAT_SQLITE else "a PostgreSQL (pg_dump) backup"
        raise BackupRefused(
            f"{path} is {what}, and DATABASE_URL ({safe_url(url)}) is "
            f"{'SQLite' if sqlite_target else 'PostgreSQL'}: restore it into a database of its "
            "own kind"
        )
    await asyncio.to_thread(_check_manifest, path)
    revision = await asyncio.to_thread(
        _sqlite_revision if kind == FORMAT_SQLITE else pg_dump_revision, path
    )
    head, known = _known_revisions(url)
    if revision is None:
        raise BackupRefused(
            f"{path} holds no schema revision (no alembic_version row): it is not a backup of "
            "this service's database"
        )
    if revision not in known:
        raise BackupRefused(
            f"{path} is at schema revision {revision}, which this release does not know (its "
            f"newest is {head}): it was made by a newer release. Restore it with that release "
            "(or a newer one), not this one"
        )
    signs = await in_use(url, alive_after_s)
    if signs.busy and not force:
        raise BackupRefused(
            f"a service is using {safe_url(url)}: {signs.replicas} replica(s) with a heartbeat "
            f"in the last {alive_after_s:g} s, {signs.leases} chat lease(s) not yet expired. "
            "Stop every replica first (`systemctl stop 'telegram-bot@*'`); add --force only if "
            "you know they are gone"
        )
    if kind == FORMAT_SQLITE:
        await asyncio.to_thread(sqlite_restore, path, _sqlite_file(url))
    else:
        await pg_restore(path, url)
    migrated = revision != head
    if migrated:
        try:
            await asyncio.to_thread(migrate.upgrade, url)
        except Exception as err:
            raise AdminError(
                f"restored {path} (schema revision {revision}) into {safe_url(url)}, but "
                f"migrating it to {head} failed: {err}. Fix the cause and run "
                "`python -m bot db upgrade`"
            ) from err
    return Restored(revision, head, migrated, signs if signs.busy else None)

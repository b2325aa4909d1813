"""The PostgreSQL role `admin sql` runs as: what makes it read-only, how it is checked and made.

A READ ONLY transaction stops table writes, but not what a role's privileges allow on the side:
a superuser (or a member of pg_execute_server_program, pg_write_server_files, ...) runs
`COPY ... TO PROGRAM`, writes and reads server files, reloads the configuration and terminates
other sessions from inside one; and on PostgreSQL 15 *every* role may, by default, create large
objects (lo_create, lo_creat, lo_from_bytea; they persist), send notifications (pg_notify),
write WAL messages (pg_logical_emit_message) and terminate its own role's other sessions in a
read-only transaction, because PUBLIC holds EXECUTE on those functions. So read-only rests on
the role:

- `role_problems` lists what a role could do beyond reading (superuser, role attributes,
  memberships, owned or writable tables and sequences, CREATE on the database or a schema,
  EXECUTE on the functions above). `admin sql` refuses to run as a role with any.
- `ensure_readonly_role` (`python -m bot db readonly-role NAME`) makes one with none: a LOGIN
  role with SELECT on the bot's tables (present and future) and nothing else, after revoking
  EXECUTE on those functions from PUBLIC in the bot's database (the tables' owner, the
  service's role, keeps what it had).

Switching a superuser connection to a weaker role (`SET ROLE pg_read_all_data`) is no defence:
the statement can switch back (`set_config('role', 'none', true)`) and run anything through
`query_to_xml`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import make_url

__all__ = [
    "READ_MEMBERSHIPS",
    "SIDE_EFFECT_FUNCTIONS",
    "ReadonlyRole",
    "RoleError",
    "ensure_readonly_role",
    "role_problems",
    "scram_sha256_verifier",
]


class RoleError(Exception):
    """The read-only role cannot be made as asked; the message says why and what to do."""


# pg_catalog functions that change something, or reach the server, although PUBLIC may run
# them in a read-only transaction: large-object writes (lo_import and lo_export are revoked from
# PUBLIC already, listed so that a grant back is noticed), notifications, WAL messages, and
# signalling other sessions (PUBLIC may terminate or cancel sessions of its own role).
SIDE_EFFECT_FUNCTIONS: tuple[str, ...] = (
    "lo_creat",
    "lo_create",
    "lo_from_bytea",
    "lo_import",
    "lo_export",
    "lo_unlink",
    "lo_put",
    "lowrite",
    "lo_truncate",
    "lo_truncate64",
    "pg_notify",
    "pg_logical_emit_message",
    "pg_terminate_backend",
    "pg_cancel_backend",
)

# Memberships that only add reading. Every other membership (pg_write_server_files,
# pg_execute_server_program, pg_signal_backend, pg_write_all_data, pg_monitor, the service's
# own role, ...) makes a role unfit.
READ_MEMBERSHIPS: tuple[str, ...] = (
    "pg_read_all_data",
    "pg_read_all_stats",
    "pg_read_all_settings",
)

_ROLE_SQL = """
WITH me AS (
    SELECT oid, rolname, rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls
    FROM pg_catalog.pg_roles WHERE rolname = $1
)
SELECT
    me.rolsuper, me.rolcreaterole, me.rolcreatedb, me.rolreplication, me.rolbypassrls,
    ARRAY(
        SELECT r.rolname::text FROM pg_catalog.pg_roles r
        WHERE r.oid <> me.oid AND pg_catalog.pg_has_role(me.oid, r.oid, 'MEMBER')
          AND r.rolname <> ALL($2::text[])
        ORDER BY 1
    ) AS memberships,
    pg_catalog.has_database_privilege(me.oid, pg_catalog.current_database(), 'CREATE')
        AS create_database,
    ARRAY(
        SELECT n.nspname::text FROM pg_catalog.pg_namespace n
        WHERE pg_catalog.has_schema_privilege(me.oid, n.oid, 'CREATE') ORDER BY 1
    ) AS create_schemas,
    ARRAY(
        SELECT c.oid::pg_catalog.regclass::text FROM pg_catalog.pg_class c
        WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
          -- UPDATE on this view is PUBLIC's, and only runs set_config() for the session.
          AND c.oid <> 'pg_catalog.pg_settings'::pg_catalog.regclass
          AND (pg_catalog.pg_has_role(me.oid, c.relowner, 'MEMBER')
               OR pg_catalog.has_table_privilege(
                   me.oid, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'))
        ORDER BY 1
    ) AS tables,
    ARRAY(
        SELECT c.oid::pg_catalog.regclass::text FROM pg_catalog.pg_class c
        WHERE c.relkind = 'S'
          AND (pg_catalog.pg_has_role(me.oid, c.relowner, 'MEMBER')
               OR pg_catalog.has_sequence_privilege(me.oid, c.oid, 'USAGE, UPDATE'))
        ORDER BY 1
    ) AS sequences,
    ARRAY(
        SELECT p.oid::pg_catalog.regprocedure::text FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace
          AND p.proname = ANY($3::text[])
          AND pg_catalog.has_function_privilege(me.oid, p.oid, 'EXECUTE')
        ORDER BY 1
    ) AS functions
FROM me
"""


def _some(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


async def role_problems(conn: Any, role: str) -> list[str]:
    """What `role` could do beyond reading, in words; empty for a read-only role.

    `conn` is an asyncpg connection to the bot's database (privileges are per database).
    """
    row = await conn.fetchrow(_ROLE_SQL, role, list(READ_MEMBERSHIPS), list(SIDE_EFFECT_FUNCTIONS))
    if row is None:
        return [f"role {role!r} does not exist"]
    if row["rolsuper"]:
        return ["is a superuser"]
    problems = [
        f"has {attribute}"
        for attribute, key in (
            ("CREATEROLE", "rolcreaterole"),
            ("CREATEDB", "rolcreatedb"),
            ("REPLICATION", "rolreplication"),
            ("BYPASSRLS", "rolbypassrls"),
        )
        if row[key]
    ]
    if row["memberships"]:
        problems.append(f"is a member of {_some(row['memberships'])}")
    if row["create_database"]:
        problems.append("may CREATE in the database")
    if row["create_schemas"]:
        problems.append(f"may CREATE in schema {_some(row['create_schemas'])}")
    if row["tables"]:
        problems.append(f"owns or may write {_some(row['tables'])}")
    if row["sequences"]:
        problems.append(f"owns or may advance sequence {_some(row['sequences'])}")
    if row["functions"]:
        problems.append(f"may run {_some(row['functions'])}")
    return problems


# --- making the role -----------------------------------------------------------------------------


def scram_sha256_verifier(
    password: str, *, salt: bytes | None = None, iterations: int = 4096
) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (as psql's \\password makes).

    Sending the verifier instead of the password keeps the password out of the server's
    statement log. Printable ASCII only: PostgreSQL normalises other passwords (SASLprep) first.
    """
    if not password or not all(" " <= ch <= "~" for ch in password):
        raise RoleError("the password must be non-empty printable ASCII")
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True, slots=True)
class ReadonlyRole:
    """What `ensure_readonly_role` did."""

    name: str
    created: bool
    database: str
    owner: str
    admin_url: str  # ADMIN_DATABASE_URL to use, the password shown as ***


async def _revoke_from_public(conn: Any, owner: str) -> None:
    """EXECUTE on the side-effect functions, and CREATE on schema public (PostgreSQL 14 and
    older grant it to PUBLIC), taken from PUBLIC; the owner keeps what it had."""
    functions = await conn.fetch(
        "SELECT p.oid::pg_catalog.regprocedure::text AS f,"
        " pg_catalog.has_function_privilege($2, p.oid, 'EXECUTE') AS owner_had"
        " FROM pg_catalog.pg_proc p"
        " WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace"
        " AND p.proname = ANY($1::text[])",
        list(SIDE_EFFECT_FUNCTIONS),
        owner,
    )
    for f in functions:
        await conn.execute(f"REVOKE EXECUTE ON FUNCTION {f['f']} FROM PUBLIC")
        if f["owner_had"] and not await conn.fetchval(
            "SELECT pg_catalog.has_function_privilege($1, $2::pg_catalog.regprocedure, 'EXECUTE')",
            owner,
            f["f"],
        ):
            await conn.execute(f"GRANT EXECUTE ON FUNCTION {f['f']} TO {_ident(owner)}")
    had_create = await conn.fetchval("SELECT has_schema_privilege($1, 'public', 'CREATE')", owner)
    await conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    if had_create and not await conn.fetchval(
        "SELECT has_schema_privilege($1, 'public', 'CREATE')", owner
    ):
        await conn.execute(f"GRANT CREATE ON SCHEMA public TO {_ident(owner)}")


async def _target(conn: Any, name: str) -> tuple[str, str, str, Any]:
    """(the caller's role, the database, the tables' owner, `name`'s pg_roles row or None);
    a RoleError where there are no bot tables or `name` may not become the read-only role."""
    me, database = await conn.fetchrow("SELECT current_user::text, current_database()::text")
    owner = await conn.fetchval(
        "SELECT pg_catalog.pg_get_userbyid(relowner)::text FROM pg_catalog.pg_class"
        " WHERE oid = pg_catalog.to_regclass('public.sessions')"
    )
    if owner is None:
        raise RoleError(
            f"database {database!r} has no bot tables yet: run `python -m bot db upgrade` first"
        )
    existing = await conn.fetchrow(
        "SELECT rolsuper, rolcanlogin, rolcreatedb, rolcreaterole, rolreplication,"
        " rolbypassrls FROM pg_catalog.pg_roles WHERE rolname = $1",
        name,
    )
    if name in (me, owner) or (existing is not None and existing["rolsuper"]):
        raise RoleError(
            f"role {name!r} is the service's own role or a superuser; "
            "pick a new name for the read-only role"
        )
    return me, database, owner, existing


async def _set_up_role(
    conn: Any, name: str, existing: Any, verifier: str | None, *, database: str, owner: str
) -> None:
    """Create the role (or bring its attributes back), set its password if given, make its
    transactions read-only and grant it SELECT on the bot's tables, now and later ones."""
    role = _ident(name)
    if existing is None:
        await conn.execute(f"CREATE ROLE {role} LOGIN")
    else:
        # Only what differs: a CREATEROLE (non-superuser) caller may not mention some.
        wanted = [
            ("LOGIN", "rolcanlogin", True),
            ("NOCREATEDB", "rolcreatedb", False),
            ("NOCREATEROLE", "rolcreaterole", False),
            ("NOREPLICATION", "rolreplication", False),
            ("NOBYPASSRLS", "rolbypassrls", False),
        ]
        changes = [opt for opt, key, value in wanted if existing[key] != value]
        if changes:
            await conn.execute(f"ALTER ROLE {role} WITH {' '.join(changes)}")
    if verifier is not None:
        await conn.execute(f"ALTER ROLE {role} PASSWORD {_literal(verifier)}")
    await conn.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
    await conn.execute(f"GRANT CONNECT ON DATABASE {_ident(database)} TO {role}")
    await conn.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
    await conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    # Tables that later migrations create (as the owner) are readable too.
    await conn.execute(
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {_ident(owner)} IN SCHEMA public "
        f"GRANT SELECT ON TABLES TO {role}"
    )


async def _check_read_only(conn: Any, name: str, me: str, owner: str) -> None:
    """Revoke from PUBLIC what writes (a superuser caller only), then refuse, rolling the
    transaction back, a role that could still do more than read."""
    superuser = await conn.fetchval(
        "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = $1", me
    )
    if superuser:  # only a superuser may (once done, a rerun need not)
        await _revoke_from_public(conn, owner)
    problems = await role_problems(conn, name)
    if problems:
        hint = (
            " Remove those rights by hand or pick a new name."
            if superuser
            else " Revoking from PUBLIC needs a superuser: run this command once with "
            "a superuser's DATABASE_URL."
        )
        raise RoleError(
            f"role {name!r} would not be read-only (nothing was changed): it "
            + "; ".join(problems)
            + "."
            + hint
        )


async def ensure_readonly_role(url: str, name: str, password: str | None = None) -> ReadonlyRole:
    """Create or update `name` as a read-only LOGIN role for the bot's database at `url`.

    Run it with a superuser's DATABASE_URL, after `db upgrade` (once a superuser has, the
    owner's will do, if it may create roles). Idempotent:
    running it again re-applies every grant and revoke and changes nothing else (the password
    only when one is given). Everything happens in one transaction, and it is rolled back if
    the role would still be able to do more than read.
    """
    import asyncpg

    if not name or name.startswith("pg_") or len(name.encode()) > 63:
        raise RoleError(f"{name!r} is not a usable role name (1-63 bytes, not starting with pg_)")
    verifier = scram_sha256_verifier(password) if password is not None else None
    u = make_url(url)
    if u.get_backend_name() != "postgresql":
        raise RoleError(
            "db readonly-role is for PostgreSQL; on SQLite admin sql opens the file read-only"
        )
    try:
        conn = await asyncpg.connect(
            u.set(drivername="postgresql").render_as_string(hide_password=False), timeout=30
        )
    except (OSError, asyncpg.PostgresError, TimeoutError) as err:
        raise RoleError(f"cannot connect to PostgreSQL: {err}") from err
    try:
        me, database, owner, existing = await _target(conn, name)
        async with conn.transaction():
            await _set_up_role(conn, name, existing, verifier, database=database, owner=owner)
            await _check_read_only(conn, name, me, owner)
    except asyncpg.PostgresError as err:
        raise RoleError(f"cannot set up role {name!r}: {err}") from err
    finally:
        await conn.close()
    admin_url = u.set(username=name, password="password" if password is not None else None)
    return ReadonlyRole(
        name=name,
        created=existing is None,
        database=database,
        owner=owner,
        admin_url=admin_url.render_as_string(hide_password=True),
    )

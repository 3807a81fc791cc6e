"""Bulk writes for the month-end and minute jobs, a fixed number of statements whatever
the number of rows (see bench/billing.py):

- ``insert_rows``: new rows; COPY on PostgreSQL, ``bulk_create`` elsewhere;
- ``upsert_rows``: insert, or update on a unique key; COPY into a temporary table and one
  ``INSERT … ON CONFLICT DO UPDATE`` on PostgreSQL, ``bulk_create(update_conflicts=True)``
  elsewhere;
- ``update_rows``: one ``UPDATE … FROM (VALUES …)``.

Small batches take the ORM path everywhere (COPY pays off from a few hundred rows). COPY
statements are recorded in ``connection.queries_log`` like any other, so query counts stay
honest.
"""

import time
from collections.abc import Sequence

from django.db import connection, transaction
from django.db.models import Model

# Below this many rows the ORM's INSERT is as fast as COPY.
COPY_THRESHOLD = 500


def _use_copy(rows: Sequence) -> bool:
    return connection.vendor == "postgresql" and len(rows) >= COPY_THRESHOLD


def _copy(cursor, table: str, fields, rows: Sequence) -> None:
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    sql = f"COPY {connection.ops.quote_name(table)} ({columns}) FROM STDIN"
    started = time.monotonic()
    with cursor.cursor.copy(sql) as copy:
        for row in rows:
            copy.write_row([getattr(row, field.attname) for field in fields])
    if connection.queries_logged:
        connection.queries_log.append(
            {"sql": f"{sql} -- {len(rows)} rows", "time": f"{time.monotonic() - started:.3f}"}
        )


def _instance(model: type[Model], row) -> Model:
    """A model instance of ``row`` (which may be any object with the fields' attnames)."""
    if isinstance(row, model):
        return row
    return model(
        **{
            field.attname: getattr(row, field.attname)
            for field in model._meta.concrete_fields
            if hasattr(row, field.attname) and not field.primary_key
        }
    )


def _fields(model: type[Model], names: Sequence[str]):
    return [model._meta.get_field(name) for name in names]


def insert_rows(model: type[Model], names: Sequence[str], rows: Sequence) -> None:
    """Insert new rows (the ``names`` fields; the primary key comes from the database)."""
    if not rows:
        return
    if not _use_copy(rows):
        model.objects.bulk_create([_instance(model, row) for row in rows])
        return
    with connection.cursor() as cursor:
        _copy(cursor, model._meta.db_table, _fields(model, names), rows)


def upsert_rows(
    model: type[Model], key: Sequence[str], names: Sequence[str], rows: Sequence
) -> None:
    """Insert rows, or update the ``names`` fields of those whose ``key`` exists."""
    if not rows:
        return
    if not _use_copy(rows):
        model.objects.bulk_create(
            [_instance(model, row) for row in rows],
            update_conflicts=True,
            unique_fields=list(key),
            update_fields=list(names),
        )
        return
    qn = connection.ops.quote_name
    table = model._meta.db_table
    load = f"{table}_load"
    fields = _fields(model, [*key, *names])
    columns = ", ".join(qn(field.column) for field in fields)
    conflict = ", ".join(qn(field.column) for field in fields[: len(key)])
    updates = ", ".join(
        f"{qn(field.column)} = EXCLUDED.{qn(field.column)}" for field in fields[len(key) :]
    )
    # The load table empties at commit: keep it all in one transaction (no savepoint, so
    # that the statement count is the same whichever path a batch takes).
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {qn(load)} ON COMMIT DELETE ROWS "  # noqa: S608
            f"AS SELECT {columns} FROM {qn(table)} WITH NO DATA"
        )
        _copy(cursor, load, fields, rows)
        cursor.execute(
            f"INSERT INTO {qn(table)} ({columns}) SELECT {columns} FROM {qn(load)} "  # noqa: S608
            f"ON CONFLICT ({conflict}) DO UPDATE SET {updates}"
        )
        cursor.execute(f"TRUNCATE {qn(load)}")


def update_rows(model: type[Model], names: Sequence[str], rows: Sequence[tuple]) -> int:
    """``UPDATE … FROM (VALUES …)``: set the ``names`` fields of many rows, given as
    (pk, *values), in one statement (batched only where the backend limits parameters,
    i.e. SQLite). Answers how many rows changed."""
    if not rows:
        return 0
    meta = model._meta
    qn = connection.ops.quote_name
    table = qn(meta.db_table)
    columns = _fields(model, names)
    per_row = len(columns) + 1
    postgres = connection.vendor == "postgresql"

    def cast(position: int, db_type: str) -> str:
        expr = f"v.column{position}"
        return f"CAST({expr} AS {db_type})" if postgres else expr

    assignments = ", ".join(
        f"{qn(column.column)} = {cast(index + 2, column.db_type(connection))}"
        for index, column in enumerate(columns)
    )
    pk_match = f"{table}.{qn(meta.pk.column)} = {cast(1, meta.pk.db_type(connection))}"
    limit = connection.features.max_query_params
    batch = max(1, limit // per_row) if limit else len(rows)
    row_sql = "(" + ", ".join(["%s"] * per_row) + ")"
    updated = 0
    with connection.cursor() as cursor:
        for offset in range(0, len(rows), batch):
            chunk = rows[offset : offset + batch]
            params: list = []
            for row in chunk:
                params.append(row[0])
                params.extend(
                    column.get_db_prep_value(value, connection, prepared=False)
                    for column, value in zip(columns, row[1:], strict=True)
                )
            cursor.execute(
                f"UPDATE {table} SET {assignments} "  # noqa: S608 - names come from the model
                f"FROM (VALUES {', '.join([row_sql] * len(chunk))}) AS v WHERE {pk_match}",
                params,
            )
            updated += cursor.rowcount
    return updated

"""Querysets compiled to SQL once and run many times with new values.

Building a queryset's SQL (its joins, columns and WHERE) costs Django more CPU than the
database takes to run a small query: much of an API list request's CPU (bench/api.py).
`Prepared(queryset).filter(**filters)` compiles `queryset.filter(**filters)` once for each
shape of its filters (their names and, for lists, their lengths rounded up to a power of two)
with stand-in values, notes where each value lands among the SQL's parameters, and then runs
that SQL with the values it is given, through Django's cursor (query counts and logging see
it) and Django's converters for each column (timestamps, JSON), as the ORM would.

The filters compare for equality (`field=` or `field__in=`), and their values are what the
database compares: ids and strings, or lists of them, not model instances. An integer no
64-bit column can hold matches nothing, as in the ORM. A list is padded to its length's power
of two by repeating its last value, which `__in` does not notice, so that few shapes compile.

It reaches into Django's private compiler API, which an upgrade may change: with
settings.PREPARED_QUERIES off, `filter` answers the plain `queryset.filter(**filters)`, the
same rows in the same order and of the same types, built by the ORM on every call (a list
holding an integer no column can hold is then the database's to refuse).
"""

import re
import threading
from datetime import datetime
from itertools import count

import orjson
from django.conf import settings
from django.db import connections, router
from django.db.models import JSONField, Model, QuerySet
from django.db.models.fields.json import KeyTransform
from django.db.models.query import ValuesIterable

# Stand-in values no real filter holds.
_INT_BASE = -(2**62)
_STRING_MARK = "\x00prepared-"
_SMALLEST, _LARGEST = -(2**63), 2**63 - 1
_NOTHING = object()  # a filter's value that no row holds
_LONG_DIGITS = re.compile(r"[0-9]{19}")  # 2**63 has 19 digits


class Prepared:
    """A values() or values_list() queryset whose SQL is compiled once per shape of filters."""

    def __init__(self, queryset: QuerySet):
        if queryset._fields is None:
            raise TypeError("Prepared runs values() or values_list() querysets")
        self.queryset = queryset
        self.names = list(queryset._fields)
        self.as_dicts = queryset._iterable_class is ValuesIterable
        # A compiler belongs to one thread's connection: each thread compiles its own.
        self._local = threading.local()

    def filter(self, **filters) -> "PreparedRows | QuerySet":
        if not settings.PREPARED_QUERIES:
            return self.queryset.filter(**filters)
        return PreparedRows(self, filters)

    def run(self, filters: dict, limit: int | None = None, offset: int = 0) -> list:
        """The rows matching `filters`, at most `limit` of them from `offset` on."""
        statement = self._statement(filters)
        if statement is None:
            return []
        connection, compiler, sql, params, converters = statement
        if limit is not None:
            sql += " LIMIT %s OFFSET %s"
            params += [limit, offset]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if converters:
            rows = compiler.apply_converters(rows, converters)
        if self.as_dicts:
            return [dict(zip(self.names, row, strict=True)) for row in rows]
        return [tuple(row) for row in rows]

    def count(self, filters: dict) -> int:
        """How many rows match `filters`: those of the same SQL, counted by the database."""
        statement = self._statement(filters)
        if statement is None:
            return 0
        connection, _, sql, params, _ = statement
        with connection.cursor() as cursor:
            # the SQL is Django's, compiled from the queryset; the values go as parameters
            cursor.execute(f"SELECT COUNT(*) FROM ({sql}) prepared_rows", params)  # noqa: S608
            return cursor.fetchone()[0]

    def _statement(self, filters: dict) -> tuple | None:
        """(connection, compiler, SQL, parameters, converters) for `filters`; None when no row
        can match them."""
        filters = {name: _padded(value) for name, value in filters.items()}
        if any(value is _NOTHING or value == [] for value in filters.values()):
            return None
        alias = router.db_for_read(self.queryset.model)
        connection = connections[alias]
        cache = self._local.__dict__.setdefault(alias, {})
        shape = tuple((name, _kind(value)) for name, value in filters.items())
        if shape not in cache or cache[shape][0].connection is not connection:
            cache[shape] = self._compile(alias, filters)
        compiler, sql, slots, converters = cache[shape]
        params = [
            constant if name is None else filters[name] if index is None else filters[name][index]
            for name, index, constant in slots
        ]
        return connection, compiler, sql, params, converters

    def _compile(self, alias: str, filters: dict) -> tuple:
        stand_ins, slot_of = {}, {}
        serial = count()
        for name, value in filters.items():
            if isinstance(value, list):
                stand_ins[name] = [_stand_in(item, next(serial)) for item in value]
                slot_of.update({item: (name, i) for i, item in enumerate(stand_ins[name])})
            else:
                stand_ins[name] = _stand_in(value, next(serial))
                slot_of[stand_ins[name]] = (name, None)
        compiler = self.queryset.filter(**stand_ins).query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        slots = [
            (*slot_of.get(param, (None, None)), param)
            if type(param) in (int, str)
            else (None, None, param)
            for param in params
        ]
        if set(slot_of.values()) - {(name, index) for name, index, _ in slots}:
            raise ValueError(f"a filter of {filters} is not among the SQL's parameters")
        fields = [column[0] for column in compiler.select[: compiler.col_count]]
        converters = _quicker(compiler.get_converters(fields), compiler.connection)
        return compiler, sql, slots, converters


def _quicker(converters: dict, connection) -> dict:
    """Django's converters of each column, with two of them quicker, each giving the same
    values (tests/test_prepared.py): a list page's 50 rows hold 250 JSON values and 200
    timestamps, and their converters were a third of its CPU.
    - A JSON column's own (json.loads through its field's decoder class, ~4 µs a value) reads
      with orjson first. orjson reads an integer past 64 bits as a float, so a text with 19
      digits in a row (where such an integer would be), what orjson refuses, and any field
      with a decoder of its own go to the field's converter.
    - SQLite's timestamps (settings.USE_TZ through the lazy settings, is_aware and make_aware,
      for each value) get the connection's time zone as make_aware gives it (a text that
      datetime.fromisoformat reads first); anything else goes to Django's converter."""
    sqlite_timestamps = (
        type(connection.ops).convert_datetimefield_value if connection.vendor == "sqlite" else None
    )
    faster = {}
    for index, (functions, expression) in converters.items():
        quicker = []
        for function in functions:
            method = getattr(function, "__func__", None)
            if (
                method is JSONField.from_db_value
                and function.__self__.decoder is None
                and not isinstance(expression, KeyTransform)
            ):
                function = _orjson_first(function)
            elif method is not None and method is sqlite_timestamps and settings.USE_TZ:
                function = _aware_first(function, connection.timezone)
            quicker.append(function)
        faster[index] = (quicker, expression)
    return faster


def _orjson_first(field_converter):
    def convert(value, expression, connection):
        if value is None:
            return None
        if type(value) is not str or _LONG_DIGITS.search(value):
            return field_converter(value, expression, connection)
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return field_converter(value, expression, connection)

    return convert


def _aware_first(sqlite_converter, zone):
    def convert(value, expression, connection):
        if type(value) is str:  # a column SQLite has no converter for
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                return sqlite_converter(value, expression, connection)
        elif type(value) is not datetime:
            return sqlite_converter(value, expression, connection)
        return value if value.tzinfo is not None else value.replace(tzinfo=zone)

    return convert


class PreparedRows:
    """A prepared query's rows for some filters, lazy as a queryset: iterate, slice, count."""

    def __init__(self, prepared: Prepared, filters: dict):
        self.prepared = prepared
        self.filters = filters

    def __iter__(self):
        return iter(self.prepared.run(self.filters))

    def __getitem__(self, window: slice) -> list:
        if not isinstance(window, slice) or window.stop is None or window.step is not None:
            raise TypeError("prepared rows take a slice [start:stop]")
        start = window.start or 0
        return self.prepared.run(self.filters, limit=max(0, window.stop - start), offset=start)

    def count(self) -> int:
        return self.prepared.count(self.filters)


def columns(model: type[Model], through: str = "") -> list[str]:
    """The names of `model`'s columns for values_list(), reached `through` a relation
    ("tenant__") or its own; `instances` builds models back from them."""
    return [through + field.attname for field in model._meta.concrete_fields]


def instances(row: tuple, *models: type[Model]) -> list[Model]:
    """Model instances from consecutive runs of `row`, `columns(model)` each, as the ORM
    builds them (Model.from_db): saved, with their fields' values as loaded."""
    built, start = [], 0
    for model in models:
        names = columns(model)
        values = row[start : start + len(names)]
        built.append(model.from_db(router.db_for_read(model), names, values))
        start += len(names)
    return built


def _kind(value) -> tuple:
    if isinstance(value, list):
        return (list, type(value[0]), len(value))
    return (type(value),)


def _padded(value):
    """A list padded to a power of two (ints no column holds left out); an int no column
    holds as _NOTHING."""
    if isinstance(value, int) and not _SMALLEST <= value <= _LARGEST:
        return _NOTHING
    if not isinstance(value, list):
        return value
    value = [item for item in value if not isinstance(item, int) or _SMALLEST <= item <= _LARGEST]
    if not value:
        return value
    size = 1 << (len(value) - 1).bit_length()
    return value + [value[-1]] * (size - len(value))


def _stand_in(value, serial: int):
    if type(value) is int:
        return _INT_BASE + serial
    if type(value) is str:
        return f"{_STRING_MARK}{serial}"
    raise TypeError(f"a prepared filter takes ints and strings, not {type(value).__name__}")

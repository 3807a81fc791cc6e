"""Integers from clients: one reading for every one of them.

A client's text (a query parameter, a form or JSON field, a websocket's query or frame, a
header) becomes an integer here and nowhere else. Python's own readings are too kind:
``int()`` takes '٣', '１', ' 3' and '3\\n', ``str.isdigit()`` says yes to '²' (which ``int()``
then refuses), and a long enough string overflows a database column. Here a number is ASCII
digits only, a leading minus only where the bounds allow negatives, no space, newline or NUL,
at most 20 digits, and within its field's bounds; anything else is a ``NotAWholeNumber``
whose message says in words what is expected (never Python's exception text), which each
caller answers as its field's error.

``Field`` (DRF) and ``FormField`` (Django forms) read their fields this way; their bounds
default to 0 and a database bigint's largest, so a field takes a sign only when its
``min_value`` is negative."""

import re

from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

LARGEST = 2**63 - 1  # a database bigint's
_UNSIGNED = re.compile(r"[0-9]{1,20}")
_SIGNED = re.compile(r"-?[0-9]{1,20}")


class NotAWholeNumber(ValueError):
    """The text is not a whole number within the bounds; the message says what is."""


def parse(text, *, minimum: int = 0, maximum: int = LARGEST) -> int:
    """The whole number `text` spells, from `minimum` to `maximum`; NotAWholeNumber else."""
    shape = _SIGNED if minimum < 0 else _UNSIGNED
    if isinstance(text, str) and shape.fullmatch(text):
        value = int(text)
        if minimum <= value <= maximum:
            return value
    raise NotAWholeNumber(f"A whole number from {minimum} to {maximum}.")


def reference_id(ref) -> int | None:
    """The id a reference "by id or by name" spells (a JSON integer or ASCII digits, 1 or
    more); None when it spells none, and the reference is then a name."""
    try:
        return parse(_as_text(ref), minimum=1)
    except NotAWholeNumber:
        return None


def _as_text(value):
    """A JSON number as the text `parse` reads: an int (not a bool) or a float with no
    fraction; anything else as it is (a string, or what parse refuses)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else value


class Field(serializers.IntegerField):
    """DRF's IntegerField, read with `parse`: a JSON integer, or a string of ASCII digits."""

    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", 0)
        kwargs.setdefault("max_value", LARGEST)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        try:
            return parse(_as_text(data), minimum=self.min_value, maximum=self.max_value)
        except NotAWholeNumber as error:
            raise serializers.ValidationError(str(error), code="invalid") from None


class FormField(forms.IntegerField):
    """Django's IntegerField, read with `parse`."""

    def __init__(self, *, min_value=0, max_value=LARGEST, **kwargs):
        super().__init__(min_value=min_value, max_value=max_value, **kwargs)

    def to_python(self, value):
        if value in self.empty_values:
            return None
        try:
            return parse(_as_text(value), minimum=self.min_value, maximum=self.max_value)
        except NotAWholeNumber as error:
            raise DjangoValidationError(str(error), code="invalid") from None

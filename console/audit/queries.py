"""Which entries a reader sees and how they narrow them: one set of filters for the console
page, its CSV and the API."""

import csv
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta

from django.db.models import Q, QuerySet
from rest_framework import serializers

from console.audit.models import DONE, REFUSED, AuditEntry


class AuditQuery(serializers.Serializer):
    actor = serializers.CharField(
        required=False, max_length=150, help_text="a username, or 'system'"
    )
    action = serializers.CharField(
        required=False,
        max_length=64,
        help_text="an action (instance.stop), or every action on a type (instance.)",
    )
    object_type = serializers.CharField(required=False, max_length=64, help_text="e.g. instance")
    outcome = serializers.ChoiceField(
        choices=[DONE, REFUSED],
        required=False,
        help_text="done: the changes made; refused: the actions refused, with their error code",
    )
    since = serializers.DateField(required=False, help_text="from this UTC day on")
    until = serializers.DateField(required=False, help_text="up to this UTC day, included")
    tenant = serializers.SlugField(
        required=False, help_text="operators only: one tenant's entries (its slug)"
    )

    def validate(self, attrs):
        if attrs.get("since") and attrs.get("until") and attrs["since"] > attrs["until"]:
            raise serializers.ValidationError({"until": "Give a day on or after since."})
        return attrs


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def visible(tenant=None) -> QuerySet[AuditEntry]:
    """A tenant's entries, or (None, for operators) every entry."""
    entries = AuditEntry.objects.all()
    return entries.filter(tenant=tenant) if tenant is not None else entries


def narrow(entries: QuerySet[AuditEntry], query: dict) -> QuerySet[AuditEntry]:
    """`entries` narrowed by a valid AuditQuery's data."""
    if actor := query.get("actor"):
        entries = entries.filter(Q(actor=actor) | Q(actor__startswith=f"{actor} (token "))
    if action := query.get("action"):
        if action.endswith("."):
            entries = entries.filter(action__startswith=action)
        else:
            entries = entries.filter(action=action)
    if object_type := query.get("object_type"):
        entries = entries.filter(object_type=object_type)
    if outcome := query.get("outcome"):
        entries = (
            entries.filter(error_code="") if outcome == DONE else entries.exclude(error_code="")
        )
    if since := query.get("since"):
        entries = entries.filter(at__gte=_day_start(since))
    if until := query.get("until"):
        entries = entries.filter(at__lt=_day_start(until + timedelta(days=1)))
    if tenant := query.get("tenant"):
        entries = entries.filter(tenant__slug=tenant)
    return entries


CSV_COLUMNS = [
    "at",
    "actor",
    "address",
    "action",
    "object_type",
    "object_id",
    "object",
    "before",
    "after",
    "outcome",
    "error_code",
]


class _Echo:
    def write(self, value):
        return value


def csv_lines(entries: QuerySet[AuditEntry]) -> Iterator[str]:
    """The entries as CSV lines (a header first), read in chunks."""
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for entry in entries.iterator(chunk_size=500):
        yield writer.writerow(
            [
                entry.at.isoformat(),
                _cell(entry.actor),
                entry.address or "",
                entry.action,
                entry.object_type,
                entry.object_id,
                _cell(entry.object_repr),
                _cell(_json(entry.before)),
                _cell(_json(entry.after)),
                entry.outcome,
                entry.error_code,
            ]
        )


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, default=str) if value else ""


def _cell(text: str) -> str:
    """Text a spreadsheet would run as a formula (names are the tenant's) starts with '."""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


FILTERS = ["actor", "action", "object_type", "outcome", "since", "until"]

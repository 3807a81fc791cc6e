"""Apply a declarative catalog file (TOML): regions, GPU models and their MIG profiles, specs
with their prices, images. The file says what the catalog is; applying it makes the database
say the same, prints each change, and changes nothing the second time.

What the file no longer lists is removed, unless something still uses it: a spec or image that
live (not terminated) instances use is refused, one that only history uses (terminated
instances, billed usage) is retired (``active = false``); a region, GPU model or MIG profile
that hosts, GPUs, specs or instances use is refused. A spec's shape (GPU model, mode, count,
profile, fraction, memory, vCPUs, RAM, disk) does not change under live instances. Prices are
points in time: a new spec's first point, then changes in the open month or later; a point is
never edited, and past points stay. Everything happens in one transaction: on any error,
nothing changes."""

import tomllib
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal, InvalidOperation
from pathlib import Path

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import ProtectedError, RestrictedError
from django.utils import timezone

from console.catalog.models import GpuModel, Image, MigProfile, Mode, Region, Spec, SpecPrice
from console.errors import DomainError, ErrorCode


class CatalogError(DomainError):
    """The file is wrong or asks for what cannot be done: one line per problem."""

    code = ErrorCode.INVALID_CATALOG
    status = 400

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class Result:
    changes: list[str] = field(default_factory=list)


# Each section's keys: required, then optional with their defaults.
REGION_KEYS: tuple[set[str], dict] = ({"code", "name"}, {})
GPU_MODEL_KEYS: tuple[set[str], dict] = ({"code", "name", "memory_mib"}, {"mig_profiles": []})
PROFILE_KEYS: tuple[set[str], dict] = (
    {"name", "compute_slices", "size", "starts", "memory_mib"},
    {},
)
SPEC_KEYS = (
    {"code", "name", "gpu_model", "mode", "gpu_memory_mib", "vcpus", "ram_mib", "disk_gib"},
    {"gpu_count": 1, "mig_profile": None, "milli": None, "active": True, "prices": None},
)
PRICE_KEYS: tuple[set[str], dict] = ({"from", "per_hour"}, {})
IMAGE_KEYS = (
    {"name", "reference"},
    {
        "cuda_version": "",
        "description": "",
        "command": [],
        "env": {},
        "ports": [],
        "restart_policy": "on-failure",
        "active": True,
    },
)
SHAPE = (
    "gpu_model",
    "mode",
    "gpu_count",
    "mig_profile",
    "milli",
    "gpu_memory_mib",
    "vcpus",
    "ram_mib",
    "disk_gib",
)
PROFILE_SHAPE = ("compute_slices", "size", "starts", "memory_mib")
WHOLE_NUMBERS = {
    "memory_mib",
    "compute_slices",
    "size",
    "gpu_count",
    "milli",
    "gpu_memory_mib",
    "vcpus",
    "ram_mib",
    "disk_gib",
}
TEXTS = {"code", "name", "gpu_model", "mode", "reference", "cuda_version", "description"}


def load(path: str | Path) -> dict:
    """The file's content, or a CatalogError saying why it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as error:
        raise CatalogError([f"{path}: cannot read it ({error.strerror})."]) from None
    except tomllib.TOMLDecodeError as error:
        raise CatalogError([f"{path}: not valid TOML ({error})."]) from None


def apply(document: dict, *, dry_run: bool = False) -> Result:
    """Make the catalog what ``document`` says. Raises CatalogError (and changes nothing)."""
    catalog = _parse(document)
    result = Result()
    with transaction.atomic():
        _Applier(result.changes).run(catalog)
        if dry_run:
            transaction.set_rollback(True)
    return result


# --- reading the file: shapes and types, each problem one line naming where it is ---------


def _entries(document: dict, section: str, keys, problems: list[str]) -> list[dict]:
    raw = document.get(section, [])
    if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
        problems.append(f"{section}: must be a list of tables ([[{section}]]).")
        return []
    entries = []
    for index, entry in enumerate(raw):
        where = f"{section}[{index}]" + (f" ({entry['code']})" if "code" in entry else "")
        if "name" in entry and "code" not in entry:
            where = f"{section}[{index}] ({entry['name']})"
        parsed = _keys(entry, keys, where, problems)
        if parsed is not None:
            parsed["_where"] = where
            entries.append(parsed)
    return entries


def _keys(entry: dict, keys, where: str, problems: list[str]) -> dict | None:
    required, optional = keys
    missing = sorted(required - set(entry))
    unknown = sorted(set(entry) - required - set(optional))
    if missing:
        problems.append(f"{where}: missing {', '.join(missing)}.")
    if unknown:
        problems.append(f"{where}: unknown key {', '.join(unknown)}.")
    for key in sorted(set(entry) & WHOLE_NUMBERS):
        value = entry[key]
        if (isinstance(value, bool) or not isinstance(value, int) or value < 0) and not (
            value is None and key in optional
        ):
            problems.append(f"{where}: {key}: a whole number, not {value!r}.")
            missing = True
    for key in sorted(set(entry) & TEXTS):
        if not isinstance(entry[key], str):
            problems.append(f"{where}: {key}: text, not {entry[key]!r}.")
            missing = True
    if "active" in entry and not isinstance(entry["active"], bool):
        problems.append(f"{where}: active: true or false.")
        missing = True
    if missing or unknown:
        return None
    return {**optional, **entry}


def _unique(entries: list[dict], key: str, section: str, problems: list[str]) -> None:
    seen = set()
    for entry in entries:
        if entry[key] in seen:
            problems.append(f"{entry['_where']}: {section} {entry[key]!r} is listed twice.")
        seen.add(entry[key])


def _moment(value, where: str, problems: list[str]) -> datetime | None:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            problems.append(f"{where}: from: give a date or a time with its UTC offset.")
            return None
        return value
    if isinstance(value, date):
        return datetime.combine(value, time(0), tzinfo=UTC)
    problems.append(f"{where}: from: a date (2026-12-01) or a time (2026-12-01T00:00:00Z).")
    return None


def _money(value, where: str, problems: list[str]) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        problems.append(f'{where}: per_hour: a price like "1.89".')
        return None
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        problems.append(f'{where}: per_hour: {value!r} is not a price like "1.89".')
        return None
    if not price.is_finite() or price < 0 or price != price.quantize(Decimal("0.0001")):
        problems.append(f"{where}: per_hour: {value!r} is not a price of at most 4 decimals ≥ 0.")
        return None
    return price


def _parse(document: dict) -> dict:
    problems: list[str] = []
    unknown = sorted(set(document) - {"regions", "gpu_models", "specs", "images"})
    if unknown:
        problems.append(
            f"unknown section {', '.join(unknown)} (regions, gpu_models, specs, images)."
        )
    catalog = {
        "regions": _entries(document, "regions", REGION_KEYS, problems),
        "gpu_models": _entries(document, "gpu_models", GPU_MODEL_KEYS, problems),
        "specs": _entries(document, "specs", SPEC_KEYS, problems),
        "images": _entries(document, "images", IMAGE_KEYS, problems),
    }
    _unique(catalog["regions"], "code", "region", problems)
    _unique(catalog["gpu_models"], "code", "GPU model", problems)
    _unique(catalog["specs"], "code", "spec", problems)
    _unique(catalog["images"], "name", "image", problems)
    for model in catalog["gpu_models"]:
        raw = model["mig_profiles"]
        if not isinstance(raw, list) or not all(isinstance(p, dict) for p in raw):
            problems.append(f"{model['_where']}: mig_profiles: a list of tables.")
            model["mig_profiles"] = []
            continue
        profiles = []
        for index, profile in enumerate(raw):
            where = f"{model['_where']}: mig_profiles[{index}]"
            parsed = _keys(profile, PROFILE_KEYS, where, problems)
            if parsed is not None:
                profiles.append({**parsed, "_where": f"{model['_where']}: {parsed['name']}"})
        _unique(profiles, "name", "MIG profile", problems)
        model["mig_profiles"] = profiles
    models = {model["code"]: model for model in catalog["gpu_models"]}
    for spec in catalog["specs"]:
        where = spec["_where"]
        model = models.get(spec["gpu_model"])
        if model is None:
            problems.append(f"{where}: gpu_model {spec['gpu_model']!r} is not in gpu_models.")
        elif spec["mig_profile"] is not None and spec["mig_profile"] not in {
            profile["name"] for profile in model["mig_profiles"]
        }:
            problems.append(
                f"{where}: mig_profile {spec['mig_profile']!r} is not one of "
                f"{spec['gpu_model']}'s mig_profiles."
            )
        if spec["mode"] not in Mode.values:
            problems.append(f"{where}: mode must be one of {', '.join(Mode.values)}.")
        prices = spec["prices"]
        if (
            not isinstance(prices, list)
            or not prices
            or not all(isinstance(p, dict) for p in prices)
        ):
            problems.append(
                f'{where}: prices: at least one {{ from = 2026-12-01, per_hour = "1.89" }}.'
            )
            spec["prices"] = []
            continue
        points = []
        for index, point in enumerate(prices):
            point_where = f"{where}: prices[{index}]"
            parsed = _keys(point, PRICE_KEYS, point_where, problems)
            if parsed is None:
                continue
            moment = _moment(parsed["from"], point_where, problems)
            price = _money(parsed["per_hour"], point_where, problems)
            if moment is not None and price is not None:
                points.append((moment, price))
        moments = [moment for moment, _ in points]
        if moments != sorted(set(moments)):
            problems.append(f"{where}: prices: list the points oldest first, one per moment.")
        spec["prices"] = points
    if problems:
        raise CatalogError(problems)
    return catalog


# --- applying: one pass in dependency order, then removals in reverse ---------------------


def _live_instances(queryset) -> list:
    """At most six not-terminated instances of ``queryset`` (a relation's ``instances``)."""
    return list(queryset.live().order_by("pk")[:6])


def _names(objects, limit: int = 5) -> str:
    shown = ", ".join(str(obj) for obj in objects[:limit])
    return shown + (", …" if len(objects) > limit else "")


class _Applier:
    def __init__(self, changes: list[str]):
        self.changes = changes
        self.problems: list[str] = []

    def run(self, catalog: dict) -> None:
        for entry in catalog["regions"]:
            self._upsert(Region, {"code": entry["code"]}, {"name": entry["name"]}, entry)
        for entry in catalog["gpu_models"]:
            self._gpu_model(entry)
        for entry in catalog["specs"]:
            self._spec(entry)
        for entry in catalog["images"]:
            self._image(entry)
        self._remove_specs({entry["code"] for entry in catalog["specs"]})
        self._remove_images({entry["name"] for entry in catalog["images"]})
        self._remove_profiles(catalog["gpu_models"])
        self._remove(GpuModel, {entry["code"] for entry in catalog["gpu_models"]})
        self._remove(Region, {entry["code"] for entry in catalog["regions"]})
        if self.problems:
            raise CatalogError(self.problems)

    def _label(self, obj) -> str:
        kind = {Region: "region", GpuModel: "GPU model", Spec: "spec", Image: "image"}
        if isinstance(obj, MigProfile):
            return f"MIG profile {obj.gpu_model.code} {obj.name}"
        return f"{kind[type(obj)]} {obj.code if hasattr(obj, 'code') else obj.name}"

    def _validate(self, obj, where: str) -> bool:
        try:
            obj.full_clean()
        except ValidationError as error:
            for name, messages in error.message_dict.items():
                prefix = "" if name == "__all__" else f"{name}: "
                self.problems.extend(f"{where}: {prefix}{message}" for message in messages)
            return False
        return True

    def _upsert(self, model, lookup: dict, values: dict, entry: dict, guard=None):
        """Create or update one row; say what changed. ``guard(obj, changed)`` may refuse."""
        obj = model.objects.filter(**lookup).first()
        if obj is None:
            obj = model(**lookup, **values)
            if self._validate(obj, entry["_where"]):
                obj.save()
                self.changes.append(f"+ {self._label(obj)}")
                return obj
            return None
        changed = {
            name: (getattr(obj, name), value)
            for name, value in values.items()
            if getattr(obj, name) != value
        }
        if not changed:
            return obj
        if guard is not None and not guard(obj, changed, entry["_where"]):
            return obj
        for name, (_old, value) in changed.items():
            setattr(obj, name, value)
        if self._validate(obj, entry["_where"]):
            obj.save()
            details = "; ".join(
                f"{name} {_show(old)} → {_show(new)}" for name, (old, new) in changed.items()
            )
            self.changes.append(f"~ {self._label(obj)}: {details}")
        return obj

    def _gpu_model(self, entry: dict) -> None:
        values = {
            "name": entry["name"],
            "memory_mib": entry["memory_mib"],
            "mig_capable": bool(entry["mig_profiles"]),
        }
        model = self._upsert(GpuModel, {"code": entry["code"]}, values, entry)
        if model is None or model.pk is None:
            return
        for profile in entry["mig_profiles"]:
            values = {name: profile[name] for name in PROFILE_SHAPE}
            self._upsert(
                MigProfile,
                {"gpu_model": model, "name": profile["name"]},
                values,
                profile,
                guard=self._profile_guard,
            )

    def _profile_guard(self, profile, changed, where) -> bool:
        live = [i for spec in profile.specs.all() for i in _live_instances(spec.instances)][:6]
        if live:
            self.problems.append(
                f"{where}: cannot change {', '.join(changed)} while instances use it "
                f"({_names(live)})."
            )
            return False
        return True

    def _spec(self, entry: dict) -> None:
        model = GpuModel.objects.filter(code=entry["gpu_model"]).first()
        if model is None or model.pk is None:
            return  # the GPU model's own problem is already reported
        profile = None
        if entry["mig_profile"] is not None:
            profile = MigProfile.objects.filter(gpu_model=model, name=entry["mig_profile"]).first()
            if profile is None:
                return
        values = {
            "name": entry["name"],
            "gpu_model": model,
            "mode": entry["mode"],
            "gpu_count": entry["gpu_count"],
            "mig_profile": profile,
            "milli": entry["milli"],
            "gpu_memory_mib": entry["gpu_memory_mib"],
            "vcpus": entry["vcpus"],
            "ram_mib": entry["ram_mib"],
            "disk_gib": entry["disk_gib"],
            "active": entry["active"],
        }
        points = entry["prices"]
        spec = Spec.objects.filter(code=entry["code"]).first()
        if spec is None:
            first_moment, first_price = points[0]
            spec = Spec(code=entry["code"], price_per_hour=first_price, **values)
            if not self._validate(spec, entry["_where"]):
                return
            spec.save()
            spec.prices.update(effective_from=first_moment)
            self.changes.append(
                f"+ spec {spec.code} at {first_price}/h from {first_moment:%Y-%m-%d %H:%M} UTC"
            )
        else:
            self._upsert(Spec, {"code": entry["code"]}, values, entry, guard=self._spec_guard)
        self._prices(spec, points, entry["_where"])

    def _spec_guard(self, spec, changed, where) -> bool:
        shape = [name for name in changed if name in SHAPE]
        live = _live_instances(spec.instances.all()) if shape else []
        if live:
            self.problems.append(
                f"{where}: cannot change {', '.join(shape)} while instances use it "
                f"({_names(live)}); add a new spec and retire this one."
            )
            return False
        return True

    def _prices(self, spec: Spec, points: list, where: str) -> None:
        existing = {point.effective_from: point for point in spec.prices.all()}
        now = timezone.now()
        for moment, price in points:
            point = existing.get(moment)
            if point is not None:
                if point.price_per_hour != price:
                    self.problems.append(
                        f"{where}: the price from {moment:%Y-%m-%d %H:%M} UTC is "
                        f"{point.price_per_hour}/h; a price point is never edited: add a new one."
                    )
                continue
            point = SpecPrice(spec=spec, effective_from=moment, price_per_hour=price)
            if self._validate(point, where):
                point.save()
                self.changes.append(
                    f"+ price of spec {spec.code}: {price}/h from {moment:%Y-%m-%d %H:%M} UTC"
                )
        listed = {moment for moment, _ in points}
        for moment, point in sorted(existing.items()):
            if moment not in listed and moment > now:
                point.delete()
                self.changes.append(
                    f"- price of spec {spec.code}: {point.price_per_hour}/h from "
                    f"{moment:%Y-%m-%d %H:%M} UTC (scheduled, cancelled)"
                )

    def _image(self, entry: dict) -> None:
        values = {
            name: entry[name]
            for name in (
                "reference",
                "cuda_version",
                "description",
                "command",
                "env",
                "ports",
                "restart_policy",
                "active",
            )
        }
        self._upsert(Image, {"name": entry["name"]}, values, entry)

    def _remove_specs(self, listed: set[str]) -> None:
        for spec in Spec.objects.exclude(code__in=listed).order_by("code"):
            self._remove_or_retire(spec, spec.instances.all())

    def _remove_images(self, listed: set[str]) -> None:
        for image in Image.objects.exclude(name__in=listed).order_by("name"):
            self._remove_or_retire(image, image.instances.all())

    def _remove_or_retire(self, obj, instances) -> None:
        """Delete what nothing uses; retire what only history uses; refuse what runs."""
        live = _live_instances(instances)
        if live:
            self.problems.append(
                f"cannot remove {self._label(obj)}: instances still use it ({_names(live)})."
            )
            return
        try:
            with transaction.atomic():
                obj.delete()
            self.changes.append(f"- {self._label(obj)}")
        except (ProtectedError, RestrictedError):
            if obj.active:
                obj.active = False
                obj.save(update_fields=["active"])
                self.changes.append(
                    f"~ {self._label(obj)}: retired (kept: terminated instances or billed usage)"
                )

    def _remove_profiles(self, gpu_models: list[dict]) -> None:
        listed = {(m["code"], p["name"]) for m in gpu_models for p in m["mig_profiles"]}
        for profile in MigProfile.objects.select_related("gpu_model").order_by("pk"):
            if (profile.gpu_model.code, profile.name) not in listed:
                self._delete(profile)

    def _remove(self, model, listed: set[str]) -> None:
        for obj in model.objects.exclude(code__in=listed).order_by("code"):
            self._delete(obj)

    def _delete(self, obj) -> None:
        label = self._label(obj)
        try:
            with transaction.atomic():
                obj.delete()
        except (ProtectedError, RestrictedError) as error:
            users = list(getattr(error, "protected_objects", None) or error.restricted_objects)
            self.problems.append(f"cannot remove {label}: still used by {_describe(users)}.")
            return
        self.changes.append(f"- {label}")


def _describe(objects: list) -> str:
    by_kind: dict[str, list] = {}
    for obj in objects:
        by_kind.setdefault(str(obj._meta.verbose_name), []).append(obj)
    return "; ".join(
        f"{len(items)} {kind}{'s' if len(items) > 1 else ''} ({_names(items)})"
        for kind, items in by_kind.items()
    )


def _show(value) -> str:
    if isinstance(value, MigProfile):
        return value.name
    if isinstance(value, GpuModel):
        return value.code
    return repr(value) if isinstance(value, str) else str(value)

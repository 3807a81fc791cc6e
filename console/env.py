"""Typed readers for settings that come from the environment."""

import ipaddress
import os
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ImproperlyConfigured


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None


def env_decimal(name: str, default: str) -> Decimal:
    raw = os.environ.get(name) or default
    try:
        return Decimal(raw)
    except InvalidOperation:
        raise ImproperlyConfigured(f"{name} must be a decimal number, got {raw!r}") from None


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_networks(name: str, default: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated networks (`10.0.0.0/8`) or single addresses."""
    networks = []
    for item in env_list(name, default):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name} must list networks like 10.0.0.0/8, got {item!r}"
            ) from None
    return networks

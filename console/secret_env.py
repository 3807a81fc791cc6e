"""Secret environment variables: what a tenant marks secret (an HF_TOKEN, a password) is kept
sealed (Fernet: AES-128-CBC with HMAC-SHA256) under a key of the console's, opened only into the
agent's request for its container, and shown everywhere else as MASK, to every role.

A variable whose name says it is a credential (HF_TOKEN, WANDB_API_KEY, DB_PASSWORD …) is a
secret even when given as plain env: `split` moves it over."""

import base64
import hashlib
import re

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

MASK = "••••••"
CREDENTIAL_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(^|_)KEY\Z|_KEY_)")


def _key(material: str) -> Fernet:
    digest = hashlib.sha256(f"env-secret:{material}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _fernet() -> MultiFernet:
    """SECRET_ENV_KEY seals when it is set; otherwise a key derived from SECRET_KEY. Either,
    and SECRET_KEY_FALLBACKS, open: rotating a key keeps what the old one sealed readable."""
    materials = [settings.SECRET_ENV_KEY, settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    return MultiFernet([_key(material) for material in materials if material])


def seal(values: dict[str, str]) -> dict[str, str]:
    """{NAME: value} → {NAME: sealed token}."""
    fernet = _fernet()
    return {name: fernet.encrypt(value.encode()).decode() for name, value in values.items()}


def open_all(sealed: dict[str, str]) -> dict[str, str]:
    """{NAME: sealed token} → {NAME: value}. ImproperlyConfigured when no key of the console
    opens one (SECRET_ENV_KEY or SECRET_KEY changed without keeping the old as a fallback)."""
    fernet = _fernet()
    try:
        return {name: fernet.decrypt(token.encode()).decode() for name, token in sealed.items()}
    except InvalidToken as exc:
        raise ImproperlyConfigured(
            "A secret env value cannot be opened with SECRET_ENV_KEY or SECRET_KEY: keep the "
            "key it was sealed with in SECRET_KEY_FALLBACKS."
        ) from exc


def masked(names) -> dict[str, str]:
    """What anyone is shown of secrets: their names, each with MASK."""
    return dict.fromkeys(sorted(names), MASK)


def looks_secret(name: str) -> bool:
    """Whether a variable's name says it holds a credential."""
    return bool(CREDENTIAL_NAME.search(name))


def split(env: dict[str, str], secret_env: dict[str, str]) -> tuple[dict, dict]:
    """(plain env, secret env): the plain variables whose names look like credentials go
    with the secrets."""
    plain = {name: value for name, value in env.items() if not looks_secret(name)}
    moved = {name: value for name, value in env.items() if looks_secret(name)}
    return plain, {**moved, **secret_env}


def unmask(given: dict[str, str], stored: dict[str, str]) -> dict[str, str]:
    """Secrets `given` in clear, where a value that is MASK (a client sends back what it was
    shown: "keep it") takes the value sealed in `stored` under that name. A MASK with nothing
    stored is left as it is, for `errors` to refuse."""
    kept = {name for name, value in given.items() if value == MASK and name in stored}
    opened = open_all({name: stored[name] for name in kept})
    return {**given, **opened}


def errors(secret_env: dict[str, str], env: dict[str, str]) -> list[str]:
    """What is wrong with secrets beside the plain `env` (the names and values themselves are
    checked as env is: catalog.env_errors)."""
    problems = [
        f"{name}: give its value; {MASK} is how a secret is shown, not a value."
        for name, value in secret_env.items()
        if value == MASK
    ]
    problems += [
        f"{name} is both in env and a secret." for name in sorted(set(env) & set(secret_env))
    ]
    return problems

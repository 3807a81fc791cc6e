"""The name an instance gets when its launch gives none: its spec's code and two readable
words ("a100-quarter-brave-otter"), free among the tenant's live instances. The form, the API
and the CLI (which leaves it to the API) all get theirs here."""

import re
import secrets

ADJECTIVES = (
    "amber", "bold", "brave", "bright", "calm", "clever", "cosmic", "crisp", "eager", "fast",
    "fierce", "gentle", "golden", "happy", "keen", "lively", "lucky", "mellow", "misty",
    "nimble", "noble", "polar", "proud", "quick", "quiet", "rapid", "silent", "solar", "steady",
    "sunny", "swift", "tidy", "vivid", "warm", "wild", "witty",
)  # fmt: skip
ANIMALS = (
    "badger", "beaver", "bison", "crane", "dingo", "eagle", "falcon", "ferret", "finch", "fox",
    "gecko", "heron", "ibis", "jaguar", "koala", "lemur", "lynx", "marten", "moose", "newt",
    "ocelot", "orca", "otter", "owl", "panda", "puffin", "quail", "raven", "robin", "seal",
    "stoat", "swan", "tapir", "tiger", "walrus", "wombat", "yak", "zebra",
)  # fmt: skip
MAX_LENGTH = 63
TRIES = 20


def _words() -> str:
    return f"{secrets.choice(ADJECTIVES)}-{secrets.choice(ANIMALS)}"


def generate(spec_code: str, taken) -> str:
    """A name for an instance of `spec_code` that `taken(name)` says is free. After a run of
    taken ones (a tenant with very many), a short random suffix makes it free."""
    # a name takes only lowercase letters, digits and hyphens: "a100-1g.10gb" → "a100-1g-10gb"
    prefix = re.sub(r"[^a-z0-9]+", "-", spec_code.lower())[: MAX_LENGTH - 30].strip("-")
    prefix = prefix or "instance"
    for _ in range(TRIES):
        name = f"{prefix}-{_words()}"
        if not taken(name):
            return name
    return f"{prefix}-{_words()}-{secrets.token_hex(3)}"

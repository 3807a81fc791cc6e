"""Which registries a tenant's own image reference may come from: the one rule the launch
form, the API's serializer, launch templates and the tests call.

A region's operator decides whether tenants may name images of their own at all
(`Region.tenant_images`) and from which registries (`Region.allowed_registries`, a list of
host[:port]; empty: any). The region's registry mirror is always allowed. A reference must
name its registry: one that names none (`ubuntu`) or `localhost/` could resolve to an image
the hosts hold themselves (built or imported by the operator), which only the operator's
catalog runs."""

from console.catalog.models import REFERENCE, REGISTRY_HOST

MAX_REFERENCE = 255
EXAMPLE = "ghcr.io/your-team/trainer:1.0"


def registry_of(reference: str) -> str:
    """The registry a reference names (`ghcr.io`, `127.0.0.1:5000`), or "" when it names
    none (its first part is no host: `ubuntu`, `team/app`)."""
    first, slash, _ = reference.partition("/")
    if not slash or not ("." in first or ":" in first or first == "localhost"):
        return ""
    return first.lower()


def repository_of(reference: str) -> str:
    """The reference without its tag or digest: `ghcr.io/x/y:1.0` → `ghcr.io/x/y`."""
    name = reference.partition("@")[0]
    head, slash, last = name.rpartition("/")
    return f"{head}{slash}{last.partition(':')[0]}"


def pinned(reference: str, digest: str) -> str:
    """What an allocation pulls and runs once the reference is pinned: `repository@digest`."""
    return f"{repository_of(reference)}@{digest}" if digest else reference


def refusal(reference: str, region) -> str | None:
    """Why `region` refuses `reference` as a tenant's own image, in a sentence naming the rule;
    None when it may be launched there."""
    if not isinstance(reference, str) or not reference:
        return "Give an image reference, e.g. " + EXAMPLE + "."
    if len(reference) > MAX_REFERENCE:
        return f"An image reference has at most {MAX_REFERENCE} characters."
    registry = registry_of(reference)
    if not REFERENCE.fullmatch(reference) or (registry and not REGISTRY_HOST.fullmatch(registry)):
        return (
            "Not an image reference: registry/repository:tag in lower case, e.g. "
            f"{EXAMPLE} (no spaces, no scheme)."
        )
    if not region.tenant_images:
        return f"Region {region.code} runs only the catalog's images: choose one of those."
    if not registry:
        return (
            f"Name the registry, e.g. docker.io/{reference}: a reference without one could "
            "name an image the hosts hold themselves, which only the operator's catalog runs."
        )
    if registry == "localhost":
        return (
            "localhost/ names an image the hosts hold themselves, which only the operator's "
            "catalog runs: push it to a registry."
        )
    allowed = allowed_registries(region)
    if allowed and registry not in allowed:
        return (
            f"{registry} is not among the registries region {region.code} allows: "
            f"{', '.join(allowed)}."
        )
    return None


def allowed_registries(region) -> list[str]:
    """The registries `region` allows tenants ([]: any), its mirror among them."""
    listed = [host.lower() for host in region.allowed_registries or []]
    mirror = (region.registry_mirror or "").lower()
    if listed and mirror and mirror not in listed:
        listed.append(mirror)
    return listed

"""The images an `oci` host holds, and how they get there.

- Inventory: every image the engine holds (its references, id, size and layers), read again
  every IMAGE_REFRESH_SECONDS and after each pull or clean-up. The console places a launch on
  a host that holds its image when that costs no more fragmentation than its tolerance.
- Pulls: through the region's registry mirror first (the reference rewritten to the mirror's
  host, then tagged as the original, so that containers and the inventory use the original
  name), from the image's own registry when the mirror fails; one pull of a reference at a
  time, which a launch and a pre-pull of it share. A tenant's registry credential comes with
  its allocation, is used for that pull only (never through the mirror) and is kept nowhere;
  an image pulled with one is pulled again at each launch, with the launch's own credential,
  so that its copy on the host gives no other tenant an image its registry would refuse them.
- Pre-pull: the references the console names (PUT /v1/images/settings, kept in the state
  directory) are pulled in the background, at start and whenever the list changes; each
  one's progress is in the inventory. A failed one is tried again PRE_PULL_RETRY_SECONDS later.
- Registries: those the console names with the settings (its catalog's), the mirror's and the
  pre-pulls' are checked for reachability (agent/registry_probe.py); the inventory's
  `registries` says which this host reaches, and why not where it does not.
- Clean-up (POST /v1/images/clean-up): removes the images the agent pulled itself that no
  allocation here uses and the console does not want pre-pulled. Images an operator put on
  the host otherwise (built, imported, pulled by hand) are never touched, and the engine
  refuses to remove one a container uses.
- Room on the disk, as kubelet's image garbage collection makes it: when the filesystem of
  the engine's storage is `high` percent full or more (checked every IMAGE_REFRESH_SECONDS and
  before each pull), the images a clean-up may remove go, the least recently launched first,
  until it is `low` percent full or none is left. The last such clean-up is in the inventory
  (the console makes it a host event).

The console compares references normalized as `normalize` does (console/fleet/images.py
does the same: the agent imports nothing of the console).
"""

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from agent.errors import invalid
from agent.pulls import PullProgress, human_size
from agent.registry_probe import RegistryProbe, registry_of
from agent.runtimes import LaunchError

log = logging.getLogger(__name__)

IMAGE_REFRESH_SECONDS = 30.0
PRE_PULL_RETRY_SECONDS = 60.0
MAX_IMAGES = 500  # images the inventory lists, at most
MAX_PRE_PULL = 100
MAX_REGISTRIES = 50
# Kubelet's defaults for its image garbage collection (imageGCHigh/LowThresholdPercent).
DISK_HIGH_PERCENT = 85
DISK_LOW_PERCENT = 80
REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
MIRROR = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}(:[0-9]{1,5})?")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def normalize(reference: str) -> str:
    """A reference as engines store it: the registry named (Docker Hub's `docker.io`, its
    official images under `library/`) and the tag (`latest` where none is given), unless it
    names a digest: `ubuntu` → `docker.io/library/ubuntu:latest`."""
    name, at, digest = reference.partition("@")
    first, slash, rest = name.partition("/")
    if not slash or ("." not in first and ":" not in first and first != "localhost"):
        first, rest = "docker.io", name
    if first == "docker.io" and "/" not in rest:
        rest = f"library/{rest}"
    if not at and ":" not in rest.rsplit("/", 1)[-1]:
        rest += ":latest"
    return f"{first}/{rest}{at}{digest}"


def mirrored(reference: str, mirror: str) -> str | None:
    """The reference at the mirror (`127.0.0.1:5001/team/pytorch:2.4`), or None where the
    mirror does not serve it: no mirror, an image of this host (`localhost/`) or of the
    mirror itself, or one named by digest (the mirror's copy could not be tagged by it)."""
    if not mirror or "@" in reference:
        return None
    registry, _, path = normalize(reference).partition("/")
    if registry in (mirror, "localhost"):
        return None
    return f"{mirror}/{path}"


def split_reference(reference: str) -> tuple[str, str]:
    """`repo[:tag]` or `repo@digest` → (repository, tag or digest)."""
    if "@" in reference:
        repository, _, digest = reference.partition("@")
        return repository, digest
    last = reference.rsplit("/", 1)[-1]
    if ":" in last:
        repository, _, tag = reference.rpartition(":")
        return repository, tag
    return reference, "latest"


def repo_digest(repo_digests: list[str], reference: str) -> str | None:
    """The digest of `reference`'s repository among an image's RepoDigests
    (`ghcr.io/x/y@sha256:…`), else the first one's (a copy pulled through the mirror names
    the mirror's repository: the same bytes)."""
    repository = split_reference(normalize(reference))[0]
    found = []
    for entry in repo_digests:
        name, at, digest = entry.partition("@")
        if not at or not DIGEST.fullmatch(digest):
            continue
        if normalize(f"{name}@{digest}").partition("@")[0] == repository:
            return digest
        found.append(digest)
    return found[0] if found else None


# Pull failures, as engines word them (Docker's and Podman's, whose errors come from
# containers/image): what the registry said, and what that calls for.
_UNAUTHORIZED = re.compile(
    r"unauthori[sz]ed|authentication required|401|invalid username/password|"
    r"access to the resource is denied|denied: ",
    re.IGNORECASE,
)
_NOT_FOUND = re.compile(
    r"manifest unknown|name unknown|not found|404|no such image|does not exist", re.IGNORECASE
)
_UNREACHABLE = re.compile(
    r"connection refused|no such host|i/o timeout|dial tcp|network is unreachable|"
    r"no route to host|timeout|server misbehaving|tls: |x509: |http response to https client",
    re.IGNORECASE,
)
RAW_ERROR_CHARS = 140  # of the engine's own words, at most, in a reason


# what Podman says before each error, the reference again: the reason names it already
_SOURCE = re.compile(r"initializing source docker://\S+: ")


def shorten(text: str, limit: int = RAW_ERROR_CHARS) -> str:
    """The engine's error in at most `limit` characters, cut at a word's end with "…"."""
    text = " ".join(_SOURCE.sub("", text).split())
    if len(text) <= limit:
        return text
    cut = text[:limit]
    cut = cut[: cut.rfind(" ")] if " " in cut else cut[:-1]
    return cut.rstrip(" ,;:(") + "…"


def pull_failure(reference: str, error: str, auth: dict | None) -> str:
    """The reason ("code: detail", console/instances/reasons.py says it in words) of a pull of
    `reference` that failed with the engine's `error`, with `auth` the credential used (its
    username may be named, never its password)."""
    registry = registry_of(normalize(reference))
    raw = shorten(error.replace(auth["password"], "••••••") if auth else error)
    if registry == "localhost":  # no registry holds it: it is built on the host, or absent
        return (
            f"image_not_found: {reference} is not on this host (an image of the host's own is "
            "built or loaded there, e.g. by make images)"
        )
    if _UNAUTHORIZED.search(error):
        if auth:
            return (
                f"registry_refused_credentials: {registry} refused the credentials "
                f"‘{auth['username']}’: {raw}"
            )
        return f"registry_needs_credentials: {registry} asks for credentials to pull {reference}"
    if _NOT_FOUND.search(error):
        return f"image_not_found: {reference} is not in {registry}: {raw}"
    if _UNREACHABLE.search(error):
        return f"registry_unreachable: {registry}: {raw}"
    return f"image_pull_failed: {reference}: {raw}"


def parse_settings(body) -> tuple[list[str], str, list[str]]:
    """The body of PUT /v1/images/settings: `{"pre_pull": [reference, …], "mirror":
    "host[:port]" or "", "registries": [host[:port], …]}` (registries to check; optional, for
    a console one version behind) → (the references normalized, sorted and unique; the
    mirror; the registries sorted and unique)."""
    if not isinstance(body, dict) or not {"pre_pull", "mirror"} <= set(body) <= SETTINGS_KEYS:
        raise invalid(
            'the body must be {"pre_pull": [reference, …], "mirror": "host[:port]", '
            '"registries": ["host[:port]", …]}'
        )
    pre_pull, mirror = body["pre_pull"], body["mirror"]
    registries = body.get("registries", [])
    if not isinstance(pre_pull, list) or len(pre_pull) > MAX_PRE_PULL:
        raise invalid(f"pre_pull must be a list of at most {MAX_PRE_PULL} references")
    for reference in pre_pull:
        if not isinstance(reference, str) or not REFERENCE.fullmatch(reference):
            raise invalid(f"not an image reference in pre_pull: {reference!r}", "invalid_reference")
    if not isinstance(mirror, str) or (mirror and not MIRROR.fullmatch(mirror)):
        raise invalid(f"mirror must be host[:port] or empty, not {mirror!r}", "invalid_mirror")
    if not isinstance(registries, list) or len(registries) > MAX_REGISTRIES:
        raise invalid(f"registries must be a list of at most {MAX_REGISTRIES} host[:port]")
    for registry in registries:
        if not isinstance(registry, str) or not MIRROR.fullmatch(registry):
            raise invalid(f"not a registry in registries: {registry!r}", "invalid_registry")
    return sorted({normalize(reference) for reference in pre_pull}), mirror, sorted(set(registries))


def _detail(report: str) -> str:
    """What a pull's report says of its progress: `3 of 7 layers · 1.2 GB of 3.4 GB`."""
    if report.startswith(("pulling ", "pulled ")):
        return report.partition(": ")[2]
    return report


class ImageStore:
    """The engine's images as the agent keeps them: see the module's docstring. Its calls
    block (the host runs them in a worker thread); the pre-pulls run in a thread of their
    own."""

    def __init__(
        self,
        client,
        path: Path,
        disk_percents: tuple[int, int] = (DISK_HIGH_PERCENT, DISK_LOW_PERCENT),
        probe: RegistryProbe | None = None,
    ):
        """`client`: the engine's docker.DockerClient; `path`: the file that keeps the
        settings and what the agent pulled, across restarts; `disk_percents`: (high, low),
        how full the engine's disk may get before images go to make room, and until when;
        `probe`: what checks the registries (a fresh one, started, by default)."""
        self.client = client
        self.path = path
        self.high, self.low = disk_percents
        # the images the host's allocations use (LocalHost sets it): never removed for room
        self.in_use: Callable[[], set[str]] = set
        self.disk_usage = shutil.disk_usage
        saved = self._load()
        self.pre_pull: list[str] = saved.get("pre_pull", [])
        self.mirror: str = saved.get("mirror", "")
        self.registries: list[str] = saved.get("registries", [])
        self.pulled: set[str] = set(saved.get("pulled", []))  # what clean-up may remove
        self.launched: dict[str, float] = saved.get("launched", {})  # reference -> when last
        self.last_room: dict | None = saved.get("last_room")  # the last clean-up for room
        # images pulled with a tenant's credential: a copy here proves no right to them, so
        # every launch of one pulls it again with its own credential (the registry decides)
        self.private: set[str] = set(saved.get("private", []))
        self._storage: str | None = None
        self._removing = threading.Lock()
        self.pulls: dict[str, dict] = {}  # pre-pull reference -> {"state", "detail"}
        self.held: list[dict] = []
        self._layers: dict[str, list[str]] = {}  # image id -> its layers, inspected once
        self._lock = threading.Lock()
        self._pulling: dict[str, threading.Lock] = {}
        self._wanted = threading.Event()
        self.refresh()
        self._wanted.set()
        threading.Thread(target=self._pre_pull_loop, name="pre-pull", daemon=True).start()
        if probe is None:
            probe = RegistryProbe()
            probe.start()
        self.probe = probe
        self._probe_wanted()

    # --- what the host holds --------------------------------------------------------------

    def refresh(self) -> None:
        """Read the engine's images again (an image inspected once is not inspected again)."""
        entries = []
        for item in self.client.api.images():
            references = sorted(
                {normalize(tag) for tag in item.get("RepoTags") or () if "<none>" not in tag}
            )
            if not references:
                continue
            layers = self._layers.get(item["Id"])
            if layers is None:
                try:
                    inspected = self.client.api.inspect_image(item["Id"])
                except NotFound:  # removed since the listing
                    continue
                layers = self._layers[item["Id"]] = (inspected.get("RootFS") or {}).get(
                    "Layers"
                ) or []
            entries.append(
                {
                    "references": references,
                    "id": item["Id"],
                    "size": int(item.get("Size") or 0),
                    "layers": layers,
                }
            )
        entries.sort(key=lambda entry: entry["id"])
        with self._lock:
            self.held = entries[:MAX_IMAGES]
            self._layers = {entry["id"]: entry["layers"] for entry in entries}

    def _refresh_quietly(self) -> None:
        try:
            self.refresh()
        except (DockerException, requests.RequestException) as exc:
            log.warning("cannot list the engine's images: %s", exc)

    def inventory(self) -> dict:
        """The inventory's part of images: what the host holds, the settings it applies, and
        each pre-pull's state (waiting, pulling, pulled, failed) with its detail."""
        with self._lock:
            return {
                "images": list(self.held),
                "image_settings": {
                    "pre_pull": list(self.pre_pull),
                    "mirror": self.mirror,
                    "registries": list(self.registries),
                },
                "registries": self.probe.report(),
                "pre_pulls": [
                    {"reference": reference, **self.pulls.get(reference, _WAITING)}
                    for reference in self.pre_pull
                ],
                "image_disk": {
                    "high_percent": self.high,
                    "low_percent": self.low,
                    "last_clean_up": self.last_room,
                },
            }

    # --- pulls ----------------------------------------------------------------------------

    def ensure(self, reference: str, progress, auth: dict | None = None) -> None:
        """Pull `reference` unless the engine has it, reporting progress (`progress(text,
        figures)`: the figures are PullProgress.snapshot's, None in a report without them),
        with `auth` ({registry, username, password}: a tenant's credential, used for this pull
        only and never kept or logged). LaunchError with the reason when it cannot be had."""
        with self._lock:
            lock = self._pulling.setdefault(reference, threading.Lock())
        with lock:  # a launch and a pre-pull of one image wait for one pull
            try:
                self.client.images.get(reference)
                if not self.is_private(reference):
                    return
            except ImageNotFound:
                pass
            except APIError as exc:
                raise LaunchError(f"engine_unavailable: {exc.explanation or exc}") from exc
            self.make_room()
            self._pull(reference, progress, auth)
            if auth:
                digest = self.digest_of(reference)
                repository = split_reference(reference)[0]
                with self._lock:
                    self.private.add(normalize(reference))
                    if digest:  # the same bytes by their digest
                        self.private.add(normalize(f"{repository}@{digest}"))
                    self._save()
        self._refresh_quietly()

    def is_private(self, reference: str) -> bool:
        """Whether `reference` was pulled with a credential: then each launch pulls it again
        with its own (see `private`)."""
        return normalize(reference) in self.private

    def launching(self, reference: str) -> None:
        """A workload of `reference` starts: the least recently launched images go first when
        room is made."""
        with self._lock:
            self.launched[normalize(reference)] = time.time()
            self._save()

    def digest_of(self, reference: str) -> str | None:
        """The digest (sha256:…) the engine's image of `reference` was pulled at, from its
        RepoDigests (that repository's, else the mirror's copy's); None for an image built or
        imported here, which no registry names."""
        if "@" in reference:
            return reference.partition("@")[2]
        try:
            attrs = self.client.api.inspect_image(reference)
        except (DockerException, requests.RequestException):
            return None
        return repo_digest(attrs.get("RepoDigests") or [], reference)

    def _pull(self, reference: str, progress, auth: dict | None = None) -> None:
        mirror = self.mirror
        # with a credential, its registry decides: a mirror's copy would ask for none
        source = None if auth else mirrored(reference, mirror)
        if source is not None:
            try:
                self._fetch(source, reference, progress, via=mirror)
                repository, tag = split_reference(reference)
                self.client.api.tag(source, repository, tag)
                with contextlib.suppress(APIError):  # the original name is there: enough
                    self.client.api.remove_image(source)
            except (LaunchError, APIError) as exc:
                progress(f"mirror {mirror} failed ({exc}); pulling {reference} from its registry")
            else:
                self._pulled(reference)
                return
        self._fetch(reference, reference, progress, auth=auth)
        self._pulled(reference)

    def _fetch(
        self, source: str, reference: str, progress, via: str = "", auth: dict | None = None
    ) -> None:
        """Pull `source` (the reference, or its copy at the mirror `via`), with `auth` when
        it is the credential of `source`'s registry."""
        repository, tag = split_reference(source)
        registry = registry_of(normalize(source))
        credential = auth if auth and auth.get("registry") == registry else None
        extra = (
            {
                "auth_config": {
                    "username": credential["username"],
                    "password": credential["password"],
                }
            }
            if credential
            else {}
        )
        pull = PullProgress(reference, via=via)
        progress(pull.start(), pull.snapshot())
        try:
            for line in self.client.api.pull(
                repository, tag=tag, stream=True, decode=True, **extra
            ):
                if line.get("error"):
                    raise LaunchError(pull_failure(reference, str(line["error"]), credential))
                pull.feed(line)
                if report := pull.due():
                    progress(report, pull.snapshot())
        except APIError as exc:
            raise LaunchError(
                pull_failure(reference, str(exc.explanation or exc), credential)
            ) from exc
        except requests.RequestException as exc:
            raise LaunchError(pull_failure(reference, str(exc), credential)) from exc
        try:
            image = self.client.images.get(source)
        except ImageNotFound as exc:
            raise LaunchError(f"image_not_found: {reference} (the pull brought nothing)") from exc
        text = pull.finished(image.id)
        progress(text, pull.snapshot(done=True))

    def _pulled(self, reference: str) -> None:
        with self._lock:
            self.pulled.add(normalize(reference))
            self._save()

    # --- pre-pulls ------------------------------------------------------------------------

    def configure(self, pre_pull: list[str], mirror: str, registries: Sequence[str] = ()) -> dict:
        """The console's settings (see parse_settings): kept, the pre-pulls started and the
        registries checked. Idempotent. Answers the settings as applied."""
        registries = list(registries)
        with self._lock:
            if (pre_pull, mirror, registries) != (self.pre_pull, self.mirror, self.registries):
                self.pre_pull, self.mirror, self.registries = pre_pull, mirror, registries
                self.pulls = {r: state for r, state in self.pulls.items() if r in pre_pull}
                self._save()
                log.info("images: pre-pull %s; mirror %s", pre_pull or "none", mirror or "none")
        self._probe_wanted()
        self._wanted.set()
        return {"pre_pull": pre_pull, "mirror": mirror, "registries": registries}

    def _probe_wanted(self) -> None:
        """The registries to check: the console's, the mirror and the pre-pulls'."""
        with self._lock:
            pulled_from = {registry_of(reference) for reference in self.pre_pull}
            self.probe.want({*self.registries, self.mirror, *pulled_from})

    def _pre_pull_loop(self) -> None:
        while True:
            with self._lock:
                failed = any(state["state"] == "failed" for state in self.pulls.values())
            self._wanted.wait(PRE_PULL_RETRY_SECONDS if failed else None)
            self._wanted.clear()
            for reference in list(self.pre_pull):
                if reference in self.pre_pull:  # not dropped meanwhile
                    self._pre_pull(reference)

    def _pre_pull(self, reference: str) -> None:
        def report(text: str, figures: dict | None = None) -> None:
            self._set_state(reference, "pulling", _detail(text))

        try:
            self.ensure(reference, report)
        except LaunchError as exc:
            log.warning("pre-pull of %s failed: %s", reference, exc)
            self._set_state(reference, "failed", str(exc))
        except (DockerException, requests.RequestException) as exc:
            self._set_state(reference, "failed", f"engine_unavailable: {exc}")
        else:
            self._set_state(reference, "pulled", "")

    def _set_state(self, reference: str, state: str, detail: str) -> None:
        with self._lock:
            if reference in self.pre_pull:
                self.pulls[reference] = {"state": state, "detail": detail[:200]}

    # --- clean-up -------------------------------------------------------------------------

    def clean_up(self, in_use: set[str]) -> dict:
        """Remove the images the agent pulled that neither `in_use` (the allocations' images)
        nor the pre-pull list names; the engine keeps one a container uses. Answers what was
        removed, what was kept and why, and the bytes freed."""
        outcome = self._remove(in_use)
        log.info(
            "image clean-up: removed %s (%s)",
            outcome["removed"] or "nothing",
            human_size(outcome["freed_bytes"]),
        )
        return outcome

    def disk_percent(self) -> float | None:
        """How full the filesystem of the engine's storage is, in percent, as `df` shows it
        (used of used and available: the root's reserve left out); None when the agent cannot
        see it (an engine on another machine, or in another mount namespace)."""
        if self._storage is None:
            info = self.client.info()
            self._storage = info.get("DockerRootDir") or (info.get("Store") or {}).get(
                "GraphRoot", ""
            )
        try:
            usage = self.disk_usage(self._storage)
        except OSError:
            return None
        return 100.0 * usage.used / (usage.used + usage.free) if usage.used + usage.free else None

    def make_room(self) -> dict | None:
        """When the engine's disk is `high` percent full or more: remove what a clean-up may
        remove, the least recently launched first, until it is `low` percent full. The
        outcome as clean_up's, with when and how full the disk was before and after; None when
        there is room (or no disk to read). The inventory keeps the last outcome that removed
        something, or a first that removed nothing: a disk that stays full of what may not go
        is reported once, not every IMAGE_REFRESH_SECONDS (each a host event)."""
        try:
            before = self.disk_percent()
            if before is None or before < self.high:
                return None
            outcome = self._remove(
                self.in_use(), enough=lambda: (self.disk_percent() or 0.0) <= self.low
            )
        except (DockerException, requests.RequestException) as exc:  # a pull may still fit
            log.warning("could not make room for images: %s", exc)
            return None
        after = self.disk_percent()
        outcome.update(
            at=round(time.time()),
            percent_before=round(before, 1),
            percent_after=round(after, 1) if after is not None else None,
        )
        with self._lock:
            last = self.last_room
            if outcome["removed"] or last is None or last["removed"]:  # not "none" again
                self.last_room = outcome
                self._save()
        log.warning(
            "images: the disk was %.1f%% full (at most %d%%): removed %s (%s); %s%% now",
            before,
            self.high,
            outcome["removed"] or "nothing",
            human_size(outcome["freed_bytes"]),
            outcome["percent_after"],
        )
        return outcome

    def _remove(self, in_use: set[str], enough: Callable[[], bool] | None = None) -> dict:
        """Clean-up's removals, the least recently launched first, until `enough()`."""
        with self._removing:
            self.refresh()
            keep = {normalize(reference) for reference in in_use} | set(self.pre_pull)
            removed, kept, freed = [], [], 0
            for entry in sorted(self.held, key=self._last_launched):
                names = set(entry["references"])
                if not names & self.pulled or names & keep:
                    continue
                if enough is not None and enough():
                    break
                if names - self.pulled:  # also named by someone else (tagged by hand): theirs
                    kept.append({"references": sorted(names), "why": "named by others too"})
                    continue
                try:
                    self.client.api.remove_image(entry["id"])
                except APIError as exc:  # a container uses it (409), or it went meanwhile
                    kept.append({"references": sorted(names), "why": str(exc.explanation or exc)})
                    continue
                removed += sorted(names)
                freed += entry["size"]
                with self._lock:
                    self.pulled -= names
            with self._lock:
                self._save()
            self._refresh_quietly()
        return {"removed": removed, "kept": kept, "freed_bytes": freed}

    def _last_launched(self, entry: dict) -> float:
        return max((self.launched.get(name, 0.0) for name in entry["references"]), default=0.0)

    # --- the state file ---------------------------------------------------------------------

    def _load(self) -> dict:
        try:
            saved = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return saved if isinstance(saved, dict) else {}

    def _save(self) -> None:
        """Write the settings and what the agent pulled, atomically (the caller holds the
        lock)."""
        data = {
            "pre_pull": self.pre_pull,
            "mirror": self.mirror,
            "registries": self.registries,
            "pulled": sorted(self.pulled),
            "launched": {name: at for name, at in self.launched.items() if name in self.pulled},
            "last_room": self.last_room,
            "private": sorted(self.private),
        }
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        with os.fdopen(fd, "w") as file:
            json.dump(data, file, indent=2, sort_keys=True)
        os.replace(tmp, self.path)


_WAITING = {"state": "waiting", "detail": ""}
SETTINGS_KEYS = frozenset({"pre_pull", "mirror", "registries"})

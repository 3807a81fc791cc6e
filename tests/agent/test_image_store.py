"""The agent's images (agent/image_store.py) on a fake engine: references as engines store
them, pulls through the region's mirror first and from the origin when it fails, clean-up that
keeps pre-pull and in-use images and what the agent did not pull; and the control API's new
routes: the console's credential only, their bodies checked."""

import asyncio
import time
from types import SimpleNamespace

import httpx
import pytest
import requests
from docker.errors import APIError, ImageNotFound

from agent.api import create_app
from agent.backends.sim import SimBackend
from agent.gpu_models import MODELS
from agent.host import LocalHost
from agent.identity import HostSecret
from agent.image_store import ImageStore, mirrored, normalize
from agent.registry_probe import RegistryProbe
from agent.runtimes import LaunchError
from agent.runtimes.sim import SimRuntime
from agent.state import StateStore

SECRET = "s3cret-of-the-host"
ORIGIN = "registry.example:5000"
MIRROR = "127.0.0.1:5001"


class FakeEngine:
    """What ImageStore asks of docker.DockerClient: images by reference, pulls that succeed
    from the registries in `serving`, tags and removals."""

    def __init__(self, serving=(ORIGIN,)):
        self.serving = set(serving)
        self.tags: dict[str, str] = {}  # reference -> image id
        self.pulled: list[str] = []
        self.in_use: set[str] = set()
        self.root = "/nonexistent/engine-storage"  # a disk the agent cannot see, unless set

    @property
    def client(self):
        """As docker.DockerClient: `api` (this), `images` (by reference) and `info`."""
        return SimpleNamespace(
            api=self,
            images=SimpleNamespace(get=self.get),
            info=lambda: {"DockerRootDir": self.root},
        )

    # docker.APIClient
    def images(self):
        ids = {}
        for reference, image_id in self.tags.items():
            ids.setdefault(image_id, []).append(reference)
        return [{"Id": i, "RepoTags": refs, "Size": 1_000_000} for i, refs in ids.items()]

    def inspect_image(self, image_id):
        return {"RootFS": {"Layers": [f"sha256:{image_id[-4:]}-layer"]}}

    def pull(self, repository, tag, stream, decode):
        reference = f"{repository}:{tag}"
        self.pulled.append(reference)
        if repository.split("/")[0] not in self.serving:
            raise APIError("connection refused")
        self.tags[reference] = f"sha256:{abs(hash(reference.split('/', 1)[1])):x}"
        yield {"status": "Pull complete", "id": "aaaa"}

    def tag(self, source, repository, tag):
        self.tags[f"{repository}:{tag}"] = self.tags[source]

    def remove_image(self, name):
        if name in self.tags:
            del self.tags[name]
            return
        if name in self.in_use:
            raise APIError("image is in use by a container")
        for reference in [r for r, i in self.tags.items() if i == name]:
            del self.tags[reference]

    def get(self, reference):
        if reference not in self.tags:
            raise ImageNotFound(reference)
        return type("Image", (), {"id": self.tags[reference]})()


def answering(**statuses):
    """A `requests.get` for the registry probe: the status each host answers; others refuse."""

    def get(url, **kwargs):
        host = url.split("/")[2]
        if host not in statuses:
            raise requests.ConnectionError("[Errno 111] Connection refused")
        return SimpleNamespace(status_code=statuses[host])

    return get


@pytest.fixture
def store(tmp_path):
    engine = FakeEngine()
    probe = RegistryProbe(get=answering(**{ORIGIN: 401}))  # not started: tests probe
    return engine, ImageStore(engine.client, tmp_path / "images.json", probe=probe)


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("ubuntu", "docker.io/library/ubuntu:latest"),
        ("pytorch/pytorch:2.5", "docker.io/pytorch/pytorch:2.5"),
        ("localhost/gpucloud/demo:latest", "localhost/gpucloud/demo:latest"),
        ("127.0.0.1:5000/team/x", "127.0.0.1:5000/team/x:latest"),
        ("ghcr.io/a/b@sha256:abc", "ghcr.io/a/b@sha256:abc"),
    ],
)
def test_references_are_compared_as_engines_store_them(given, stored):
    assert normalize(given) == stored


def test_the_mirror_serves_what_it_can_cache():
    assert mirrored("pytorch/pytorch:2.5", MIRROR) == f"{MIRROR}/pytorch/pytorch:2.5"
    assert mirrored(f"{ORIGIN}/team/x:1", MIRROR) == f"{MIRROR}/team/x:1"
    assert mirrored("localhost/gpucloud/demo:latest", MIRROR) is None  # this host's own
    assert mirrored(f"{MIRROR}/team/x:1", MIRROR) is None
    assert mirrored("ghcr.io/a/b@sha256:abc", MIRROR) is None  # a digest cannot be re-tagged
    assert mirrored("ubuntu", "") is None


def test_a_pull_goes_through_the_mirror_and_keeps_the_original_name(store):
    engine, images = store
    engine.serving.add(MIRROR)
    images.configure([], MIRROR)
    said = []
    images.ensure(f"{ORIGIN}/team/x:1", lambda text, *_: said.append(text))
    assert engine.pulled == [f"{MIRROR}/team/x:1"]
    assert set(engine.tags) == {f"{ORIGIN}/team/x:1"}  # the mirror's name is gone
    assert said[0] == f"pulling {ORIGIN}/team/x:1 (via mirror {MIRROR})"
    assert said[-1].startswith(f"pulled {ORIGIN}/team/x:1 (via mirror {MIRROR}) in ")
    assert images.inventory()["images"][0]["references"] == [f"{ORIGIN}/team/x:1"]


def test_a_failing_mirror_falls_back_to_the_origin_and_says_so(store):
    engine, images = store
    images.configure([], MIRROR)  # the mirror serves nothing: refused
    said = []
    images.ensure(f"{ORIGIN}/team/x:1", lambda text, *_: said.append(text))
    assert engine.pulled == [f"{MIRROR}/team/x:1", f"{ORIGIN}/team/x:1"]
    assert any(m.startswith(f"mirror {MIRROR} failed (") for m in said), said
    assert said[-1].startswith(f"pulled {ORIGIN}/team/x:1 in ")


def test_pre_pulls_run_in_the_background_and_report_their_state(store):
    engine, images = store
    images.configure([f"{ORIGIN}/team/a:1", f"{ORIGIN}/team/missing:1"], "")
    engine.serving.discard(ORIGIN)
    deadline = time.monotonic() + 5
    while any(p["state"] in ("waiting", "pulling") for p in images.inventory()["pre_pulls"]):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    states = {p["reference"]: p for p in images.inventory()["pre_pulls"]}
    assert states[f"{ORIGIN}/team/a:1"]["state"] == "failed"
    assert (
        states[f"{ORIGIN}/team/a:1"]["detail"]
        == "registry_unreachable: registry.example:5000: connection refused"
    )


def test_clean_up_keeps_pre_pull_in_use_and_what_the_agent_did_not_pull(store):
    engine, images = store
    for name in ("pre", "used", "busy", "junk"):
        images.ensure(f"{ORIGIN}/team/{name}:1", lambda *_: None)
    engine.tags["localhost/built/by-hand:1"] = "sha256:hand"  # not the agent's
    engine.in_use.add(engine.tags[f"{ORIGIN}/team/busy:1"])  # a container of it
    images.configure([f"{ORIGIN}/team/pre:1"], "")
    outcome = images.clean_up({f"{ORIGIN}/team/used:1"})
    assert outcome["removed"] == [f"{ORIGIN}/team/junk:1"]
    assert [k["references"] for k in outcome["kept"]] == [[f"{ORIGIN}/team/busy:1"]]
    assert set(engine.tags) == {
        f"{ORIGIN}/team/pre:1",
        f"{ORIGIN}/team/used:1",
        f"{ORIGIN}/team/busy:1",
        "localhost/built/by-hand:1",
    }


def test_the_inventory_digest_stays_while_the_images_do(tmp_path, store):
    engine, images = store
    runtime = SimRuntime()
    runtime.images = images
    host = LocalHost("h", SimBackend("h", MODELS["l4"], ["whole"]), runtime, StateStore(tmp_path))
    first = host.inventory()["digest"]
    images.refresh()
    assert host.inventory()["digest"] == first
    images.ensure(f"{ORIGIN}/team/x:1", lambda *_: None)
    assert host.inventory()["digest"] != first


def call(host, method, path, body=None, secret=SECRET):
    async def go():
        transport = httpx.ASGITransport(app=create_app(host, HostSecret(SECRET)))
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            return await client.request(method, path, json=body, headers=headers)

    return asyncio.run(go())


@pytest.fixture
def sim_host(tmp_path):
    return LocalHost(
        "h", SimBackend("h", MODELS["l4"], ["whole"]), SimRuntime(), StateStore(tmp_path)
    )


@pytest.mark.parametrize("secret", [None, "another-hosts-secret"])
def test_the_image_routes_take_only_the_consoles_credential(sim_host, secret):
    settings = call(sim_host, "PUT", "/v1/images/settings", {"pre_pull": [], "mirror": ""}, secret)
    assert settings.status_code == 401
    assert call(sim_host, "POST", "/v1/images/clean-up", secret=secret).status_code == 401


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"pre_pull": []}, "invalid_body"),
        ({"pre_pull": "ubuntu", "mirror": ""}, "invalid_body"),
        ({"pre_pull": ["bad reference; rm -rf"], "mirror": ""}, "invalid_reference"),
        ({"pre_pull": [], "mirror": "http://mirror/path"}, "invalid_mirror"),
        ({"pre_pull": ["x"] * 101, "mirror": ""}, "invalid_body"),
        ({"pre_pull": [], "mirror": "", "registries": ["https://quay.io"]}, "invalid_registry"),
        ({"pre_pull": [], "mirror": "", "registries": "quay.io"}, "invalid_body"),
        ({"pre_pull": [], "mirror": "", "registries": [], "more": 1}, "invalid_body"),
    ],
)
def test_bad_settings_are_refused_field_by_field(tmp_path, store, body, code):
    runtime = SimRuntime()
    runtime.images = store[1]
    host = LocalHost("h", SimBackend("h", MODELS["l4"], ["whole"]), runtime, StateStore(tmp_path))
    answer = call(host, "PUT", "/v1/images/settings", body)
    assert answer.status_code == 400
    assert answer.json()["error"] == code


def test_a_host_without_images_says_so(sim_host):
    answer = call(sim_host, "PUT", "/v1/images/settings", {"pre_pull": [], "mirror": ""})
    assert answer.status_code == 409
    assert answer.json()["error"] == "no_images"
    assert call(sim_host, "POST", "/v1/images/clean-up").json()["error"] == "no_images"


def short_disk(engine, base_gb: int, total_gb: int = 100):
    """disk_usage of an engine's disk holding `base_gb` besides 5 GB an image."""

    def usage(path):
        assert path == engine.root
        used = base_gb + 5 * len(set(engine.tags.values()))
        return SimpleNamespace(total=total_gb, used=used, free=total_gb - used)

    return usage


def test_a_short_disk_loses_the_least_recently_launched_images_until_it_has_room(store):
    """As kubelet's image garbage collection: at 85% full, images go (oldest launch first, one
    never launched before any) until 80%; in-use, pre-pull and others' images stay."""
    engine, images = store
    engine.root = "/var/lib/containers/storage"
    for name in ("old", "recent", "never", "used", "pre"):
        images.ensure(f"{ORIGIN}/team/{name}:1", lambda *_: None)
    engine.tags["localhost/built/by-hand:1"] = "sha256:hand"
    images.launching(f"{ORIGIN}/team/old:1")
    images.launching(f"{ORIGIN}/team/recent:1")
    images.configure([f"{ORIGIN}/team/pre:1"], "")
    images.in_use = lambda: {f"{ORIGIN}/team/used:1"}
    images.disk_usage = short_disk(engine, base_gb=54)  # 6 images: 84% full
    assert images.make_room() is None

    engine.tags["localhost/built/another:1"] = "sha256:another"  # 89%
    outcome = images.make_room()
    assert outcome["removed"] == [f"{ORIGIN}/team/never:1", f"{ORIGIN}/team/old:1"]
    assert (outcome["percent_before"], outcome["percent_after"]) == (89.0, 79.0)
    assert f"{ORIGIN}/team/recent:1" in engine.tags
    assert images.inventory()["image_disk"] == {
        "high_percent": 85, "low_percent": 80, "last_clean_up": outcome
    }  # fmt: skip
    again = ImageStore(
        engine.client, images.path, probe=RegistryProbe()
    )  # a restarted agent still reports it
    assert again.inventory()["image_disk"]["last_clean_up"] == outcome


def test_a_pull_onto_a_short_disk_makes_room_first(store):
    engine, images = store
    engine.root = "/var/lib/containers/storage"
    images.ensure(f"{ORIGIN}/team/old:1", lambda *_: None)
    images.disk_usage = short_disk(engine, base_gb=85)
    images.ensure(f"{ORIGIN}/team/new:1", lambda *_: None)
    assert f"{ORIGIN}/team/old:1" not in engine.tags
    assert f"{ORIGIN}/team/new:1" in engine.tags
    assert images.last_room["removed"] == [f"{ORIGIN}/team/old:1"]


def test_a_disk_the_agent_cannot_see_removes_nothing(store):
    engine, images = store
    images.ensure(f"{ORIGIN}/team/old:1", lambda *_: None)
    assert images.make_room() is None
    assert f"{ORIGIN}/team/old:1" in engine.tags


@pytest.mark.parametrize(
    ("given", "ok"),
    [("90:75", (90, 75)), ("85:80", (85, 80)), ("80:85", None), ("101:80", None),
     ("85", None), ("85:0", None), ("x:y", None)],
)  # fmt: skip
def test_the_agent_takes_its_disk_percents_as_high_colon_low(given, ok, capsys):
    from agent.__main__ import _parser

    if ok is None:
        with pytest.raises(SystemExit):
            _parser().parse_args(["--images-disk", given])
        assert "HIGH:LOW" in capsys.readouterr().err
    else:
        assert _parser().parse_args(["--images-disk", given]).images_disk == ok


def test_a_disk_that_stays_full_of_what_may_not_go_is_reported_once(store):
    """Checked every 30 s: the inventory (a host event each change) keeps the first 'removed
    none', not one per check, and a later clean-up that removes something replaces it."""
    engine, images = store
    engine.root = "/var/lib/containers/storage"
    images.ensure(f"{ORIGIN}/team/used:1", lambda *_: None)
    images.in_use = lambda: {f"{ORIGIN}/team/used:1"}
    images.disk_usage = short_disk(engine, base_gb=90)
    first = images.make_room()
    assert first["removed"] == []
    assert images.make_room()["removed"] == []
    assert images.inventory()["image_disk"]["last_clean_up"] is first
    images.in_use = set
    assert images.make_room()["removed"] == [f"{ORIGIN}/team/used:1"]
    assert images.inventory()["image_disk"]["last_clean_up"]["removed"] == [f"{ORIGIN}/team/used:1"]


def test_the_registries_named_the_mirror_and_the_pre_pulls_are_checked_and_reported(store):
    _, images = store
    applied = images.configure([f"{ORIGIN}/team/x:1"], MIRROR, ["localhost", "quay.io"])
    assert applied == {"pre_pull": [f"{ORIGIN}/team/x:1"], "mirror": MIRROR,
                       "registries": ["localhost", "quay.io"]}  # fmt: skip
    assert images.inventory()["registries"] == []  # not checked yet
    images.probe.probe_due()
    found = {entry["registry"]: entry for entry in images.inventory()["registries"]}
    assert set(found) == {ORIGIN, MIRROR, "quay.io"}  # localhost: this host's own images
    assert found[ORIGIN]["reachable"] and found[ORIGIN]["error"] == ""  # 401: it is there
    assert not found["quay.io"]["reachable"]
    assert found["quay.io"]["error"] == (
        "https: [Errno 111] Connection refused; http: [Errno 111] Connection refused"
    )
    assert images.inventory()["image_settings"]["registries"] == ["localhost", "quay.io"]


def test_a_registry_is_asked_again_once_its_answer_is_old_and_a_new_one_at_once():
    statuses = {"quay.io": 503}
    asked = []

    def get(url, **kwargs):
        asked.append(url)
        return SimpleNamespace(status_code=statuses[url.split("/")[2]])

    probe = RegistryProbe(get=get, interval=0.2)
    probe.want(["quay.io"])
    probe.probe_due()
    assert asked == ["https://quay.io/v2/", "http://quay.io/v2/"]
    assert probe.report()[0]["error"] == "https: HTTP 503 from /v2/; http: HTTP 503 from /v2/"
    probe.probe_due()
    assert len(asked) == 2  # its answer is fresh
    statuses.update({"quay.io": 200, "docker.io": 200, "registry-1.docker.io": 200})
    probe.want(["quay.io", "docker.io"])
    probe.probe_due()
    assert asked[2:] == ["https://registry-1.docker.io/v2/"]  # Docker Hub's API host
    time.sleep(0.25)
    probe.probe_due()
    assert [entry["reachable"] for entry in probe.report()] == [True, True]
    probe.want(["docker.io"])
    assert [entry["registry"] for entry in probe.report()] == ["docker.io"]


class PrivateEngine(FakeEngine):
    """A registry that serves ORIGIN's images to the credential `allowed` only."""

    allowed = {"username": "ci-bot", "password": "right"}

    def pull(self, repository, tag, stream, decode, auth_config=None):
        if auth_config != self.allowed:
            self.pulled.append(f"{repository}:{tag}")
            raise APIError("unauthorized: authentication required")
        return super().pull(repository, tag, stream, decode)

    def inspect_image(self, image_id):
        digest = "sha256:" + "e" * 64
        return {**super().inspect_image(image_id), "RepoDigests": [f"{ORIGIN}/team/p@{digest}"]}


def test_an_image_pulled_with_a_credential_is_no_other_tenants(tmp_path):
    engine = PrivateEngine()
    images = ImageStore(engine.client, tmp_path / "images.json")
    reference = f"{ORIGIN}/team/p:1"
    right = {"registry": ORIGIN, **PrivateEngine.allowed}
    images.ensure(reference, lambda *_: None, right)
    assert images.is_private(reference)
    assert images.is_private(f"{ORIGIN}/team/p@sha256:" + "e" * 64)
    # the host holds it, yet a launch without the credential asks the registry, which refuses
    with pytest.raises(LaunchError, match="registry_needs_credentials"):
        images.ensure(reference, lambda *_: None)
    wrong = {**right, "password": "wrong"}
    with pytest.raises(LaunchError, match="registry_refused_credentials") as refused:
        images.ensure(reference, lambda *_: None, wrong)
    assert "wrong" not in str(refused.value).replace("‘ci-bot’", "")
    images.ensure(reference, lambda *_: None, right)  # the owner's launch pulls again
    assert "right" not in (tmp_path / "images.json").read_text()
    # an agent restarted remembers which are private
    again = ImageStore(engine.client, tmp_path / "images.json")
    assert again.is_private(reference)

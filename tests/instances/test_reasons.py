"""State reasons in words (console/instances/reasons.py): every code has a sentence, every
reason the agents send is read as one of them, and the instance page, the list, the API
(reason_text) and the CLI say it."""

import ast
import json
import re
from pathlib import Path

import pytest
from django.test import Client

from accounts.roles import Role
from cli.main import main as cli_main
from console.instances import reasons
from console.instances.models import Instance, State
from console.instances.reasons import Code, Reason
from tests.instances.helpers import make_instance

ROOT = Path(__file__).resolve().parents[2]
# Where the agents make the reasons they send as text (their exit and failure reasons); the
# console's own are a Code each.
SOURCES = [
    # not backends/: a GPU's health, not a state
    *sorted((ROOT / "agent").glob("*.py")),
    *sorted((ROOT / "agent" / "runtimes").glob("*.py")),
]
CODE_WITH_DETAIL = re.compile(r"^([a-z]+(?:_[a-z]+)+): ")
# Calls whose arguments are reasons: (name, index of the reason among the positional ones).
REASON_ARGS = {"Exit": 1, "_ended": 2, "LaunchError": 0}
# Calls whose `reason=` is a state reason.
REASON_KEYWORDS = {"Exit", "_ended"}


def _text(node: ast.AST, constants: dict[str, str]) -> str | None:
    """A string literal, an f-string with each placeholder read as "0" (or as the module's
    string constant it names), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(value.value)
            elif isinstance(value.value, ast.Name) and value.value.id in constants:
                parts.append(constants[value.value.id])
            else:
                parts.append("0")
        return "".join(parts)
    return None


def _literals(node: ast.AST | None, constants: dict[str, str]) -> list[str]:
    """The strings an expression can be: a literal, either branch of `a if c else b`, the
    operands of `a or b`."""
    if node is None:
        return []
    if isinstance(node, ast.IfExp):
        return _literals(node.body, constants) + _literals(node.orelse, constants)
    if isinstance(node, ast.BoolOp):
        return [text for value in node.values for text in _literals(value, constants)]
    text = _text(node, constants)
    return [text] if text is not None else []


def _assigned(node: ast.Assign) -> list[tuple[str, ast.AST]]:
    """(name, value) of `a = x` and of `a, b = x, y`."""
    pairs = []
    for target in node.targets:
        if isinstance(target, ast.Name):
            pairs.append((target.id, node.value))
        elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
            pairs += [
                (t.id, v)
                for t, v in zip(target.elts, node.value.elts, strict=False)
                if isinstance(t, ast.Name)
            ]
    return pairs


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def collected_reasons() -> dict[str, set[str]]:
    """Every state reason the agents can send, by file: literals passed as a reason (to Exit,
    _ended, LaunchError, or as `reason=`), assigned to `reason`, returned by `_reattach`, and
    every "code: detail" literal."""
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        constants = {
            name: value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            for name, value in _assigned(node)
            if isinstance(value, ast.Constant) and isinstance(value.value, str)
        }
        texts: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                index = REASON_ARGS.get(_call_name(node))
                if index is not None and len(node.args) > index:
                    texts += _literals(node.args[index], constants)
                for keyword in node.keywords:
                    if keyword.arg == "reason" and _call_name(node) in REASON_KEYWORDS:
                        texts += _literals(keyword.value, constants)
            elif isinstance(node, ast.Assign):
                for name, value in _assigned(node):
                    if name == "reason":
                        texts += _literals(value, constants)
            elif isinstance(node, ast.FunctionDef) and node.name == "_reattach":
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Return):
                        texts += _literals(inner.value, constants)
            text = _text(node, constants)
            if text is not None and CODE_WITH_DETAIL.match(text):
                texts.append(text)
        if texts:
            found[str(path.relative_to(ROOT))] = set(texts)
    return found


def test_every_code_has_a_sentence():
    assert set(reasons.REASONS) == set(Code)


def test_every_reason_the_agents_send_is_a_code():
    found = collected_reasons()
    # the collection finds what it must: the agent's exits and failures
    every = {reasons.from_agent(text).code for texts in found.values() for text in texts}
    assert {"oom_killed", "container_lost", "gpu_memory_cap", "image_pull_failed",
            "exit_code", "exited", "agent_restarted"} <= every  # fmt: skip
    without = {
        (where, text)
        for where, texts in found.items()
        for text in texts
        # a placeholder first ("{reason}: …") is a code made from the other literals
        if text and not text.startswith("0") and not reasons.from_agent(text).code
    }
    assert not without, f"agents' reasons that are not a Code in reasons.py: {sorted(without)}"


@pytest.mark.parametrize(
    ("text", "code", "detail"),
    [
        ("oom_killed", Code.OOM_KILLED, ""),
        ("image_pull_failed: ghcr.io/x:1: manifest unknown", Code.IMAGE_PULL_FAILED,
         "ghcr.io/x:1: manifest unknown"),
        ("exit code 3", Code.EXIT_CODE, "3"),
        ("exit code -9", Code.EXIT_CODE, "-9"),
        ("pulling demo 1.2 of 3.4 GB", "", "pulling demo 1.2 of 3.4 GB"),
        ("no_such_code: what it said", "", "no_such_code: what it said"),
    ],
)  # fmt: skip
def test_an_agents_reason_is_read_as_a_code_and_its_detail_and_said_back_the_same(
    text, code, detail
):
    reason = reasons.from_agent(text)
    assert (reason.code, reason.detail, reason.text) == (code, detail, text)


@pytest.mark.django_db
def test_an_instance_keeps_its_reasons_code_and_detail(catalog, tenant):
    instance = make_instance(catalog, tenant, state=State.FAILED)
    instance.set_reason(Reason(Code.HOST_LOST, "host gpu-1 lost at 12:00"))
    kept = Instance.objects.get(pk=instance.pk)
    assert Code(kept.state_reason_code) is Code.HOST_LOST
    assert kept.reason == Reason(Code.HOST_LOST, "host gpu-1 lost at 12:00")
    assert kept.state_reason == "host_lost: host gpu-1 lost at 12:00"
    # a long detail is cut so that the reason's one line stays within 200 characters
    instance.set_reason(Reason(Code.AGENT_REJECTED, "x" * 300))
    kept = Instance.objects.get(pk=instance.pk)
    assert len(kept.state_reason) == 200 and kept.state_reason.startswith("agent_rejected: xx")
    instance.set_reason(None)
    assert Instance.objects.get(pk=instance.pk).reason == Reason()


def test_the_sentences_say_what_happened_and_what_to_do():
    oom = reasons.explain(Reason(Code.OOM_KILLED), ram_mib=256)
    assert oom == "Ran out of its 256 MiB of memory — choose a larger spec (resize it)."
    assert "its 1.5 TiB of memory" in reasons.explain(Reason(Code.OOM_KILLED), ram_mib=1536 * 1024)
    capped = reasons.explain(Reason(Code.GPU_MEMORY_CAP), gpu_memory_mib=40960)
    assert "its 40 GiB of GPU memory" in capped
    assert reasons.explain(Reason(Code.EXIT_CODE, "3")) == (
        "Its workload exited with code 3 — read its logs for the error, then start it again."
    )
    pulled = reasons.explain(Reason(Code.IMAGE_PULL_FAILED, "ghcr.io/x:1: manifest unknown"))
    assert pulled.startswith("Its image could not be downloaded (ghcr.io/x:1: manifest unknown)")
    # words already are shown as they are; nothing is nothing
    waiting = "Waiting for capacity: no A100 x1 free in Local 1."
    assert reasons.explain(Reason(detail=waiting)) == waiting
    assert reasons.explain(Reason()) == reasons.explain(None) == ""


@pytest.fixture
def oom(catalog, tenant):
    return make_instance(
        catalog, tenant, state=State.FAILED, name="oom", state_reason_code=Code.OOM_KILLED,
        exit_code=137,
    )  # fmt: skip


@pytest.mark.django_db
def test_the_api_gives_reason_text_next_to_the_code(
    oom, catalog, tenant, make_member, token_client
):
    api = token_client(make_member(tenant, Role.VIEWER))
    shown = api.get(f"/api/v1/instances/{oom.pk}/").json()
    sentence = "Ran out of its 16 GiB of memory — choose a larger spec (resize it)."
    assert (shown["state_reason"], shown["reason_text"]) == ("oom_killed", sentence)
    listed = api.get("/api/v1/instances/").json()["results"]
    assert [row["reason_text"] for row in listed] == [sentence]
    running = make_instance(catalog, tenant, state=State.RUNNING, name="fine")
    assert api.get(f"/api/v1/instances/{running.pk}/").json()["reason_text"] == ""
    # the one line of a code with its detail, and of words, as it always was
    spent = make_instance(
        catalog, tenant, state=State.STOPPED, name="spent",
        **Instance.reason_fields(reasons.budget_stopped("0.12 USD", "0.13 USD")),
    )  # fmt: skip
    shown = api.get(f"/api/v1/instances/{spent.pk}/").json()
    assert shown["state_reason"] == "budget_stopped: monthly budget of 0.12 USD reached at 0.13 USD"
    waiting = "Waiting for capacity: no A100 x1 free in Local 1."
    queued = make_instance(catalog, tenant, name="queued", state_reason_detail=waiting)
    shown = api.get(f"/api/v1/instances/{queued.pk}/").json()
    assert (shown["state_reason"], shown["reason_text"]) == (waiting, waiting)


@pytest.mark.django_db
def test_the_instance_page_and_the_list_say_it_in_words(oom, catalog, tenant, make_member):
    budget = reasons.budget_stopped("0.12 USD", "0.13 USD")
    make_instance(
        catalog, tenant, state=State.STOPPED, name="spent", **Instance.reason_fields(budget)
    )
    web = Client()
    web.force_login(make_member(tenant, Role.VIEWER).user)
    page = web.get(f"/instances/{oom.pk}/").content.decode()
    assert "Ran out of its 16 GiB of memory — choose a larger spec (resize it)." in page
    listing = web.get("/instances/").content.decode()
    assert "Ran out of its 16 GiB of memory" in listing
    assert "Stopped: monthly budget of 0.12 USD reached at 0.13 USD" in listing
    assert ">oom_killed<" not in page + listing


@pytest.mark.django_db(transaction=True)
def test_the_cli_shows_the_reason_in_words(
    live_server, catalog, tenant, make_member, token_client, monkeypatch, tmp_path, capsys
):
    failed = make_instance(
        catalog, tenant, state=State.FAILED, name="oom", state_reason_code=Code.OOM_KILLED
    )
    client = token_client(make_member(tenant, Role.MEMBER))
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("GPUCLOUD_URL", live_server.url)
    monkeypatch.setenv("GPUCLOUD_TOKEN", client.raw_token)
    sentence = "Ran out of its 16 GiB of memory — choose a larger spec (resize it)."
    assert cli_main(["instances"]) == 0
    listing = capsys.readouterr().out
    assert "REASON" in listing.splitlines()[0] and sentence in listing
    assert cli_main(["show", "oom"]) == 0
    assert sentence in capsys.readouterr().out
    assert cli_main(["--json", "show", str(failed.pk)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["state_reason"], shown["reason_text"]) == ("oom_killed", sentence)

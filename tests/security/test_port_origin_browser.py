"""The attack of the issue, in Chromium: a member of Globex serves a page from their instance;
alice, a member of Globex and owner of Acme, opens it from the console. Its script tries to
read the console, to switch alice to Acme and create an API token there (with a CSRF cookie it
tossed onto the whole domain), to frame the console, and its server sets `sessionid` and
`csrftoken`. The console and its ports share a domain (gpucloud.test, *.ports.gpucloud.test),
as they would in production, so that nothing but the origin keeps them apart."""

import json

import pytest
from playwright.sync_api import expect

from accounts.models import ApiToken, Membership
from accounts.roles import Role
from tests.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.instances.e2e import api_client, make_tenant
from tests.pages import screenshot, sign_in, steady
from tests.security import test_port_origin
from tests.security.test_port_origin import CONSOLE_HOST, PORTS_DOMAIN, launch_site, with_demo_image

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.containers]
port_stack = test_port_origin.port_stack  # the fixture: console and ports on one domain

TOSSED = "t" * 32  # a well-formed CSRF secret
ATTACK = """(async () => {
  const C = "%(console)s", out = {};
  const attempt = async (name, f) => {
    try { out[name] = await f(); } catch (e) { out[name] = "blocked: " + e.name; }
  };
  await attempt("read_tokens", async () =>
    (await (await fetch(C + "/tokens/", {credentials: "include"})).text()).slice(0, 80));
  out.cookies = document.cookie;
  document.cookie = "csrftoken=%(tossed)s; domain=%(domain)s; path=/";
  const post = (path, body) => fetch(C + path, {
    method: "POST", mode: "no-cors", credentials: "include",
    headers: {"Content-Type": "application/x-www-form-urlencoded"},
    body: "csrfmiddlewaretoken=%(tossed)s&" + body,
  }).then((answer) => answer.type);
  await attempt("switch", () => post("/tenant/switch/", "tenant=%(acme)s"));
  await attempt("token", () => post("/tokens/", "name=stolen"));
  const frame = document.createElement("iframe");
  frame.src = C + "/";
  document.body.append(frame);
  await new Promise((done) => { frame.onload = done; setTimeout(done, 3000); });
  await attempt("frame", async () => String(frame.contentDocument));
  await attempt("app_cookies", async () => (await fetch("/cgi-bin/cookie")).status);
  document.getElementById("result").textContent = JSON.stringify(out);
})();"""


@pytest.fixture
def chromium():
    """Chromium that finds gpucloud.test and its subdomains on this machine."""
    import os

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    rules = f"MAP {CONSOLE_HOST} 127.0.0.1, MAP *.{CONSOLE_HOST} 127.0.0.1"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[*CHROMIUM_ARGS, f"--host-resolver-rules={rules}"],
        )
        yield browser
        browser.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


def test_a_page_on_a_members_port_can_neither_read_nor_act_on_the_console(
    port_stack, container_engine, chromium
):
    stack = port_stack
    with_demo_image(stack, container_engine)
    acme, alice = make_tenant(slug="acme", username="alice")
    Membership.objects.filter(pk=alice.pk).update(role=Role.OWNER)
    globex, mallory = make_tenant(slug="globex", username="mallory")
    Membership.objects.create(user=alice.user, tenant=globex, role=Role.MEMBER)
    script = ATTACK % {"console": stack.console, "tossed": TOSSED, "domain": CONSOLE_HOST,
                       "acme": acme.pk}  # fmt: skip
    site = launch_site(stack, api_client(stack, mallory), script=script)

    context = chromium.new_context()
    page = steady(context.new_page())
    page.set_default_timeout(15_000)
    sign_in(page, stack.console, "alice")
    page.select_option("#tenant-select", str(globex.pk))
    expect(page.get_by_test_id("current-tenant")).to_contain_text("Globex")
    page.goto(f"{stack.console}/instances/{site['id']}/")
    with page.expect_popup() as opened:
        page.get_by_test_id("port-link").click()
    app = opened.value
    expect(app.locator("#result")).not_to_be_empty(timeout=20_000)
    assert app.url.startswith(f"http://i{site['id']}-8888.{PORTS_DOMAIN}:{stack.port}/")
    out = json.loads(app.locator("#result").text_content())
    screenshot(app, "port-origin-attack")

    assert out["read_tokens"] == "blocked: TypeError"  # cross-origin, no CORS: nothing to read
    assert "sessionid" not in out["cookies"] and "csrftoken" not in out["cookies"]
    assert "gpucloud-port" not in out["cookies"]  # the origin's own cookie is HttpOnly
    assert out["switch"] == out["token"] == "opaque"  # sent; what came back is unreadable
    assert not ApiToken.objects.filter(user=alice.user).exists()
    assert out["frame"] == "null" and out["app_cookies"] == 200
    framed = [f for f in app.frames if f is not app.main_frame]
    assert framed and all(f.url.startswith("chrome-error://") for f in framed)

    console_cookies = {(c["name"], c["domain"], c["value"]) for c in context.cookies(stack.console)}
    assert not {value for name, _, value in console_cookies if name == "sessionid"} & {"evil"}
    assert ("csrftoken", f".{CONSOLE_HOST}", TOSSED) in console_cookies  # and yet refused above
    app_cookies = {c["name"]: c for c in context.cookies(app.url)}
    assert app_cookies["sessionid"]["value"] == "evil"  # the app's, on its origin only
    assert app_cookies["sessionid"]["domain"] == f"i{site['id']}-8888.{PORTS_DOMAIN}"

    page.goto(f"{stack.console}/tokens/")
    expect(page.get_by_test_id("current-tenant")).to_contain_text("Globex")  # not switched
    assert "stolen" not in page.content()
    context.close()

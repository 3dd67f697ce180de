"""The web console in a real browser: headless Chromium, driven by Selenium, against ``engram up``
running as a user runs it. Sign in (one-time link, pasted token), find an owner's memory, recall,
pin, purge with its receipt, the purge in the audit log, the config form — and hostile memory text
(an XSS corpus and the 73-attack injection corpus) shown as text: no alert, no script, no request
to another origin. Screenshots of each view go to ``bench-results/console/``."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit
from uuid import uuid4

import httpx
import nats
import pytest

from contracts.connection import ConnectionInfo
from tests.e2e.xss_corpus import XSS
from tests.engram_up import EngramUp, cli, stack_dir
from tests.unit.injection_corpus import ATTACKS

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')"
)
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="headless Chromium is absent: apt-get install chromium chromium-driver (.ci/run does)",
    ),
]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "bench-results" / "console"
#: What a page gets to appear on a loaded 2-core machine (a bound, not a pause).
WAIT_S = 60.0
#: The lifetime of the token whose end the console must notice.
SHORT_TTL_S = 20


class _Foreign(BaseHTTPRequestHandler):
    """Another origin: any request it receives came from a payload that escaped into a page."""

    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(204)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def foreign() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Foreign)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{server.server_address[1]}"  # a hostname: the PII policy keeps it
    server.shutdown()


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[EngramUp, dict[str, Any]]]:
    with stack_dir() as data_dir, EngramUp(data_dir, data_dir.parent / f"{data_dir.name}.log") as up:
        info = asyncio.run(up.connection())
        asyncio.run(up.wait_for_output("web console at", 30))
        yield up, info


@pytest.fixture(scope="module")
def info(stack: tuple[EngramUp, dict[str, Any]]) -> dict[str, Any]:
    return stack[1]


@pytest.fixture(scope="module")
def api(info: dict[str, Any]) -> Iterator[httpx.Client]:
    """The HTTP API under the development token: seeds memories and checks what the console did."""
    with httpx.Client(
        base_url=info["http_url"], headers={"Authorization": f"Bearer {info['token']}"}, timeout=60
    ) as client:
        yield client


def _save(api: httpx.Client, info: dict[str, Any], owner: str, texts: list[str]) -> list[str]:
    kind, _, ident = owner.partition(":")
    reply = api.post(
        "/v1/memories",
        json={
            "agent_config_id": info["agent_config_id"],
            "principal": {"kind": kind, "id": ident},
            "entries": [{"text": t, "importance": round(0.9 - i / 200, 3)} for i, t in enumerate(texts)],
            "wait": True,
        },
    )
    assert reply.status_code == 200, reply.text
    ids: list[str] = reply.json()["ids"]
    return ids


@pytest.fixture(scope="module")
def owner(api: httpx.Client, info: dict[str, Any]) -> dict[str, Any]:
    """An owner with three ordinary memories."""
    ref = f"end_user:ada-{uuid4().hex[:6]}"
    texts = [
        "Ada prefers dark roast coffee, no sugar",
        "Ada deploys from the release branch on Thursdays",
        "Ada's team uses Postgres 17 in production",
    ]
    return {"ref": ref, "texts": texts, "ids": _save(api, info, ref, texts)}


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


def _wait(driver: WebDriver) -> WebDriverWait[WebDriver]:
    return WebDriverWait(driver, WAIT_S)


def _shot(driver: WebDriver, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


@pytest.fixture
def signed_in(browser: WebDriver, stack: tuple[EngramUp, dict[str, Any]]) -> WebDriver:
    """The browser with a console session (signed in by a one-time link when it has none)."""
    browser.get(f"{stack[1]['http_url']}/console/memories")
    if not browser.current_url.endswith("/console/memories"):
        browser.get(cli("console", "--data-dir", str(stack[0].data_dir)).stdout.strip())
        _wait(browser).until(ec.url_matches(r"/console/memories$"))
    return browser


def test_engram_up_prints_the_console_url(stack: tuple[EngramUp, dict[str, Any]]) -> None:
    """engram up names the console's URL beside the HTTP API's."""
    up, info = stack
    assert f"web console at {info['http_url']}/console" in up.output()


def test_api_docs_render_offline_from_the_gateway(
    browser: WebDriver, stack: tuple[EngramUp, dict[str, Any]]
) -> None:
    """`engram up` prints the docs' URL; /docs renders Swagger UI from the gateway's own files (no
    CDN) with every route of /openapi.json; the console's top bar links to it."""
    up, info = stack
    asyncio.run(up.wait_for_output(f"HTTP API docs at {info['http_url']}/docs", WAIT_S))
    document = httpx.get(f"{info['http_url']}/openapi.json", timeout=WAIT_S).json()
    browser.get(f"{info['http_url']}/docs")
    _wait(browser).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, ".swagger-ui .info .title"), "Engram")
    )
    _wait(browser).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) >= len(document["paths"])
    )
    shown = {
        el.get_attribute("data-path")
        for el in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    }
    assert shown == set(document["paths"])
    origin = info["http_url"]
    loaded = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded, "the page loaded nothing"
    assert [url for url in loaded if not url.startswith(origin)] == []
    _shot(browser, "api-docs")

    browser.get(f"{origin}/console/signin")
    link = _wait(browser).until(ec.presence_of_element_located((By.ID, "api-docs")))
    assert link.get_attribute("href") == f"{origin}/docs"


def test_sign_in_with_a_one_time_link(
    browser: WebDriver, stack: tuple[EngramUp, dict[str, Any]], info: dict[str, Any]
) -> None:
    """`engram console` prints a link whose code signs in once; the browser ends on a URL without
    it, the session shows the development identity, and the same link does not sign in again."""
    browser.get(f"{info['http_url']}/console/signin")
    _wait(browser).until(ec.presence_of_element_located((By.ID, "token")))
    _shot(browser, "signin")
    link = cli("console", "--data-dir", str(stack[0].data_dir)).stdout.strip()
    assert "/console/signin/code?code=" in link
    assert info["token"] not in link
    browser.get(link)
    _wait(browser).until(ec.url_matches(r"/console/memories$"))
    assert "code=" not in browser.current_url
    assert browser.find_element(By.CSS_SELECTOR, ".who .principal").text == "service:engram-dev"
    cookie = browser.get_cookie("engram_console")
    assert cookie is not None
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"

    browser.delete_all_cookies()
    browser.get(link)
    _wait(browser).until(ec.presence_of_element_located((By.ID, "error")))
    assert "used already or has expired" in browser.find_element(By.ID, "error").text


def test_sign_in_with_a_pasted_token(browser: WebDriver, info: dict[str, Any]) -> None:
    """A bearer token pasted into the form signs in; a wrong one is refused on the form."""
    browser.delete_all_cookies()
    browser.get(f"{info['http_url']}/console/signin")
    browser.find_element(By.ID, "token").send_keys("not-a-token")
    browser.find_element(By.CSS_SELECTOR, "#signin button").click()
    _wait(browser).until(ec.text_to_be_present_in_element((By.ID, "error"), "not an Engram token"))
    browser.find_element(By.ID, "token").send_keys(info["token"])
    browser.find_element(By.ID, "agent_config_id").send_keys(info["agent_config_id"])
    browser.find_element(By.CSS_SELECTOR, "#signin button").click()
    _wait(browser).until(ec.url_matches(r"/console/memories$"))
    assert info["token"] not in browser.page_source


def test_find_an_owners_memory_and_recall(
    signed_in: WebDriver, info: dict[str, Any], owner: dict[str, Any]
) -> None:
    """Filtering by owner lists exactly that owner's memories; the recall box shows the context an
    agent acting for them would get."""
    browser = signed_in
    browser.get(f"{info['http_url']}/console/memories")
    field = browser.find_element(By.ID, "owner")
    field.clear()
    field.send_keys(owner["ref"])
    browser.find_element(By.ID, "apply-filters").click()
    # Wait on the filtered page (the unfiltered one may list the same text).
    _wait(browser).until(ec.url_contains("owner="))
    _wait(browser).until(ec.text_to_be_present_in_element((By.ID, "memories"), owner["texts"][0]))
    rows = browser.find_elements(By.CSS_SELECTOR, "#memories tbody tr[data-entry]")
    assert sorted(r.get_attribute("data-entry") for r in rows) == sorted(owner["ids"])
    _shot(browser, "memories")

    browser.get(f"{info['http_url']}/console/recall")
    browser.find_element(By.NAME, "cue").send_keys("what coffee does Ada like")
    browser.find_element(By.NAME, "as").send_keys(owner["ref"])
    Select(browser.find_element(By.NAME, "strategy")).select_by_visible_text("importance")
    browser.find_element(By.NAME, "token_budget").send_keys("400")
    browser.find_element(By.CSS_SELECTOR, "#recall-form button").click()
    # The page before submitting has a context too (the shared pool's): wait for this recall's.
    _wait(browser).until(ec.url_contains("token_budget=400"))
    _wait(browser).until(ec.text_to_be_present_in_element((By.ID, "context"), owner["texts"][0]))
    context = browser.find_element(By.ID, "context").text
    assert all(text in context for text in owner["texts"]), context
    assert browser.find_element(By.TAG_NAME, "h2").text.startswith("importance")
    _shot(browser, "recall")


def test_pin_a_memory(
    signed_in: WebDriver, info: dict[str, Any], owner: dict[str, Any], api: httpx.Client
) -> None:
    """Pin on an entry's page pins it (the API says so too)."""
    browser = signed_in
    entry_id = owner["ids"][1]
    browser.get(f"{info['http_url']}/console/memories/{entry_id}")
    browser.find_element(By.ID, "op-pin").click()
    _wait(browser).until(ec.presence_of_element_located((By.ID, "pinned")))
    assert browser.find_element(By.ID, "entry-text").text == owner["texts"][1]
    reply = api.get(f"/v1/memories/{entry_id}", params={"agent_config_id": info["agent_config_id"]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["entry"]["pinned"] is True
    _shot(browser, "entry")


def test_purge_an_owner_and_read_the_receipt(
    signed_in: WebDriver, info: dict[str, Any], owner: dict[str, Any], api: httpx.Client
) -> None:
    """A purge needs the owner typed again; the receipt counts what each store removed; the owner
    has nothing left."""
    browser = signed_in
    browser.get(f"{info['http_url']}/console/purge")
    browser.find_element(By.ID, "purge-owner").send_keys(owner["ref"])
    browser.find_element(By.ID, "purge-confirm").send_keys("end_user:someone-else")
    browser.find_element(By.ID, "purge-submit").click()
    _wait(browser).until(ec.text_to_be_present_in_element((By.ID, "error"), "exactly to confirm"))
    assert api.get(
        "/v1/memories", params={"agent_config_id": info["agent_config_id"], "actor_ref": owner["ref"]}
    ).json()["entries"], "a purge without the typed confirmation erased something"

    browser.find_element(By.ID, "purge-confirm").send_keys(owner["ref"])
    browser.find_element(By.ID, "purge-submit").click()
    _wait(browser).until(ec.presence_of_element_located((By.ID, "receipt")))
    assert browser.find_element(By.ID, "r-entries").text == str(len(owner["ids"]))
    owner["purge_id"] = browser.find_element(By.ID, "purge-id").text
    _shot(browser, "receipt")
    left = api.get(
        "/v1/memories", params={"agent_config_id": info["agent_config_id"], "actor_ref": owner["ref"]}
    )
    assert left.status_code == 200
    assert left.json()["entries"] == []


def test_the_purge_shows_in_the_audit_log(
    signed_in: WebDriver, info: dict[str, Any], owner: dict[str, Any]
) -> None:
    """The audit log, filtered by kind and owner, shows the purge and who made it; the chain verifies."""
    browser = signed_in
    assert owner.get("purge_id"), "the purge test did not run first"
    browser.get(f"{info['http_url']}/console/audit")
    browser.find_element(By.NAME, "kind").send_keys("memory.purged")
    browser.find_element(By.NAME, "actor").send_keys(owner["ref"])
    browser.find_element(By.CSS_SELECTOR, "#audit-filters button").click()
    _wait(browser).until(ec.url_contains("kind=memory.purged"))  # not the unfiltered page before it
    _wait(browser).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "#audit tr[data-kind='memory.purged']"))
    )
    rows = browser.find_elements(By.CSS_SELECTOR, "#audit tbody tr[data-kind]")
    assert rows
    assert all(f"actor_scope={owner['ref']}" in r.text for r in rows)
    assert all("service:engram-dev" in r.text for r in rows)  # who purged
    assert browser.find_element(By.ID, "chain-status").text.startswith("chain verified")
    _shot(browser, "audit")


def test_config_form_saves_a_new_version(
    signed_in: WebDriver, info: dict[str, Any], api: httpx.Client
) -> None:
    """The memory config as a form: a changed field is saved as a new version."""
    browser = signed_in
    browser.get(f"{info['http_url']}/console/config")
    top_k = browser.find_element(By.CSS_SELECTOR, "#config input[name=top_k]")
    top_k.clear()
    top_k.send_keys("7")
    browser.find_element(By.CSS_SELECTOR, "#config button").click()
    _wait(browser).until(ec.presence_of_element_located((By.ID, "notice")))
    reply = api.get("/v1/config", params={"agent_config_id": info["agent_config_id"]})
    assert reply.json()["config"]["top_k"] == 7
    _shot(browser, "config")


def _publish(info: dict[str, Any], body: bytes, token: str | None) -> None:
    """``engram.session.ended`` over NATS, as a platform publishes (stored first, checked after)."""

    async def publish() -> None:
        nc = await nats.connect(info["nats_url"], **ConnectionInfo.model_validate(info).nats_options())
        try:
            headers = {"Authorization": f"Bearer {token}"} if token is not None else None
            await nc.jetstream().publish("engram.session.ended", body, headers=headers)
        finally:
            await nc.close()

    asyncio.run(publish())


def test_dead_letters_page_lists_the_letter_and_the_lag(
    signed_in: WebDriver, info: dict[str, Any], api: httpx.Client
) -> None:
    """A session for another organization, published with the development token, is dead-lettered
    under the token's organization (over HTTP it is refused at once: 403); a tokenless one is the
    system organization's. The development identity is the deployment's operator: the page lists
    both with their organization, code, reason and hash, as many letters as the stream counts, and
    the consumers' lag."""
    browser = signed_in
    session = {
        "event_id": str(uuid4()),
        "schema_version": 1,
        "org_id": str(uuid4()),
        "agent_config_id": info["agent_config_id"],
        "session_id": "<script>window.__pwned=1</script>",
        "status": "failed",
        "principal": {"kind": "end_user", "id": "ada"},
        "steps": 1,
        "task": "t",
        "tool_trace": [],
        "ended_at": "2026-01-01T00:00:00+00:00",
    }
    body = json.dumps(session).encode()
    reply = api.post("/v1/sessions", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 403, reply.text
    _publish(info, body, info["token"])
    tokenless = json.dumps({**session, "event_id": str(uuid4())}).encode()
    _publish(info, tokenless, None)
    mine, system = (
        f"#dead-letters td.sha[title='{hashlib.sha256(b).hexdigest()}']" for b in (body, tokenless)
    )

    def listed(driver: WebDriver) -> bool:
        driver.get(f"{info['http_url']}/console/dead-letters")
        return bool(
            driver.find_elements(By.CSS_SELECTOR, mine) and driver.find_elements(By.CSS_SELECTOR, system)
        )

    _wait(browser).until(listed)  # ingest dead-letters them asynchronously
    text = browser.find_element(By.CSS_SELECTOR, mine).find_element(By.XPATH, "..").text
    assert "FORBIDDEN" in text
    assert "org_id does not match the token" in text
    assert "engram.session.ended" in text
    assert info["org_id"] in text
    text = browser.find_element(By.CSS_SELECTOR, system).find_element(By.XPATH, "..").text
    assert "UNAUTHENTICATED" in text
    assert "system" in text
    letters = browser.find_elements(By.CSS_SELECTOR, "#dead-letters tbody tr[data-code]")
    counts = {
        row.find_elements(By.TAG_NAME, "td")[0].text: row.find_elements(By.TAG_NAME, "td")[1].text
        for row in browser.find_elements(By.CSS_SELECTOR, "#streams tbody tr")
    }
    assert str(len(letters)) == counts["ENGRAM_DLQ"], (len(letters), counts)
    durables = {
        e.get_attribute("data-durable") for e in browser.find_elements(By.CSS_SELECTOR, "#consumers tr")
    }
    assert {"ingest", "distill", "embed"} <= durables
    _assert_inert(browser, info["http_url"], _Foreign.hits)
    _shot(browser, "dead-letters")


def _assert_inert(driver: WebDriver, origin: str, foreign_hits: list[str]) -> None:
    """Nothing in the page ran or fetched: no alert, no marker, no active element, no request
    anywhere but the console's own origin."""
    _wait(driver).until(lambda d: d.execute_script("return document.readyState") == "complete")
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018 (the property raises when there is none)
    assert driver.execute_script("return typeof window.__pwned") == "undefined"
    active = "script, img, iframe, svg, object, embed, style:not(head style), base, meta[http-equiv], math"
    assert driver.find_elements(By.CSS_SELECTOR, f"main {active}") == []
    handlers = driver.execute_script(
        "return [...document.querySelectorAll('*')].flatMap(e => [...e.attributes]"
        ".filter(a => a.name.startsWith('on') || a.value.trim().toLowerCase().startsWith('javascript:'))"
        ".map(a => e.tagName + ' ' + a.name))"
    )
    assert handlers == []
    resources = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(urlsplit(r).netloc == urlsplit(origin).netloc for r in resources), resources
    assert foreign_hits == []


def test_hostile_memory_text_renders_as_text(
    signed_in: WebDriver, info: dict[str, Any], api: httpx.Client, foreign: str
) -> None:
    """The XSS corpus and the 73 injection attacks, as stored memories, show as text on the list,
    the entry and the recall pages: nothing runs, nothing loads from another origin."""
    browser = signed_in
    xss = [p.replace("{foreign}", foreign) for p in XSS]
    xss_owner, inject_owner = f"end_user:mallory-{uuid4().hex[:6]}", f"end_user:eve-{uuid4().hex[:6]}"
    xss_ids = _save(api, info, xss_owner, xss)
    _save(api, info, inject_owner, list(ATTACKS))
    origin = info["http_url"]

    for who in (xss_owner, inject_owner):
        browser.get(f"{origin}/console/memories?owner={who}&lifecycle=active")
        _wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#memories tr[data-entry]")))
        _assert_inert(browser, origin, _Foreign.hits)
        if who == xss_owner:
            _shot(browser, "xss-corpus")

    for entry_id in xss_ids:
        browser.get(f"{origin}/console/memories/{entry_id}")
        stored = api.get(f"/v1/memories/{entry_id}", params={"agent_config_id": info["agent_config_id"]})
        shown = browser.find_element(By.ID, "entry-text").get_attribute("textContent")
        assert shown == stored.json()["entry"]["text"]
        _assert_inert(browser, origin, _Foreign.hits)

    browser.get(f"{origin}/console/recall?as={xss_owner}&strategy=importance")
    _wait(browser).until(ec.presence_of_element_located((By.ID, "context")))
    assert "<script>" in browser.find_element(By.ID, "context").get_attribute("textContent")
    _assert_inert(browser, origin, _Foreign.hits)


# --- the same rules without a browser: what an attacker's own client would try ----------------


@contextmanager
def _session(info: dict[str, Any]) -> Iterator[httpx.Client]:
    """An HTTP client signed in to the console (by a one-time code) as a browser would be."""
    with httpx.Client(base_url=info["http_url"], timeout=60) as client:
        yield _signed_in(client, info)


def _signed_in(client: httpx.Client, info: dict[str, Any]) -> httpx.Client:
    ticket = client.post(
        "/console/tickets",
        json={"agent_config_id": info["agent_config_id"]},
        headers={"Authorization": f"Bearer {info['token']}"},
    )
    assert ticket.status_code == 200, ticket.text
    assert client.get(ticket.json()["path"]).status_code == 303
    return client


def test_every_console_response_carries_a_strict_policy(info: dict[str, Any]) -> None:
    """Pages, redirects and static files carry the CSP without inline script, nosniff and no-store;
    the session cookie is HttpOnly and SameSite=Strict."""
    with httpx.Client(base_url=info["http_url"], timeout=60) as anonymous:
        for path in ("/console/signin", "/console/memories", "/console/static/console.css"):
            reply = anonymous.get(path)
            csp = reply.headers["content-security-policy"]
            assert "script-src 'self'" in csp, path
            assert "unsafe-inline" not in csp
            assert "default-src 'none'" in csp
            assert "frame-ancestors 'none'" in csp
            assert reply.headers["x-content-type-options"] == "nosniff"
    ticket = httpx.post(
        f"{info['http_url']}/console/tickets",
        json={"agent_config_id": info["agent_config_id"]},
        headers={"Authorization": f"Bearer {info['token']}"},
    ).json()
    redeemed = httpx.get(f"{info['http_url']}{ticket['path']}")
    assert redeemed.status_code == 303
    cookie = redeemed.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    assert "path=/console" in cookie
    assert redeemed.headers["location"] == "/console/memories"


def test_mutations_without_the_csrf_token_or_from_another_origin_are_refused(
    info: dict[str, Any], api: httpx.Client
) -> None:
    """A pin with the session cookie but without the form's token, with a wrong one, or with the
    right one from another origin is refused (403) and changes nothing; so is a purge."""
    entry_id = _save(api, info, f"end_user:csrf-{uuid4().hex[:6]}", ["a memory an attacker wants pinned"])[0]
    with _session(info) as browser_like:
        token = _csrf(browser_like.get(f"/console/memories/{entry_id}").text)
        attempts = [
            ({"op": "pin"}, {}),
            ({"op": "pin", "csrf": "forged"}, {}),
            ({"op": "pin", "csrf": token}, {"Origin": "http://evil.example"}),
        ]
        for form, headers in attempts:
            reply = browser_like.post(f"/console/memories/{entry_id}/manage", data=form, headers=headers)
            assert reply.status_code == 403, (form, headers, reply.status_code)
        purge = browser_like.post("/console/purge", data={"owner": "none", "confirm": "none"})
        assert purge.status_code == 403
        huge = browser_like.post(
            f"/console/memories/{entry_id}/manage",
            content=b"op=edit&text=" + b"x" * 100_000,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert huge.status_code == 413  # read no further than the console's form limit
        stored = api.get(f"/v1/memories/{entry_id}", params={"agent_config_id": info["agent_config_id"]})
        assert stored.json()["entry"]["pinned"] is False
        done = browser_like.post(f"/console/memories/{entry_id}/manage", data={"op": "pin", "csrf": token})
        assert done.status_code == 303  # the same request with its token goes through


def _csrf(page: str) -> str:
    return page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def test_every_entry_action_does_what_its_operation_does(info: dict[str, Any], api: httpx.Client) -> None:
    """Disable, enable, edit (the next version), mark incorrect and
    delete (a receipt), each through the console's forms, as the API then reports."""
    agent = {"agent_config_id": info["agent_config_id"]}
    entry_id = _save(api, info, f"end_user:acts-{uuid4().hex[:6]}", ["Bob likes tea"])[0]
    with _session(info) as console:
        token = _csrf(console.get(f"/console/memories/{entry_id}").text)

        def act(op: str, **form: str) -> httpx.Response:
            return console.post(
                f"/console/memories/{entry_id}/manage", data={"op": op, "csrf": token, **form}
            )

        assert act("disable").status_code == 303
        assert api.get(f"/v1/memories/{entry_id}", params=agent).json()["entry"]["lifecycle"] == "disabled"
        assert act("enable").status_code == 303
        assert api.get(f"/v1/memories/{entry_id}", params=agent).json()["entry"]["lifecycle"] == "active"

        edited = act("edit", text="Bob likes green tea")
        assert edited.status_code == 303
        # The page of the entry as it is now (the edit's new version).
        entry_id = edited.headers["location"].split("/memories/", 1)[1].split("?", 1)[0]
        page = console.get(f"/console/memories/{entry_id}").text
        assert "Bob likes green tea" in page.split('id="entry-text">', 1)[1].split("<", 1)[0]
        # semantic memories are edited in place (the type policy's version_on_edit is off): v2
        assert api.get(f"/v1/memories/{entry_id}", params=agent).json()["entry"]["version"] == 2
        assert act("mark_incorrect").status_code in (200, 303)
        assert api.get(f"/v1/memories/{entry_id}", params=agent).json()["entry"]["reliability"] < 1.0

        deleted = console.post(f"/console/memories/{entry_id}/delete", data={"csrf": token})
        assert deleted.status_code == 200
        assert 'id="receipt"' in deleted.text
        assert api.get(f"/v1/memories/{entry_id}", params=agent).status_code == 404


def test_signed_out_sessions_and_used_codes_are_dead(info: dict[str, Any]) -> None:
    """After sign-out the old cookie opens nothing; a code redeems once."""
    client = httpx.Client(base_url=info["http_url"], timeout=60)
    ticket = client.post(
        "/console/tickets",
        json={"agent_config_id": info["agent_config_id"]},
        headers={"Authorization": f"Bearer {info['token']}"},
    ).json()
    assert client.get(ticket["path"]).status_code == 303
    assert client.get(ticket["path"]).status_code == 401
    sid = client.cookies["engram_console"]
    token = _csrf(client.get("/console/memories").text)
    assert client.post("/console/signout", data={"csrf": token}).status_code == 303
    replay = httpx.get(f"{info['http_url']}/console/memories", cookies={"engram_console": sid})
    assert replay.status_code == 303
    assert replay.headers["location"] == "/console/signin"
    client.close()


def test_the_token_is_never_in_the_log(stack: tuple[EngramUp, dict[str, Any]]) -> None:
    """After every flow above, engram up's output has never carried the token."""
    up, info = stack
    assert info["token"] not in up.output()


def test_a_session_ends_with_its_token(stack: tuple[EngramUp, dict[str, Any]]) -> None:
    """A session opened with a token valid for a few seconds sends its browser back to sign-in
    once the token has expired (polled, bounded), whatever the session's own lifetime."""
    up, info = stack
    # Long enough to sign in on a busy machine (the clock starts inside `engram token mint`),
    # short against the session's own lifetime and the wait below.
    short = cli(
        "token", "mint", "--org", info["org_id"], "--kind", "end_user", "--id", "brief",
        "--perm", "memory.read", "--agent-config", info["agent_config_id"], "--ttl", str(SHORT_TTL_S),
        "--data-dir", str(up.data_dir),
    ).stdout.strip()  # fmt: skip
    with httpx.Client(base_url=info["http_url"], timeout=60) as client:
        ticket = client.post("/console/tickets", headers={"Authorization": f"Bearer {short}"}).json()
        assert client.get(ticket["path"]).status_code == 303
        assert client.get("/console/memories").status_code == 200
        deadline = time.monotonic() + SHORT_TTL_S + WAIT_S
        while client.get("/console/memories").status_code == 200:
            assert time.monotonic() < deadline, "the session outlived its token"
            time.sleep(0.2)  # polling a condition, bounded by the deadline above
        assert client.get("/console/memories").headers["location"].startswith("/console/signin")

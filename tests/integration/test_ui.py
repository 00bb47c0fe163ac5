"""`lcm ui`, the read-only web explorer (issue 19): over HTTP on both backends, and in a real
headless Chromium (Debian's chromium + chromium-driver, driven by Selenium).

The store holds a compacted session (so there is a DAG to click through) and messages written to
attack the page: script tags, an inline event handler, javascript: links. They must show as text
and never run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store
from tests.conftest import SMALL_ENGINE
from tests.support.conversation import run_host
from tests.support.storing import append_messages
from tests.support.ui_server import serving

REPO = Path(__file__).resolve().parents[2]
HOSTILE = [
    "<script>window.__pwned = 1; document.title = 'pwned'</script>",
    '<img src="x" onerror="window.__pwned = 2">',
    "[click me](javascript:window.__pwned=3)",
    '<a href="javascript:window.__pwned=4" id="evil">evil link</a>',
]


def _fill(url: str) -> tuple[Store, str]:
    """An agent with one compacted session whose last turn is hostile; (store, agent)."""
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, agent_id="explorer", **SMALL_ENGINE))
    engine.update_model("test-model", 3000)
    engine.on_session_start("s-main", platform="cli")
    transcript, _ = run_host(engine, 24)
    hostile = [{"role": "user", "content": "\n".join(HOSTILE)},
               {"role": "assistant", "content": "noted: " + HOSTILE[0]}]
    engine.on_turn_complete([*transcript, *hostile])
    assert engine.context.last_error is None, engine.context.last_error
    assert engine.store.sessions.find("explorer", "s-main").summary_count > 0
    return Store.open(url), "explorer"


@pytest.fixture
def explorer(db_url):
    Store.open(db_url, upgrade=True)
    store, agent = _fill(db_url)
    with serving(store) as base:
        yield base, store, agent


def test_every_page_answers_and_has_a_json_twin(explorer):
    base, store, agent = explorer
    session = store.sessions.find(agent, "s-main")
    [node] = store.summaries.of_session(session.id, depth=0, limit=1)
    pages = {
        "/": "agents",
        "/a/explorer/s/s-main": "messages",
        "/a/explorer/s/s-main?after=0&limit=5": "messages",
        "/a/explorer/s/s-main/dag": "depths",
        f"/a/explorer/node/{node.id}": "sources",
        "/a/explorer/msg/1": "message",
        "/search?q=fact3&agent=explorer": "results",
        "/status": "stats",
        "/doctor?agent=explorer": "doctor",
    }
    for path, key in pages.items():
        html = httpx.get(base + path)
        assert html.status_code == 200, (path, html.text[:300])
        assert html.headers["content-type"].startswith("text/html")
        data = httpx.get(base + path + ("&" if "?" in path else "?") + "format=json").json()
        assert key in data, (path, list(data))
    assert httpx.get(base + "/a/explorer/s/s-main?after=0&limit=5&format=json").json()["messages"][0]["seq"] == 1
    last = httpx.get(base + "/a/explorer/s/s-main", headers={"accept": "application/json"}).json()
    assert last["messages"][-1]["seq"] == session.last_seq and last["older"] is not None
    dag = httpx.get(base + "/a/explorer/s/s-main/dag?format=json").json()
    assert [d["depth"] for d in dag["depths"]] == sorted((d["depth"] for d in dag["depths"]), reverse=True)
    hits = httpx.get(base + "/search?q=fact3&agent=explorer&format=json").json()["results"]["results"]
    assert hits and any("fact3" in h["snippet"] for h in hits)


def test_errors_are_pages_not_tracebacks(explorer):
    base, _, _ = explorer
    missing = httpx.get(base + "/a/explorer/s/no-such-session")
    assert missing.status_code == 404 and "no session" in missing.text
    assert httpx.get(base + "/a/explorer/node/999999?format=json").json()["error"]
    assert httpx.get(base + "/a/explorer/s/s-main?limit=0").status_code == 400
    nowhere = httpx.get(base + "/no/such/page")  # issue 33.10: the explorer's own page, not a bare "Not Found"
    assert nowhere.status_code == 404 and "no page at /no/such/page" in nowhere.text and "<html" in nowhere.text
    assert httpx.get(base + "/no/such/page?format=json").json()["error"].startswith("no page at")


def test_nothing_writes_and_content_is_escaped(explorer):
    base, store, _ = explorer
    before = store.health.stats()
    for path in ("/", "/a/explorer/s/s-main", "/search"):
        assert httpx.post(base + path, data={"q": "x"}).status_code == 405
        assert httpx.delete(base + path).status_code == 405
    page = httpx.get(base + "/a/explorer/s/s-main")
    assert "<script>window.__pwned" not in page.text and "&lt;script&gt;window.__pwned" in page.text
    assert 'onerror="window' not in page.text and 'href="javascript:' not in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    after = store.health.stats()
    assert {k: before[k] for k in ("messages", "summaries", "sessions")} == \
        {k: after[k] for k in ("messages", "summaries", "sessions")}


def test_the_agents_page_shows_a_fleet_a_page_at_a_time(db_url):
    """A fleet's store holds thousands of agents: the front page reads 25 of them (and their
    sessions) at a time, with links to the others, never the whole store."""
    store = Store.open(db_url, upgrade=True)
    for n in range(30):
        session = store.sessions.get_or_create(f"fleet-{n:02d}", "s1", platform="cli")
        append_messages(store, session.id, [{"role": "user", "content": f"hello from agent {n}"}])
    with serving(store) as base:
        first = httpx.get(base + "/?format=json").json()
        assert [a["agent"] for a in first["agents"]] == [f"fleet-{n:02d}" for n in range(25)]
        assert (first["agent_count"], first["page"], first["pages"]) == (30, 0, 2)
        second = httpx.get(base + "/?page=1&format=json").json()
        assert [a["agent"] for a in second["agents"]] == [f"fleet-{n:02d}" for n in range(25, 30)]
        assert second["agents"][0]["messages"] == 1
        html = httpx.get(base + "/?page=1").text
        assert "agents 26-30 of 30" in html and 'href="?page=0"' in html and 'id="next"' not in html
        assert 'id="next" href="?page=1"' in httpx.get(base + "/").text
        beyond = httpx.get(base + "/?page=2&format=json")
        assert beyond.status_code == 400 and "page" in beyond.json()["error"]


def test_a_token_is_required_when_one_is_set(sqlite_url):
    Store.open(sqlite_url)
    with serving(Store.open(sqlite_url), token="s3cret") as base:
        assert httpx.get(base + "/").status_code == 401
        assert httpx.get(base + "/?token=wrong").status_code == 401
        with httpx.Client(base_url=base) as client:
            assert client.get("/?token=s3cret").status_code == 200
            assert client.get("/status").status_code == 200  # the cookie carries it on
        assert httpx.get(base + "/", headers={"authorization": "Bearer s3cret"}).status_code == 200


def test_lcm_ui_refuses_a_public_address_it_cannot_bind_and_needs_its_extra(lcm, sqlite_url):
    Store.open(sqlite_url)
    code, _, err = lcm("ui", "--url", sqlite_url, "--host", "203.0.113.7", "--no-browser")
    assert code == 1 and "cannot listen on 203.0.113.7" in err


# ------------------------------------------------------------------------------ the browser


def _browser_problem() -> str | None:
    for binary in ("chromium", "chromedriver"):
        if shutil.which(binary) is None:
            return f"{binary} is not installed (apt-get install chromium chromium-driver; .ci/run installs them)"
    return None


@pytest.fixture
def browser():
    problem = _browser_problem()
    if problem is not None:
        pytest.skip(f"browser tests skipped: {problem}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver, name: str) -> None:
    """Screenshots for docs/ui.md, refreshed with LCM_UI_SCREENSHOTS=1."""
    if os.environ.get("LCM_UI_SCREENSHOTS") == "1":
        driver.save_screenshot(str(REPO / "docs" / "ui" / f"{name}.png"))


def _until(browser, check, what: str):
    """Wait (10 s at most) until ``check(browser)`` is truthy: a click or a submit navigates
    asynchronously, and the old page answers until the new one has loaded."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, 10, ignored_exceptions=(StaleElementReferenceException,)).until(
        check, message=f"waiting for {what}")


def _heading(browser) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.TAG_NAME, "h1").text)


def test_click_through_session_dag_node_and_source_in_a_real_browser(sqlite_url, browser):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    store, _ = _fill(sqlite_url)
    with serving(store) as base:
        browser.get(base + "/")
        assert "Agents and sessions" in _heading(browser)
        _shot(browser, "agents")
        browser.find_element(By.LINK_TEXT, "s-main").click()
        _until(browser, lambda b: _heading(b) == "explorer / s-main", "the session page")
        # the hostile turn is on this (last) page: shown as text, nothing ran
        body = browser.find_element(By.TAG_NAME, "main").text
        assert "<script>window.__pwned = 1" in body and "javascript:window.__pwned=3" in body
        assert browser.execute_script("return window.__pwned === undefined")
        assert browser.title != "pwned"
        assert not browser.find_elements(By.CSS_SELECTOR, "a[href^='javascript'], #evil, img[src='x']")
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert.text  # noqa: B018 - raises when there is none
        _shot(browser, "session")

        browser.find_element(By.ID, "dag-link").click()
        nodes = _until(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "svg a.node"), "the DAG's nodes")
        _shot(browser, "dag")
        leaf = nodes[-1]
        node_id = leaf.get_attribute("data-node")
        browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", leaf)
        _until(browser, lambda b: _heading(b).startswith(f"node:{node_id}"), f"node {node_id}'s page")
        assert browser.find_element(By.ID, "summary").text.strip()
        _shot(browser, "node")
        first = browser.find_elements(By.CSS_SELECTOR, "a.source-message, a.source-node")[0]
        target = first.text.split(":")[1]
        first.click()
        _until(browser, lambda b: target in _heading(b) and not _heading(b).startswith(f"node:{node_id}"),
               "the source's page")

        browser.get(base + "/search")
        browser.find_element(By.ID, "q").send_keys("fact7")
        browser.find_element(By.ID, "go").click()
        hits = _until(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "li.hit"), "search hits")
        assert hits and "fact7" in browser.find_element(By.CSS_SELECTOR, "ol.hits").text
        assert browser.find_elements(By.CSS_SELECTOR, "li.hit mark")  # matched words marked
        _shot(browser, "search")
        browser.get(base + "/status")
        _shot(browser, "status")
        browser.find_element(By.CSS_SELECTOR, "a.doctor").click()
        overall = _until(browser, lambda b: b.find_elements(By.ID, "overall"), "the doctor's verdict")
        assert overall[0].text in ("healthy", "warning")
        _shot(browser, "doctor")

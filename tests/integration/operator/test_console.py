"""`strata console` in a real browser (Debian's headless Chromium, driven by Selenium through Debian's
chromedriver) against the real platform and operator: a Stack's failure reaches the open overview
within 2 s of the API server having it, a plan approved from its page is applied, a user whose RBAC
cannot patch Stacks sees the API server's refusal, and the keyboard moves between pages and rows.

Screenshots of every page go to $STRATA_CONSOLE_SCREENSHOTS (default: the test's tmp directory), at
1280x800; docs/console/ holds one of each for the README.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from strata_components.team import build_team_source, build_team_sync

from .conftest import has_condition, stash_program

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
FAILING = {"configuration": {"region": {"type": "String"}},
           "resources": {"r": {"type": "pulumi:index:Stash", "properties": {"input": "${region}"}}}}


class ConsoleProcess:
    """`strata console --port 0` as a user starts it; `url` is what it printed."""

    def __init__(self, kubeconfig: Path, state_dir: Path, log: Path) -> None:
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "strata_components.cli", "console", "--port", "0", "--kubeconfig", str(kubeconfig),
             "--operator-state-dir", str(state_dir)],
            stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
        line = self.process.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=\S+", line)
        assert match, f"no URL printed: {line!r}; log: {log.read_text()}"
        self.url, self.base = match.group(0), match.group(1).rstrip("/")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run `make setup` as root (`strata local host-packages` installs "
                    "Debian's chromium and chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800",
                     "--disable-gpu", "--no-first-run"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_window_size(1280, 800)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    directory = Path(os.environ.get("STRATA_CONSOLE_SCREENSHOTS") or tmp_path / "screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(interval)
    raise AssertionError(f"not within {timeout}s: {what}")


def row_state(driver, row_id: str) -> str:
    return driver.execute_script(
        "const r = document.getElementById(arguments[0]); return r ? r.dataset.state : '';", row_id)


def test_the_console_in_a_browser(stacks, operator, local_platform, platform, browser, shots, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    ns = stacks.namespace
    console = ConsoleProcess(local_platform.kubeconfig_path, operator.state_dir, tmp_path / "console.log")
    try:
        # Stacks to look at: one Ready, one whose Program will start failing, one waiting for approval,
        # and a Program rolled out in waves to two Stacks.
        stacks.program("hello", stash_program(greeting="hi"))
        stacks.program("flaky", stash_program(value="fine"))
        stacks.program("gated", stash_program(first="one", second="two"))
        stacks.custom.create_namespaced_custom_object("pulumi.com", "v1", ns, "programs", {
            "apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "fleet"},
            "rollout": {"waves": [{"count": 1}]}, "program": stash_program(version="v1")})
        # good stands for the platform Stack: fully qualified (the operator names a Program's project after it),
        # so what its program creates can name it.
        good_stack = "organization/hello/good"
        stacks.create("good", stacks.spec(stack=good_stack, programRef={"name": "hello"}))
        stacks.create("flaky", stacks.spec(stack="flaky", programRef={"name": "flaky"}))
        stacks.create("gated", stacks.spec(stack="gated", programRef={"name": "gated"}, approval={"mode": "Manual"},
                                           prerequisites=[{"name": "good"}]))
        for name in ("fleet-a", "fleet-b"):
            stacks.create(name, stacks.spec(stack=name, programRef={"name": "fleet"}))
        for name in ("good", "flaky", "fleet-a", "fleet-b"):
            stacks.wait_ready(name, 120)
        waiting = stacks.wait("gated", lambda o: has_condition(o, "Reconciling", "AwaitingApproval"), 120,
                              "AwaitingApproval")
        # A team's sync as the platform layer renders it (TeamEnvironment), created by good's stack; suspended,
        # since the Layers page needs the objects and their annotation, not Flux fetching anything.
        team_source = build_team_source("console", ns, {"url": "http://127.0.0.1:9/none.git"}, good_stack)
        team_sync = build_team_sync("console", ns, "team-console", {"path": "."}, good_stack)
        for manifest, plural in ((team_source, "gitrepositories"), (team_sync, "kustomizations")):
            manifest["spec"]["suspend"] = True
            group, version = manifest["apiVersion"].split("/")
            stacks.custom.create_namespaced_custom_object(group, version, ns, plural, manifest)
        digest = waiting["status"]["plan"]["digest"]

        browser.get(console.url)  # the printed URL: its token becomes the session's cookie
        browser.get(f"{console.base}/?namespace={ns}")
        flaky_row = "row-Stack--" + ns + "--flaky"
        wait_for(lambda: row_state(browser, flaky_row) == "Ready", 10, "the overview lists flaky as Ready")
        browser.save_screenshot(str(shots / "overview.png"))

        # A failure: the API server has it at t_api (a watch of our own), the open page shows it at t_page.
        seen: dict[str, float] = {}

        def watch_api() -> None:
            from kubernetes import watch

            stream = watch.Watch()
            for event in stream.stream(stacks.custom.list_namespaced_custom_object, "pulumi.com", "v1", ns, "stacks",
                                       field_selector="metadata.name=flaky", timeout_seconds=120):
                if ((event["object"].get("status") or {}).get("lastUpdate") or {}).get("state") == "failed":
                    seen["api"] = time.monotonic()
                    stream.stop()

        watcher = threading.Thread(target=watch_api, daemon=True)
        watcher.start()
        time.sleep(0.5)  # the watch is open before the change
        stacks.replace_program("flaky", FAILING)
        # Failed while its retry waits; Stalled once the failures are too many (either is the failure shown).
        wait_for(lambda: row_state(browser, flaky_row) in ("Failed", "Stalled"), 120, "the overview shows flaky failed")
        seen["page"] = time.monotonic()
        watcher.join(10)
        assert "api" in seen, "the API server never showed the failure"
        lag = seen["page"] - seen["api"]
        print(f"failure on the overview {lag:.2f}s after the API server had it")
        assert lag <= 2.0, f"the failure took {lag:.2f}s to reach the open overview"
        assert "region" in browser.find_element(By.ID, flaky_row).text

        # Keyboard: l -> Layers, o -> Overview, j -> the first row's link, Enter opens it.
        body = browser.find_element(By.TAG_NAME, "body")
        body.send_keys("l")
        wait_for(lambda: browser.current_url.endswith("/layers"), 5, "l opens Layers")
        assert browser.find_elements(By.ID, f"node-Stack--{ns}--gated")
        browser.get(f"{console.base}/layers?namespace={ns}")
        # good -> the team's GitRepository and Kustomization it created, and the source -> its Kustomization.
        made = {kind: f"{kind}/{ns}/team-console" for kind in ("GitRepository", "Kustomization")}
        for why, source, target in (("created", f"Stack/{ns}/good", made["GitRepository"]),
                                    ("created", f"Stack/{ns}/good", made["Kustomization"]),
                                    ("source", made["GitRepository"], made["Kustomization"])):
            arrow = f'path.edge-{why}[data-from="{source}"][data-to="{target}"]'
            assert browser.find_elements(By.CSS_SELECTOR, arrow), f"no {why} arrow {source} -> {target} on Layers"
        browser.save_screenshot(str(shots / "layers.png"))
        browser.find_element(By.TAG_NAME, "body").send_keys("o")
        wait_for(lambda: browser.current_url == console.base + "/", 5, "o opens the Overview")
        browser.get(f"{console.base}/?namespace={ns}&kind=Stack")
        browser.find_element(By.TAG_NAME, "body").send_keys("j")
        focused = browser.switch_to.active_element
        assert focused.tag_name == "a", "j focuses the first row's link"
        focused.send_keys(Keys.ENTER)
        wait_for(lambda: "/stacks/" in browser.current_url, 5, "Enter opens the Stack")

        # The Stack page: conditions, outputs, history with change summaries, the engine output.
        browser.get(f"{console.base}/stacks/{ns}/good")
        page = browser.find_element(By.TAG_NAME, "main").text
        assert "greeting" in page and "Successfully updated stack (create" in page
        assert browser.find_element(By.ID, "engine-output").text.strip()
        browser.save_screenshot(str(shots / "stack.png"))

        # Approvals: the plan as resources with their diffs; Approve applies exactly it.
        browser.get(f"{console.base}/approvals")
        browser.find_element(By.LINK_TEXT, f"{ns}/gated").click()
        wait_for(lambda: browser.find_elements(By.ID, "plan-digest"), 5, "the plan page")
        assert browser.find_element(By.ID, "plan-digest").text == digest
        plan_text = browser.find_element(By.TAG_NAME, "main").text
        assert plan_text.count("pulumi:index:Stash") == 2 and "one" in plan_text and "two" in plan_text
        browser.save_screenshot(str(shots / "approvals.png"))
        browser.find_element(By.ID, "action-approve").click()
        result = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#action-result [data-outcome]"), 10,
                          "the approval's answer")[0]
        assert result.get_attribute("data-outcome") == "ok" and digest in result.text, result.text
        applied = stacks.wait_ready("gated", 120)
        assert applied["status"]["lastUpdate"]["plan"] == digest
        assert applied["status"]["outputs"] == {"first": "one", "second": "two"}

        # Rollout of the fleet's Program.
        browser.get(f"{console.base}/rollout/{ns}/fleet")
        rollout = browser.find_element(By.TAG_NAME, "main").text
        assert "Wave 1" in rollout and "Wave 2" in rollout and "fleet-a" in rollout and "fleet-b" in rollout
        browser.save_screenshot(str(shots / "rollout.png"))
    finally:
        console.stop()
    log = (tmp_path / "console.log").read_text()
    assert "token=" not in log and "Traceback" not in log, log


def test_rbac_refusal_is_shown_with_the_api_servers_message(stacks, operator, platform, browser, tmp_path):
    from selenium.webdriver.common.by import By

    ns = stacks.namespace
    rbac = client.RbacAuthorizationV1Api(stacks.api)
    stacks.core.create_namespaced_service_account(ns, {"metadata": {"name": "viewer"}})
    rbac.create_namespaced_role(ns, {"metadata": {"name": "stack-viewer"}, "rules": [
        {"apiGroups": ["pulumi.com"], "resources": ["stacks", "programs"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}]})
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "stack-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "stack-viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns}]})
    kubeconfig = tmp_path / "viewer.kubeconfig"
    kubeconfig.write_text(platform.token_kubeconfig(ns, "viewer", 3600))
    kubeconfig.chmod(0o600)
    stacks.program("hello", stash_program(greeting="hi"))
    stacks.create("app", stacks.spec(stack="app", programRef={"name": "hello"}))
    stacks.wait_ready("app", 120)

    console = ConsoleProcess(kubeconfig, operator.state_dir, tmp_path / "viewer-console.log")
    try:
        browser.get(console.url)
        wait_for(lambda: row_state(browser, f"row-Stack--{ns}--app") == "Ready", 15,
                 "the viewer's overview lists its namespace's Stack")
        assert "showing namespace" in browser.find_element(By.TAG_NAME, "main").text, \
            "the overview says the user may not list cluster-wide"
        browser.get(f"{console.base}/stacks/{ns}/app")
        browser.find_element(By.ID, "action-suspend").click()
        refused = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#action-result [data-outcome]"), 10,
                           "the answer to Suspend")[0]
        assert refused.get_attribute("data-outcome") == "refused"
        assert (f'stacks.pulumi.com "app" is forbidden: User "system:serviceaccount:{ns}:viewer" cannot patch '
                f'resource "stacks"') in refused.text, refused.text
        assert not (stacks.get("app").get("spec") or {}).get("suspend"), "nothing was patched"
    finally:
        console.stop()

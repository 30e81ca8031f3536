"""The real optuna-dashboard, served by `autotune dashboard`, in a real headless Chromium.

After one real `autotune run`, the address that `autotune dashboard --study-name` prints opens
the study's page in a browser, and the single-page app renders what the run stored: the study
in the study list, its objective name and best trial, every trial with its state, the baseline
trial's user attributes (throughput, speedup), and the study's note with the exported profile.
Every expected text comes from the study as Optuna reads it, so a wrong address, an empty or
unreadable storage, or a missing attribute or note fails a wait here.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.profile.profile import Profile
from tests.conftest import autotune_cmd
from tests.integration.conftest import STUDY

try:
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    pytest.skip("selenium not importable: pip install -e '.[test]'", allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.browser]

#: Debian's packages (apt-get install chromium chromium-driver); the variables choose others.
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
#: Seconds to wait for the SPA to render a page.
WAIT_S = 30

if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip(
        "Chromium/ChromeDriver not installed: apt-get install chromium chromium-driver "
        "(.ci/run does)",
        allow_module_level=True,
    )

#: Headless as root, with no outside network: no sandbox, no GPU, nothing phoning home.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",  # the desktop layout: trial list and trial detail side by side
]
PRINTED = re.compile(r"optuna-dashboard for (\S+) at (http://\S+) \(Ctrl-C stops it\)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dashboard(finished_run, tmp_path_factory):
    """`autotune dashboard --study-name STUDY` on a free port; yields the line it printed."""
    port = free_port()
    logs = tmp_path_factory.mktemp("dashboard")
    out, err = logs / "stdout", logs / "stderr"
    with out.open("w") as o, err.open("w") as e:
        server = subprocess.Popen(
            autotune_cmd("dashboard", "--study-name", STUDY, "--port", str(port)),
            env=finished_run["env"],  # AUTOTUNE_HOME: the run's default storage
            stdout=o,
            stderr=e,
        )
    try:
        # The first line, printed before the server starts.
        deadline = time.monotonic() + 60
        while "\n" not in out.read_text() and server.poll() is None:
            assert time.monotonic() < deadline, f"no address printed: {err.read_text()}"
            time.sleep(0.1)
        line = out.read_text().partition("\n")[0]
        assert server.poll() is None, f"autotune dashboard exited: {line}\n{err.read_text()}"
        # Then wait until it answers: without the printed address's token, with 403 (H-W07:
        # another local user's request to its API is refused by the real server).
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5)
            except urllib.error.HTTPError as e:
                assert e.code == 403, e.code
                break
            except OSError:
                assert time.monotonic() < deadline, f"no answer: {err.read_text()}"
                time.sleep(0.2)
            else:
                raise AssertionError("the dashboard answered a request without its token")
        yield {"line": line, "port": port}
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium driven by the system's ChromeDriver: Selenium Manager stays idle."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in CHROMIUM_ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SE_OFFLINE", "true")
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.shots = tmp_path_factory.mktemp("screenshots")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def study(finished_run):
    return optuna.load_study(study_name=STUDY, storage=finished_run["url"])


@pytest.fixture(scope="module")
def study_page(dashboard, finished_run, study, browser):
    """The address printed: the study's page, by the study's id in the run's storage, with the
    dashboard's token (``autotune.cli.dashboard``), which the first visit trades for a cookie.
    ``url`` is the page's address without it, as the browser then shows it."""
    m = PRINTED.fullmatch(dashboard["line"])
    assert m, dashboard["line"]
    assert m[1] == finished_run["url"]
    study_id = optuna.storages.get_storage(finished_run["url"]).get_study_id_from_name(STUDY)
    page = f"http://127.0.0.1:{dashboard['port']}/dashboard/studies/{study_id}"
    assert re.fullmatch(re.escape(page) + r"\?token=[A-Za-z0-9_-]{32}", m[2]), m[2]
    browser.get(m[2])  # the printed address: its token traded for the cookie
    assert browser.current_url == page  # and gone from the address bar
    return {"url": page, "printed": m[2], "id": study_id}


def wait_for(driver, xpath: str, what: str):
    """The visible element at ``xpath`` once the SPA renders it; on a timeout, fail with the
    page's text and a screenshot."""
    try:
        return WebDriverWait(driver, WAIT_S).until(
            EC.visibility_of_element_located((By.XPATH, xpath))
        )
    except TimeoutException:
        shot = Path(driver.shots) / f"{re.sub(r'[^a-z0-9]+', '_', what.lower())}.png"
        driver.save_screenshot(str(shot))
        text = driver.find_element(By.TAG_NAME, "body").text
        pytest.fail(
            f"{driver.current_url}: no {what} ({xpath}) within {WAIT_S}s; "
            f"screenshot {shot}; page text:\n{text[:3000]}"
        )


def test_the_study_list_links_the_study(browser, study_page):
    browser.get(study_page["url"].rsplit("/studies/", 1)[0])
    card = wait_for(
        browser, f"//a[@href='/dashboard/studies/{study_page['id']}']//h5", "study card"
    )
    assert card.text == f"{study_page['id']}. {STUDY}"


def test_the_printed_address_opens_the_study_page(browser, study_page, study):
    browser.get(study_page["url"])
    wait_for(browser, f"//*[normalize-space()='{STUDY} (id={study_page['id']})']", "title")
    # the history plot's objective: the name the run gave it
    wait_for(browser, "//*[@role='combobox' and normalize-space()='samples_per_s']", "objective")
    best = study.best_trial
    heading = wait_for(browser, "//h6[starts-with(., 'Best Trial')]", "best trial")
    assert heading.text == f"Best Trial (number={best.number})"
    value = heading.find_element(By.XPATH, "following-sibling::h3")
    assert float(value.text) == best.value


def test_the_trials_page_lists_every_trial_and_the_baselines_attributes(browser, study_page, study):
    trials = study.get_trials(deepcopy=False)
    base = trials[0]
    assert base.user_attrs["baseline"] is True
    browser.get(f"{study_page['url']}/trials?numbers=0")
    wait_for(browser, f"//li//p[normalize-space()='{len(trials)} Trials']", "trial count")
    for t in trials:
        item = wait_for(browser, f"//li[.//span[normalize-space()='Trial {t.number}']]", "trial")
        assert t.state.name.capitalize() in item.text.split("\n"), item.text
    # trial 0, selected: its detail with the user attributes the run recorded
    wait_for(browser, "//*[starts-with(normalize-space(), 'Trial 0 (trial_id=')]", "detail")
    for key in ("baseline", "throughput", "speedup"):
        # optuna-dashboard shows a number as Python's str() of it
        wait_for(browser, f"//p[normalize-space()='{key} {base.user_attrs[key]}']", key)
    failed = [t for t in trials if t.state == TrialState.FAIL and "reason" in t.user_attrs]
    if failed:  # a failed trial shows why
        browser.get(f"{study_page['url']}/trials?numbers={failed[0].number}")
        wait_for(browser, "//p[starts-with(normalize-space(), 'reason ')]", "failure reason")


def test_the_note_page_shows_the_exported_profile(browser, study_page, study, finished_run):
    browser.get(f"{study_page['url']}/note")
    wait_for(browser, "//h2[normalize-space()='Exported profile']", "note")
    profile = Path(finished_run["home"]) / "profiles" / f"{STUDY}.yaml"
    wait_for(browser, f"//code[normalize-space()='{profile}']", "profile path")
    yaml = wait_for(browser, "//h2[normalize-space()='Exported profile']/following::pre", "yaml")
    # the exported profile's choice: the re-validation's winner, or the search's best
    assert f"best_trial: {Profile.load(profile).study['best_trial']}" in yaml.text
    assert f"name: {STUDY}" in yaml.text

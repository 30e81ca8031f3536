"""Make the README's pictures from a real run: the live display, the report, the dashboard.

    python docs/screenshots.py     # ~4 minutes: docs/images/{live.svg,report.png,dashboard.png}

1. ``autotune run --space default --budget 3m`` (the README's run) runs in this process on a
   real local Ray instance with real gloo ranks. Its display is the command's own
   (``progress.RunView``) on a recording rich console; after the fourth trial, the log so far
   and the live status under it are drawn to ``live.svg``.
2. ``autotune report`` (the installed command) writes that study's page, and headless Chromium
   takes a picture of its first screen: ``report.png``.
3. ``autotune dashboard`` serves the study, and Chromium takes a picture of its trials page:
   ``dashboard.png``.

The pictures are kept only when the run found something: a re-validated profile whose 95 %
interval lies above 1.0x (``found``). A null result - the report's first screen saying "keep
the defaults" - says why and leaves the images as they are; run it again.

Needs ``pip install -e '.[test]'`` (selenium) and Chromium with its ChromeDriver
(``apt-get install chromium chromium-driver``; ``CHROMIUM`` and ``CHROMEDRIVER`` choose others).
Everything else it writes goes to a temporary directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

IMAGES = Path(__file__).resolve().parent / "images"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
WIDTH = 118  # columns of the terminal picture
SNAPSHOT_AFTER = 4  # finished trials


def live_picture(home: Path, out: Path):
    """Run the study with the command's own display on a recording console; draw it after
    ``SNAPSHOT_AFTER`` trials into ``out``. Returns the study's name and the study."""
    from rich.console import Console, Group
    from rich.text import Text

    from autotune.core import events
    from autotune.definition.studydef import StudyDefinition
    from autotune.report.progress import RunView
    from autotune.tuner import RunRequest, run

    d = StudyDefinition.load("default").override(budget_s=180.0)
    screen = Console(record=True, width=WIDTH, force_terminal=True, color_system="truecolor")
    lines: list[Text] = []
    finished = 0

    class Recording(Console):
        """What the view prints, kept for the picture as well."""

        def print(self, *objects, **kwargs):  # noqa: A003
            for o in objects:
                lines.append(o if isinstance(o, Text) else Text.from_markup(str(o)))
            super().print(*objects, **kwargs)

    console = Recording(width=WIDTH, force_terminal=False)
    view = RunView(console, budget_s=d.budget_s, live=False)

    def emit(event) -> None:
        nonlocal finished
        view(event)
        if isinstance(event, events.TrialFinished):
            finished += 1
            if finished == SNAPSHOT_AFTER:
                screen.print(Text("$ autotune run --space default --budget 3m", style="bold"))
                left = [t for t in lines if t.plain.startswith("  - ")]
                shown = [t for t in lines if not t.plain.startswith("  - ")]
                at = next(i for i, t in enumerate(shown) if t.plain.startswith("Left out")) + 1
                shown.insert(at, Text(f"  ... {len(left)} knobs, each with its reason"))
                screen.print(Group(*shown))
                screen.print(view.status())
                screen.save_svg(str(out / "live.svg"), title="autotune run")

    req = RunRequest(
        definition=d,
        run_dir=home,
        study_name=None,
        storage_url=None,
        address=None,
        profile_path=None,
        sigterm=False,
    )
    with view:
        summary = run(req, emit=emit)
    return summary.study_name, summary.study


def found(study) -> str | None:
    """Why the run's result is not worth a picture (None: it found something): its profile
    must be re-validated, with the low end of its speedup's 95 % interval above 1.0."""
    from autotune.profile.export import study_profile

    if study is None:
        return "the run left no study"
    measured = study_profile(study).measured
    ci = measured.get("speedup_interval")
    if not measured.get("validation") or not ci or ci[0] is None or ci[0] <= 1.0:
        return f"the run found nothing beyond the noise ({study_profile(study).headline()})"
    return None


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--window-size=1300,900",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    os.environ["SE_OFFLINE"] = "true"
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    IMAGES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = {**os.environ, "AUTOTUNE_HOME": str(home)}
        os.environ["AUTOTUNE_HOME"] = str(home)
        shots = Path(tmp) / "images"
        shots.mkdir()
        study, record = live_picture(home, shots)
        if (why := found(record)) is not None:
            print(f"screenshots: {why}; the images are left as they are: run it again")
            return 1
        subprocess.run(
            [AUTOTUNE, "report", "--study-name", study, "-o", f"{tmp}/report"],
            env=env,
            check=True,
            capture_output=True,
        )
        port = free_port()
        command = [AUTOTUNE, "dashboard", "--study-name", study, "--port", str(port)]
        server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        driver = browser()
        try:
            driver.get(f"file://{tmp}/report/report.html")
            time.sleep(2)
            driver.save_screenshot(str(shots / "report.png"))
            address = server.stdout.readline().split(" at ")[1].split()[0]
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5)
                    break
                except urllib.error.HTTPError:  # it answers: 403 without the printed token
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.3)
            driver.get(address)
            time.sleep(6)  # the single-page app draws its charts
            driver.save_screenshot(str(shots / "dashboard.png"))
        finally:
            driver.quit()
            server.terminate()
            server.wait(timeout=10)
        for name in ("live.svg", "report.png", "dashboard.png"):
            shutil.copyfile(shots / name, IMAGES / name)
    for name in ("live.svg", "report.png", "dashboard.png"):
        print(IMAGES / name, (IMAGES / name).stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    if not shutil.which(CHROMEDRIVER):
        sys.exit(f"screenshots: {CHROMEDRIVER} not found; apt-get install chromium-driver")
    sys.exit(main())

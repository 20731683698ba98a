"""A real headless browser for the tests: the system's Chromium and chromedriver (Debian `chromium`,
`chromium-driver`), driven with Selenium. Never a browser download: the binaries are the apt packages
`python3 tools/dev.py test` installs.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = ("/usr/bin/chromium", "chromium")
CHROMEDRIVER = ("/usr/bin/chromedriver", "chromedriver")
HINT = "install them with `python3 tools/dev.py test` (apt-get install chromium chromium-driver)"
ARTIFACTS = Path(__file__).resolve().parent.parent / ".artifacts"  # git-ignored: screenshots of browser tests

# What Chromium needs to run headless as root in a container, and to stay off the network.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1300,1800")


def _find(candidates: tuple[str, ...]) -> str | None:
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    return None


def binaries() -> tuple[str, str] | None:
    """(chromium, chromedriver), or None when either is not installed."""
    browser, driver = _find(CHROMIUM), _find(CHROMEDRIVER)
    return (browser, driver) if browser and driver else None


@contextlib.contextmanager
def headless_chromium() -> Iterator[Any]:
    """A Selenium WebDriver on a headless Chromium with a fresh profile folder; quit afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = binaries()
    if found is None:
        raise RuntimeError(f"chromium or chromedriver is not installed: {HINT}")
    browser, driver = found
    with tempfile.TemporaryDirectory(prefix="farm-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        session = webdriver.Chrome(service=Service(executable_path=driver), options=options)
        try:
            yield session
        finally:
            session.quit()


def screenshot(session: Any, name: str) -> Path:
    """Save the page as .artifacts/<name>.png (kept after the test, for a person to look at); its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    session.save_screenshot(str(path))
    return path

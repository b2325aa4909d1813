"""Debian's Chromium under Selenium, for the browser tests (`@pytest.mark.browser`).

Where Chromium, its chromedriver or Selenium is missing the tests are skipped with the reason
(and the command that installs them); under CI=true they fail instead, because .ci/run
installs them. Nothing is downloaded at run time: the browser and driver are the system's.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

INSTALL = "apt-get install -y chromium chromium-driver"
# Debian's /usr/bin/chromium is a shell wrapper around this binary.
_BINARIES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")


def _find(names: tuple[str, ...]) -> str | None:
    for name in names:
        if Path(name).is_absolute():
            if Path(name).is_file() and os.access(name, os.X_OK):
                return name
        elif found := shutil.which(name):
            return found
    return None


def chromium_unavailable() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[dev]')"
    if _find(_BINARIES) is None:
        return f"Chromium is not installed ({INSTALL})"
    if _find(("chromedriver",)) is None:
        return f"chromedriver is not installed ({INSTALL})"
    return None


def require_chromium() -> None:
    """Skip (or, under CI=true, fail) when the browser tests cannot run."""
    why = chromium_unavailable()
    if why is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why} -- required under CI=true (.ci/run installs it)")
    pytest.skip(why)


def start_chromium(width: int = 1280, height: int = 900) -> Any:
    """A headless Chromium driven by Debian's chromedriver; quit() it when done."""
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(_find(_BINARIES))
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    service = Service(executable_path=str(_find(("chromedriver",))))
    return webdriver.Chrome(service=service, options=options)

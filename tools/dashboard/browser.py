# Owns driving a real headless Chromium for the console's tests and its
# screenshot command: finding Debian's `chromium` (Playwright is pointed at
# that executable; it downloads no browser of its own), and one dedicated
# thread that owns Playwright's sync API, since its objects belong to the
# thread that made them while the cluster and the console run under trio.
#
#   async with open_browser() as browser:
#       await browser.run(lambda page: page.goto(url))
import concurrent.futures
import os
import shutil
from contextlib import asynccontextmanager

import trio

CHROMIUM_NAMES = ("chromium", "chromium-browser")
VIEWPORT = {"width": 1280, "height": 900}


class BrowserUnavailable(Exception):
    """No Chromium executable or no Playwright: the reason, for a skip or an error line."""


def find_chromium() -> str:
    """$LEDGERMQ_CHROMIUM, else Debian's chromium on PATH."""
    explicit = os.environ.get("LEDGERMQ_CHROMIUM")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise BrowserUnavailable(f"$LEDGERMQ_CHROMIUM={explicit} is not an executable")
        return explicit
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserUnavailable("no chromium on PATH (`make setup` installs Debian's chromium with apt-get; "
                             "or set $LEDGERMQ_CHROMIUM)")


class Browser:
    """One page in a headless Chromium, used from trio: run(fn) calls
    fn(page) on the browser's own thread."""

    def __init__(self, executable: str):
        self._executable = executable
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="chromium")
        self._pw = self._browser = self.page = None

    def _start(self) -> None:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError as e:
            raise BrowserUnavailable(f"playwright is not installed ({e}); it is in the test extra") from None
        self._pw = sync_playwright().start()
        # --no-sandbox: the tests run as root, where Chromium's sandbox refuses to start.
        self._browser = self._pw.chromium.launch(executable_path=self._executable, headless=True,
                                                 args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        self.page = self._browser.new_page(viewport=VIEWPORT)
        self.page.set_default_timeout(60_000)

    def _stop(self) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._pw is not None:
            self._pw.stop()

    async def call(self, fn, *args):
        future = self._pool.submit(fn, *args)
        return await trio.to_thread.run_sync(future.result, abandon_on_cancel=True)

    async def run(self, fn):
        return await self.call(lambda: fn(self.page))


@asynccontextmanager
async def open_browser():
    browser = Browser(find_chromium())
    try:
        await browser.call(browser._start)
        yield browser
    finally:
        with trio.CancelScope(shield=True):
            await browser.call(browser._stop)
        browser._pool.shutdown(wait=False)

# Owns running `mqadmin` as operators do, in a subprocess from the
# repository root, for the tests of planned operations.
import sys

import trio

from tests.helpers import REPO_ROOT


async def mqadmin(*args, ns: str | None = None, expect: int = 0) -> str:
    """stdout of `python -m tools.mqadmin ARGS [-n NS]`; asserts the exit
    status is `expect` and that nothing raised a traceback."""
    argv = [sys.executable, "-m", "tools.mqadmin", *args] + (["-n", ns] if ns else [])
    r = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False, cwd=str(REPO_ROOT))
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == expect and "Traceback" not in err, (args, r.returncode, out, err)
    return out

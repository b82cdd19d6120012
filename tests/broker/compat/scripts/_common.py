# Shared by the scripts run inside the compat venv (.venv-compat) with the
# stock rocketmq==0.4.4 client: JSON output and the exit path.  These files
# run under the compat interpreter, never import ledgermq, and print exactly
# one JSON object on stdout (the last line) for stock_client.run_script().
import json
import os
import sys
import time


def emit(result: dict) -> None:
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def finish(result: dict, clients, shutdown: bool) -> None:
    """Print the result and exit.  A clean shutdown of the C++ core takes
    about 10 s, so by default the process ends with os._exit after the
    result is out; --shutdown measures the clean path instead."""
    if shutdown:
        t0 = time.monotonic()
        for c in clients:
            c.shutdown()
        result["shutdown_seconds"] = round(time.monotonic() - t0, 3)
        emit(result)
        # The wrappers' __del__ would shut down again; skip interpreter teardown.
        os._exit(0)
    emit(result)
    os._exit(0)


def text(value) -> "str | None":
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

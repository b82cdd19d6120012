# Shared by the official-client scripts (run in the official client's own
# venv, .venv-grpc-client): the client configuration from argv and one JSON
# line per event on stdout.
import json
import sys

from rocketmq import ClientConfiguration, Credentials


def config(endpoint: str, ak: str, sk: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(ak if ak != "-" else "", sk if sk != "-" else ""),
                               request_timeout=5)


def emit(**obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def log_lines(*needles: str) -> list[str]:
    """The client's own log lines (~/logs/rocketmq_python) that mention any
    of `needles`: what the server answered, where the client's exception
    does not say."""
    import glob
    import os
    out = []
    for path in glob.glob(os.path.expanduser("~/logs/rocketmq_python/*.log")):
        with open(path, errors="replace") as f:
            out += [line.strip()[:300] for line in f if any(n in line for n in needles)]
    return out[:5]

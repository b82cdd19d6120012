# Owns the `mqnamesrv` and `mqbroker` entry points.  The name server and the
# broker arrive with the broker issue; until then these say so plainly.
import sys


def _not_yet(name: str) -> None:
    print(f"{name}: not yet available in this ledgermq build (the broker is being built; "
          "see the README for what runs today)", file=sys.stderr)
    sys.exit(2)


def mqnamesrv() -> None:
    _not_yet("mqnamesrv")


def mqbroker() -> None:
    _not_yet("mqbroker")

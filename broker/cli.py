# Owns the `mqnamesrv` and `mqbroker` entry points.  The name server runs
# (broker/namesrv); the broker arrives with the broker issue and until then
# `mqbroker` says so plainly.
import sys


def _not_yet(name: str) -> None:
    print(f"{name}: not yet available in this ledgermq build (the broker is being built; "
          "see the README for what runs today)", file=sys.stderr)
    sys.exit(2)


def mqnamesrv() -> None:
    from broker.namesrv.cli import main  # imported here: mqbroker does not need trio/click loaded
    main()


def mqbroker() -> None:
    _not_yet("mqbroker")

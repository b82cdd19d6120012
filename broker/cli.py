# Owns the `mqnamesrv` and `mqbroker` entry points (console scripts); each
# imports its service lazily so one command does not load the other's code.


def mqnamesrv() -> None:
    from broker.namesrv.cli import main
    main()


def mqbroker() -> None:
    from broker.server import main
    main()

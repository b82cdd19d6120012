# Owns how every ledgermq command logs: the console (stderr) as before, plus
# an optional file with size-based rotation, in text or JSON lines, and the
# validated --log-level / --log-file / --log-format options the commands
# (mqbroker, mqnamesrv, mqadmin) share.
#
# The standard library's logging, not structlog: every module already logs
# through logging.getLogger(...), RotatingFileHandler is the rotation
# RocketMQ operators expect (a size, N backups: broker.log, broker.log.1,
# ...), and JSON lines need only a Formatter of a dozen lines -- structlog
# would be a new dependency and a second way to log for the same output.
#
# A JSON line: {"ts": "2026-01-01T12:00:00.123Z", "level": "INFO",
# "logger": "ledgermq.broker", "message": "...", "pid": 123} plus "exc" (the
# formatted traceback) when one is attached; one object per line, what
# Fluent Bit / Vector / Filebeat read without a parser config.
import json
import logging
import logging.handlers
import os
import sys
import time

import click

LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DEFAULT_MAX_BYTES = 128 * 1024 * 1024  # RocketMQ's logback rolls at 128 MB
DEFAULT_BACKUPS = 10


class JsonLinesFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _formatter(fmt: str) -> logging.Formatter:
    return JsonLinesFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def setup_logging(level: str = "INFO", log_file: str | None = None, fmt: str = "text", *,
                  console: bool = True, max_bytes: int = DEFAULT_MAX_BYTES,
                  backups: int = DEFAULT_BACKUPS) -> logging.Handler | None:
    """Configure the root logger: stderr (text, or JSON when fmt is json)
    and, with log_file, a rotating file in the same format.  Raises OSError
    naming the path when the file cannot be opened (its folder is created)."""
    level = level.upper()
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r} (one of {', '.join(LEVELS)})")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(level)
    if console:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_formatter(fmt))
        root.addHandler(handler)
    file_handler = None
    if log_file:
        folder = os.path.dirname(os.path.abspath(log_file))
        try:
            os.makedirs(folder, exist_ok=True)
            file_handler = logging.handlers.RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups,
                                                                encoding="utf-8")
        except OSError as exc:
            raise OSError(f"cannot write the log file {log_file}: {exc.strerror or exc}") from None
        file_handler.setFormatter(_formatter(fmt))
        root.addHandler(file_handler)
    return file_handler


def log_options(default_level: str = "INFO"):
    """click options --log-level (validated: an unknown level is a usage
    error), --log-file and --log-format, for a command's callback."""

    def decorate(fn):
        fn = click.option("--log-format", type=click.Choice(FORMATS), default="text", show_default=True,
                          help="console and file log format: text, or JSON lines for log shippers")(fn)
        fn = click.option("--log-file", type=click.Path(dir_okay=False), default=None,
                          help=f"also log to this file, rotated at {DEFAULT_MAX_BYTES >> 20} MiB "
                               f"({DEFAULT_BACKUPS} backups)")(fn)
        fn = click.option("--log-level", type=click.Choice(LEVELS, case_sensitive=False), default=default_level,
                          show_default=True, help="log level")(fn)
        return fn

    return decorate


def cli_logging(level: str, log_file: str | None, fmt: str, *, log_dir: str | None = None,
                file_name: str = "ledgermq.log") -> str | None:
    """setup_logging for a command: --log-file wins, else <logDir>/<file_name>
    when the config names a logDir.  An unusable file is a one-line
    click error naming the path.  Returns the log file used (or None)."""
    path = log_file or (os.path.join(log_dir, file_name) if log_dir else None)
    try:
        setup_logging(level, path, fmt)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    return path


def version_text() -> str:
    """`<prog> --version`: the installed ledgermq version."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("ledgermq")
    except PackageNotFoundError:
        return "unknown (not installed)"

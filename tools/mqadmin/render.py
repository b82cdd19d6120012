# Owns how mqadmin's online commands print: aligned tables and key/value
# lists with rich (colour only when stdout is a terminal, never cut to a
# terminal width when it is not, so scripts can split on whitespace), one
# JSON document with --json, and progress bars on stderr for the long
# operations (shown only when stderr is a terminal and --json is off).
import contextlib
import json
import sys

import attrs
import click
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def _console(err: bool = False) -> Console:
    stream = sys.stderr if err else sys.stdout
    tty = stream.isatty()
    # Not a terminal: no colour, no wrapping (a pipe has no width).
    return Console(file=stream, highlight=False, soft_wrap=not tty, width=None if tty else 100_000,
                   color_system="auto" if tty else None, force_terminal=tty)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, (list, tuple)):
        return ",".join(_cell(v) for v in value) or "-"
    text = str(value)
    return text if text else "-"  # an empty cell would shift columns for `split()`


@attrs.define
class Output:
    as_json: bool = False

    def json(self, obj) -> None:
        click.echo(json.dumps(obj, sort_keys=False, default=str))

    def table(self, columns: list[str], rows: list[list], title: str | None = None) -> None:
        """An aligned table: a header row, then one row per item."""
        t = Table(box=None if not sys.stdout.isatty() else box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  header_style="bold" if sys.stdout.isatty() else None, title=title)
        for name in columns:
            t.add_column(name, no_wrap=True, overflow="ignore")
        for row in rows:
            t.add_row(*(_cell(v) for v in row))
        _console().print(t)

    def kv(self, pairs, title: str | None = None) -> None:
        """`key  value` lines, keys aligned."""
        self.table(["KEY", "VALUE"], [[k, v] for k, v in pairs], title=title)

    def line(self, text: str = "") -> None:
        click.echo(text)

    def note(self, text: str) -> None:
        """A remark for people (stderr: stdout stays parseable)."""
        click.echo(text, err=True)

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None):
        """A bar on stderr when it is a terminal; else a silent counter.
        Yields advance(n=1)."""
        if self.as_json or not sys.stderr.isatty():
            yield lambda n=1: None
            return
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=_console(err=True), transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)

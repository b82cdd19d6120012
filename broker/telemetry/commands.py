# Owns how every console script (pyproject's [project.scripts]) shows a
# usage error: the cause first ("Error: Invalid value for '--log-level':
# ..."), then click's usage line and the --help hint, so the first line of
# stderr -- what a journal, a CI log or `2>&1 | head -1` shows -- names the
# cause.  Click's own order puts "Usage: ..." first and the cause last.
#
#   @click.command(cls=CauseFirstCommand, ...)   /   @click.group(cls=CauseFirstGroup, ...)
#
# Rule: a usage error raised while parsing (the command's or a
# subcommand's) or in a callback is re-raised as CauseFirstUsageError with
# the same message, context and exit status (2); other ClickExceptions are
# one line already ("Error: ...") and pass untouched.
import contextlib

import click


class CauseFirstUsageError(click.UsageError):
    def show(self, file=None) -> None:
        color = self.ctx.color if self.ctx is not None else None

        def say(line: str) -> None:
            click.echo(line, file=file, err=file is None, color=color)

        say(f"Error: {self.format_message()}")
        if self.ctx is not None:
            say(self.ctx.get_usage())
            if self.ctx.command.get_help_option(self.ctx) is not None:
                option = max(self.ctx.command.get_help_option_names(self.ctx), key=len)
                say(f"Try '{self.ctx.command_path} {option}' for help.")


@contextlib.contextmanager
def _cause_first():
    try:
        yield
    except CauseFirstUsageError:
        raise
    except click.UsageError as exc:
        raise CauseFirstUsageError(exc.format_message(), exc.ctx) from None


class _CauseFirst:
    def make_context(self, *args, **kwargs):
        with _cause_first():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _cause_first():
            return super().invoke(ctx)


class CauseFirstCommand(_CauseFirst, click.Command):
    pass


class CauseFirstGroup(_CauseFirst, click.Group):
    pass

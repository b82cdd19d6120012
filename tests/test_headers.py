# Owns the rules for module headers in the five packages (native,
# commitlog, consumequeue, broker, tools; README "Architecture"):
#
#   * every module opens with a comment, and a module's comment (not a
#     package's __init__.py or __main__.py, which may describe the package
#     or be empty) starts with "# Owns": what the module owns, then the
#     rules it keeps;
#   * the opening comment is at most MAX_LINES lines.  A longer one is named
#     in LONG with the reason it is not cut yet; LONG may only shrink (the
#     ratchet: LONG_AT_MOST), and an entry whose module has come under the
#     limit must leave it;
#   * no history: an opening comment names no issue number and tells no
#     "used to" or speed-up story (that belongs in commit messages).  A
#     measured figure stays only when it is the reason for a rule.
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("native", "commitlog", "consumequeue", "broker", "tools")

MAX_LINES = 30

# path -> why its opening comment may be longer than MAX_LINES.
LONG = {
    # Being reworked by the transaction/timer/chaos round (issue 32's header cut left them alone):
    "broker/store/timer.py": "the timer queue's formats and delivery rules; to cut after that round",
    "broker/store/transaction.py": "the half/op formats and the check rules; to cut after that round",
    "broker/store/schedule.py": "the delay-level rewrite and its rules; to cut after that round",
    "tools/chaos/fuzz.py": "the fuzzers' targets and the rule each checks; to cut after that round",
    "tools/chaos/livefuzz.py": "the live fuzzer's targets and rules; to cut after that round",
}

# The ratchet: LONG may hold at most this many modules (it only goes down).
LONG_AT_MOST = 5

HISTORY = re.compile(r"\bissue \d+|\bused to\b|\bspeed-?ups?\b", re.IGNORECASE)


def opening_comment(text: str) -> list[str]:
    """The module's opening comment: its first run of `#` lines, after a
    shebang or coding line."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and (lines[i].startswith("#!") or lines[i].startswith("# -*-")):
        i += 1
    out = []
    while i < len(lines) and lines[i].startswith("#"):
        out.append(lines[i])
        i += 1
    return out


def _modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            found.append(path.relative_to(REPO).as_posix())
    return found


def _is_package_file(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1] in ("__init__.py", "__main__.py")


def _header(rel: str) -> list[str]:
    return opening_comment((REPO / rel).read_text(encoding="utf-8"))


def test_every_module_opens_with_what_it_owns():
    missing = [rel for rel in _modules()
               if not _is_package_file(rel) and not (_header(rel) and _header(rel)[0].startswith("# Owns"))]
    assert not missing, f"modules whose opening comment does not start with '# Owns': {missing}"


def test_opening_comments_are_short():
    too_long = {rel: len(_header(rel)) for rel in _modules()
                if len(_header(rel)) > MAX_LINES and rel not in LONG}
    assert not too_long, (f"opening comments over {MAX_LINES} lines (cut them to what the module owns and "
                          f"the rules it keeps, or name the reason in LONG): {too_long}")


def test_the_long_list_only_shrinks():
    assert len(LONG) <= LONG_AT_MOST, f"LONG has {len(LONG)} modules, the ratchet allows {LONG_AT_MOST}"
    assert all(reason.strip() for reason in LONG.values())


def test_every_long_entry_is_still_long():
    gone = [rel for rel in LONG if not (REPO / rel).exists()]
    short = [rel for rel in LONG if (REPO / rel).exists() and len(_header(rel)) <= MAX_LINES]
    assert not gone, f"LONG names modules that do not exist: {gone}"
    assert not short, (f"these headers are now at most {MAX_LINES} lines: take them out of LONG "
                       f"and lower LONG_AT_MOST: {short}")


def test_opening_comments_tell_no_history():
    told = [f"{rel}:{n + 1}: {line}" for rel in _modules()
            for n, line in enumerate(_header(rel)) if HISTORY.search(line)]
    assert not told, "history belongs in commit messages:\n" + "\n".join(told)


@pytest.mark.parametrize(("text", "expected"), [
    ("# Owns x.\n# rule\nimport y\n", 2),
    ("#!/usr/bin/env python\n# Owns x.\n\n# not the header\n", 1),
    ('"""doc"""\n# later\n', 0),
    ("", 0),
])
def test_the_checks_see_what_they_count(text, expected):
    assert len(opening_comment(text)) == expected
    assert HISTORY.search("# faster since issue 31") and not HISTORY.search("# Owns the issue queue")

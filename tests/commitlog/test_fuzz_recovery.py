# Store recovery under random damage (issue 14): hypothesis corrupts a
# cleanly written store -- flipped bytes, zeroed ranges, truncation, deleted
# files -- in its data segments, index files, `checkpoint`, `currterm` or
# `ledgermq-base`, then opens it.  Either the open fails with a typed store
# error (a CorruptStoreError names the file and the offset), or the store
# serves a log in which every entry it returns is byte for byte the entry
# that was written at that index: a valid prefix, never corrupt data.  An
# entry it cannot vouch for raises a typed error when read; the store
# accepts appends after it opened.  LEDGERMQ_FUZZ_EXAMPLES sets the budget.
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from commitlog.config import ConfigError
from commitlog.errors import CommitLogError, CorruptStoreError
from commitlog.store import SegmentedStore
from tests.commitlog.store_helpers import body, cfg, fill

N = 60
EXAMPLES = int(os.environ.get("LEDGERMQ_FUZZ_EXAMPLES", "300"))
_TEMPLATE: list[str] = []


def template() -> str:
    """A cleanly closed store of N entries (built once per session)."""
    if not _TEMPLATE:
        root = tempfile.mkdtemp(prefix="ledgermq-fuzz-template-")
        with SegmentedStore.open(cfg(root)) as s:
            fill(s, N)
            s.set_committed(N - 1)
        _TEMPLATE.append(root)
    return _TEMPLATE[0]


def files_of(store_dir: str) -> list[str]:
    out = []
    for sub in ("data", "index"):
        d = os.path.join(store_dir, sub)
        out += [os.path.join(sub, f) for f in sorted(os.listdir(d))]
    return out + [f for f in ("checkpoint", "currterm", "ledgermq-base") if os.path.exists(os.path.join(store_dir, f))]


damage = st.lists(st.tuples(
    st.sampled_from(["flip", "zero", "truncate", "delete", "garbage"]),
    st.integers(0, 10 ** 6), st.integers(0, 10 ** 6), st.integers(1, 64)), min_size=1, max_size=3)


def apply(store_dir: str, ops) -> list[str]:
    done = []
    for op, which, where, n in ops:
        names = files_of(store_dir)
        if not names:
            break
        name = names[which % len(names)]
        path = os.path.join(store_dir, name)
        size = os.path.getsize(path)
        at = where % size if size else 0
        if op == "delete":
            os.unlink(path)
        elif op == "truncate":
            os.truncate(path, at)
        else:
            with open(path, "r+b") as f:
                f.seek(at)
                old = f.read(n)
                f.seek(at)
                f.write(bytes(len(old)) if op == "zero" else
                        bytes(b ^ 0xFF for b in old) if op == "flip" else os.urandom(len(old)))
        done.append(f"{op} {name} at {at} ({n})")
    return done


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=damage)
# Found by this test: a flipped byte in `checkpoint` was a UnicodeDecodeError
# traceback (now CorruptStoreError naming the file); zeroed header bytes of an
# old entry (both CRCs, body size, first body byte) were served as a stock
# entry without checks (reads now check the body size against the entry size).
@example(ops=[("flip", 220, 0, 1)])
@example(ops=[("zero", 1, 31, 18)])
def test_random_damage_recovers_a_valid_prefix_or_names_the_file(ops):
    root = tempfile.mkdtemp(prefix="ledgermq-fuzz-")
    try:
        shutil.copytree(template(), root, dirs_exist_ok=True)
        store_dir = os.path.join(root, "dledger-n0")
        what = apply(store_dir, ops)
        try:
            s = SegmentedStore.open(cfg(root))
        except CorruptStoreError as e:
            assert e.path.startswith(root) and e.offset >= 0, (what, e)
            assert os.path.basename(e.path) in str(e), (what, e)
            return
        except (CommitLogError, ConfigError) as e:  # typed, with a message
            assert str(e), what
            return
        with s:
            assert -1 <= s.end_index <= N - 1 + 0, what
            for i in range(max(s.begin_index, 0), s.end_index + 1):
                try:
                    e = s.get(i)
                except CommitLogError:
                    continue  # refused, not served
                assert bytes(e.body) == body(i), (what, i)
            end = s.end_index
            fill(s, 2)  # still takes writes after whatever it cut
            assert s.end_index == end + 2
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _cleanup_template():
    yield
    for root in _TEMPLATE:
        shutil.rmtree(root, ignore_errors=True)
    _TEMPLATE.clear()

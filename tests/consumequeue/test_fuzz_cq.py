# Consume queues, index files and the dispatch checkpoint under random
# damage (issue 14): hypothesis flips, zeroes and truncates the files a
# broker derives from its commitlog, then the consume queues are opened
# again (the broker's start-up path) and every queue is read from offset 0.
# The open may rebuild, repair or refuse with a typed error; a read may
# refuse with a typed error; but every record a read returns is exactly the
# record that was stored at that queue and offset -- damage is never served
# to a consumer.  LEDGERMQ_FUZZ_EXAMPLES sets the budget.
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitlog.errors import CommitLogError
from consumequeue import record as M
from consumequeue.reader import read_messages
from tests.consumequeue.test_dispatch import leader_store, open_store
from tests.consumequeue.test_reader import open_service, split

N = 400
EXAMPLES = int(os.environ.get("LEDGERMQ_FUZZ_EXAMPLES", "120"))
_TEMPLATE: dict = {}


def template() -> tuple[str, dict]:
    """A store of N messages with its consume queues and index, closed, and
    (topic, queue, offset) -> record bytes as a clean read returns them."""
    if not _TEMPLATE:
        root = tempfile.mkdtemp(prefix="ledgermq-cqfuzz-")
        store, _ = leader_store(root, N)
        svc = open_service(store)
        want = read_all(svc)
        svc.close()
        store.close()
        _TEMPLATE.update(root=root, want=want)
    return _TEMPLATE["root"], _TEMPLATE["want"]


def read_all(svc) -> dict:
    out = {}
    for topic in ("T", "U"):
        for q in range(4):
            offset = 0
            while True:
                r = read_messages(svc, topic, q, offset, max_msgs=32)
                for qo, rec in zip(r.queue_offsets, split(r.records)):
                    out[(topic, q, qo)] = rec
                if r.next_begin_offset <= offset or r.next_begin_offset >= r.max_offset:
                    break
                offset = r.next_begin_offset
    return out


def derived_files(root: str) -> list[str]:
    out = []
    for d, _dirs, files in sorted(os.walk(root)):
        rel = os.path.relpath(d, root)
        if rel.startswith("dledger-"):
            continue  # the commitlog itself: test_fuzz_recovery.py
        out += sorted(os.path.join(rel, f) for f in files)
    return out


damage = st.lists(st.tuples(st.sampled_from(["flip", "zero", "truncate", "delete"]),
                            st.integers(0, 10 ** 6), st.integers(0, 10 ** 6), st.integers(1, 40)),
                  min_size=1, max_size=3)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=damage)
def test_damaged_queues_never_serve_wrong_records(ops):
    src, want = template()
    root = tempfile.mkdtemp(prefix="ledgermq-cqfuzz-")
    try:
        shutil.copytree(src, root, dirs_exist_ok=True)
        what = []
        for op, which, where, n in ops:
            names = derived_files(root)
            name = names[which % len(names)]
            path = os.path.join(root, name)
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
                    f.write(bytes(len(old)) if op == "zero" else bytes(b ^ 0x5A for b in old))
            what.append(f"{op} {name} at {at}")
        store = open_store(root)
        try:
            try:
                svc = open_service(store)
            except CommitLogError:
                return  # refused at open with a typed error
            try:
                for topic in ("T", "U"):
                    for q in range(4):
                        offset = 0
                        for _ in range(N):
                            try:
                                r = read_messages(svc, topic, q, offset, max_msgs=32)
                            except CommitLogError:
                                break  # refused, not served
                            for qo, rec in zip(r.queue_offsets, split(r.records)):
                                assert want.get((topic, q, qo)) == rec, (what, topic, q, qo, M.decode(rec))
                            if r.next_begin_offset <= offset or r.next_begin_offset >= r.max_offset:
                                break
                            offset = r.next_begin_offset
            finally:
                svc.close()
        finally:
            store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _cleanup_template():
    yield
    if _TEMPLATE:
        shutil.rmtree(_TEMPLATE["root"], ignore_errors=True)
        _TEMPLATE.clear()

# kill -9 of a child process appending to a real store, many times over the
# same store: after each crash the store must reopen with every acknowledged
# entry intact (page cache survives kill -9 in async mode; sync mode flushed
# before acknowledging), nothing torn served, and stay appendable.
import os
import random
import signal
import subprocess
import sys

import pytest

from commitlog.scan import verify_store
from commitlog.store import SegmentedStore, StoreConfig
from tests.commitlog.store_helpers import body
from tests.helpers import REPO_ROOT

ROOT = str(REPO_ROOT)
ITERATIONS = 24
MAX_BATCH = 40

CHILD = r"""
import os, random, signal, sys
from commitlog.config import FlushDiskType
from commitlog.store import SegmentedStore, StoreConfig
from tests.commitlog.store_helpers import body
root, policy, term, seed, tear = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "tear"
rng = random.Random(seed)
if tear:
    # Die in the middle of a write: the k-th pwrite puts a random prefix of
    # its bytes on disk, then the process SIGKILLs itself.
    real_pwrite, real_pwritev, calls, tear_at = os.pwrite, os.pwritev, [0], rng.randrange(5, 120)

    def torn(fd, data, off):
        calls[0] += 1
        if calls[0] == tear_at:
            flat = b"".join(bytes(d) for d in data) if isinstance(data, list) else bytes(data)
            n = rng.randrange(1, len(flat) + 1)
            real_pwrite(fd, flat[:n], off)
            os.kill(os.getpid(), signal.SIGKILL)
        return real_pwritev(fd, data, off) if isinstance(data, list) else real_pwrite(fd, data, off)

    os.pwrite, os.pwritev = torn, torn
store = SegmentedStore.open(StoreConfig(root=root, data_segment_size=4096, index_segment_size=32 * 64,
                                        flush_disk_type=FlushDiskType[policy]))
print("open", store.end_index, flush=True)
while True:
    first = store.end_index + 1
    n = rng.randrange(1, %d)
    store.append_leader([body(i) for i in range(first, first + n)], term)
    if store.sync_flush:
        store.flush()
    print("acked", store.end_index, flush=True)
""" % (MAX_BATCH + 1)


def store_cfg(root):
    return StoreConfig(root=str(root), data_segment_size=4096, index_segment_size=32 * 64)


@pytest.mark.slow
def test_kill_9_mid_append_many_times(tmp_path):
    """Slow: a child process killed -9 mid-append many times over, the store reopened after each."""
    rng = random.Random(1234)
    acked, cuts, rebuilt = -1, 0, 0
    for it in range(ITERATIONS):
        policy = "SYNC_FLUSH" if it % 2 else "ASYNC_FLUSH"
        tear = it % 4 >= 2
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), policy, str(it + 1), str(it),
                                  "tear" if tear else "kill"],
                                 cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
        try:
            opened = child.stdout.readline().split()
            assert opened[0] == "open" and int(opened[1]) >= acked
            target = rng.randrange(1, 25)
            for line in child.stdout:  # a tearing child dies by itself
                if not line.endswith("\n"):  # cut by the child's death mid-write: that ack never fully arrived
                    assert line.startswith("acked") or "acked".startswith(line), line
                    break
                assert line.startswith("acked"), line
                acked = int(line.split()[1])
                target -= 1
                if target == 0 and not tear:
                    os.kill(child.pid, signal.SIGKILL)
            # (after the kill the loop drains what the child printed before it died)
        finally:
            child.kill()
            child.wait()
        assert child.returncode == -signal.SIGKILL
        with SegmentedStore.open(store_cfg(tmp_path)) as s:
            rep = s.recovery
            cuts += rep.cut_at is not None
            rebuilt += rep.index_units_rewritten > 0
            assert acked <= s.end_index <= acked + MAX_BATCH, (acked, s.end_index, rep)
            batch = s.read_batch(max(0, s.end_index - 60), 10**7, 10**6)  # verified on the way out
            assert batch.last_index == s.end_index
            for i in range(max(0, s.end_index - 60), s.end_index + 1):
                assert bytes(s.get(i).body) == body(i)
            assert s.end_term <= it + 1
            acked = s.end_index
    summary = verify_store(os.path.join(tmp_path, "dledger-n0"))
    assert summary.problems == [] and summary.last_index == acked and summary.first_index == 0
    with SegmentedStore.open(store_cfg(tmp_path)) as s:
        assert [s.term_at(i) for i in (0, s.end_index)] == [1, s.end_term]
    # The tearing runs are seeded, so these are deterministic: torn data and
    # torn index writes both happened and were repaired.
    assert cuts >= 2 and rebuilt >= 2, (cuts, rebuilt)

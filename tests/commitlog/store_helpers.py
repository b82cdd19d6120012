# Shared helpers for the segmented-store tests (no tests here): small
# segment configs, deterministic bodies, file snapshots, replication.
import os
import random

from commitlog.store import SegmentedStore, StoreConfig

DATA_SEG = 1024
INDEX_SEG = 320  # 10 units per index file


def cfg(root, self_id="n0", **kw) -> StoreConfig:
    kw.setdefault("data_segment_size", DATA_SEG)
    kw.setdefault("index_segment_size", INDEX_SEG)
    return StoreConfig(root=str(root), self_id=self_id, **kw)


def body(i: int, seed: int = 0) -> bytes:
    """A deterministic body for entry i (lengths 0..199)."""
    rng = random.Random(i * 7919 + seed)
    return bytes(rng.getrandbits(8) for _ in range(rng.randrange(200)))


def fill(store: SegmentedStore, n: int, *, term: int = 1, batch: int = 5, seed: int = 0) -> None:
    """Append n deterministic entries as leader in batches."""
    while n > 0:
        k = min(batch, n)
        first = store.end_index + 1
        store.append_leader([body(i, seed) for i in range(first, first + k)], term)
        n -= k


def snapshot(store_dir: str) -> dict[str, bytes]:
    """{relative path: content} of every data and index file."""
    out = {}
    for sub in ("data", "index"):
        d = os.path.join(store_dir, sub)
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name), "rb") as f:
                out[f"{sub}/{name}"] = f.read()
    return out


def replicate(leader: SegmentedStore, follower: SegmentedStore, *, max_bytes: int = 600, max_count: int = 7) -> None:
    """Copy leader entries after the follower's end with read_batch/append_follower."""
    i = follower.end_index + 1
    while i <= leader.end_index:
        batch = leader.read_batch(i, max_bytes, max_count)
        follower.append_follower(batch)
        i = batch.last_index + 1


def data_path(store: SegmentedStore, start: int) -> str:
    return os.path.join(store.store_dir, "data", f"{start:020d}")


def index_path(store: SegmentedStore, start: int) -> str:
    return os.path.join(store.store_dir, "index", f"{start:020d}")

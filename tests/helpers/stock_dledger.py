# Writes stores the way stock DLedger 0.3.1.2 lays them out, built from the
# spec alone (../shared/spec/rocketmq-dledger-formats.md §5) and sharing no
# code with commitlog/, so tests can check that ledgermq reads real stores:
#   * entries: i32 magic | i32 size | i64 index | i64 term | i64 pos |
#     i32 channel 0 | i32 chainCrc 0 | i32 bodyCrc 0 | i32 bodySize | body;
#   * data files of `data_size` bytes named by 20-digit start offset; an
#     entry of `len` bytes that does not satisfy len + 8 <= remaining is
#     preceded by a blank (i32 -1, i32 remaining, zeros) and a new file;
#   * index unit i (i32 magic, i64 pos, i32 size, i64 index, i64 term) at
#     byte i*32 of the index files (`index_size` bytes each, no blanks);
#   * every file is full size (DLedger maps whole files);
#   * `checkpoint` and `currterm` as Java-properties text in dledger-<id>/.
import os
import struct

ENTRY = struct.Struct(">iiqqqiiii")
UNIT = struct.Struct(">iqiqq")


def write_stock_store(root: str, entries: list[tuple[bytes, int]], *, self_id: str = "n0",
                      data_size: int = 4096, index_size: int = 32 * 16, first_index: int = 0,
                      first_file: int = 0, committed: int | None = None, magic: int = 1,
                      current_term: int | None = None, vote_leader: str = "") -> list[tuple[int, int]]:
    """Write `entries` ((body, term) pairs) as a stock store starting at
    index `first_index` in the data file starting at `first_file` (non-zero
    for a store whose head was deleted by retention).  Returns (index, pos)
    per entry."""
    base = os.path.join(root, f"dledger-{self_id}")
    data_dir, index_dir = os.path.join(base, "data"), os.path.join(base, "index")
    os.makedirs(data_dir, exist_ok=True)
    os.makedirs(index_dir, exist_ok=True)
    data: dict[int, bytearray] = {}
    index: dict[int, bytearray] = {}

    def data_file(start: int) -> bytearray:
        return data.setdefault(start, bytearray(data_size))

    placed = []
    pos = first_file
    for i, (body, term) in enumerate(entries):
        idx = first_index + i
        size = 48 + len(body)
        file_start = pos - (pos - first_file) % data_size
        remaining = file_start + data_size - pos
        if size + 8 > remaining:
            buf = data_file(file_start)
            struct.pack_into(">ii", buf, pos - file_start, -1, remaining)
            pos = file_start + data_size
            file_start = pos
        buf = data_file(file_start)
        at = pos - file_start
        ENTRY.pack_into(buf, at, magic, size, idx, term, pos, 0, 0, 0, len(body))
        buf[at + 48:at + size] = body
        unit_off = idx * 32
        ifile = unit_off - unit_off % index_size
        ibuf = index.setdefault(ifile, bytearray(index_size))
        UNIT.pack_into(ibuf, unit_off - ifile, magic, pos, size, idx, term)
        placed.append((idx, pos))
        pos += size
    for files, directory in ((data, data_dir), (index, index_dir)):
        for start, buf in files.items():
            with open(os.path.join(directory, f"{start:020d}"), "wb") as f:
                f.write(buf)
    end = first_index + len(entries) - 1
    with open(os.path.join(base, "checkpoint"), "w") as f:
        f.write(f"endIndex={end}\ncommittedIndex={end if committed is None else committed}\n")
    last_term = entries[-1][1] if entries else 0
    with open(os.path.join(base, "currterm"), "w") as f:
        f.write(f"currTerm={last_term if current_term is None else current_term}\nvoteLeader={vote_leader}\n")
    return placed

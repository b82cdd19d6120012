# Resident set size of a process's file mappings, from /proc/self/smaps:
# what tests of the store's and the dispatcher's page release measure.


def resident_kib(path_prefix: str) -> int:
    """Rss (KiB) of this process's mappings of files under path_prefix."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 6 and "-" in head[0] and ":" in head[3]:
                inside = head[5].startswith(path_prefix)
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def resident_maps(path_prefix: str) -> list[tuple[str, str, int]]:
    """(address range, path, Rss KiB) of each mapping of a file under
    path_prefix: what a failed resident_kib() check prints."""
    out, cur = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 6 and "-" in head[0] and ":" in head[3]:
                cur = (head[0], head[5]) if head[5].startswith(path_prefix) else None
            elif cur and head[0] == "Rss:":
                out.append((*cur, int(head[1])))
    return out

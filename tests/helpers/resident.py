# Resident set size of a process's file mappings, from /proc/self/smaps:
# what tests of the store's and the dispatcher's page release measure.


def _is_header(head: list[str]) -> bool:
    """A mapping's first line: "start-end perms offset dev inode [path]"."""
    return len(head) >= 5 and "-" in head[0] and not head[0].endswith(":") and ":" in head[3]


def resident_kib(path_prefix: str) -> int:
    """Rss (KiB) of this process's mappings of files under path_prefix."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if _is_header(head):  # every mapping's header, anonymous ones (5 fields) included
                inside = len(head) >= 6 and head[5].startswith(path_prefix)
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
            if _is_header(head):
                cur = (head[0], head[5]) if len(head) >= 6 and head[5].startswith(path_prefix) else None
            elif cur and head[0] == "Rss:":
                out.append((*cur, int(head[1])))
    return out

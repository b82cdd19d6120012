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

# Owns RocketMQ's permission bits (PermName) for brokers and topics, and
# their text as mqadmin prints them.
PERM_PRIORITY, PERM_READ, PERM_WRITE, PERM_INHERIT = 8, 4, 2, 1


def perm_text(perm: int) -> str:
    """7 -> "RW+INHERIT", 6 -> "RW", 4 -> "R", 2 -> "W", 0 -> "-"."""
    rw = ("R" if perm & PERM_READ else "") + ("W" if perm & PERM_WRITE else "")
    extra = [name for bit, name in ((PERM_INHERIT, "INHERIT"), (PERM_PRIORITY, "PRIORITY")) if perm & bit]
    return "+".join([rw or "-", *extra]) if rw or not extra else "+".join(extra)

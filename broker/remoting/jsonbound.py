# Owns the one check every decoder of outside JSON makes after parsing: how
# deep a decoded value nests (arrays and objects inside each other).  It
# walks with an explicit stack, never by recursion, so no input can raise
# RecursionError here; its work is one step per container element, bounded
# by the bytes that were parsed.  The limits themselves belong to the
# decoders (codec.py for headers, header.py for bodies), which state them.


def nests_deeper_than(value: object, limit: int) -> bool:
    """True if `value` has arrays/objects nested more than `limit` deep (a
    scalar is depth 0, [] and {} are depth 1, [[1]] is depth 2)."""
    if type(value) is not list and type(value) is not dict:
        return False
    if limit < 1:
        return True
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        container, depth = pop()
        for child in (container.values() if type(container) is dict else container):
            if type(child) is list or type(child) is dict:
                if depth >= limit:
                    return True
                push((child, depth + 1))
    return False

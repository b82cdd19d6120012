# Helpers of the feature tests (orderly, transactions, broadcasting, SQL92):
# waiting in whichever event loop the test runs on, and the order checks.
import anyio


async def wait_until(predicate, timeout: float, what: str) -> None:
    """Until predicate() holds (a test's wait on what consumers did)."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)


def order_problems(seqs: list[int], n: int) -> list[str]:
    """What is wrong with one key's consumed sequence numbers: each must be
    the next one, or a step back (a redelivery from an earlier committed
    offset, at least once), never a skip; and all n must arrive."""
    problems = []
    prev = -1
    for s in seqs:
        if s > prev + 1:
            problems.append(f"{s} after {prev}: skipped ahead")
        prev = s
    missing = set(range(n)) - set(seqs)
    if missing:
        problems.append(f"missing {sorted(missing)[:10]}")
    return problems

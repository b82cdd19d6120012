# Owns the Python face of the ACL helpers in C (native/src/acl.c,
# acl_sha1.c): an account table (accessKeys sorted, each secret's HMAC-SHA1
# states computed once), and the check of a scan's plain SEND_MESSAGE_V2
# requests against it -- verdict per request, the distinct (account, topic)
# pairs the ones that verified make, and the topic decisions applied back --
# in one call per scan.  What the verdicts mean, and the decisions, are
# broker/acl/fastpath.py's; the general path (broker/acl/validator.py) is
# the oracle.  With no extension (AVAILABLE false) there are no scanned
# sends either, and callers never come here.
from array import array

from native import NATIVE_LOADED, ffi, lib

AVAILABLE = NATIVE_LOADED and hasattr(lib, "lmq_acl_check_sends")

OK, GENERAL, NO_KEY, UNKNOWN_KEY, BAD_SIGNATURE, DENIED = range(6)
MAX_KEY = 1024
SCRATCH = 1 << 20  # unescaped header values: a header longer than this is left to the general path


def hmac_key(secret: bytes):
    """The HMAC states of one secret (lmq_hmac_key)."""
    key = ffi.new("lmq_hmac_key *")
    lib.lmq_hmac_sha1_key(secret, len(secret), key)
    return key


def hmac_sha1(secret: bytes, data: bytes) -> bytes:
    """HmacSHA1 by the C helper (for the oracle tests)."""
    out = ffi.new("uint8_t[20]")
    lib.lmq_hmac_sha1(hmac_key(secret), data, len(data), out)
    return bytes(out)


def sha1(data: bytes) -> bytes:
    out = ffi.new("uint8_t[20]")
    lib.lmq_sha1(data, len(data), out)
    return bytes(out)


def portable_sha1(on: bool) -> bool:
    """Use the portable block function (True) or the CPU's SHA extensions
    when it has them; returns the previous setting.  For tests."""
    return bool(lib.lmq_sha1_portable(1 if on else 0))


def uses_sha_extensions() -> bool:
    return bool(lib.lmq_sha1_uses_shani())


class AccountTable:
    """Accounts as the C check reads them: accessKeys (UTF-8) sorted
    bytewise with their secrets' HMAC states; `keys[i]` is account i's
    accessKey (str).  Built once per loaded rules."""

    __slots__ = ("keys", "n", "_blob", "_key_off", "_hmac")

    def __init__(self, secrets: dict[str, str]) -> None:
        encoded = sorted((k.encode("utf-8", "surrogatepass"), k) for k in secrets)
        self.keys = [k for _, k in encoded]
        self.n = len(encoded)
        blob = b"".join(b for b, _ in encoded)
        offsets = [0]
        for b, _ in encoded:
            offsets.append(offsets[-1] + len(b))
        self._blob = ffi.from_buffer("uint8_t[]", blob or b"\0")  # (the cdata keeps the bytes alive)
        self._key_off = ffi.new("int64_t[]", offsets)
        self._hmac = ffi.new("lmq_hmac_key[]", max(1, self.n))
        for i, (_, k) in enumerate(encoded):
            secret = secrets[k].encode("utf-8")
            lib.lmq_hmac_sha1_key(secret, len(secret), ffi.addressof(self._hmac, i))

    def bind(self, modes: bytes, broker_name: bytes) -> "BoundAccounts":
        """The table for one caller's address: modes[i] 0 (check the
        signature) or 1 (whitelisted: nothing checked)."""
        return BoundAccounts(self, modes, broker_name)


class BoundAccounts:
    """lmq_acl_accounts: a table, one address's modes, the broker's name."""

    __slots__ = ("table", "c", "_keep")

    def __init__(self, table: AccountTable, modes: bytes, broker_name: bytes) -> None:
        c = ffi.new("lmq_acl_accounts *")
        mode_buf = ffi.from_buffer("uint8_t[]", modes or b"\0")
        broker_buf = ffi.from_buffer("uint8_t[]", broker_name or b"\0")
        c.n, c.keys, c.key_off, c.hmac = table.n, table._blob, table._key_off, table._hmac
        c.mode, c.broker, c.broker_len = mode_buf, broker_buf, len(broker_name)
        self.table, self.c, self._keep = table, c, (mode_buf, broker_buf)


class ScanVerdicts:
    """The verdicts of requests [lo, n) of one scan (lmq_acl_check_sends):
    `verdict[i]` (an 'i' array over the whole scan), and for the refusals
    naming the accessKey its text (access_key(i))."""

    __slots__ = ("scan", "lo", "verdict", "pair", "ak_off", "ak_len", "pairs", "npairs")

    def __init__(self, scan, lo: int, verdict: array, pair: array, ak_off: array, ak_len: array, pairs,
                 npairs: int) -> None:
        self.scan, self.lo, self.verdict, self.pair = scan, lo, verdict, pair
        self.ak_off, self.ak_len, self.pairs, self.npairs = ak_off, ak_len, pairs, npairs

    def access_key(self, i: int) -> str:
        off = self.ak_off[i]
        # (UTF-8: the scanner checked every string of the header)
        return self.scan.data[off:off + self.ak_len[i]].decode("utf-8", "replace")

    def pair_of(self, k: int) -> tuple[int, int, bool]:
        """(account index, the scanner's topic_first, whitelisted)."""
        p = self.pairs[k]
        return p.account, p.topic_first, bool(p.white)

    def apply(self, pair_verdicts: list[int]) -> None:
        """Each pair's topic decision (OK or DENIED) onto its requests."""
        if not self.npairs:
            return
        f = ffi.from_buffer
        lib.lmq_acl_apply(f("int32_t[]", self.verdict), f("int32_t[]", self.pair),
                          f("int32_t[]", array("i", pair_verdicts)), self.lo, self.scan.n)


_scratch = None


def check_sends(scan, lo: int, accounts: BoundAccounts) -> ScanVerdicts:
    """Check requests lo.. of a native.sendpath.SendScan."""
    global _scratch
    if _scratch is None:
        _scratch = ffi.new("uint8_t[]", SCRATCH)
    n = scan.n
    # Requests before lo are never checked here: GENERAL, so that a caller
    # asking about one anyway is sent to the general path, never admitted.
    verdict, pair = array("i", [GENERAL]) * n, array("i", bytes(4 * n))
    ak_off, ak_len = array("q", bytes(8 * n)), array("i", bytes(4 * n))
    pairs = ffi.new("lmq_acl_pair[]", max(1, n - lo))
    f = ffi.from_buffer
    npairs = lib.lmq_acl_check_sends(scan.data_ptr(), len(scan.data), scan.reqs, lo, n, accounts.c,
                                     f("int32_t[]", verdict), f("int32_t[]", pair), f("int64_t[]", ak_off),
                                     f("int32_t[]", ak_len), pairs, _scratch, SCRATCH)
    return ScanVerdicts(scan, lo, verdict, pair, ak_off, ak_len, pairs, npairs)

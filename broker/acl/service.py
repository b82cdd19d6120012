# Owns the running ACL of a broker or name server: the rules in force, the
# check the composition root puts in front of dispatch (AclService.check:
# refusals answered as RocketMQ answers them, SYSTEM_ERROR with the
# AclException text, and logged -- the one place an AclDenied becomes an
# answer; the sends the native scanner parsed are judged a scan at a time
# by fastpath.py, every other request by validator.validate), what each connection authenticated as (the accessKeys whose
# signed requests it sent), the check-back filter built on that
# (may_check_back), the store lookup requests naming a commitlog offset are
# judged with (message_lookup), and reloading the file when it changes.
#
# Reloading (RocketMQ's AclFileWatchService): the directory of the file is
# watched with inotify, so an edit in place, an editor's write-and-rename and
# a delete are all seen without polling.  Every event re-reads the file and
# compares its bytes; a file that no longer parses keeps the rules in force
# and logs the error (`last_error`, `reloads` count what happened).  Where
# inotify is missing (not Linux), a 2 s stat timer stands in.
#
#   acl = AclService.load(path, broker_policy(name))  # AclConfigError at start
#   await nursery.start(acl.run)                      # the watcher
#   guarded = GuardedDispatcher(dispatcher, checks=[acl.check])
#   acl.lookup = message_lookup(store.cq)             # once the store is open
import ctypes
import ctypes.util
import errno
import hashlib
import logging
import math
import os
import struct

import trio

from broker.acl import fastpath
from broker.acl.plain import Account, AclConfigError, AclRules, parse_plain_acl_text
from broker.acl.table import PROPERTY_REAL_TOPIC, Lookup, StoredMessage, check_back_resources
from broker.acl.validator import AclDenied, Policy, permits, validate
from broker.remoting.codec import RawSend, SendRun
from broker.remoting.codes import ResponseCode, code_name
from broker.remoting.command import RemotingCommand
from consumequeue import record as M
from consumequeue.errors import MessageNotFoundError
from consumequeue.reader import message_at

log = logging.getLogger("ledgermq.acl")

PRINCIPALS = "ledgermq.acl.principals"  # conn.attributes: the accessKeys it sent verified requests as

DEFAULT_ACL_FILE = os.path.join("conf", "plain_acl.yml")  # under ROCKETMQ_HOME, as RocketMQ 4.x
_LOG_BURST = 20  # refusal lines per second before they are summarised
STAT_INTERVAL = 2.0


def default_acl_path(rocketmq_home: str | None = None) -> str | None:
    home = rocketmq_home or os.environ.get("ROCKETMQ_HOME")
    return os.path.join(home, DEFAULT_ACL_FILE) if home else None


def host_of(address: str) -> str:
    """"1.2.3.4:5" / "[::1]:5" -> the IP part (what whitelists match)."""
    host = address.rpartition(":")[0] if address.count(":") == 1 or address.startswith("[") else address
    return host.strip("[]")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise AclConfigError(f"{path}: cannot read: {e.strerror or e}") from None


def _parse(raw: bytes, path: str, extra: tuple[Account, ...]) -> AclRules:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AclConfigError(f"{path}: not UTF-8: {e}") from None
    rules = parse_plain_acl_text(text, path)
    for account in extra:
        rules = rules.with_account(account)
    return rules


class AclService:
    def __init__(self, path: str | None, rules: AclRules, policy: Policy, *, digest: bytes = b"",
                 extra: tuple[Account, ...] = ()) -> None:
        self.path = path
        self.rules = rules
        self.policy = policy
        self.extra = extra
        self.reloads = 0  # successful reloads after the first load
        self.last_error: str | None = None
        self.refused = 0
        self.changed = trio.Event()  # set (and replaced) after every reload attempt
        # A commitlog offset -> the message stored there (the broker's store,
        # set once it is open); None refuses the requests that need it.
        self.lookup: Lookup | None = None
        self._digest = digest
        self._log_window = (0.0, 0, 0)  # (second, lines logged, lines suppressed)
        # Scanned sends (RawSend) are checked a scan at a time in C
        # (fastpath.py; None: every request takes validate()), the verdicts
        # of the last scan kept for the sends of it that follow.
        self._scan_checks: fastpath.ScanChecks | None = None
        self._memo_scan = self._memo_rules = self._memo_verdict = None  # (the last scan's, for check())
        self.sends = fastpath.SendChecks(policy) if fastpath.applies(policy) else None

    @property
    def sends(self) -> "fastpath.SendChecks | None":
        return self._sends

    @sends.setter
    def sends(self, checks: "fastpath.SendChecks | None") -> None:
        self._sends = checks
        self._scan_checks = self._memo_scan = self._memo_rules = self._memo_verdict = None

    @classmethod
    def load(cls, path: str | None, policy: Policy, *, extra: tuple[Account, ...] = ()) -> "AclService":
        """Rules from `path` (None: only the `extra` accounts).  A missing
        or bad file is an AclConfigError: a server told to enforce ACL must
        not start open."""
        if path is None:
            return cls(None, _extra_only(extra), policy, extra=extra)
        raw = _read(path)
        return cls(path, _parse(raw, path, extra), policy, digest=hashlib.sha256(raw).digest(), extra=extra)

    # --- the guard check ------------------------------------------------------------

    def check(self, conn, cmd: RemotingCommand) -> RemotingCommand | None:
        """None to let `cmd` through, else the refusal to answer it with."""
        if type(cmd) is RawSend:
            # A send the native scanner parsed: its scan's verdicts, checked
            # in C once for every send of the scan (fastpath.py; the sends
            # before the one that started the check are GENERAL there).
            if cmd.scan is self._memo_scan and self.rules is self._memo_rules:
                verdict = self._memo_verdict[cmd.index]
                if verdict == 0:  # fastpath.OK
                    return None
            elif self._sends is not None:
                verdict = self._check_scan(conn, cmd).verdict[cmd.index]
                if verdict == fastpath.OK:
                    return None
            else:
                verdict = fastpath.GENERAL
            if verdict != fastpath.GENERAL:
                return self._refuse(conn, cmd, self._scan_checks.refusal(cmd.index))
        address = host_of(conn.remote_address)
        try:
            access_key = validate(self.rules, address, cmd, self.policy, self.lookup)
        except AclDenied as e:
            return self._refuse(conn, cmd, e)
        if access_key is not None:
            self._authenticated(conn, access_key)
        return None

    def check_item(self, conn, item) -> list[tuple[int, RemotingCommand]]:
        """What check() says of each request of an item of a read (one
        request, or a SendRun of sends): (position in the item, answer) of
        the refused ones, in order.  A run is asked about once (check_run)."""
        if type(item) is SendRun:
            refusals = self.check_run(conn, item)
            if refusals:
                lo = item.lo
                return [(i - lo, answer) for i, answer in refusals]
            return refusals
        refusal = self.check(conn, item)
        return [] if refusal is None else [(0, refusal)]

    def check_run(self, conn, run) -> list[tuple[int, RemotingCommand]]:
        """The refusals of a SendRun's sends, (frame index, answer) in
        order; every other send of the run is admitted.  What check() says
        of each send, asked once per run (for admission that keeps runs
        whole: no RawSend is made for an admitted send)."""
        if self.sends is None:
            out = []
            for i in range(run.lo, run.hi):
                refusal = self.check(conn, run.send(i))
                if refusal is not None:
                    out.append((i, refusal))
            return out
        memo = self._scan_checks
        if memo is None or memo.scan is not run.scan or memo.rules is not self.rules or run.lo < memo.lo:
            memo = self._check_scan(conn, run.send(run.lo))
        verdict = memo.verdict
        if not any(verdict[run.lo:run.hi]):  # (OK is 0) the usual run: nothing refused, nothing to ask
            return []
        out = []
        for i in range(run.lo, run.hi):
            if verdict[i] != fastpath.OK:
                refusal = self.check(conn, run.send(i))
                if refusal is not None:
                    out.append((i, refusal))
        return out

    def _refuse(self, conn, cmd, e: AclDenied) -> RemotingCommand:
        self.refused += 1
        self._log_refusal(conn.remote_address, cmd, e)
        return cmd.make_response(ResponseCode.SYSTEM_ERROR, e.remark)

    @staticmethod
    def _authenticated(conn, access_key: str) -> None:
        keys = conn.attributes.get(PRINCIPALS)
        if keys is None:
            conn.attributes[PRINCIPALS] = {access_key}
        elif access_key not in keys:
            keys.add(access_key)

    def _check_scan(self, conn, cmd) -> "fastpath.ScanChecks":
        memo = self._scan_checks = self._sends.check_scan(self.rules, host_of(conn.remote_address), cmd.scan,
                                                          cmd.index)
        self._memo_scan, self._memo_rules, self._memo_verdict = memo.scan, memo.rules, memo.verdict
        for access_key in memo.principals:
            self._authenticated(conn, access_key)
        return memo

    def may_check_back(self, conn, group: str, real_topic: str) -> bool:
        """May CHECK_TRANSACTION_STATE for a half of `real_topic` (producer
        group `group`) go to `conn`?  Only if an account it authenticated as
        holds PUB on that topic under the rules in force now (and does not
        DENY the group by name), or its address is globally whitelisted."""
        rules = self.rules
        if rules.globally_whitelisted(host_of(conn.remote_address)):
            return True
        needed = check_back_resources(group, real_topic)
        for access_key in conn.attributes.get(PRINCIPALS, ()):
            account = rules.accounts.get(access_key)
            if account is not None and permits(account, needed):
                return True
        return False

    def _log_refusal(self, remote: str, cmd: RemotingCommand, e: AclDenied) -> None:
        # A client retrying a refused request in a loop must not flood the log.
        now = math.floor(trio.current_time())
        second, logged, suppressed = self._log_window
        if now != second:
            if suppressed:
                log.warning("ACL: %d more refusals not logged", suppressed)
            second, logged, suppressed = now, 0, 0
        if logged < _LOG_BURST:
            log.warning("ACL refused %s from %s: %s", code_name(cmd.code), remote, e.reason)
            logged += 1
        else:
            suppressed += 1
        self._log_window = (second, logged, suppressed)

    # --- reloading ------------------------------------------------------------------------

    def reload(self) -> bool:
        """Re-read the file; True if new rules are in force.  An unchanged
        file is not parsed again; a bad one leaves the old rules."""
        if self.path is None:
            return False
        try:
            raw = _read(self.path)
            digest = hashlib.sha256(raw).digest()
            if digest == self._digest:
                return False
            rules = _parse(raw, self.path, self.extra)
        except AclConfigError as e:
            if str(e) != self.last_error:
                log.error("ACL: %s; the rules loaded before stay in force", e)
            self.last_error = str(e)
            return False
        finally:
            self.changed.set()
            self.changed = trio.Event()
        self.rules, self._digest, self.last_error = rules, digest, None
        self.reloads += 1
        log.info("ACL: reloaded %s (%d accounts)", self.path, len(rules.accounts))
        return True

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Watch the file until cancelled."""
        if self.path is None:
            task_status.started()
            await trio.sleep_forever()
        watcher = _Inotify.open(self.path)
        if watcher is None:
            log.info("ACL: inotify unavailable; checking %s every %g s", self.path, STAT_INTERVAL)
            task_status.started()
            while True:
                await trio.sleep(STAT_INTERVAL)
                self.reload()
        with watcher:
            task_status.started()
            while True:
                await watcher.wait_event()
                self.reload()


def message_lookup(cq) -> Lookup:
    """The Lookup of a broker's store: the committed message starting at a
    commitlog offset (what VIEW_MESSAGE_BY_ID would answer), None when there
    is none."""
    def lookup(offset: int) -> StoredMessage | None:
        try:
            record = M.decode(message_at(cq, offset))
        except (MessageNotFoundError, M.MessageFormatError):
            return None
        return StoredMessage(record.topic, record.properties.get(PROPERTY_REAL_TOPIC))
    return lookup


def _extra_only(extra: tuple[Account, ...]) -> AclRules:
    rules = AclRules(source="<config>")
    for account in extra:
        rules = rules.with_account(account)
    return rules


# --- inotify (Linux), through libc: no dependency for one syscall family -----------

_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class _Inotify:
    def __init__(self, fd: int, name: bytes) -> None:
        self.fd, self.name = fd, name

    @classmethod
    def open(cls, path: str) -> "_Inotify | None":
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError):
            return None
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        # The directory, not the file: editors and config tools replace the
        # file by rename, which a watch on the old inode would never see.
        directory = os.path.dirname(os.path.abspath(path)) or "."
        if add(fd, directory.encode(), _MASK) < 0:
            log.warning("ACL: cannot watch %s: %s", directory, os.strerror(ctypes.get_errno()))
            os.close(fd)
            return None
        return cls(fd, os.path.basename(path).encode())

    def __enter__(self) -> "_Inotify":
        return self

    def __exit__(self, *exc) -> None:
        trio.lowlevel.notify_closing(self.fd)
        os.close(self.fd)

    async def wait_event(self) -> None:
        """Return after an event that concerns the watched file name."""
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            try:
                data = os.read(self.fd, 64 * 1024)
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    continue
                raise
            pos, hit = 0, False
            while pos + _EVENT.size <= len(data):
                _wd, _mask, _cookie, length = _EVENT.unpack_from(data, pos)
                name = data[pos + _EVENT.size:pos + _EVENT.size + length].rstrip(b"\0")
                hit = hit or name == self.name
                pos += _EVENT.size + length
            if hit:
                # Writers often touch a file several times in a row: let
                # them finish, then read once.
                await trio.sleep(0.05)
                return

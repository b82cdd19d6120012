# The console's login (issue 31 part 3): with accounts configured, an
# anonymous admin write and an anonymous read of message bodies get 401
# saying a login is needed (the live views stay readable); a login sets an
# HttpOnly, SameSite=Strict cookie whose session opens writes and body
# reads; a session ends after its idle time, after its absolute lifetime
# and on logout; failed logins from one address are bounded (429 with
# Retry-After until the window passes).  The sessions' clock is a fake one
# the test moves (no waiting).  In-process: a name server and the console
# in one trio run over real TCP; the accounts come from a --users file and
# from a plain_acl.yml's admin accounts as the CLI reads them.
import json

import attrs
import pytest

from broker.namesrv.service import NamesrvConfig, serve_namesrv
from tests.tools.dashboard.test_hostile_http import exchange
from tools.dashboard.auth import (
    Auth,
    UsersFileError,
    acl_admin_users,
    hash_password,
    load_users_file,
    parse_users_text,
)
from tools.dashboard.serve import DashboardConfig, serve_dashboard

PASSWORD = "correct horse battery staple"


@attrs.define
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


async def request(port: int, method: str, path: str, body: dict | None = None, cookie: str | None = None,
                  console_header: bool = True) -> tuple[int, dict, dict]:
    """(status, headers (lower-case names; set-cookie joined), JSON body)."""
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    if data or method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    if console_header and method == "POST":
        head += "X-Ledgermq-Console: write\r\n"
    if cookie:
        head += f"Cookie: {cookie}\r\n"
    raw = await exchange(port, head.encode() + b"\r\n" + data)
    top, _, payload = raw.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers: dict = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = (headers[k.strip().lower()] + "\n" if k.strip().lower() in headers else "") + v.strip()
    try:
        decoded = json.loads(payload) if payload else {}
    except ValueError:
        decoded = {"raw": payload.decode("utf-8", "replace")}
    return int(lines[0].split()[1]), headers, decoded


def session_cookie(headers: dict) -> str:
    (line,) = [c for c in headers["set-cookie"].split("\n") if c.startswith("ledgermq_console_session=")]
    attrs_ = [a.strip().lower() for a in line.split(";")]
    assert "httponly" in attrs_ and "samesite=strict" in attrs_ and "path=/" in attrs_, line
    return line.split(";")[0]


def test_users_file_and_acl_admins(tmp_path):
    h = hash_password(PASSWORD)
    assert h.matches(PASSWORD) and not h.matches(PASSWORD + "x")
    assert PASSWORD not in h.text() and PASSWORD not in repr(h)
    users_file = tmp_path / "users"
    users_file.write_text(f"# console accounts\nalice:{h.text()}\n\n")
    users = load_users_file(str(users_file))
    assert list(users) == ["alice"] and users["alice"].matches(PASSWORD)
    for bad, why in ((f"alice:{h.text()}\nalice:{h.text()}", "twice"), ("bob:plaintext", "scrypt"),
                     ("bob:scrypt$3$8$1$00$00", "out of range"),             # N not a power of two
                     ("bob:scrypt$1073741824$8$1$" + "00" * 16 + "$" + "00" * 32, "out of range"),  # 1 GiB scrypt
                     (":" + h.text(), "name")):
        with pytest.raises(UsersFileError, match=why):
            parse_users_text(bad, "users")
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: ops0001\n    secretKey: s3cret-ops-key\n    admin: true\n"
                   "  - accessKey: app0001\n    secretKey: app-key-123456\n    admin: false\n")
    admins = acl_admin_users(str(acl))
    assert list(admins) == ["ops0001"] and admins["ops0001"].matches("s3cret-ops-key")
    acl.write_text("accounts:\n  - accessKey: app0001\n    secretKey: app-key-123456\n")
    with pytest.raises(UsersFileError, match="admin: true"):
        acl_admin_users(str(acl))


def test_sessions_expire_idle_and_absolute_and_failures_are_bounded():
    clock = FakeClock()
    auth = Auth({"alice": hash_password(PASSWORD)}, idle_s=60, absolute_s=300, max_failures=3,
                failure_window_s=100, clock=clock)
    token = auth.login_result("1.2.3.4", "alice", auth.check_password("alice", PASSWORD))
    assert auth.session(token).user == "alice"
    for _ in range(5):                     # kept alive by requests, within the idle time...
        clock.now += 59
        assert auth.session(token) is not None
    clock.now += 59                        # ...but not past the absolute lifetime (354 s > 300 s)
    assert auth.session(token) is None
    token = auth.login_result("1.2.3.4", "alice", True)
    clock.now += 61
    assert auth.session(token) is None     # idle too long
    assert auth.session("forged") is None and auth.session("x" * 10_000) is None
    for _ in range(3):
        assert auth.retry_after("5.6.7.8") is None
        assert auth.login_result("5.6.7.8", "alice", auth.check_password("alice", "guess")) is None
    assert auth.retry_after("5.6.7.8") == pytest.approx(100)
    assert auth.retry_after("1.2.3.4") is None          # another client is not affected
    clock.now += 100
    assert auth.retry_after("5.6.7.8") is None          # the window passed
    assert not auth.check_password("nobody", PASSWORD)


async def test_anonymous_writes_and_body_reads_are_refused_and_sessions_end(nursery):
    clock = FakeClock()
    ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
    cfg = DashboardConfig(ns.address, port=0, period_s=0.5, users={"alice": hash_password(PASSWORD)},
                          session_idle_s=60, session_absolute_s=3600, login_max_failures=3, clock=clock)
    url = await nursery.start(serve_dashboard, cfg)
    port = int(url.rsplit(":", 1)[1])
    write = {"topic": "Anon", "cluster": "C", "confirmed": True}
    body_reads = ("/api/messages?by=key&topic=T&key=k", "/api/messages/range?topic=T", "/api/dlq?group=G",
                  "/api/dlq/export?group=G")
    writes = (("/api/topics", write), ("/api/topics/delete", write), ("/api/groups", {"group": "G", "cluster": "C",
              "confirmed": True}), ("/api/groups/delete", {"group": "G", "cluster": "C", "confirmed": True}),
              ("/api/consumers/reset", {"group": "G", "topic": "T", "timestamp": 0, "confirmed": True}),
              ("/api/messages/resend", {"messages": [], "confirmed": True}),
              ("/api/credentials", {"accessKey": "a", "secretKey": "b", "confirmed": True}))

    async def refused_without(cookie: str | None):
        for path, body in writes:
            status, _, answer = await request(port, "POST", path, body, cookie)
            assert status == 401 and answer["loginRequired"] is True, (path, status, answer)
            assert "needs a login" in answer["error"]
        for path in body_reads:
            status, _, answer = await request(port, "GET", path, cookie=cookie)
            assert status == 401 and "needs a login" in answer["error"], (path, status, answer)

    async def allowed_with(cookie: str):
        for path, body in writes:
            status, _, answer = await request(port, "POST", path, body, cookie)
            assert status not in (401, 403), (path, status, answer)   # the app's own answer (no such cluster...)
        for path in body_reads:
            status, _, answer = await request(port, "GET", path, cookie=cookie)
            assert status not in (401, 403), (path, status, answer)

    # Anonymous: the live views answer, writes and bodies do not.
    status, _, answer = await request(port, "GET", "/api/session")
    assert answer == {"loginRequired": True, "user": None}
    assert (await request(port, "GET", "/api/snapshot"))[0] == 200
    await refused_without(None)
    await refused_without("ledgermq_console_session=forged-token")

    # A login needs the console header (no login from another site's form) and the right password.
    status, _, answer = await request(port, "POST", "/api/login", {"user": "alice", "password": PASSWORD},
                                      console_header=False)
    assert status == 400 and "header" in answer["error"]
    status, _, answer = await request(port, "POST", "/api/login", {"user": "alice", "password": "wrong"})
    assert status == 401 and "wrong user or password" in answer["error"]
    status, headers, answer = await request(port, "POST", "/api/login", {"user": "alice", "password": PASSWORD})
    assert status == 200 and answer == {"loginRequired": True, "user": "alice"}
    cookie = session_cookie(headers)
    assert (await request(port, "GET", "/api/session", cookie=cookie))[2]["user"] == "alice"
    await allowed_with(cookie)

    # Idle past the limit: refused again, the page sees it is logged out.
    clock.now += 61
    await refused_without(cookie)
    assert (await request(port, "GET", "/api/session", cookie=cookie))[2]["user"] is None

    # Logout ends the session on the server (the old cookie is worth nothing after).
    status, headers, _ = await request(port, "POST", "/api/login", {"user": "alice", "password": PASSWORD})
    cookie = session_cookie(headers)
    await allowed_with(cookie)
    status, headers, answer = await request(port, "POST", "/api/logout", {}, cookie)
    assert status == 200 and answer["user"] is None
    await refused_without(cookie)

    # Guessing: three failures from this address, then 429 even for the right password, until the window passes.
    for _ in range(3):   # (the wrong attempt above was forgiven by the logins after it)
        assert (await request(port, "POST", "/api/login", {"user": "alice", "password": "guess"}))[0] == 401
    status, headers, answer = await request(port, "POST", "/api/login", {"user": "alice", "password": PASSWORD})
    assert status == 429 and int(headers["retry-after"]) > 0 and "too many failed logins" in answer["error"]
    clock.now += 301
    status, headers, _ = await request(port, "POST", "/api/login", {"user": "alice", "password": PASSWORD})
    assert status == 200
    nursery.cancel_scope.cancel()


async def test_without_accounts_the_console_stays_open(nursery):
    """No --users / --acl-file: writes need the header and confirm step only (as before)."""
    ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
    url = await nursery.start(serve_dashboard, DashboardConfig(ns.address, port=0, period_s=0.5))
    port = int(url.rsplit(":", 1)[1])
    assert (await request(port, "GET", "/api/session"))[2] == {"loginRequired": False, "user": None}
    status, _, answer = await request(port, "POST", "/api/topics", {"topic": "T", "cluster": "C", "confirmed": True})
    assert status == 404, answer          # reached the app: no cluster C
    status, _, answer = await request(port, "POST", "/api/login", {"user": "a", "password": "b"})
    assert status == 400 and "no accounts" in answer["error"]
    nursery.cancel_scope.cancel()


def test_cli_hash_password_line_and_users_errors(tmp_path):
    from click.testing import CliRunner

    from tools.dashboard.cli import dashboard
    result = CliRunner().invoke(dashboard, ["--hash-password", "alice"], input=f"{PASSWORD}\n{PASSWORD}\n")
    assert result.exit_code == 0, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("alice:scrypt$") and PASSWORD not in line
    assert parse_users_text(line, "out")["alice"].matches(PASSWORD)
    result = CliRunner().invoke(dashboard, ["-n", "127.0.0.1:9876", "--users", str(tmp_path / "none")])
    assert result.exit_code == 2 and "--users" in result.output and "cannot read" in result.output


async def test_daily_page_requests_are_bounded(nursery):
    """Bad or oversized requests to the new pages get a 400/404 with the
    reason (logged in, so the login is not what refuses them); the console
    never connects to an address a request names."""
    ns = await nursery.start(serve_namesrv, NamesrvConfig(listen_port=0, bind_address="127.0.0.1"))
    url = await nursery.start(serve_dashboard, DashboardConfig(ns.address, port=0, period_s=0.5,
                                                               users={"alice": hash_password(PASSWORD)}))
    port = int(url.rsplit(":", 1)[1])
    _, headers, _ = await request(port, "POST", "/api/login", {"user": "alice", "password": PASSWORD})
    cookie = session_cookie(headers)
    cases = [
        ("GET", "/api/messages/range?topic=T&limit=100000", None, 400, "limit"),
        ("GET", "/api/messages/range?topic=T&begin=yesterday", None, 400, "whole number"),
        ("GET", "/api/messages/range?topic=T&begin=2000&end=1000", None, 400, "before its begin"),
        ("GET", "/api/messages/range?topic=a%20b", None, 400, "not a valid name"),
        ("GET", "/api/dlq?group=" + "g" * 300, None, 400, "not a valid name"),
        ("GET", "/api/routes?topic=../../etc", None, 400, "not a valid name"),
        ("GET", "/api/brokers/config?addr=10.255.255.1:10911", None, 404, "not a broker registered"),
        ("GET", "/api/producers?group=", None, 400, "required"),
        ("POST", "/api/messages/resend", {"messages": [{"topic": "T"}] * 101, "confirmed": True}, 400, "1..100"),
        ("POST", "/api/messages/resend", {"messages": [{"topic": "T", "brokerName": "b"}], "confirmed": True},
         400, "queueId"),
        ("POST", "/api/groups", {"group": "G", "cluster": "C", "retryQueueNums": 10**9, "confirmed": True},
         400, "retryQueueNums"),
        ("POST", "/api/groups", {"group": "G", "cluster": "C", "consumeEnable": "maybe", "confirmed": True},
         400, "consumeEnable"),
        ("POST", "/api/groups", {"group": "G", "cluster": "C"}, 400, "not confirmed"),
        ("POST", "/api/topics/delete", {"topic": "T;rm", "cluster": "C", "confirmed": True}, 400, "valid name"),
        ("POST", "/api/login", {"user": "alice", "password": "p" * (1 << 20)}, 400, "larger than"),
    ]
    for method, path, body, status, why in cases:
        got, _, answer = await request(port, method, path, body, cookie)
        assert got == status and why in answer.get("error", ""), (path, got, answer)
    # a long password is checked (and fails) without costing more than a short one's hash
    got, _, answer = await request(port, "POST", "/api/login", {"user": "alice", "password": "p" * 5000})
    assert got == 401
    assert (await request(port, "GET", "/api/snapshot"))[0] == 200
    nursery.cancel_scope.cancel()

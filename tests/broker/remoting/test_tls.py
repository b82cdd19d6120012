# TLS on the remoting port (broker/remoting/tls.py) with RocketMQ's modes,
# on real sockets and trustme certificates: enforcing refuses plaintext,
# permissive serves both on one port, a client verifies the server (a wrong
# CA or a name the certificate does not carry fails the dial), mutual TLS,
# a stalled handshake, and the config errors an operator can make.
import ssl

import pytest
import trio

from broker.remoting.client import open_remoting_client
from broker.remoting.codec import encode_command
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingConnectError, RemotingError
from broker.remoting.server import serve_remoting
from broker.remoting.streams import ServerLimits
from broker.remoting.tls import ClientTls, ServerTls, TlsMode
from commitlog.config import ConfigError
from tests.broker.remoting.helpers import ECHO, EchoService, raw_invoke, read_until_eof
from tests.broker.remoting.tls_helpers import make_tls_files


@pytest.fixture
def files(tmp_path):
    return make_tls_files(tmp_path)


async def start(nursery, tls: ServerTls, limits: ServerLimits | None = None):
    svc = EchoService()
    return await nursery.start(lambda task_status: serve_remoting(
        svc.dispatcher, "127.0.0.1", 0, tls=tls, limits=limits, task_status=task_status))


async def echo(server, tls: ClientTls | None, addr: str | None = None) -> bytes | RemotingError:
    """The echoed body, or the error the call failed with."""
    async with open_remoting_client(tls=tls) as client:
        try:
            resp = await client.invoke(addr or server.address, RemotingCommand(ECHO, body=b"secret"), timeout=5)
        except RemotingError as e:
            return e
        return resp.body


def refused(result, match: str = "") -> bool:
    return isinstance(result, RemotingError) and match in str(result)


async def test_enforcing_serves_tls_and_refuses_plaintext(nursery, files):
    server = await start(nursery, ServerTls.from_props(files.server_props("enforcing")))
    assert await echo(server, ClientTls.create(files.ca)) == b"secret"
    plain = await trio.open_tcp_stream("127.0.0.1", server.port)
    await plain.send_all(encode_command(RemotingCommand(ECHO, opaque=1, body=b"x")))
    assert await read_until_eof(plain) == []  # closed, unanswered
    # (The TCP dial succeeds; the server closes before answering.)
    assert refused(await echo(server, None))


async def test_permissive_serves_both_on_one_port(nursery, files):
    server = await start(nursery, ServerTls.from_props(files.server_props("permissive")), ServerLimits())
    assert await echo(server, ClientTls.create(files.ca)) == b"secret"
    assert await echo(server, None) == b"secret"
    plain = await trio.open_tcp_stream("127.0.0.1", server.port)
    assert (await raw_invoke(plain, RemotingCommand(ECHO, opaque=3, body=b"p"))).body == b"p"


async def test_client_refuses_a_server_it_cannot_verify(nursery, files, tmp_path):
    server = await start(nursery, ServerTls.from_props(files.server_props("enforcing")))
    # A certificate from the right CA but for another name than the one dialed.
    wrong_name = make_tls_files(tmp_path / "other", names=("localhost",))
    named = await start(nursery, ServerTls.from_props(wrong_name.server_props("enforcing")))
    for result in (await echo(server, ClientTls.create(files.other_ca)),
                   await echo(server, ClientTls.create()),  # the system's CAs do not know trustme's
                   await echo(named, ClientTls.create(wrong_name.ca))):  # dialed as 127.0.0.1
        assert isinstance(result, RemotingConnectError) and "certificate verify failed" in str(result), result
    # Only by name does an operator turn verification off (tls.client.authServer=false).
    insecure = ClientTls.from_props({"tls.enable": "true", "tls.client.authServer": "false"})
    assert await echo(server, insecure) == b"secret"


async def test_mutual_tls(nursery, files):
    tls = ServerTls.from_props(files.server_props(
        "enforcing", **{"tls.server.need.client.auth": "require", "tls.server.trustCertPath": files.ca}))
    server = await start(nursery, tls)
    # No client certificate: refused (with TLS 1.3 the client learns it on
    # its first read, not in its own handshake).
    assert refused(await echo(server, ClientTls.create(files.ca)))
    with_cert = ClientTls.from_props({"tls.enable": "true", "tls.client.trustCertPath": files.ca,
                                      "tls.client.certPath": files.client_cert,
                                      "tls.client.keyPath": files.client_key})
    assert await echo(server, with_cert) == b"secret"


async def test_a_stalled_handshake_is_closed(nursery, files):
    server = await start(nursery, ServerTls.from_props(files.server_props("permissive")),
                         ServerLimits(handshake_timeout=0.5))
    silent = await trio.open_tcp_stream("127.0.0.1", server.port)
    t0 = trio.current_time()
    assert await read_until_eof(silent) == []
    assert trio.current_time() - t0 < 3
    half = await trio.open_tcp_stream("127.0.0.1", server.port)
    await half.send_all(b"\x16\x03\x01")  # a TLS record that never completes
    assert await read_until_eof(half) == []
    assert await echo(server, ClientTls.create(files.ca)) == b"secret"


def test_config_keys_and_errors(files, tmp_path):
    assert ServerTls.from_props({}).mode is TlsMode.DISABLED and not ClientTls.from_props({}).enabled
    assert ServerTls.from_props(files.server_props("permissive")).context is not None
    with pytest.raises(ConfigError, match="tls.server.mode"):
        ServerTls.from_props({"tls.server.mode": "strict"})
    with pytest.raises(ConfigError, match="needs tls.server.certPath"):
        ServerTls.from_props({"tls.server.mode": "enforcing"})
    with pytest.raises(ConfigError, match="cannot load"):
        ServerTls.from_props(files.server_props("enforcing", **{"tls.server.keyPath": files.ca}))
    with pytest.raises(ConfigError, match="trustCertPath"):
        ServerTls.from_props(files.server_props("enforcing", **{"tls.server.need.client.auth": "require"}))
    tls_file = tmp_path / "tls.properties"  # RocketMQ's tls.config.file
    tls_file.write_text(f"tls.server.mode=enforcing\ntls.server.certPath={files.cert}\n"
                        f"tls.server.keyPath={files.key}\n")
    assert ServerTls.from_props({"tls.config.file": str(tls_file)}).mode is TlsMode.ENFORCING
    client = ClientTls.from_props({"tls.enable": "true", "tls.client.trustCertPath": files.ca})
    assert client.verify and client.context.verify_mode == ssl.CERT_REQUIRED

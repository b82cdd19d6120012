# Owns TLS for the remoting ports, with RocketMQ's keys (TlsSystemConfig):
# the server side (ServerTls: tls.server.mode disabled | permissive |
# enforcing, certificate, key, client authentication) and the client side
# (ClientTls: tls.enable, the CA to trust, an optional client certificate),
# each turned into an ssl.SSLContext once, at start; accept_stream(), the
# server's choice per connection; and StreamAdapter, what a Connection reads
# when TLS (or a sniffed first byte) sits between it and the socket.
#
#   key                              side    meaning
#   tls.server.mode                  server  disabled (default here) | permissive | enforcing
#   tls.server.certPath / keyPath    server  PEM certificate chain / private key
#   tls.server.keyPassword           server  the key's password, if it has one
#   tls.server.need.client.auth      server  none (default) | optional | require
#   tls.server.trustCertPath         server  CA bundle for client certificates
#   tls.enable                       client  dial with TLS (brokers to name servers, clients, mqadmin)
#   tls.client.trustCertPath         client  CA bundle (default: the system's)
#   tls.client.authServer            client  verify the server's certificate and name (default true)
#   tls.client.certPath / keyPath / keyPassword  client  a client certificate, for servers that require one
#   tls.config.file                  both    a properties file holding more of these keys
#
# Where ledgermq differs from RocketMQ, deliberately: the server mode
# defaults to disabled (RocketMQ's permissive default serves a self-signed
# test certificate, tls.test.mode.enable, which is no protection), and a
# client verifies the server by default (RocketMQ's authServer defaults to
# false).  tls.test.mode.enable is accepted and ignored.  Permissive serves TLS and plaintext on one port, told apart by the first
# byte: a TLS record starts with 0x16 (handshake), and a remoting frame never
# does (its length would be over 369 MB, beyond any frameMaxLength).
# Enforcing closes a connection whose first byte is not 0x16.
import enum
import logging
import ssl

import attrs
import trio

from commitlog.config import ConfigError, load_properties

log = logging.getLogger(__name__)

TLS_RECORD_HANDSHAKE = 0x16


class TlsMode(enum.Enum):
    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


_CLIENT_AUTH = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}
KNOWN_KEYS = frozenset({
    "tls.server.mode", "tls.server.certPath", "tls.server.keyPath", "tls.server.keyPassword",
    "tls.server.need.client.auth", "tls.server.trustCertPath", "tls.server.authClient",
    "tls.enable", "tls.client.trustCertPath", "tls.client.authServer", "tls.client.certPath",
    "tls.client.keyPath", "tls.client.keyPassword", "tls.config.file", "tls.test.mode.enable",
})


def tls_props(props: dict[str, object]) -> dict[str, str]:
    """The tls.* keys of a config, with tls.config.file's keys under them
    (keys in the config itself win)."""
    out = {k: str(v).strip() for k, v in props.items() if k.startswith("tls.")}
    path = out.get("tls.config.file")
    if path:
        try:
            extra = load_properties(path)
        except OSError as e:
            raise ConfigError("tls.config.file", path, f"cannot read: {e.strerror or e}") from None
        out = {**{k: v.strip() for k, v in extra.items() if k.startswith("tls.")}, **out}
    return out


def _bool(key: str, text: str | None, default: bool) -> bool:
    if text is None or text == "":
        return default
    if text.lower() not in ("true", "false"):
        raise ConfigError(key, text, "expected true or false")
    return text.lower() == "true"


@attrs.frozen
class ServerTls:
    mode: TlsMode = TlsMode.DISABLED
    context: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def enabled(self) -> bool:
        return self.mode is not TlsMode.DISABLED

    @classmethod
    def from_props(cls, props: dict[str, object]) -> "ServerTls":
        p = tls_props(props)
        text = p.get("tls.server.mode", "disabled").lower()
        try:
            mode = TlsMode(text)
        except ValueError:
            raise ConfigError("tls.server.mode", text, "expected disabled, permissive or enforcing") from None
        if mode is TlsMode.DISABLED:
            return cls()
        cert, key = p.get("tls.server.certPath"), p.get("tls.server.keyPath")
        if not cert or not key:
            raise ConfigError("tls.server.certPath", cert, f"tls.server.mode={mode.value} needs "
                                                          f"tls.server.certPath and tls.server.keyPath")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(cert, key, p.get("tls.server.keyPassword") or None)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError("tls.server.certPath", cert, f"cannot load the certificate/key: {e}") from None
        auth = p.get("tls.server.need.client.auth", "none").lower()
        if auth not in _CLIENT_AUTH:
            raise ConfigError("tls.server.need.client.auth", auth, "expected none, optional or require")
        ctx.verify_mode = _CLIENT_AUTH[auth]
        if auth != "none":
            trust = p.get("tls.server.trustCertPath")
            if not trust:
                raise ConfigError("tls.server.trustCertPath", None,
                                  f"tls.server.need.client.auth={auth} needs the CA of the client certificates")
            _load_ca(ctx, "tls.server.trustCertPath", trust)
        return cls(mode, ctx)


@attrs.frozen
class ClientTls:
    enabled: bool = False
    verify: bool = True
    context: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def from_props(cls, props: dict[str, object]) -> "ClientTls":
        p = tls_props(props)
        if not _bool("tls.enable", p.get("tls.enable"), False):
            return cls()
        return cls.create(trust=p.get("tls.client.trustCertPath") or None,
                          verify=_bool("tls.client.authServer", p.get("tls.client.authServer"), True),
                          cert=p.get("tls.client.certPath") or None, key=p.get("tls.client.keyPath") or None,
                          key_password=p.get("tls.client.keyPassword") or None)

    @classmethod
    def create(cls, trust: str | None = None, *, verify: bool = True, cert: str | None = None,
               key: str | None = None, key_password: str | None = None) -> "ClientTls":
        """TLS on, trusting `trust` (a CA bundle; None: the system's)."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if trust:
            _load_ca(ctx, "tls.client.trustCertPath", trust)
        if not verify:  # operators asked for it by name (tls.client.authServer=false)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cert:
            try:
                ctx.load_cert_chain(cert, key, key_password)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError("tls.client.certPath", cert, f"cannot load the certificate/key: {e}") from None
        return cls(True, verify, ctx)

    @classmethod
    def from_context(cls, ctx: ssl.SSLContext) -> "ClientTls":
        return cls(True, ctx.verify_mode != ssl.CERT_NONE, ctx)


def _load_ca(ctx: ssl.SSLContext, key: str, path: str) -> None:
    try:
        ctx.load_verify_locations(cafile=path)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(key, path, f"cannot load the CA certificates: {e}") from None


def innermost_socket(stream):
    while not hasattr(stream, "socket") and hasattr(stream, "transport_stream"):
        stream = stream.transport_stream
    return stream.socket

class StreamAdapter(trio.abc.HalfCloseableStream):
    """A stream over another: first hands out `prefix` (bytes read to sniff
    the protocol), shows the socket underneath (Connection names its peer by
    it), and half-closes only what can be half-closed (TLS cannot: its
    send_eof is a no-op, the connection's lingering close then waits)."""

    def __init__(self, inner, prefix: bytes = b"") -> None:
        self.inner = inner
        self._prefix = prefix

    @property
    def socket(self):
        return innermost_socket(self.inner)

    async def send_all(self, data) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            n = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:n], self._prefix[n:]
            await trio.lowlevel.checkpoint()
            return data
        return await self.inner.receive_some(max_bytes)

    async def send_eof(self) -> None:
        if hasattr(self.inner, "send_eof"):
            await self.inner.send_eof()
        else:
            await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await self.inner.aclose()


class TlsRefused(Exception):
    """A connection the server's TLS mode does not take (logged, closed)."""


async def accept_stream(stream: trio.abc.Stream, tls: ServerTls, handshake_timeout: float):
    """The stream a server reads from: `stream` itself when TLS is off, else
    after sniffing the first byte, TLS (handshake done within
    `handshake_timeout`) or, in permissive mode, plaintext.  Raises
    TlsRefused for a connection that must be closed."""
    if not tls.enabled:
        return stream
    try:
        with trio.fail_after(handshake_timeout):
            first = await stream.receive_some(1)
            if not first:
                raise TlsRefused("closed before sending anything")
            if first[0] != TLS_RECORD_HANDSHAKE:
                if tls.mode is TlsMode.ENFORCING:
                    raise TlsRefused("plaintext refused (tls.server.mode=enforcing)")
                return StreamAdapter(stream, first)
            ssl_stream = trio.SSLStream(StreamAdapter(stream, first), tls.context, server_side=True)
            await ssl_stream.do_handshake()
    except trio.TooSlowError:
        raise TlsRefused(f"no TLS handshake within {handshake_timeout:g} s") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
        cause = e.__cause__ or e
        raise TlsRefused(f"TLS handshake failed: {cause}") from None
    return StreamAdapter(ssl_stream)

# Owns proxy.conf: the settings of one mqproxy process (Java properties, like
# broker.conf; keys named as in RocketMQ's rmq-proxy.json where it has one).
#
#   namesrvAddr=127.0.0.1:9876          required: where the brokers are found
#   grpcServerPort=8081                 RocketMQ's proxy default
#   bindAddress=0.0.0.0
#   maxMessageBodySize=4194304          publishing.max_body_size handed to clients, and enforced
#   grpcMaxInboundMessageSize=5242880   one request's bytes (grpc max_receive_message_length)
#   grpcMaxConcurrentStreams=128        per HTTP/2 connection
#   maxHeldReceives=1024                ReceiveMessage long polls held at once (past it: TOO_MANY_REQUESTS)
#   maxClients=10000                    clients with settings (telemetry sessions)
#   telemetryQueueSize=256              commands waiting for one client's stream (past it: dropped, logged)
#   maxTransactionRecords=100000        open transactions the proxy remembers for EndTransaction
#   longPollingTimeoutMillis=20000      the longest ReceiveMessage hold a client may ask for
#   autoRenewInvisibleMillis=60000      a push consumer's (auto_renew) invisible time, renewed while it holds the message
#   maxRenewedReceipts=100000           receipts renewed at once
#   sendTimeoutMillis=3000              one SendMessage, retries included
#   aclEnable=false                     check the authorization header against aclFile
#   aclFile=$ROCKETMQ_HOME/conf/plain_acl.yml
#   innerAccessKey= / innerSecretKey=   the account the proxy signs its remoting requests with
#   tls.server.mode=disabled            enforcing: gRPC over TLS with tls.server.certPath/keyPath
#   tls.enable=false ...                dialling the brokers with TLS (broker.conf's tls.client.* keys)
#
# Bounds are checked here: a value out of range is a ConfigError naming the
# key, not a proxy that starts and misbehaves.
import os

import attrs

from broker.acl.service import default_acl_path
from broker.acl.signing import Credentials
from broker.namesrv.client import parse_namesrv_addrs
from broker.remoting.tls import ClientTls
from commitlog.config import ConfigError, iter_properties

_KEYS = {"namesrvAddr", "grpcServerPort", "bindAddress", "maxMessageBodySize", "grpcMaxInboundMessageSize",
         "grpcMaxConcurrentStreams", "maxHeldReceives", "maxClients", "telemetryQueueSize", "maxTransactionRecords",
         "longPollingTimeoutMillis", "sendTimeoutMillis", "aclEnable", "aclFile", "innerAccessKey", "innerSecretKey",
         "proxyMode", "autoRenewInvisibleMillis", "maxRenewedReceipts"}


@attrs.frozen
class ServerTlsFiles:
    cert_path: str
    key_path: str

    def credentials(self):
        import grpc
        with open(self.key_path, "rb") as k, open(self.cert_path, "rb") as c:
            return grpc.ssl_server_credentials([(k.read(), c.read())])


@attrs.frozen
class ProxyConfig:
    namesrv_addr: tuple[str, ...]
    grpc_port: int = 8081
    bind_address: str = "0.0.0.0"
    max_body_size: int = 4 * 1024 * 1024
    max_inbound_message_size: int = 5 * 1024 * 1024
    max_concurrent_streams: int = 128
    max_held_receives: int = 1024
    max_clients: int = 10000
    telemetry_queue_size: int = 256
    max_transaction_records: int = 100_000
    long_polling_timeout_ms: int = 20_000
    auto_renew_invisible_ms: int = 60_000
    max_renewed_receipts: int = 100_000
    send_timeout_ms: int = 3000
    acl_enable: bool = False
    acl_file: str | None = None
    inner_credentials: Credentials | None = None
    tls: ServerTlsFiles | None = None
    client_tls: ClientTls = ClientTls()

    @classmethod
    def from_dict(cls, props: dict) -> "ProxyConfig":
        p = {str(k): str(v).strip() for k, v in props.items()}
        unknown = sorted(k for k in p if k not in _KEYS and not k.startswith("tls."))
        if unknown:
            raise ConfigError(unknown[0], p[unknown[0]], "not a proxy.conf key")
        if p.get("proxyMode", "cluster").lower() != "cluster":
            raise ConfigError("proxyMode", p["proxyMode"], "only cluster mode: the proxy runs beside the brokers")
        if not p.get("namesrvAddr"):
            raise ConfigError("namesrvAddr", None, "required: the name servers that route to the brokers")
        try:
            ns = tuple(parse_namesrv_addrs(p["namesrvAddr"]))
        except (ValueError, TypeError) as e:
            raise ConfigError("namesrvAddr", p["namesrvAddr"], str(e)) from None

        def num(key: str, default: int, lo: int, hi: int) -> int:
            text = p.get(key)
            if text is None or text == "":
                return default
            try:
                value = int(text)
            except ValueError:
                raise ConfigError(key, text, "not an integer") from None
            if not lo <= value <= hi:
                raise ConfigError(key, text, f"must be within {lo}..{hi}")
            return value

        body = num("maxMessageBodySize", 4 * 1024 * 1024, 1, 64 * 1024 * 1024)
        acl_enable = p.get("aclEnable", "false").lower() == "true"
        acl_file = p.get("aclFile") or default_acl_path()
        if acl_enable and not acl_file:
            raise ConfigError("aclFile", None, "aclEnable=true needs aclFile (or ROCKETMQ_HOME)")
        ak, sk = p.get("innerAccessKey") or None, p.get("innerSecretKey") or None
        if bool(ak) != bool(sk):
            raise ConfigError("innerAccessKey", ak, "innerAccessKey and innerSecretKey go together")
        tls = None
        mode = p.get("tls.server.mode", "disabled").lower()
        if mode not in ("disabled", "enforcing"):
            raise ConfigError("tls.server.mode", mode, "the gRPC port is either plaintext (disabled) or TLS "
                                                       "(enforcing); it cannot offer both")
        if mode == "enforcing":
            cert, key = p.get("tls.server.certPath"), p.get("tls.server.keyPath")
            for k, v in (("tls.server.certPath", cert), ("tls.server.keyPath", key)):
                if not v or not os.path.isfile(v):
                    raise ConfigError(k, v, "tls.server.mode=enforcing needs a readable file")
            tls = ServerTlsFiles(cert, key)
        return cls(
            namesrv_addr=ns,
            grpc_port=num("grpcServerPort", 8081, 0, 65535),
            bind_address=p.get("bindAddress") or "0.0.0.0",
            max_body_size=body,
            max_inbound_message_size=num("grpcMaxInboundMessageSize", body + 1024 * 1024, 4096, 256 * 1024 * 1024),
            max_concurrent_streams=num("grpcMaxConcurrentStreams", 128, 1, 65536),
            max_held_receives=num("maxHeldReceives", 1024, 1, 1_000_000),
            max_clients=num("maxClients", 10000, 1, 10_000_000),
            telemetry_queue_size=num("telemetryQueueSize", 256, 1, 1_000_000),
            max_transaction_records=num("maxTransactionRecords", 100_000, 1, 100_000_000),
            long_polling_timeout_ms=num("longPollingTimeoutMillis", 20_000, 0, 300_000),
            auto_renew_invisible_ms=num("autoRenewInvisibleMillis", 60_000, 3000, 12 * 3600 * 1000),
            max_renewed_receipts=num("maxRenewedReceipts", 100_000, 0, 10_000_000),
            send_timeout_ms=num("sendTimeoutMillis", 3000, 100, 600_000),
            acl_enable=acl_enable,
            acl_file=acl_file,
            inner_credentials=Credentials(ak, sk) if ak else None,
            tls=tls,
            client_tls=ClientTls.from_props(p),
        )

    @classmethod
    def from_properties(cls, text: str) -> "ProxyConfig":
        return cls.from_dict({key: value for _n, key, value in iter_properties(text)})


def load_proxy_config(path: str) -> ProxyConfig:
    with open(path, encoding="utf-8") as f:
        return ProxyConfig.from_properties(f.read())

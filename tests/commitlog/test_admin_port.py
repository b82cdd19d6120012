# The log node's JSON admin port (commitlog/admin.py) is an operator-only
# port with no authentication: serve_node binds it to loopback unless told
# otherwise.  Checked in the kernel's own table of listening sockets.
import os

import trio

from commitlog.config import ReplicationConfig
from commitlog.node import serve_node


def listening_addresses(port: int) -> set[str]:
    """Local IPv4 addresses with a listening TCP socket on `port` (/proc/net/tcp)."""
    out = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            local, state = line.split()[1], line.split()[3]
            ip_hex, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                out.add(".".join(str(b) for b in reversed(bytes.fromhex(ip_hex))))
    return out


async def test_admin_port_binds_loopback_by_default(tmp_path):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    cfg, _ = ReplicationConfig.from_dict({"dLegerGroup": "g", "dLegerPeers": f"n0-127.0.0.1:{port}",
                                          "dLegerSelfId": "n0", "storePathRootDir": os.path.join(tmp_path, "n0")})
    async with trio.open_nursery() as nursery:
        running = await nursery.start(lambda task_status: serve_node(cfg, admin_port=0, listeners=listeners,
                                                                     task_status=task_status))
        assert listening_addresses(running.admin_port) == {"127.0.0.1"}
        nursery.cancel_scope.cancel()

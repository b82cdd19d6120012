# Owns the broadcasting consumer's offsets (Java's LocalFileOffsetStore):
# in broadcasting mode every consumer instance reads every queue, so its
# progress is its own and lives on its machine, not on the broker:
#
#   <store_dir>/<ip>@<instance_name>/<group>/offsets.json
#       {"offsetTable": [{"topic": "T", "brokerName": "broker-a", "queueId": 0, "offset": 42}, ...]}
#
# store_dir defaults to ~/.rocketmq_offsets (Java's rocketmq.client.localOffsetStoreDir).
# Writes are atomic (commitlog/atomicfile.py: temp file, fsync, rename,
# fsync the directory), so a crash leaves the previous offsets or the new
# ones; the previous file is kept as offsets.json.bak, which load() falls
# back to when the main one is unreadable, as Java does.  Offsets only move
# forward here; a restart resumes from the last persisted ones (messages
# consumed after the last persist come again: at least once).
#
# The file IO is blocking: callers render() in the event loop and write()
# in a worker thread.
import json
import logging
import os
import shutil
import socket

import attrs

from broker.client.model import MessageQueue
from commitlog.atomicfile import write_atomic

log = logging.getLogger("ledgermq.client.offsets")

DEFAULT_STORE_DIR = os.path.join(os.path.expanduser("~"), ".rocketmq_offsets")
FILE_NAME = "offsets.json"


def _local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@attrs.define(eq=False)
class LocalFileOffsetStore:
    group: str
    instance_name: str = "DEFAULT"
    store_dir: str = DEFAULT_STORE_DIR
    offsets: dict[MessageQueue, int] = attrs.Factory(dict)

    @property
    def path(self) -> str:
        return os.path.join(self.store_dir, f"{_local_ip()}@{self.instance_name}", self.group, FILE_NAME)

    def load(self) -> dict[MessageQueue, int]:
        """Read the file (or its .bak); an absent store is empty."""
        for path in (self.path, self.path + ".bak"):
            try:
                with open(path, "rb") as f:
                    obj = json.loads(f.read())
                table = {MessageQueue(e["topic"], e["brokerName"], int(e["queueId"])): int(e["offset"])
                         for e in obj["offsetTable"]}
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("local offsets %s unreadable, trying the backup: %s", path, exc)
                continue
            self.offsets = table
            return dict(table)
        return {}

    def read(self, mq: MessageQueue) -> int | None:
        return self.offsets.get(mq)

    def update(self, mq: MessageQueue, offset: int) -> None:
        if offset >= 0 and offset > self.offsets.get(mq, -1):
            self.offsets[mq] = offset

    def render(self) -> bytes:
        """The file's bytes now (in the event loop: the table may change after)."""
        table = [{"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
                 for mq, off in sorted(self.offsets.items())]
        return json.dumps({"offsetTable": table}, indent=1).encode()

    def write(self, data: bytes) -> None:
        """Replace the file with `data`, keeping the old one as .bak
        (blocking: run it in a worker thread)."""
        path = self.path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            shutil.copyfile(path, path + ".bak")
        write_atomic(path, data)

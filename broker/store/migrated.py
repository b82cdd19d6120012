# Owns the broker's side of a store migrated from master-slave (the read
# side is consumequeue.migrated): whether a store root still needs the
# upgrade on start, the log identity the peer handshake compares, and the
# one-time import of the old config tables.
#
#   dledger-<id>/ledgermq-import.json    the old config tables (topics,
#       subscription groups, consumer offsets, delay offsets) captured by
#       the upgrade (broker.store.upgrade), for the replicated metadata.
#
# The first leader imports the old tables through the log, before it
# accepts writes (MigrationImport, the role gate's before_open hook), once:
# the import ends with a marker offset (IMPORT_MARK_TOPIC@IMPORT_MARK_GROUP)
# that every later leader sees in the replicated tables and so never
# imports again.  The gate runs the hook after it installed the append
# hook, so the import's records are stamped (QUEUEOFFSET, PHYSICALOFFSET)
# like every other record and `verifyStore --cq` finds them in order.
import json
import logging
import os

import attrs

from broker.common.values import InvalidMetadataError, TopicConfig
from broker.metadata.records import DelayOffsetCommit, GroupUpsert, OffsetReset, TopicUpsert, is_internal_topic
from broker.metadata.service import MetadataService
from broker.metadata.tables import SubscriptionGroupConfig
from commitlog.atomicfile import write_atomic
from consumequeue.migrated import MARKER_FILE, DividedLog, legacy_segments, store_dir_of

log = logging.getLogger("ledgermq.migration")

IMPORT_FILE = "ledgermq-import.json"
IMPORT_MARK_TOPIC = "rmq_sys_LEDGERMQ_TOPIC_CONFIG"  # internal: hidden from topic and offset lists
IMPORT_MARK_GROUP = "LEDGERMQ_MIGRATION_IMPORT"

def log_identity(marker: "DividedLog | None") -> dict[str, str]:
    """What replicas of one group must share for the log's positions to
    mean the same bytes, compared by the peer handshake: where the DLedger
    log begins (0, or the divided offset of a migrated store) and, for a
    migrated store, where its old data ends."""
    if marker is None:
        return {"origin": "0"}
    return {"origin": str(marker.divided), "legacyEnd": str(marker.legacy_end)}


def needs_upgrade(root: str, self_id: str) -> bool:
    """An old commitlog with records and no migrated DLedger store yet: what
    makes the broker upgrade in place on start (enableDLegerCommitLog)."""
    store_dir = store_dir_of(root, self_id)
    if os.path.exists(os.path.join(store_dir, MARKER_FILE)):
        return False
    return any(length > 0 for _, _, length in legacy_segments(root))


# --- the one-time import of the old config tables ------------------------------

def load_import(store_dir: str) -> dict | None:
    try:
        with open(os.path.join(store_dir, IMPORT_FILE), "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def write_import(store_dir: str, data: dict) -> None:
    write_atomic(os.path.join(store_dir, IMPORT_FILE), json.dumps(data, sort_keys=True).encode())


def imported(metadata) -> bool:
    return metadata.state.offsets.query(IMPORT_MARK_TOPIC, IMPORT_MARK_GROUP, 0) is not None


def import_ops(data: dict, marker_value: int) -> list:
    """The metadata ops that carry the old tables: topic and group upserts,
    offset resets, delay offsets, and last the import mark (entries commit
    in order, so a committed mark means everything before it is in)."""
    ops = []
    for name, cfg in sorted(data.get("topics", {}).items()):
        try:
            if not is_internal_topic(name):
                ops.append(TopicUpsert(TopicConfig.from_json({**cfg, "topicName": name})))
        except (InvalidMetadataError, TypeError, ValueError) as exc:
            log.warning("not importing topic %r: %s", name, exc)
    for name, cfg in sorted(data.get("groups", {}).items()):
        try:
            ops.append(GroupUpsert(SubscriptionGroupConfig.from_json({**cfg, "groupName": name})))
        except (InvalidMetadataError, TypeError, ValueError) as exc:
            log.warning("not importing subscription group %r: %s", name, exc)
    for key, queues in sorted(data.get("offsets", {}).items()):
        try:
            ops.append(OffsetReset({key: {int(q): int(o) for q, o in queues.items()}}))
        except (InvalidMetadataError, TypeError, ValueError) as exc:
            log.warning("not importing consumer offsets of %r: %s", key, exc)
    delays = data.get("delayOffsets") or {}
    if delays:
        try:
            ops.append(DelayOffsetCommit({int(k): int(v) for k, v in delays.items()}))
        except (InvalidMetadataError, TypeError, ValueError) as exc:
            log.warning("not importing delay offsets: %s", exc)
    ops.append(OffsetReset({f"{IMPORT_MARK_TOPIC}@{IMPORT_MARK_GROUP}": {0: marker_value}}))
    return ops


@attrs.define(eq=False)
class MigrationImport:
    """The role gate's before_open hook on a migrated store: after the
    leader barrier (every earlier leader's writes applied) and with the
    append hook installed (the records get their offsets), the old tables
    are imported once per group, so the first master serves the old offsets
    from its first request on; a later leader sees the mark and does
    nothing."""

    metadata: MetadataService
    store_dir: str
    marker: DividedLog

    async def __call__(self) -> int | None:
        if imported(self.metadata):
            return None
        data = load_import(self.store_dir)
        if data is None:
            log.warning("%s: no %s; the old config tables are not imported", self.store_dir, IMPORT_FILE)
            return None
        ops = import_ops(data, self.marker.divided)
        index = await self.metadata.import_ops(ops)
        log.info("imported the master-slave config tables (%d ops, import %s)", len(ops), data.get("importId"))
        return index

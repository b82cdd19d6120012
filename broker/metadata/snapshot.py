# Owns the metadata snapshot: RocketMQ's own config files under
# ${storePathRootDir}/config/ (spec §8.7), each carrying the log index it
# includes everything up to:
#
#   topics.json             {"dataVersion":{..},"topicConfigTable":{"T":{..}},"ledgermqAppliedIndex":N}
#   subscriptionGroup.json  {"dataVersion":{..},"subscriptionGroupTable":{"G":{..}},"ledgermqAppliedIndex":N}
#   consumerOffset.json     {"dataVersion":{..},"offsetTable":{"T@G":{"0":123}},"ledgermqAppliedIndex":N}
#   delayOffset.json        {"dataVersion":{..},"offsetTable":{"3":17},"ledgermqAppliedIndex":N}
#   ledgermqTimer.json      {"low":N,"done":[[a,b]],"lastBatch":[..],"lastIndex":I,"dataVersion":{..},
#                            "ledgermqAppliedIndex":N}   (ours: the timer progress)
# plus "ledgermqBrokerAddrs" ({selfId: brokerAddr}) in topics.json and
# "ledgermqQueueLocks" ([[group, topic, queueId, clientId, timestamp,
# maxLiveMs], ...]) in consumerOffset.json.  Stock fastjson ignores the extra
# fields; we write standard JSON and read fastjson's unquoted integer keys too.
#
# Rules.  Each file is replaced atomically (tmp, fsync, rename, fsync the
# directory; a torn .tmp is never read and is removed on load), but the files
# are not replaced as one unit: loading takes the OLDEST of their indexes and
# replays the log from there, which is exact because each file names its index
# and replay is idempotent (tables.py).  A missing file is an empty table at
# index -1; a missing delayOffset.json or ledgermqTimer.json is an empty table
# that does not pull the index down; a stock file (no ledgermqAppliedIndex) is
# a base state at index -1; a file that does not parse counts as missing (the
# caller fails if the log no longer reaches back).  Retention: the commitlog
# deletes only entries at or below the last DURABLE snapshot's index
# (min_retained_index() in service.py).
import os

import attrs

from broker.common.values import DataVersion, InvalidMetadataError, TopicConfig
from broker.metadata import fastjson
from broker.metadata.pop import PopTable
from broker.metadata.tables import (
    ConsumerOffsetTable,
    DelayOffsetTable,
    MetadataState,
    QueueLockTable,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    TimerProgress,
    TopicConfigTable,
    split_offset_key,
)
from commitlog.atomicfile import fsync_dir, write_tmp

CONFIG_DIR = "config"
TOPICS_FILE = "topics.json"
GROUPS_FILE = "subscriptionGroup.json"
OFFSETS_FILE = "consumerOffset.json"
DELAY_FILE = "delayOffset.json"
TIMER_FILE = "ledgermqTimer.json"
FILES = (TOPICS_FILE, GROUPS_FILE, OFFSETS_FILE, DELAY_FILE, TIMER_FILE)
_OPTIONAL = frozenset({DELAY_FILE, TIMER_FILE})
APPLIED_FIELD = "ledgermqAppliedIndex"
BROKER_ADDRS_FIELD = "ledgermqBrokerAddrs"
LOCKS_FIELD = "ledgermqQueueLocks"
POP_FIELD = "ledgermqPopCheckpoints"  # POP consumption (broker/metadata/pop.py)


@attrs.frozen
class LoadedSnapshot:
    state: MetadataState  # applied_index = the oldest file's index (-1 if any is missing)
    file_indexes: dict  # file name -> its ledgermqAppliedIndex, or None (missing/unusable)
    problems: tuple = ()  # "file: reason" for files that did not parse


def config_dir(root: str) -> str:
    return os.path.join(root, CONFIG_DIR)


# --- rendering (on the trio thread: a consistent copy of the tables) ------

def render(state: MetadataState) -> dict[str, bytes]:
    """The three files' bytes for `state`, stamped with its applied index."""
    idx = state.applied_index
    topics = {"dataVersion": state.topics.data_version.to_json(),
              "topicConfigTable": {n: c.to_json() for n, c in state.topics.topics.items()},
              BROKER_ADDRS_FIELD: dict(state.broker_addrs), APPLIED_FIELD: idx}
    groups = {"dataVersion": state.groups.data_version.to_json(),
              "subscriptionGroupTable": {n: c.to_json() for n, c in state.groups.groups.items()},
              APPLIED_FIELD: idx}
    offsets = {"dataVersion": state.offsets.data_version.to_json(),
               "offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in state.offsets.offsets.items()},
               LOCKS_FIELD: state.locks.to_json(), POP_FIELD: state.pop.to_json(),
               APPLIED_FIELD: idx}
    delays = {"dataVersion": state.delay_offsets.data_version.to_json(),
              "offsetTable": {str(k): v for k, v in sorted(state.delay_offsets.offsets.items())},
              APPLIED_FIELD: idx}
    timer = {**state.timer.to_json(), APPLIED_FIELD: idx}
    return {TOPICS_FILE: fastjson.dumps(topics).encode(), GROUPS_FILE: fastjson.dumps(groups).encode(),
            OFFSETS_FILE: fastjson.dumps(offsets).encode(), DELAY_FILE: fastjson.dumps(delays).encode(),
            TIMER_FILE: fastjson.dumps(timer).encode()}


# --- writing (blocking; run it in a worker thread) -------------------------

def write_files(root: str, files: dict[str, bytes]) -> None:
    """Replace each file atomically; returns once the renames are durable."""
    directory = config_dir(root)
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
        fsync_dir(os.path.dirname(os.path.abspath(directory)))
    for name, data in files.items():
        path = os.path.join(directory, name)
        os.replace(write_tmp(path, data), path)
    fsync_dir(directory)


def write_snapshot(root: str, state: MetadataState) -> int:
    """render + write_files; returns the snapshot's index."""
    write_files(root, render(state))
    return state.applied_index


# --- loading ---------------------------------------------------------------

def _read_json(path: str):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    obj = fastjson.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("top level is not an object")
    return obj


def _applied(obj: dict) -> int:
    value = obj.get(APPLIED_FIELD, -1)
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError(f"bad {APPLIED_FIELD} {value!r}")
    return value


def _load_topics(obj: dict) -> TopicConfigTable:
    raw = obj.get("topicConfigTable") or {}
    topics = {}
    for name, cfg in raw.items():
        cfg = dict(cfg)
        cfg.setdefault("topicName", name)
        topics[name] = TopicConfig.from_json(cfg)
    return TopicConfigTable(topics, DataVersion.from_json(obj.get("dataVersion")))


def _load_groups(obj: dict) -> SubscriptionGroupTable:
    raw = obj.get("subscriptionGroupTable") or {}
    groups = {}
    for name, cfg in raw.items():
        cfg = dict(cfg)
        cfg.setdefault("groupName", name)
        groups[name] = SubscriptionGroupConfig.from_json(cfg)
    return SubscriptionGroupTable(groups, DataVersion.from_json(obj.get("dataVersion")))


def _load_offsets(obj: dict) -> ConsumerOffsetTable:
    raw = obj.get("offsetTable") or {}
    offsets = {}
    for key, queues in raw.items():
        split_offset_key(key)
        if not isinstance(queues, dict):
            raise ValueError(f"offsets of {key!r} are not an object")
        offsets[key] = {int(q): int(o) for q, o in queues.items()}
    return ConsumerOffsetTable(offsets, DataVersion.from_json(obj.get("dataVersion")))


def _load_delays(obj: dict) -> DelayOffsetTable:
    raw = obj.get("offsetTable") or {}
    if not isinstance(raw, dict):
        raise ValueError("delay offsetTable is not an object")
    return DelayOffsetTable({int(k): int(v) for k, v in raw.items()}, DataVersion.from_json(obj.get("dataVersion")))


_LOADERS = {TOPICS_FILE: ("topics", _load_topics), GROUPS_FILE: ("groups", _load_groups),
            OFFSETS_FILE: ("offsets", _load_offsets), DELAY_FILE: ("delay_offsets", _load_delays),
            TIMER_FILE: ("timer", TimerProgress.from_json)}


def load_snapshot(root: str) -> LoadedSnapshot:
    """Load the three files (see the header for missing, foreign and
    unparseable files) and remove torn .tmp leftovers."""
    directory = config_dir(root)
    state = MetadataState()
    indexes: dict[str, int | None] = {}
    problems = []
    bad: set[str] = set()
    for name in FILES:
        path = os.path.join(directory, name)
        try:
            os.unlink(path + ".tmp")
        except FileNotFoundError:
            pass
        attr, loader = _LOADERS[name]
        try:
            obj = _read_json(path)
            if obj is None:
                indexes[name] = None
                continue
            table = loader(obj)
            indexes[name] = _applied(obj)
            if name == TOPICS_FILE:
                addrs = obj.get(BROKER_ADDRS_FIELD) or {}
                if not isinstance(addrs, dict):
                    raise ValueError(f"{BROKER_ADDRS_FIELD} is not an object")
                state.broker_addrs = {str(k): str(v) for k, v in addrs.items()}
            if name == OFFSETS_FILE:
                state.locks = QueueLockTable.from_json(obj.get(LOCKS_FIELD) or [])
                state.pop = PopTable.from_json(obj.get(POP_FIELD) or [])
        except (ValueError, TypeError, AttributeError, InvalidMetadataError, UnicodeDecodeError) as exc:
            problems.append(f"{path}: {exc}")
            bad.add(name)
            indexes[name] = None
            continue
        setattr(state, attr, table)
    state.applied_index = min(-1 if i is None else i for n, i in indexes.items()
                              if not (n in _OPTIONAL and i is None and n not in bad))
    return LoadedSnapshot(state, indexes, tuple(problems))


def read_config_dir(root: str) -> dict[str, object]:
    """Every ${root}/config/*.json by name (a stock store's, as fastjson
    wrote them: unquoted integer map keys read as strings), for migration;
    *.bak files are skipped, an empty file is None.  ValueError names the
    file that does not parse."""
    out: dict[str, object] = {}
    cdir = config_dir(root)
    if not os.path.isdir(cdir):
        return out
    for name in sorted(os.listdir(cdir)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(cdir, name), "rb") as f:
            raw = f.read()
        try:
            out[name[:-len(".json")]] = fastjson.loads(raw) if raw.strip() else None
        except ValueError as exc:
            raise ValueError(f"{os.path.join(cdir, name)}: {exc}") from None
    return out

# Owns the decoder fuzzer: seeded random and mutated inputs for every
# decoder that reads bytes from outside, each with the one rule it must keep.
#
#   remoting   broker/remoting/codec.py CommandDecoder (the broker and name
#              server port), fed in random chunks: commands, NEED_DATA,
#              CLOSED or RemoteProtocolError, never anything else; nothing
#              buffered beyond what was fed, and never more than one frame
#              limit (a frame announcing 2 GiB is refused from its prefix)
#   peer       commitlog/transport/framing.py FrameDecoder, then the HELLO
#              and Raft message decoders on every payload: frames or
#              FrameError / HandshakeError / WireError
#   record     consumequeue/record.py decode and check_record (the stored
#              message record a pull returns): a record or MessageFormatError
#
# Inputs are mutations of a corpus of valid inputs (bit flips, byte
# overwrites with boundary values, inserted/deleted/duplicated ranges,
# lengths rewritten, truncation, splicing two inputs) plus pure random
# bytes.  Everything comes from random.Random(seed), so a failing input is
# reproduced from (target, seed, index); it is printed with the error.
#
#   python -m tools.chaos.fuzz [--target remoting,peer,record] [--seconds 60 | --inputs N] [--seed S]
#   python -m tools.chaos.fuzz --atheris remoting --seconds 60   # coverage-guided (the `fuzz` extra)
#   python -m tools.chaos.fuzz --minutes N                       # a live group: tools/chaos/livefuzz.py
#   python -m tools.chaos.fuzz --live --seconds 20 | --live --frames 2000
#
# --atheris runs one target under atheris (libFuzzer's coverage guidance on
# the instrumented Python decoders), seeded with the same corpus, with the
# same check; libFuzzer reports the inputs run ("Done N runs") and exits
# non-zero with the input saved on a broken rule.
#
# The store-recovery fuzzer (random corruption of segment, index,
# checkpoint and consume queue files) lives in tests/commitlog, beside the
# store it builds; live ports are fuzzed by tests/tools/chaos.
import random
import sys
import time
import types

import attrs
import click

from broker.remoting.codec import CommandDecoder, encode_command
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemoteProtocolError
from commitlog.errors import WireError
from commitlog.raft import wire
from commitlog.raft.messages import HeartbeatRequest, PushRequest, PushType, VoteRequest
from commitlog.transport.errors import FrameError, HandshakeError
from commitlog.transport.framing import CLOSED, NEED_DATA, FrameDecoder, FrameKind, Hello, decode_hello, encode_frame
from consumequeue import record as M
from tools.chaos.hostile import mutate, peer_seeds, remoting_seeds
from tools.cli import CONTEXT, run_command


class FuzzFailure(AssertionError):
    """A decoder broke its rule on an input (which the message shows)."""


# --- inputs ----------------------------------------------------------------------------------

def inputs(rng: random.Random, corpus: list[bytes]):
    """An endless stream: mostly mutations, some pure random, some valid."""
    while True:
        r = rng.random()
        if r < 0.1:
            yield rng.randbytes(rng.randrange(0, 256))
        elif r < 0.15:
            yield rng.choice(corpus)
        else:
            yield mutate(rng, rng.choice(corpus), corpus)


# --- targets -------------------------------------------------------------------------------

def _chunks(rng: random.Random, data: bytes):
    i = 0
    while i < len(data):
        n = rng.choice((1, 3, 8, 64, len(data)))
        yield data[i:i + n]
        i += n


def remoting_corpus() -> list[bytes]:
    reqs = [
        RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {
            "a": "pg", "b": "TopicA", "c": "TBW102", "d": 4, "e": 1, "f": 0, "g": 1700000000000, "h": 0,
            "i": "KEYS\x01k\x02", "j": 0, "k": False, "m": False}, body=b"hello"),
        RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": "cg", "topic": "TopicA", "queueId": 1, "queueOffset": 0, "maxMsgNums": 32,
            "sysFlag": 2, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}),
        RemotingCommand.create_request(RequestCode.HEART_BEAT, body=b'{"clientID":"c","consumerDataSet":[],'
                                                                     b'"producerDataSet":[{"groupName":"pg"}]}'),
        RemotingCommand.create_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"}),
    ]
    out = [encode_command(r.as_request(opaque=i)) for i, r in enumerate(reqs)]
    # With the crafted frames and those at each of the decoder's limits (the small ones).
    return out + [out[0] + out[1]] + [s for s in remoting_seeds() if len(s) <= 4096]


MAX_REMOTING_FRAME = 1 << 20


def check_remoting(rng: random.Random, data: bytes) -> str:
    dec = CommandDecoder(max_frame_size=MAX_REMOTING_FRAME)
    fed = 0
    try:
        for chunk in [*_chunks(rng, data), b""]:
            dec.receive_data(chunk)
            fed += len(chunk)
            if dec.buffered > fed or dec.buffered > MAX_REMOTING_FRAME + len(chunk):
                raise FuzzFailure(f"decoder holds {dec.buffered} bytes after {fed} fed")
            while True:
                cmd = dec.next_command()
                if cmd is NEED_DATA or cmd is CLOSED:
                    break
                if not isinstance(cmd, RemotingCommand):
                    raise FuzzFailure(f"decoder returned {cmd!r}")
    except RemoteProtocolError:
        return "error"
    return "ok"


def peer_corpus() -> list[bytes]:
    from commitlog.entry import EntryBatch
    msgs = [
        VoteRequest("n0", "n1", 3, 10, 2, True, False),
        HeartbeatRequest("n0", "n1", 3, 9),
        PushRequest("n0", "n1", 3, PushType.APPEND, 7, 9, 10, 2, 0,
                    EntryBatch(11, 1, ((11, 3),), b"\x00" * 48)),
        PushRequest("n0", "n1", 3, PushType.COMPARE, 8, 9, 10, 2, 0),
    ]
    frames = [encode_frame(Hello("g", "n0", "n1", "origin=0").encode(), FrameKind.HELLO)]
    frames += [encode_frame(wire.encode(m)) for m in msgs]
    return frames + [b"".join(frames)] + peer_seeds("g", ["n0", "n1", "n2"], "n1", "origin=0")


def check_peer(rng: random.Random, data: bytes) -> str:
    dec = FrameDecoder(max_frame_size=MAX_REMOTING_FRAME)
    outcome = "ok"
    try:
        for chunk in [*_chunks(rng, data), b""]:
            dec.receive_data(chunk)
            while True:
                frame = dec.next_frame()
                if frame is NEED_DATA or frame is CLOSED:
                    break
                try:
                    if frame.kind is FrameKind.HELLO:
                        decode_hello(frame.payload)
                    elif frame.kind is FrameKind.DATA:
                        wire.decode(frame.payload)
                except (FrameError, HandshakeError, WireError):
                    outcome = "error"  # the transport closes the connection on these
    except FrameError:
        return "error"
    return outcome


def record_corpus() -> list[bytes]:
    import ipaddress
    out = []
    for props, body in (({"KEYS": "k1", "UNIQ_KEY": "AB"}, b"body"), ({}, b""), ({"TAGS": "t"}, b"x" * 100)):
        rec = M.MessageRecord(
            topic="TopicA", queue_id=1, queue_offset=5, physical_offset=1000, born_timestamp=1,
            born_host=M.HostAddr(ipaddress.ip_address("127.0.0.1"), 1), store_timestamp=2,
            store_host=M.HostAddr(ipaddress.ip_address("127.0.0.1"), 2), body=body, properties=props)
        out.append(M.encode(rec))
    return out


def check_record(rng: random.Random, data: bytes) -> str:
    try:
        M.decode(data, check_crc=rng.random() < 0.5)
        outcome = "ok"
    except M.MessageFormatError:
        outcome = "error"
    reason = M.check_record(data)  # a reason string or None, never an exception
    if reason is not None and not isinstance(reason, str):
        raise FuzzFailure(f"check_record returned {reason!r}")
    return outcome


TARGETS = {
    "remoting": (remoting_corpus, check_remoting),
    "peer": (peer_corpus, check_peer),
    "record": (record_corpus, check_record),
}


@attrs.define
class FuzzReport:
    target: str
    inputs: int = 0
    accepted: int = 0
    rejected: int = 0
    seconds: float = 0.0


def fuzz(target: str, seed: int, *, max_inputs: int | None = None, seconds: float | None = None) -> FuzzReport:
    """Run one target; raises FuzzFailure naming the input on a broken rule
    (or any exception other than the decoder's typed error)."""
    corpus_fn, check = TARGETS[target]
    corpus = corpus_fn()
    rng = random.Random(seed)
    report = FuzzReport(target)
    t0 = time.monotonic()
    for i, data in enumerate(inputs(rng, corpus)):
        if max_inputs is not None and i >= max_inputs:
            break
        if seconds is not None and i % 64 == 0 and time.monotonic() - t0 >= seconds:
            break
        try:
            outcome = check(random.Random(seed * 1_000_003 + i), data)
        except Exception as exc:
            raise FuzzFailure(f"{target} (seed {seed}, input {i}): {type(exc).__name__}: {exc}\n"
                              f"input ({len(data)} bytes): {data[:200]!r}") from exc
        report.inputs += 1
        if outcome == "ok":
            report.accepted += 1
        else:
            report.rejected += 1
    report.seconds = round(time.monotonic() - t0, 2)
    return report


def run_atheris(target: str, seconds: float, seed: int) -> None:
    """Coverage-guided fuzzing of one target; libFuzzer ends the process."""
    import os
    import tempfile

    import atheris

    corpus_fn, check = TARGETS[target]
    corpus_dir = tempfile.mkdtemp(prefix=f"ledgermq-atheris-{target}-")
    for i, data in enumerate(corpus_fn()):
        with open(os.path.join(corpus_dir, f"seed{i}"), "wb") as f:
            f.write(data)
    def one(data: bytes) -> None:
        check(random.Random(0), data)  # raises on a broken rule: libFuzzer reports and saves the input

    atheris.instrument_all()  # libFuzzer prints "Done N runs" at the end
    atheris.Setup([sys.argv[0], f"-max_total_time={int(seconds)}", f"-seed={seed % 2 ** 31}",
                   "-max_len=4096", corpus_dir], one)
    atheris.Fuzz()


def _targets(ctx, param, value: str) -> str:
    unknown = [t for t in value.split(",") if t not in TARGETS]
    if unknown:
        raise click.BadParameter(f"unknown target {','.join(unknown)} (known: {','.join(TARGETS)})")
    return value


# The live run's options (tools/chaos/livefuzz.py reads them by these names).
@click.command(context_settings=CONTEXT)
@click.option("--target", default=",".join(TARGETS), show_default=True, callback=_targets,
              help="comma-separated decoders to fuzz")
@click.option("--seconds", type=float, default=None, help="per target (default 30 unless --inputs)")
@click.option("--inputs", type=int, default=None, help="per target")
@click.option("--seed", type=int, default=None, help="the inputs' seed (default: a random one, printed)")
@click.option("--atheris", metavar="TARGET", type=click.Choice(list(TARGETS)), default=None,
              help="coverage-guided run of one target")
@click.option("--minutes", type=float, default=None, help="fuzz a live group for this long")
@click.option("--live", is_flag=True, help="fuzz a live group (--seconds / --frames bound it)")
@click.option("--frames", type=int, default=None, help="live: frames per port")
@click.option("--attach", metavar="NAMESRV", default=None, help="live: a running group, found here")
@click.option("--broker-name", default=None, help="live, --attach: which group (default: the first)")
@click.option("--dir", default=None, help="live: where the started group lives (default: a temp dir)")
@click.option("--rss-limit-mib", type=int, default=256, show_default=True, help="live: RSS bound per process")
@click.option("--insecure-peers", is_flag=True,
              help="live: no peer secret, Raft messages reach the core (forged traffic is possible by design there)")
@click.option("--json", is_flag=True, help="live: the report as JSON")
def command(**kw) -> int:
    """Fuzz ledgermq's decoders (--minutes, --live, --attach or --frames: a
    live group, tools/chaos/livefuzz.py)."""
    args = types.SimpleNamespace(**kw)
    if args.live or args.minutes is not None or args.attach or args.frames is not None:
        from tools.chaos.livefuzz import run_live
        return run_live(args)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 32)
    seconds = args.seconds if args.seconds is not None or args.inputs is not None else 30.0
    print(f"seed {seed}")
    if args.atheris:
        run_atheris(args.atheris, seconds, seed)
        return 0
    failed = False
    for target in args.target.split(","):
        try:
            r = fuzz(target, seed, max_inputs=args.inputs, seconds=seconds)
        except FuzzFailure as e:
            print(f"{target}: FAILED: {e}")
            failed = True
            continue
        print(f"{target}: {r.inputs:,} inputs in {r.seconds} s ({r.accepted:,} decoded, {r.rejected:,} refused "
              f"with the decoder's error), no crash")
    return 1 if failed else 0


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.chaos.fuzz")


if __name__ == "__main__":
    sys.exit(main())

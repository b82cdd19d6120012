# Owns the benchmark of signed sends under ACL (`python -m
# tools.bench.acl_send`): the rate of pipelined SEND_MESSAGE_V2 on a
# one-member group served in this process, in one run, in three modes:
#
#   off       ACL off, unsigned sends (the peer every figure is divided by)
#   on        aclEnable=true, every send signed: admission checks a scan's
#             sends in C (broker/acl/fastpath.py)
#   general   the same broker and frames with that C check switched off, so
#             every send is decoded and judged by validator.validate (the
#             path before it)
#
# Both brokers run side by side in one trio loop (each on its own port and
# data directory); rounds alternate between the modes so that a noisy
# neighbour hits them alike, and the figures are median rates and their
# ratio to `off`, by the wall clock and per CPU second this process used
# (the one to trust when other work shares the cores: a round descheduled
# by a neighbour takes longer, not more CPU).  The load is
# tools/bench/rawsend.py's generator: one connection, `window` requests in
# flight, each write carrying up to `window` frames, so the broker reads
# them as bursts (the native send path; admission checks each send of a
# run).  Client and broker share this process and its core, as the
# README's figures say.  Not a test; nothing is asserted.
#
#   python -m tools.bench.acl_send [--count N] [--window W] [--body B] [--rounds R] [--modes off,on,general]
#   py-spy record -- python -m tools.bench.acl_send --modes on   (one mode, to profile it)
import json
import os
import statistics
import sys
import tempfile
import time
import types

import click
import trio

from broker.acl.signing import Credentials
from broker.config import BrokerConfig
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.server import serve_broker
from consumequeue import record as M
from native import acl as native_acl
from tools.bench.rawsend import FrameTemplate, run_window
from tools.cli import CONTEXT, run_command
from tools.localcluster import free_ports

TOPIC = "AclBenchTopic"
QUEUES = 4
ACCOUNT = Credentials("bench-producer", "bench-producer-secret")
PLAIN_ACL = (f"accounts:\n  - accessKey: {ACCOUNT.access_key}\n    secretKey: {ACCOUNT.secret_key}\n"
             f"    topicPerms: [{TOPIC}=PUB]\n")


def send_request(seq: int, body: bytes) -> RemotingCommand:
    props = M.properties_to_string({"TAGS": "t", "UNIQ_KEY": f"{seq:032X}", "WAIT": "true"})
    fields = {"a": "bench_pg", "b": TOPIC, "c": "TBW102", "d": QUEUES, "e": seq % QUEUES, "f": 0,
              "g": str(1_700_000_000_000 + seq), "h": 0, "i": props, "j": 0, "k": False, "m": False}
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, fields, body=body)


def broker_config(root: str, acl: bool) -> BrokerConfig:
    conf = {"brokerName": "acl-bench", "brokerIP1": "127.0.0.1", "listenPort": "0", "dLegerGroup": "acl-bench",
            "dLegerPeers": f"n0-127.0.0.1:{free_ports(1)[0]}", "dLegerSelfId": "n0",
            "storePathRootDir": f"{root}/n0", "flushDiskType": "ASYNC_FLUSH"}
    if acl:
        with open(f"{root}/plain_acl.yml", "w", encoding="utf-8") as f:
            f.write(PLAIN_ACL)
        conf |= {"aclEnable": "true", "aclFile": f"{root}/plain_acl.yml"}
    cfg, _ = BrokerConfig.from_dict(conf)
    return cfg


MODES = {  # what each mode measures: (the broker, with ACL's C check of scanned sends)
    "off": "ACL off, unsigned sends",
    "on": "aclEnable=true, signed sends (the C check of a scan's sends)",
    "general": "aclEnable=true, signed sends, every one through validate() (the path before the C check)",
}


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def measure(args) -> dict:
    body = b"m" * args.body
    # Distinct signed frames (each signature covers its own fields and
    # body); the generator patches only the opaque, which is not signed.
    signed = [FrameTemplate(ACCOUNT.sign(send_request(i, body))) for i in range(64)]
    plain = [FrameTemplate(send_request(i, body)) for i in range(64)]
    modes = list(args.modes)
    rates: dict[str, list[float]] = {m: [] for m in modes}
    cpu_rates: dict[str, list[float]] = {m: [] for m in modes}
    errors: dict[str, dict] = {m: {} for m in modes}
    with tempfile.TemporaryDirectory(prefix="acl-bench-") as tmp:
        async with trio.open_nursery() as nursery:
            brokers = {}
            for acl in (False, True):
                root = f"{tmp}/{'on' if acl else 'off'}"
                os.makedirs(root)
                cfg = broker_config(root, acl=acl)
                brokers[acl] = await nursery.start(lambda task_status, cfg=cfg: serve_broker(
                    cfg, bind_host="127.0.0.1", task_status=task_status))
                await brokers[acl].gate.wait_writable(timeout=30)
            acl_broker = brokers[True]
            fast = acl_broker.acl.sends

            async def round_of(mode: str, count: int) -> dict:
                broker = brokers[mode != "off"]
                acl_broker.acl.sends = None if mode == "general" else fast
                return await run_window(f"127.0.0.1:{broker.server.port}", plain if mode == "off" else signed,
                                        count=count, window=args.window, seconds=args.seconds)

            # Warm up: the topic is created by the first send (autoCreate),
            # and the first rounds pay for imports and allocations.
            for mode in modes:
                await round_of(mode, 2000)
            for r in range(args.rounds):
                for mode in (modes if r % 2 == 0 else modes[::-1]):
                    cpu0 = time.process_time()
                    res = await round_of(mode, args.count)
                    rates[mode].append(res["count"] / res["seconds"])
                    cpu_rates[mode].append(res["count"] / (time.process_time() - cpu0))
                    for code, n in res["errors"].items():
                        errors[mode][code] = errors[mode].get(code, 0) + n
            acl_broker.acl.sends = fast
            nursery.cancel_scope.cancel()
    out = {"window": args.window, "body": args.body, "count": args.count, "rounds": args.rounds, "errors": errors,
           "sha_extensions": native_acl.uses_sha_extensions()}
    for m in modes:
        out[f"rate_{m}"] = round(_median(rates[m]), 1)
        out[f"cpu_rate_{m}"] = round(_median(cpu_rates[m]), 1)
        out[f"rates_{m}"] = [round(x) for x in rates[m]]
    for m in modes:
        if m != "off" and "off" in modes:
            out[f"ratio_{m}"] = round(out[f"rate_{m}"] / out["rate_off"], 3)
            out[f"cpu_ratio_{m}"] = round(out[f"cpu_rate_{m}"] / out["cpu_rate_off"], 3)
    return out


def _modes(ctx, param, value: str) -> list[str]:
    modes = value.split(",")
    if not set(modes) <= set(MODES):
        raise click.BadParameter(f"{value!r}: each of {', '.join(MODES)}")
    return modes


@click.command(context_settings=CONTEXT)
@click.option("--count", type=int, default=20000, show_default=True, help="messages per round")
@click.option("--window", type=int, default=64, show_default=True, help="requests in flight (and frames per write)")
@click.option("--body", type=int, default=1024, show_default=True, help="body bytes")
@click.option("--rounds", type=int, default=5, show_default=True, help="rounds per mode, alternating")
@click.option("--seconds", type=float, default=30.0, show_default=True, help="time cap of one round")
@click.option("--modes", default="off,on,general", show_default=True, callback=_modes,
              help="comma-separated, of " + ", ".join(MODES) + " (one mode alone: to profile it)")
@click.option("--json", is_flag=True, help="print one JSON object")
def command(**kw) -> int:
    """Signed sends with the ACL off and on, alternating rounds, in one process."""
    args = types.SimpleNamespace(**kw)
    t0 = time.perf_counter()
    out = trio.run(measure, args)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.body} B bodies, window {args.window}, client and brokers in one process "
          f"(SHA extensions: {out['sha_extensions']}):")
    for m in args.modes:
        ratio = f"  on/off {out[f'ratio_{m}']:.3f} (wall), {out[f'cpu_ratio_{m}']:.3f} (CPU)" if f"ratio_{m}" in out \
            else ""
        print(f"  {m:8s} {out[f'rate_{m}']:>8.0f} msg/s wall, {out[f'cpu_rate_{m}']:>8.0f} per CPU s{ratio}")
        print(f"           {MODES[m]}; rounds {out[f'rates_{m}']}")
    if any(out["errors"].values()):
        print(f"  errors {out['errors']}")


def main(argv=None) -> int:
    return run_command(command, argv, "python -m tools.bench.acl_send")


if __name__ == "__main__":
    sys.exit(main())

# Owns the benchmark of signed sends under ACL (`python -m
# tools.bench.acl_send`): the rate of pipelined SEND_MESSAGE_V2 on a
# one-member group served in this process, with aclEnable=true and every
# send signed, against the same load with ACL off, in one run.  Both brokers
# run side by side in one trio loop (each on its own port and data
# directory); rounds alternate between them so that a noisy neighbour on the
# machine hits both alike, and the figure printed is the ratio of the
# median rates (ACL on / ACL off).  The load is tools/bench/rawsend.py's
# generator: one connection, `window` requests in flight, each write
# carrying up to `window` frames, so the broker reads them as bursts (the
# native send path, admission checking each send of a run).  Client and
# broker share this process and its core, as the README's figures say.
# Not a test; nothing is asserted.
#
#   python -m tools.bench.acl_send [--count N] [--window W] [--body B] [--rounds R] [--json]
#   py-spy record -- python -m tools.bench.acl_send --only on   (one mode, to profile it)
import argparse
import json
import os
import statistics
import tempfile
import time

import trio

from broker.acl.signing import Credentials
from broker.config import BrokerConfig
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.server import serve_broker
from consumequeue import record as M
from tools.bench.rawsend import FrameTemplate, run_window
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


async def measure(args) -> dict:
    body = b"m" * args.body
    # Distinct signed frames (each signature covers its own fields and
    # body); the generator patches only the opaque, which is not signed.
    signed = [FrameTemplate(ACCOUNT.sign(send_request(i, body))) for i in range(64)]
    plain = [FrameTemplate(send_request(i, body)) for i in range(64)]
    rates: dict[str, list[float]] = {"off": [], "on": []}
    errors: dict[str, dict] = {"off": {}, "on": {}}
    with tempfile.TemporaryDirectory(prefix="acl-bench-") as tmp:
        async with trio.open_nursery() as nursery:
            addrs = {}
            for mode in ("off", "on"):
                root = f"{tmp}/{mode}"
                os.makedirs(root)
                cfg = broker_config(root, acl=mode == "on")
                broker = await nursery.start(lambda task_status, cfg=cfg: serve_broker(
                    cfg, bind_host="127.0.0.1", task_status=task_status))
                await broker.gate.wait_writable(timeout=30)
                addrs[mode] = f"127.0.0.1:{broker.server.port}"
            templates = {"off": plain, "on": signed}
            # Warm up: the topic is created by the first send (autoCreate),
            # and the first rounds pay for imports and allocations.
            for mode in ("off", "on"):
                await run_window(addrs[mode], templates[mode], count=2000, window=args.window, seconds=30)
            modes = ("off", "on") if args.only is None else (args.only,)
            for r in range(args.rounds):
                for mode in (modes if r % 2 == 0 else modes[::-1]):
                    res = await run_window(addrs[mode], templates[mode], count=args.count, window=args.window,
                                           seconds=args.seconds)
                    rates[mode].append(res["count"] / res["seconds"])
                    for code, n in res["errors"].items():
                        errors[mode][code] = errors[mode].get(code, 0) + n
            nursery.cancel_scope.cancel()
    off, on = (statistics.median(rates[m]) if rates[m] else float("nan") for m in ("off", "on"))
    return {"window": args.window, "body": args.body, "count": args.count, "rounds": args.rounds,
            "rate_off": round(off, 1), "rate_on": round(on, 1), "ratio": round(on / off, 3),
            "rates_off": [round(x) for x in rates["off"]], "rates_on": [round(x) for x in rates["on"]],
            "errors": errors}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--count", type=int, default=20000, help="messages per round")
    p.add_argument("--window", type=int, default=64, help="requests in flight (and frames per write)")
    p.add_argument("--body", type=int, default=1024, help="body bytes")
    p.add_argument("--rounds", type=int, default=5, help="rounds per mode, alternating")
    p.add_argument("--seconds", type=float, default=30.0, help="time cap of one round")
    p.add_argument("--only", choices=("on", "off"), help="measure one mode only (to profile it)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    out = trio.run(measure, args)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(out))
        return
    print(f"signed SEND_MESSAGE_V2, {args.body} B bodies, window {args.window}, one process:")
    print(f"  ACL off  {out['rate_off']:>9.0f} msg/s   rounds {out['rates_off']}")
    print(f"  ACL on   {out['rate_on']:>9.0f} msg/s   rounds {out['rates_on']}")
    print(f"  ratio on/off  {out['ratio']:.3f}   errors {out['errors']}")


if __name__ == "__main__":
    main()

# Owns the stock C++ client's side of a nemesis run.  It runs inside the
# compat venv (PyPI rocketmq==0.4.4, never ledgermq), sends unique bodies
# with send_sync until terminated, and prints one JSON line before and one
# after every send, so the harness knows which sends were in flight when it
# stopped (their outcome is unknown).
#
#   stock_producer.py NAMESRV TOPIC [--prefix cpp] [--timeout-ms 3000]
#
# Its command line stays on argparse: the compat venv holds rocketmq==0.4.4
# alone, without click (tests/test_cli_hygiene.py's allow-list).
import argparse
import json
import os
import signal
import sys
import time

from rocketmq.client import Message, Producer


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("namesrv")
    p.add_argument("topic")
    p.add_argument("--prefix", default="cpp")
    p.add_argument("--timeout-ms", type=int, default=3000)
    a = p.parse_args()
    # SIGTERM ends the process at once (the C++ core's clean shutdown takes ~10 s).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    producer = Producer("chaos_cpp_pg", timeout=a.timeout_ms)
    producer.set_namesrv_addr(a.namesrv)
    producer.start()
    seq = 0
    while True:
        seq += 1
        body = f"{a.prefix}-{os.getpid()}-{seq:08d}"
        msg = Message(a.topic)
        msg.set_keys(body)
        msg.set_body(body)
        emit({"event": "start", "body": body})
        try:
            r = producer.send_sync(msg)
            emit({"event": "end", "body": body, "status": r.status.name, "offset": r.offset})
        except Exception as e:  # the wrapper's RocketMQException subclasses
            emit({"event": "end", "body": body, "error": f"{type(e).__name__}: {e}"[:300]})
            time.sleep(0.05)  # failures are immediate (no route): do not spin


main()

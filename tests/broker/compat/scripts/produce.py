# produce.py NAMESRV TOPIC COUNT [--group G] [--mode sync|oneway|orderly]
#            [--timeout-ms N] [--tags T] [--keys K] [--body-prefix P] [--shutdown]
#            [--access-key AK --secret-key SK [--channel C]]
#            [--until-file PATH [--pace-ms N]]
# With --until-file it sends until PATH exists (COUNT at most), one message
# every --pace-ms: a producer running throughout a planned operation.
# Sends COUNT messages with the stock client and prints
# {"sent": [{"status", "msg_id", "offset"} | {"error"}], "ok": n, ...}.
import argparse
import os
import time

from _common import finish, text
from rocketmq.client import Message, Producer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("namesrv")
    p.add_argument("topic")
    p.add_argument("count", type=int)
    p.add_argument("--group", default="compat_producer")
    p.add_argument("--mode", choices=("sync", "oneway", "orderly"), default="sync")
    p.add_argument("--timeout-ms", type=int, default=3000)
    p.add_argument("--tags", default="TagA")
    p.add_argument("--keys", default="")
    p.add_argument("--body-prefix", default="hello-")
    p.add_argument("--shutdown", action="store_true")
    p.add_argument("--access-key", default=None, help="ACL: set_session_credentials(access key, secret, channel)")
    p.add_argument("--secret-key", default="")
    p.add_argument("--channel", default="ALIYUN")
    p.add_argument("--until-file", default=None)
    p.add_argument("--pace-ms", type=int, default=0)
    a = p.parse_args()

    producer = Producer(a.group, timeout=a.timeout_ms)
    producer.set_namesrv_addr(a.namesrv)
    if a.access_key is not None:
        producer.set_session_credentials(a.access_key, a.secret_key, a.channel)
    producer.start()
    sent, t0 = [], time.monotonic()
    for i in range(a.count):
        if a.until_file is not None and os.path.exists(a.until_file):
            break
        if a.pace_ms:
            time.sleep(a.pace_ms / 1000)
        msg = Message(a.topic)
        msg.set_tags(a.tags)
        if a.keys:
            msg.set_keys(f"{a.keys}{i}")
        msg.set_body(f"{a.body_prefix}{i}")
        try:
            if a.mode == "sync":
                r = producer.send_sync(msg)
                sent.append({"status": r.status.name, "msg_id": r.msg_id, "offset": r.offset})
            elif a.mode == "orderly":
                r = producer.send_orderly(msg, i)
                sent.append({"status": r.status.name, "msg_id": r.msg_id, "offset": r.offset})
            else:
                producer.send_oneway(msg)
                sent.append({"status": "ONEWAY"})
        except Exception as e:  # the wrapper's RocketMQException subclasses
            sent.append({"error": f"{type(e).__name__}: {text(str(e))}"})
    ok = sum(1 for s in sent if s.get("status") in ("OK", "ONEWAY"))
    # Oneway sends are written by the C++ event loop after send_oneway
    # returns: exiting at once would lose them, so oneway always shuts down.
    finish({"sent": sent, "ok": ok, "send_seconds": round(time.monotonic() - t0, 3)}, [producer], a.shutdown or a.mode == "oneway")


main()

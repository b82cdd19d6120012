# simple.py ENDPOINT AK SK TOPIC GROUP IDS_FILE [change|watch]: a
# SimpleConsumer receives and acks until it has acked every message id
# listed in IDS_FILE (the test writes it once the producer is done; until
# then it keeps going).  `watch`: then it keeps receiving for one invisible
# time more to see whether anything it acked comes back (delivery_attempt
# > 1: a redelivery; a second copy of a message id with attempt 1 is a
# duplicate send, reported apart).  `change`: the first message is not
# acked but its invisible duration set to 2 s: it must come back.
import json
import os
import sys
import time

from _common import config, emit
from rocketmq import FilterExpression, SimpleConsumer

endpoint, ak, sk, topic, group, ids_file = sys.argv[1:7]
mode = sys.argv[7] if len(sys.argv) > 7 else ""
change, watch = mode == "change", mode == "watch"
INVISIBLE = 10
consumer = SimpleConsumer(config(endpoint, ak, sk), group, {topic: FilterExpression("*")}, await_duration=5)
consumer.startup()
acked, deliveries, changed, after, copies, ack_failed = set(), {}, None, [], [], {}
bodies = {}
deadline = time.monotonic() + 90
want = None
redelivery_until = None
while time.monotonic() < deadline:
    if want is None and os.path.exists(ids_file):
        with open(ids_file) as f:
            want = set(json.load(f))
    if want is not None and want <= acked and redelivery_until is None:
        redelivery_until = time.monotonic() + (INVISIBLE + 1 if watch else 0)
        emit(all_acked=len(acked))
    if redelivery_until is not None and time.monotonic() > redelivery_until:
        break
    try:
        messages = consumer.receive(32, INVISIBLE)
    except Exception as e:
        emit(receive_error=f"{type(e).__name__}: {e}"[:300])
        continue
    for m in messages:
        mid = m.message_id
        deliveries[mid] = deliveries.get(mid, 0) + 1
        bodies[mid] = m.body.decode(errors="replace")
        if mid in acked:
            (after if m.delivery_attempt > 1 else copies).append([mid, m.delivery_attempt])
            consumer.ack(m)
            continue
        if change and changed is None:
            consumer.change_invisible_duration(m, 2)
            changed = mid
            continue
        try:
            consumer.ack(m)
            acked.add(mid)
        except Exception as e:
            ack_failed[mid] = f"{type(e).__name__}: {e}"[:200]
            emit(ack_error=ack_failed[mid], id=mid)
consumer.shutdown()
emit(result={"acked": sorted(acked), "redelivered_after_ack": after, "duplicate_copies": copies, "changed": changed,
             "changed_deliveries": deliveries.get(changed, 0), "complete": want is not None and want <= acked,
             "missing": {mid: [deliveries.get(mid, 0), ack_failed.get(mid)] for mid in sorted((want or set()) - acked)[:20]},
             "bodies": bodies})

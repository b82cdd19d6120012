# produce.py ENDPOINT AK SK TOPIC KIND COUNT: COUNT sends of KIND (normal,
# fifo: message groups g0/g1, delay: due 2 s ahead) with the official
# Producer; a line {"sent": i, "id": ...} per acknowledged send, {"failed": i,
# "error": ...} per failed one, then {"result": {...}}.
import sys
import time

from _common import config, emit, log_lines
from rocketmq import Message, Producer

endpoint, ak, sk, topic, kind, count = sys.argv[1:7]
producer = Producer(config(endpoint, ak, sk), (topic,))
try:
    producer.startup()
except Exception as e:
    emit(result={"startup_error": f"{type(e).__name__}: {e}", "ids": [], "failed": int(count)})
    sys.exit(0)
ids, failed, errors = [], 0, []
for i in range(int(count)):
    msg = Message()
    msg.topic = topic
    msg.body = f"{kind}-{i}".encode()
    msg.tag = "TagA"
    msg.keys = f"k{i}"
    if kind == "fifo":
        msg.message_group = f"g{i % 2}"
    elif kind == "delay":
        msg.delivery_timestamp = int(time.time()) + 2
    try:
        receipt = producer.send(msg)
        ids.append(receipt.message_id)
        emit(sent=i, id=receipt.message_id)
    except Exception as e:
        failed += 1
        errors.append(f"{type(e).__name__}: {e}")
        emit(failed=i, error=errors[-1][:300])
producer.shutdown()
emit(result={"ids": ids, "failed": failed, "errors": errors[:5], "log": log_lines("40100", "40300", "UNAUTHORIZED")})

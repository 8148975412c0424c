"""redis-py's pub/sub and blocking commands, unmodified, against `pmnet gateway --redis`: run by
crates/pmnet/tests/redis_direct.rs as `python3 pubsub_py.py PORT PROTOCOL` (PROTOCOL 2 or 3).
Prints one line per check and `ok` at the end; a failure raises and says what differed."""
import sys
import threading

import redis

port = int(sys.argv[1])
protocol = int(sys.argv[2])
r = redis.Redis(port=port, protocol=protocol, socket_timeout=60)
publisher = redis.Redis(port=port, socket_timeout=60)


def check(what, got, expected):
    assert got == expected, f"{what}: got {got!r}, expected {expected!r}"
    print(f"{what}: ok", flush=True)


p = r.pubsub()
p.subscribe("py:news")
check("subscribe confirmation", p.get_message(timeout=60)["type"], "subscribe")
p.psubscribe("py:*")
check("psubscribe confirmation", p.get_message(timeout=60)["type"], "psubscribe")
check("publish reaches both", publisher.publish("py:news", "hello"), 2)
first = p.get_message(timeout=60)
second = p.get_message(timeout=60)
check("message", (first["type"], first["channel"], first["data"]), ("message", b"py:news", b"hello"))
check("pmessage", (second["type"], second["pattern"], second["data"]), ("pmessage", b"py:*", b"hello"))
p.unsubscribe("py:news")
check("unsubscribe confirmation", p.get_message(timeout=60)["type"], "unsubscribe")
p.punsubscribe("py:*")
check("punsubscribe confirmation", p.get_message(timeout=60)["type"], "punsubscribe")
p.close()

# A job queue: a worker blocks, the producer pushes (RQ, Celery and Sidekiq work this way).
result = {}
worker = threading.Thread(target=lambda: result.update(job=r.blpop(["py:jobs"], timeout=0)))
worker.start()
publisher.rpush("py:jobs", "job-1")
worker.join(60)
check("blpop woken by rpush", tuple(result.get("job") or ()), (b"py:jobs", b"job-1"))
check("brpoplpush times out with nil", r.brpoplpush("py:empty", "py:dst", timeout=1), None)
print("ok")

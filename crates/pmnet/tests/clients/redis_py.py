"""redis-py, unmodified and with its defaults, against `pmnet gateway`.

Run by crates/pmnet/tests/redis_clients.rs: `python3 redis_py.py PORT PROTOCOL` where PROTOCOL
is `default` (redis-py's own: RESP3 in redis-py 8), `2` or `3`. Prints one line per check and
`ok` at the end; any failure raises (exit status 1) with what differed.
"""

import sys
import threading

import redis
from redis.exceptions import ResponseError, WatchError

port = int(sys.argv[1])
protocol = sys.argv[2]
kwargs = {} if protocol == "default" else {"protocol": int(protocol)}
r = redis.Redis(port=port, **kwargs)
other = redis.Redis(port=port, **kwargs)
tag = f"p{protocol}:"


def check(what, got, expected):
    if got != expected:
        raise AssertionError(f"{what}: got {got!r}, expected {expected!r}")
    print(f"{what}: ok")


check("redis-py version", int(redis.__version__.split(".")[0]) >= 5, True)
check("ping", r.ping(), True)

# Strings, hashes, sets, sorted sets: the reply types the protocol version gives.
check("set", r.set(tag + "a", "1"), True)
check("get", r.get(tag + "a"), b"1")
r.hset(tag + "h", mapping={"f": "v", "g": "w"})
check("hgetall", r.hgetall(tag + "h"), {b"f": b"v", b"g": b"w"})
r.sadd(tag + "s", "x", "y")
check("smembers", r.smembers(tag + "s"), {b"x", b"y"})
r.zadd(tag + "z", {"m": 1.5, "n": 2})
check("zscore", r.zscore(tag + "z", "m"), 1.5)
# (pairs come as tuples in RESP2 and as lists in RESP3, as with Redis itself)
pairs = [tuple(pair) for pair in r.zrange(tag + "z", 0, -1, withscores=True)]
check("zrange withscores", pairs, [(b"m", 1.5), (b"n", 2.0)])
check("zincrby", r.zincrby(tag + "z", 1, "n"), 3.0)
check("hgetall of nothing", r.hgetall(tag + "missing"), {})
check("mget with a missing key", r.mget(tag + "a", tag + "missing"), [b"1", None])
check("zrevrange", r.zrevrange(tag + "z", 0, -1), [b"n", b"m"])
check("get of nothing", r.get(tag + "missing"), None)

# The default pipeline is a MULTI/EXEC transaction.
pipe = r.pipeline()
pipe.set(tag + "p1", "a")
pipe.incr(tag + "count")
pipe.get(tag + "p1")
pipe.hgetall(tag + "h")
check("pipeline (transaction)", pipe.execute(), [True, 1, b"a", {b"f": b"v", b"g": b"w"}])
pipe = r.pipeline(transaction=False)
pipe.incr(tag + "count")
pipe.get(tag + "count")
check("pipeline (no transaction)", pipe.execute(), [2, b"2"])

# A command Redis rejects inside a transaction: its error takes its place.
pipe = r.pipeline()
pipe.set(tag + "str", "text")
pipe.incr(tag + "str")
pipe.get(tag + "str")
results = pipe.execute(raise_on_error=False)
check("transaction with a failing command", (results[0], isinstance(results[1], ResponseError), results[2]), (True, True, b"text"))

# WATCH: a transaction runs only if the watched key did not change.
def add_two(pipe):
    value = int(pipe.get(tag + "w") or 0)
    pipe.multi()
    pipe.set(tag + "w", value + 2)

r.transaction(add_two, tag + "w")
check("transaction() with WATCH", r.get(tag + "w"), b"2")
with r.pipeline() as pipe:
    pipe.watch(tag + "w")
    other.incr(tag + "w")  # answered by Redis: applied before the reply
    pipe.multi()
    pipe.set(tag + "w", "lost")
    try:
        pipe.execute()
        aborted = False
    except WatchError:
        aborted = True
check("a watched key changed: EXEC aborted", (aborted, r.get(tag + "w")), (True, b"3"))

# Scripts: register_script (EVALSHA, then SCRIPT LOAD on NOSCRIPT), EVAL, and the Lock.
incr_by = r.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
check("register_script", incr_by(keys=[tag + "e"], args=[5]), 5)
check("register_script again", incr_by(keys=[tag + "e"], args=[5]), 10)
check("eval", r.eval("return {KEYS[1], ARGV[1], 3}", 1, "k", "v"), [b"k", b"v", 3])
try:
    r.eval("return redis.call('INCR', KEYS[1])", 1, tag + "str")
    failed = False
except ResponseError as error:
    failed = "not an integer" in str(error)
check("a script's error reaches the client", failed, True)
# Functions: a library loaded through the gateway, called with FCALL and FCALL_RO.
library = f"lib_p{protocol}"
code = (
    f"#!lua name={library}\n"
    f"redis.register_function('{library}_add', function(keys, args) "
    "return redis.call('INCRBY', keys[1], args[1]) end)\n"
    f"redis.register_function{{function_name='{library}_get', "
    "callback=function(keys) return redis.call('GET', keys[1]) end, flags={'no-writes'}}"
)
check("function load", r.function_load(code, replace=True) in (library, library.encode()), True)
check("fcall", r.fcall(f"{library}_add", 1, tag + "f", 4), 4)
check("fcall again", r.fcall(f"{library}_add", 1, tag + "f", 4), 8)
check("fcall_ro", r.fcall_ro(f"{library}_get", 1, tag + "f"), b"8")
lock = r.lock(tag + "lock", timeout=30)
check("lock acquire", lock.acquire(blocking=False), True)
check("lock held", r.get(tag + "lock") is not None, True)
check("second lock refused", r.lock(tag + "lock", timeout=30).acquire(blocking=False), False)
lock.release()
check("lock released", r.get(tag + "lock"), None)

# Connection commands redis-py and applications send.
r.client_setname("pmnet-test")
check("client getname", r.client_getname() in ("pmnet-test", b"pmnet-test"), True)
check("client id", isinstance(r.client_id(), int), True)

# Everyday commands.
r.rpush(tag + "l", "a", "b", "c")
check("lpos", r.lpos(tag + "l", "b"), 1)
check("linsert", r.linsert(tag + "l", "before", "b", "x"), 4)
check("lmove", r.lmove(tag + "l", tag + "l2", "LEFT", "RIGHT"), b"a")
check("sinter", r.sinter(tag + "s", tag + "s"), {b"x", b"y"})
check("smismember", r.smismember(tag + "s", ["x", "q"]), [1, 0])
check("hincrbyfloat", r.hincrbyfloat(tag + "h2", "f", 1.5), 1.5)
check("setbit/bitcount", (r.setbit(tag + "bits", 7, 1), r.bitcount(tag + "bits")), (0, 1))
check("pfadd/pfcount", (r.pfadd(tag + "hll", "a", "b"), r.pfcount(tag + "hll")), (1, 2))
r.xadd(tag + "st", {"f": "v"})
check("xlen", r.xlen(tag + "st"), 1)
check("geoadd", r.geoadd(tag + "geo", (13.361389, 38.115556, "Palermo")), 1)
check("getex", r.getex(tag + "a", ex=100), b"1")
check("expiretime", r.expiretime(tag + "a") > 0, True)
check("copy", r.copy(tag + "a", tag + "a-copy"), True)
check("object encoding", r.object("encoding", tag + "a") in (b"int", "int"), True)
check("publish", r.publish(tag + "channel", "hi"), 0)
check("time", len(r.time()), 2)

# The adaptor's records are not among the user's keys.
keys = r.keys("*")
check("no records among the keys", [k for k in keys if k.startswith(b"pmnet:")], [])
check("dbsize counts the user's keys", r.dbsize(), len(keys))

# Refused with a precise error, not "unknown command".
for command in (("BLPOP", tag + "l", "0"), ("SUBSCRIBE", "c"), ("FCALL", "f", "0")):
    try:
        r.execute_command(*command)
        refused = ""
    except ResponseError as error:
        refused = str(error)
    check(f"{command[0]} refused precisely", bool(refused) and "unknown command" not in refused, True)

print("ok")

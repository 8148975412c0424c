"""Celery, unmodified and with its defaults, with Redis as its broker and result backend: the
app and its task, a producer, and a check of what Celery itself says of the tasks.

Run by crates/pmnet/tests/job_queues.rs, against `pmnet redis-up` (or a plain redis-server),
with PMNET_JOBS_URL=redis://HOST:PORT/0 in the environment:

    python3 celery_jobs.py produce N                   # record.delay(0) … record.delay(N-1)
    celery -A celery_jobs worker --concurrency 2       # run in this directory
    python3 celery_jobs.py check N                     # every task's result SUCCESS, nothing
                                                       # left in the queue or unacknowledged

Each task adds 1 to the field of its number in the hash `jobs:done`, through the result
backend's connection; the test reads that hash to see every task ran exactly once. A failed
check raises (exit status 1) and says what differed; success prints `ok`.
"""

import os
import sys
import time

from celery import Celery

URL = os.environ["PMNET_JOBS_URL"]
app = Celery("celery_jobs", broker=URL, backend=URL)


@app.task
def record(number):
    """The task: count this task's run in `jobs:done`."""
    app.backend.client.hincrby("jobs:done", str(number), 1)
    return number


def produce(count):
    started = time.monotonic()
    for number in range(count):
        record.delay(number)
    print(f"sent {count} tasks in {time.monotonic() - started:.1f} s")


def check(count):
    backend = app.backend
    keys = list(backend.client.scan_iter(match=backend.task_keyprefix + b"*", count=1000))
    statuses = {}
    results = set()
    for start in range(0, len(keys), 1000):
        for value in backend.client.mget(keys[start : start + 1000]):
            meta = backend.decode_result(value)
            statuses[meta["status"]] = statuses.get(meta["status"], 0) + 1
            results.add(meta["result"])
    if statuses != {"SUCCESS": count} or results != set(range(count)):
        raise AssertionError(
            f"results: {statuses}, {len(results)} distinct, expected {count} SUCCESS"
        )
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        waiting = channel.client.llen(app.conf.task_default_queue)
        unacked = channel.client.hlen(channel.unacked_key)
    if (waiting, unacked) != (0, 0):
        raise AssertionError(f"{waiting} tasks still queued, {unacked} unacknowledged")
    print(f"Celery's results: {statuses}; queued {waiting}, unacknowledged {unacked}")
    print("ok")


if __name__ == "__main__":
    action, count = sys.argv[1], int(sys.argv[2])
    {"produce": produce, "check": check}[action](count)

"""RQ, unmodified and with its defaults: a producer, the jobs, and a check of RQ's own registries.

Run by crates/pmnet/tests/job_queues.rs, against `pmnet redis-up` (or a plain redis-server):

    rq worker --worker-class rq.worker.SimpleWorker --url URL
                                       # run in this directory: RQ imports rq_jobs.record
    python3 rq_jobs.py produce URL N   # enqueue record(0) … record(N-1) on RQ's default queue
    python3 rq_jobs.py check URL N     # RQ's registries: N finished, nothing queued, started,
                                       # failed, deferred or scheduled

Each job adds 1 to the field of its number in the hash `jobs:done`, through the worker's own
connection; the test reads that hash to see every job ran exactly once. A failed check raises
(exit status 1) and says what differed; success prints `ok`.
"""

import sys
import time

from redis import Redis
from rq import Queue, get_current_job


def record(number):
    """The job: count this job's run in `jobs:done` (through the worker's connection)."""
    job = get_current_job()
    job.connection.hincrby("jobs:done", str(number), 1)
    return number


def produce(url, count):
    queue = Queue(connection=Redis.from_url(url))
    started = time.monotonic()
    for number in range(count):
        queue.enqueue("rq_jobs.record", number)
    print(f"enqueued {count} jobs in {time.monotonic() - started:.1f} s")


def check(url, count):
    queue = Queue(connection=Redis.from_url(url))
    counts = {
        "queued": queue.count,
        "started": queue.started_job_registry.count,
        "failed": queue.failed_job_registry.count,
        "deferred": queue.deferred_job_registry.count,
        "scheduled": queue.scheduled_job_registry.count,
        "finished": queue.finished_job_registry.count,
    }
    expected = {name: 0 for name in counts} | {"finished": count}
    if counts != expected:
        raise AssertionError(f"RQ's registries: {counts}, expected {expected}")
    print(f"RQ's registries: {counts}")
    print("ok")


if __name__ == "__main__":
    action, url, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    {"produce": produce, "check": check}[action](url, count)

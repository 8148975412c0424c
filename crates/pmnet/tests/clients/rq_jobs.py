"""RQ, unmodified and with its defaults: a producer, the jobs, and a check of RQ's own registries.

Run by crates/pmnet/tests/job_queues.rs, against `pmnet redis-up` (or a plain redis-server):

    rq worker --worker-class rq.worker.SimpleWorker --url URL
                                       # run in this directory: RQ imports rq_jobs.record
    python3 rq_jobs.py produce URL N   # enqueue record(0) … record(N-1) on RQ's default queue
    python3 rq_jobs.py check URL N     # RQ's registries: nothing queued, started, failed,
                                       # deferred or scheduled; N finished (fewer when
                                       # some finished over RQ's result TTL ago)

Each job adds 1 to the field of its number in the hash `jobs:done`, through the worker's own
connection; the test reads that hash to see every job ran exactly once. A failed check raises
(exit status 1) and says what differed; success prints `ok`.
"""

import sys
import time
from datetime import datetime, timezone

from redis import Redis
from rq import Queue, get_current_job
from rq.job import Job


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
    """RQ keeps a finished job in its registry for the job's result TTL (500 s by default):
    on a slow machine the first jobs of a long run are gone from it by the end, as RQ means
    them to be. So the finished registry holds at most N, and N whenever no finished job is
    older than the TTL; `jobs:done` (checked by the test) says each job ran exactly once."""
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
    expired = count - counts["finished"]
    if 0 < expired < count and oldest_finished_over_ttl(queue):
        expected["finished"] = counts["finished"]
        print(f"{expired} finished jobs are past RQ's result TTL and left its registry")
    if counts != expected:
        raise AssertionError(f"RQ's registries: {counts}, expected {expected}")
    print(f"RQ's registries: {counts}")
    print("ok")


def oldest_finished_over_ttl(queue):
    """Whether the job that finished first among those still registered ended more than the
    default result TTL ago: then jobs that finished before it may have expired."""
    ids = queue.finished_job_registry.get_job_ids(0, -1)
    ended = [
        job.ended_at
        for job in Job.fetch_many(ids, connection=queue.connection)
        if job is not None and job.ended_at is not None
    ]
    if not ended:
        return False
    oldest = min(ended)
    if oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=timezone.utc)
    # A job still registered finished at most one TTL ago; the ones before it, earlier still.
    return (datetime.now(timezone.utc) - oldest).total_seconds() > 500 - 60


if __name__ == "__main__":
    action, url, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    {"produce": produce, "check": check}[action](url, count)

// BullMQ, unmodified and with its defaults: a worker, a producer, and a check of what BullMQ
// itself counts. Run by crates/pmnet/tests/job_queues.rs, against `pmnet redis-up` (or a plain
// redis-server), with NODE_PATH naming a node_modules that holds bullmq:
//
//   node bullmq_jobs.js worker PORT     # a Worker on the queue "jobs"; closes on SIGTERM
//   node bullmq_jobs.js produce PORT N  # queue.add("record", {number}) for 0 … N-1
//   node bullmq_jobs.js check PORT N    # getJobCounts(): N completed, nothing else
//
// Each job adds 1 to the field of its number in the hash `jobs:done` (through an ioredis
// connection of the worker's); the test reads that hash to see every job ran exactly once. A
// failed check exits with status 1 and says what differed; success prints `ok`.
"use strict";
const { Queue, Worker } = require("bullmq");
const IORedis = require("ioredis");

const QUEUE = "jobs";

async function worker(connection) {
  const recorder = new IORedis(connection);
  const worker = new Worker(
    QUEUE,
    async (job) => {
      await recorder.hincrby("jobs:done", String(job.data.number), 1);
      return job.data.number;
    },
    { connection },
  );
  worker.on("error", (error) => console.error("worker error:", error));
  worker.on("failed", (job, error) => console.error(`job ${job && job.id} failed:`, error));
  await worker.waitUntilReady();
  console.log("worker ready");
  await new Promise((resolve) => process.once("SIGTERM", resolve));
  await worker.close();
  await recorder.quit();
  console.log("worker closed");
}

async function produce(connection, count) {
  const queue = new Queue(QUEUE, { connection });
  const started = Date.now();
  for (let number = 0; number < count; number++) {
    await queue.add("record", { number });
  }
  console.log(`added ${count} jobs in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  await queue.close();
}

async function check(connection, count) {
  const queue = new Queue(QUEUE, { connection });
  const counts = await queue.getJobCounts();
  await queue.close();
  const expected = Object.fromEntries(Object.keys(counts).map((state) => [state, 0]));
  expected.completed = count;
  require("assert").deepStrictEqual(counts, expected, "BullMQ's job counts");
  console.log(`BullMQ's job counts: ${JSON.stringify(counts)}`);
  console.log("ok");
}

async function main() {
  const [action, port, count] = process.argv.slice(2);
  const connection = { host: "127.0.0.1", port: Number(port) };
  const actions = { worker, produce, check };
  await actions[action](connection, Number(count));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

// ioredis subscriber connections and blocking commands, unmodified, against `pmnet gateway
// --redis`: run by crates/pmnet/tests/redis_direct.rs as `node pubsub_ioredis.js PORT` with
// NODE_PATH naming a node_modules that holds ioredis. Prints one line per check and `ok` at the
// end; a failure exits with status 1 and says what differed.
"use strict";
const Redis = require("ioredis");
const assert = require("assert");

async function main() {
  const port = Number(process.argv[2]);
  const sub = new Redis({ port, maxRetriesPerRequest: 1 });
  const pub = new Redis({ port, maxRetriesPerRequest: 1 });
  const check = (what, got, expected) => {
    assert.deepStrictEqual(got, expected, what);
    console.log(`${what}: ok`);
  };
  const message = new Promise((resolve) => sub.on("message", (channel, text) => resolve([channel, text])));
  const pmessage = new Promise((resolve) =>
    sub.on("pmessage", (pattern, channel, text) => resolve([pattern, channel, text])));
  check("subscribe", await sub.subscribe("js:news"), 1);
  check("psubscribe", await sub.psubscribe("js:*"), 2);
  check("publish", await pub.publish("js:news", "hello"), 2);
  check("message", await message, ["js:news", "hello"]);
  check("pmessage", await pmessage, ["js:*", "js:news", "hello"]);
  check("unsubscribe", await sub.unsubscribe("js:news"), 1);
  const worker = new Redis({ port, maxRetriesPerRequest: 1 });
  const job = worker.blpop("js:jobs", 0);
  // Whichever reaches Redis first, the worker's BLPOP gets the job.
  await pub.rpush("js:jobs", "job-1");
  check("blpop", await job, ["js:jobs", "job-1"]);
  sub.disconnect();
  pub.disconnect();
  worker.disconnect();
  console.log("ok");
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

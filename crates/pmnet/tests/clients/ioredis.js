// ioredis, unmodified, against `pmnet gateway`: run by crates/pmnet/tests/redis_clients.rs as
// `node ioredis.js PORT` with NODE_PATH naming a node_modules that holds ioredis. Prints one
// line per check and `ok` at the end; a failure exits with status 1 and says what differed.
"use strict";
const Redis = require("ioredis");
const assert = require("assert");

async function main() {
  const port = Number(process.argv[2]);
  const redis = new Redis({ port, lazyConnect: false, maxRetriesPerRequest: 1 });
  const check = (what, got, expected) => {
    assert.deepStrictEqual(got, expected, what);
    console.log(`${what}: ok`);
  };
  check("ping", await redis.ping(), "PONG");
  check("set", await redis.set("js:a", "1"), "OK");
  check("get", await redis.get("js:a"), "1");
  await redis.hset("js:h", { f: "v", g: "w" });
  check("hgetall", await redis.hgetall("js:h"), { f: "v", g: "w" });
  check("multi/exec", await redis.multi().set("js:m", "x").incr("js:n").get("js:m").exec(),
    [[null, "OK"], [null, 1], [null, "x"]]);
  check("pipeline", await redis.pipeline().incr("js:n").get("js:n").exec(),
    [[null, 2], [null, "2"]]);
  redis.defineCommand("incrTwice", {
    numberOfKeys: 1,
    lua: "redis.call('INCR', KEYS[1]); return redis.call('INCR', KEYS[1])",
  });
  check("defineCommand (EVALSHA, then EVAL)", await redis.incrTwice("js:s"), 2);
  check("defineCommand again", await redis.incrTwice("js:s"), 4);
  check("eval", await redis.eval("return ARGV[1]", 0, "hello"), "hello");
  check("zrevrange", (await redis.zadd("js:z", 1, "a", 2, "b"), await redis.zrevrange("js:z", 0, -1)), ["b", "a"]);
  check("client setname", await redis.client("SETNAME", "js-test"), "OK");
  check("client getname", await redis.client("GETNAME"), "js-test");
  await redis.quit();
  console.log("ok");
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

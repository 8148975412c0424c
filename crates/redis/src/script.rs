//! The Lua scripts the adaptor runs in Redis, and the per-session records they keep.
//!
//! The records live in their own logical database (`--record-db`, by default the last one
//! Redis has), out of the databases clients use; the scripts `SELECT` it around each record
//! access, and the client's database around the command, inside the same atomic script call.
//!
//! Every request that may change data runs as one script call (`EVALSHA`), so that the command,
//! the session's last-applied sequence number and the command's reply become durable together:
//! Redis runs a script atomically and writes its effects to the append-only file as one
//! `MULTI … EXEC` block, which a restart replays whole or not at all.
//!
//! The record of session `S` is the hash `<prefix><S as 16 hex digits>` with the field `seq`
//! (the last applied sequence number, decimal) and the fields `r0` … `r63` and `s0` … `s63`:
//! the RESP reply of request `n` is kept in `r<n mod 64>` and its number in `s<n mod 64>`, so
//! the replies of the last 64 recorded requests are kept, each with the number it answers (a
//! read between them records nothing, and must not be taken for the request 64 before it). The
//! adaptor never has more than 64 requests of one session at Redis at once, so a request redone
//! after a crash always finds its reply. Each write also sets the record to expire after the
//! adaptor's session TTL (`--session-ttl`, default 7 days; 0 keeps records for ever), so the
//! records of sessions that ended do not pile up.

/// Replies kept per session (the adaptor's limit of requests of one session at Redis).
pub const REPLY_RING: u32 = 64;

/// How long a session record outlives its session's last write, by default (7 days).
pub const DEFAULT_SESSION_TTL_SECS: u64 = 7 * 24 * 3600;

/// The default key prefix of the session records.
pub const DEFAULT_RECORD_PREFIX: &str = "pmnet:session:";

/// `--record-db` for "the last database Redis has" (`databases` − 1), the default: the
/// records stay out of every database a client selects (a Redis started with `databases 17`
/// leaves the clients Redis's usual 16).
pub const RECORD_DB_LAST: u32 = u32::MAX;

/// The hash, in the records' database, of the user scripts loaded through the adaptor
/// (`SCRIPT LOAD`): SHA-1 → body, so that `EVALSHA` finds them after a restart.
pub const SCRIPTS_KEY: &str = "pmnet:scripts";

/// User scripts the adaptor keeps in memory at most; beyond, `EVALSHA` reads them from Redis.
pub const SCRIPTS_CACHED_MAX: usize = 4096;

/// Status of a script's answer: the command ran now.
pub const STATUS_APPLIED: i64 = 1;
/// Status of a script's answer: applied before (a redo); the stored reply follows.
pub const STATUS_ALREADY_APPLIED: i64 = 0;
/// Status of a script's answer: applied before, reply no longer kept (or, for a checked read,
/// a later request of the session is already applied, so the read cannot be answered as of
/// its place in the sequence).
pub const STATUS_REPLY_GONE: i64 = 2;

/// The RESP encoder shared by every script: Redis hands a command's reply to Lua as a value
/// (status and error replies as tables with `ok`/`err`, a nil bulk string and a nil array both
/// as `false`, integers as Lua numbers, which are doubles), and this turns it back into the
/// RESP bytes a client would have received:
/// - `enc(r, null, user)`: an array is read up to its first `nil`, as Redis reads a script's
///   table; `false` becomes `null` (the nil bulk string unless given); a number of a command's
///   reply is printed exactly below 2^53 and as the double's own integer beyond (clamped to
///   ±2^63), of a user's script (`user`) as Redis converts it (a C cast: `string.format('%d')`).
/// - `run(first, last)`: run `ARGV[first..last]` as a command (`redis.pcall`) and encode its
///   reply as Redis would have sent it: a nil array (`*-1`) where the command answers one
///   (`LPOP`/`RPOP` with a count, `LMPOP`, `ZMPOP`, `XREAD`, `XREADGROUP`, `GEOPOS`), and
///   the exact new value of `INCR`, `DECR`, `INCRBY`, `DECRBY` and `HINCRBY` beyond ±2^53,
///   read back as the string the key holds; a `BITFIELD` with fields wider than 53 bits whose
///   reply has an integer beyond ±2^53 is answered exactly: the bytes of its fields were read
///   before it ran (`GETRANGE`), they are put back, and its operations run again one at a time,
///   each field's bits read (`GETRANGE`) and printed in decimal by the script — the data ends
///   as the command left it.
/// - `enc_error(e)`: an error caught by `pcall` (a string, or a table with `err`) as an error
///   reply.
const ENCODER: &str = r#"
local big = 9007199254740992
local function int_text(r, user)
  if user or (r > -big and r < big) then return string.format('%d', r) end
  if r >= 9223372036854775807 then return '9223372036854775807' end
  if r <= -9223372036854775808 then return '-9223372036854775808' end
  return string.format('%.0f', r)
end
local function enc(r, null, user)
  local t = type(r)
  if t == 'table' then
    if r.ok then return '+' .. r.ok .. '\r\n' end
    if r.err then return '-' .. r.err .. '\r\n' end
    local n = 0
    while r[n + 1] ~= nil do n = n + 1 end
    local parts = {'*' .. n .. '\r\n'}
    for i = 1, n do parts[#parts + 1] = enc(r[i], null, user) end
    return table.concat(parts)
  elseif t == 'number' then
    return ':' .. int_text(r, user) .. '\r\n'
  elseif t == 'string' then
    return '$' .. #r .. '\r\n' .. r .. '\r\n'
  elseif r == true then
    return ':1\r\n'
  end
  return null or '$-1\r\n'
end
local nil_arrays = {lmpop = 0, zmpop = 0, xread = 0, xreadgroup = 0, geopos = 0, lpop = 3, rpop = 3}
local exact_reads = {incr = 2, decr = 2, incrby = 2, decrby = 2, hincrby = 3}
local function bitfield_wide(first, last)
  local ops, j, wide, writes = {}, first + 2, false, false
  local sizes = {GET = 3, SET = 4, INCRBY = 4, OVERFLOW = 2}
  while j <= last do
    local word = string.upper(ARGV[j])
    local n = sizes[word]
    if not n or j + n - 1 > last then return nil end
    local op = {word = word, words = {unpack(ARGV, j, j + n - 1)}}
    if word ~= 'OVERFLOW' then
      local kind = ARGV[j + 1]
      local sign, bits = string.lower(string.sub(kind, 1, 1)), tonumber(string.sub(kind, 2))
      local at = ARGV[j + 2]
      local offset
      if string.sub(at, 1, 1) == '#' then
        offset = tonumber(string.sub(at, 2))
        if offset and bits then offset = offset * bits end
      else
        offset = tonumber(at)
      end
      if (sign ~= 'i' and sign ~= 'u') or not bits or not offset then return nil end
      if bits >= 54 then wide = true end
      if word ~= 'GET' then writes = true end
      op.signed, op.bits, op.offset = sign == 'i', bits, offset
      op.b0, op.b1 = math.floor(offset / 8), math.floor((offset + bits - 1) / 8)
      local ok, saved = pcall(redis.call, 'GETRANGE', ARGV[first + 1], op.b0, op.b1)
      if not ok then return nil end
      op.saved = saved
    end
    ops[#ops + 1] = op
    j = j + n
  end
  if not wide then return nil end
  return {ops = ops, writes = writes}
end
local function field_text(key, op)
  local bytes = redis.call('GETRANGE', key, op.b0, op.b1)
  local limbs = {0}
  local function add(double, carry)
    for k = 1, #limbs do
      local v = limbs[k] * double + carry
      limbs[k] = v % 10000000
      carry = math.floor(v / 10000000)
    end
    if carry > 0 then limbs[#limbs + 1] = carry end
  end
  local start, negative = op.offset - op.b0 * 8, false
  for k = 0, op.bits - 1 do
    local pos = start + k
    local byte = string.byte(bytes, math.floor(pos / 8) + 1) or 0
    local bit = math.floor(byte / 2 ^ (7 - pos % 8)) % 2
    if k == 0 and op.signed and bit == 1 then negative = true end
    if negative then bit = 1 - bit end
    add(2, bit)
  end
  if negative then add(1, 1) end
  local text = string.format('%d', limbs[#limbs])
  for k = #limbs - 1, 1, -1 do text = text .. string.format('%07d', limbs[k]) end
  if negative then text = '-' .. text end
  return text
end
local function bitfield_exact(key, wide)
  local ops = wide.ops
  if wide.writes then
    local len = redis.call('STRLEN', key)
    for k = #ops, 1, -1 do
      local op = ops[k]
      if op.b0 and op.b0 < len then
        local want = math.min(op.b1, len - 1) - op.b0 + 1
        local bytes = string.sub(op.saved .. string.rep('\0', want), 1, want)
        redis.call('SETRANGE', key, op.b0, bytes)
      end
    end
  end
  local overflow, parts, count = 'WRAP', {}, 0
  for k = 1, #ops do
    local op = ops[k]
    if op.word == 'OVERFLOW' then
      overflow = op.words[2]
    else
      count = count + 1
      local reply
      if op.word == 'GET' then
        reply = ':' .. field_text(key, op) .. '\r\n'
      else
        local before = field_text(key, op)
        local r = redis.call('BITFIELD', key, 'OVERFLOW', overflow, unpack(op.words))
        if not r[1] then
          reply = '$-1\r\n'
        elseif op.word == 'SET' then
          reply = ':' .. before .. '\r\n'
        else
          reply = ':' .. field_text(key, op) .. '\r\n'
        end
      end
      parts[#parts + 1] = reply
    end
  end
  return '*' .. count .. '\r\n' .. table.concat(parts)
end
local function beyond_doubles(r)
  for j = 1, #r do
    if type(r[j]) == 'number' and (r[j] >= big or r[j] <= -big) then return true end
  end
  return false
end
local function run(first, last)
  local name = string.lower(ARGV[first])
  local wide = nil
  if name == 'bitfield' then wide = bitfield_wide(first, last) end
  local r = redis.pcall(unpack(ARGV, first, last))
  if wide and type(r) == 'table' and not r.err and beyond_doubles(r) then
    return bitfield_exact(ARGV[first + 1], wide)
  end
  if type(r) == 'number' and (r >= big or r <= -big) then
    local words = exact_reads[name]
    if words == 2 then
      return ':' .. redis.call('GET', ARGV[first + 1]) .. '\r\n'
    elseif words == 3 then
      return ':' .. redis.call('HGET', ARGV[first + 1], ARGV[first + 2]) .. '\r\n'
    end
  end
  local rule = nil_arrays[name]
  if rule and last - first + 1 >= rule then return enc(r, '*-1\r\n') end
  return enc(r)
end
local function enc_error(e)
  local text
  if type(e) == 'table' and e.err then text = tostring(e.err) else text = tostring(e) end
  text = string.gsub(text, '[\r\n]', ' ')
  if not string.find(text, '^[A-Z][A-Z_]* ') then text = 'ERR ' .. text end
  return '-' .. text .. '\r\n'
end
"#;

/// What every script shares after the encoder: moving between the database of the records
/// and the user's (database 0), the reply ring, the redo check, recording a reply, and the
/// fingerprint of a watched key. `{RECORD_DB}` is replaced by the record database.
const PRELUDE: &str = r#"
local recdb = {RECORD_DB}
local ring = 64
local datadb = 0
local function use_db(db)
  datadb = tonumber(db)
  if datadb ~= 0 then redis.call('SELECT', datadb) end
end
local function at_records() if recdb ~= datadb then redis.call('SELECT', recdb) end end
local function at_data() if recdb ~= datadb then redis.call('SELECT', datadb) end end
local function redo(key, seq)
  at_records()
  local last = tonumber(redis.call('HGET', key, 'seq') or '0')
  local answer = nil
  if seq <= last then
    local stored = false
    if last - seq < ring then
      local slot = seq % ring
      local kept = redis.call('HMGET', key, 'e' .. slot, 's' .. slot, 'r' .. slot)
      local tag = tostring(seq) .. ' '
      if kept[1] and string.sub(kept[1], 1, #tag) == tag then
        stored = string.sub(kept[1], #tag + 1)
      elseif kept[2] == tostring(seq) then
        stored = kept[3]
      end
    end
    if stored then answer = {0, stored} else answer = {2, ''} end
  end
  at_data()
  return answer
end
local function passed(key, bound)
  at_records()
  local last = tonumber(redis.call('HGET', key, 'seq') or '0')
  at_data()
  return last >= bound
end
local function record(key, seq, ttl, reply)
  at_records()
  local slot = tonumber(seq) % ring
  redis.call('HSET', key, 'seq', seq, 'e' .. slot, seq .. ' ' .. reply)
  if tonumber(ttl) > 0 then redis.call('EXPIRE', key, ttl) end
  at_data()
end
local function call_user(fn, user_sha)
  local handler = nil
  pcall(function() handler = __redis__err__handler end)
  local ok, result
  if type(handler) == 'function' then
    ok, result = xpcall(fn, handler)
  else
    ok, result = pcall(fn)
  end
  if ok then return enc(result, nil, true) end
  if type(handler) == 'function' and type(result) == 'table' and result.err then
    local text = tostring(result.err)
    if user_sha ~= '' and result.source and result.line then
      text = text .. ' script: ' .. user_sha .. ', on ' .. result.source .. ':' .. result.line .. '.'
    end
    text = string.gsub(text, '[\r\n]', ' ')
    return '-' .. text .. '\r\n'
  end
  return enc_error(result)
end
local function fingerprint(key)
  local dump = redis.call('DUMP', key)
  if not dump then return '' end
  return redis.sha1hex(dump) .. ':' .. redis.call('PEXPIRETIME', key)
end
"#;

/// The update script. `KEYS[1]`: the session record; `ARGV[1]`: the sequence number;
/// `ARGV[2]`: seconds the record lives after this write (0: for ever); `ARGV[3]`: the database
/// the command runs in (the client's `SELECT`); `ARGV[4]`, the mode, and its words from
/// `ARGV[5]`:
/// - `c`: run the command in `ARGV[5..]`;
/// - `r`: record `ARGV[5]` as the reply and run nothing (no-op fills, refused commands);
/// - `x`: a transaction: `ARGV[5]` watched keys follow as (database, key, fingerprint), then the
///   number of commands, then each command as its word count and its words; if a watched key
///   changed the reply is the nil array and nothing runs, else every command runs (a failing
///   one gives its error in its place, as `EXEC` does) and the reply is the array of replies.
///   Besides commands, the elements the adaptor makes: `PMNET.REPLY <reply>` (that reply in its
///   place: a connection command the gateway answered), `PMNET.SELECT n` (`+OK`, and the
///   commands after it run in database `n`), `PMNET.SCRIPT r|w <sha> <code> <numkeys> keys…
///   args…` (a user's script, compiled now as Redis compiles it, `@user_script`, and run with
///   its own `KEYS` and `ARGV` — with `r`, through a `redis` table whose `call` and `pcall`
///   refuse commands Redis flags `write`, as Redis refuses them in a read-only script);
/// - `f`: `FLUSHALL` of every database but the records', `ARGV[5]` databases, `ARGV[6]` an
///   optional `ASYNC`/`SYNC`.
///
/// Returns `{status, reply}`.
const APPLY_BODY: &str = r#"
local function denies_writes(...)
  local count, words = select('#', ...), {...}
  if count == 0 then return false end
  for j = 1, count do
    local kind = type(words[j])
    -- Redis checks the arguments' types first: its own call gives that error.
    if kind ~= 'string' and kind ~= 'number' then return false end
  end
  local info = redis.call('COMMAND', 'INFO', tostring(words[1]))[1]
  if type(info) ~= 'table' then return false end
  if type(info[10]) == 'table' and #info[10] > 0 and words[2] then
    local full = string.lower(tostring(words[1]) .. '|' .. tostring(words[2]))
    info = redis.call('COMMAND', 'INFO', full)[1]
    if type(info) ~= 'table' then return false end
  end
  local arity = info[2]
  if (arity > 0 and count ~= arity) or (arity < 0 and count < -arity) then return false end
  local write = false
  for _, flag in ipairs(info[3]) do
    if flag.ok == 'noscript' then return false end
    if flag.ok == 'write' then write = true end
  end
  return write
end
local read_only_error = 'ERR Write commands are not allowed from read-only scripts.'
local function read_only_call(raise)
  return function(...)
    if denies_writes(...) then
      local e = {err = read_only_error}
      if raise then error(e) end
      return e
    end
    if raise then return redis.call(...) end
    return redis.pcall(...)
  end
end
local read_only_redis = setmetatable({}, {__index = function(t, k)
  if k == 'call' then return coroutine.wrap(read_only_call(true)) end
  if k == 'pcall' then return coroutine.wrap(read_only_call(false)) end
  return redis[k]
end})
local function run_script(first, last)
  local api = redis
  if ARGV[first] == 'r' then api = read_only_redis end
  local sha, code, nkeys = ARGV[first + 1], ARGV[first + 2], tonumber(ARGV[first + 3])
  local keys, args = {}, {}
  for j = 1, nkeys do keys[j] = ARGV[first + 3 + j] end
  for j = first + 4 + nkeys, last do args[#args + 1] = ARGV[j] end
  local fn, err = loadstring('local redis, KEYS, ARGV = ...; ' .. code, '@user_script')
  if not fn then
    return '-ERR Error compiling script (new function): ' .. string.gsub(tostring(err), '[\r\n]', ' ') .. '\r\n'
  end
  local reply = call_user(function() return fn(api, keys, args) end, sha)
  redis.call('SELECT', datadb)
  return reply
end
local function element(first, last)
  local name = ARGV[first]
  if name == 'PMNET.REPLY' then return ARGV[first + 1] end
  if name == 'PMNET.SELECT' then
    datadb = tonumber(ARGV[first + 1])
    redis.call('SELECT', datadb)
    return '+OK\r\n'
  end
  if name == 'PMNET.SCRIPT' then return run_script(first + 1, last) end
  return run(first, last)
end
local seq = tonumber(ARGV[1])
use_db(ARGV[3])
local answer = redo(KEYS[1], seq)
if answer then return answer end
local mode = ARGV[4]
local reply
if mode == 'c' then
  reply = run(5, #ARGV)
elseif mode == 'x' then
  local i = 6
  local intact = true
  for w = 1, tonumber(ARGV[5]) do
    local wdb = tonumber(ARGV[i])
    if wdb ~= datadb then redis.call('SELECT', wdb) end
    if fingerprint(ARGV[i + 1]) ~= ARGV[i + 2] then intact = false end
    if wdb ~= datadb then redis.call('SELECT', datadb) end
    i = i + 3
  end
  if intact then
    local count = tonumber(ARGV[i])
    i = i + 1
    local parts = {'*' .. count .. '\r\n'}
    for c = 1, count do
      local argc = tonumber(ARGV[i])
      parts[#parts + 1] = element(i + 1, i + argc)
      i = i + 1 + argc
    end
    reply = table.concat(parts)
  else
    reply = '*-1\r\n'
  end
elseif mode == 'f' then
  for db = 0, tonumber(ARGV[5]) - 1 do
    if db ~= recdb then
      redis.call('SELECT', db)
      if ARGV[6] then redis.call('FLUSHDB', ARGV[6]) else redis.call('FLUSHDB') end
    end
  end
  redis.call('SELECT', datadb)
  reply = '+OK\r\n'
else
  reply = ARGV[5] or ''
end
record(KEYS[1], ARGV[1], ARGV[2], reply)
return {1, reply}
"#;

/// The group script: several requests' commands (of one session or several) in one script
/// call, each exactly as the update script's mode `c` runs it, in order. `KEYS[i]`: the record
/// of request `i`; `ARGV[1]`: the record's TTL; then, for each request, its sequence number,
/// its database, its word count and its words. Returns one `{status, reply}` per request.
const APPLY_GROUP_BODY: &str = r#"
local ttl = ARGV[1]
local out = {}
local i = 2
for e = 1, #KEYS do
  local seq = tonumber(ARGV[i])
  use_db(ARGV[i + 1])
  local last = i + 2 + tonumber(ARGV[i + 2])
  local answer = redo(KEYS[e], seq)
  if answer then
    out[e] = answer
  else
    local reply = run(i + 3, last)
    record(KEYS[e], ARGV[i], ttl, reply)
    out[e] = {1, reply}
  end
  i = last + 1
end
return out
"#;

/// The checked read, used only when a read is resent after a lost connection while a later
/// request of its session may have been applied. `KEYS[1]`: the session record; `ARGV[1]`:
/// the sequence number of that later request; `ARGV[2]`: the database; `ARGV[3..]`: the
/// command. Runs the read only if the session has not reached `ARGV[1]` (so it still sees the
/// state of its place in the sequence). Writes nothing.
const CHECKED_READ_BODY: &str = r#"
use_db(ARGV[2])
if passed(KEYS[1], tonumber(ARGV[1])) then return {2, ''} end
return {1, run(3, #ARGV)}
"#;

/// The fingerprints of watched keys (`WATCH` through the gateway): `KEYS[1]`: the session
/// record; `ARGV[1]`: 0, or the bound of a checked read (as above); `ARGV[2]`: the database;
/// `ARGV[3..]`: the keys. A key's fingerprint is the SHA-1 of its serialized value and its
/// expiry time, or empty when it does not exist; the reply is the array of them, as bulk
/// strings. Writes nothing.
const WATCH_BODY: &str = r#"
local bound = tonumber(ARGV[1])
use_db(ARGV[2])
if bound > 0 and passed(KEYS[1], bound) then return {2, ''} end
local parts = {'*' .. (#ARGV - 2) .. '\r\n'}
for i = 3, #ARGV do
  local print = fingerprint(ARGV[i])
  parts[#parts + 1] = '$' .. #print .. '\r\n' .. print .. '\r\n'
end
return {1, table.concat(parts)}
"#;

/// The exactly-once wrapper of a user's script (`EVAL`/`EVALSHA` through the gateway): the
/// user's code starts on the wrapper's first line, as a function of its own `KEYS` and `ARGV`
/// ([`USER_SCRIPT_HEAD`]), so that Redis names the lines of the user's code as it would (in
/// compile errors and runtime errors alike); this body follows, with the user script's SHA-1
/// (or nothing) in place of `{USER_SHA}`. `KEYS[1]` is the session record and `KEYS[2..]` the
/// user's keys; `ARGV[1]` the sequence number, `ARGV[2]` the record's TTL, `ARGV[3]` the
/// database, `ARGV[4..]` the user's arguments. The user's function runs under Redis's own error handler
/// (`__redis__err__handler`, which notes where an error was raised) when Redis has one, and its
/// result, or its error in the form Redis gives a failed script (`… script: <sha>, on
/// @user_script:<line>.`), becomes the recorded reply, in the same atomic script call.
const USER_SCRIPT_BODY: &str = r#"
local user_sha = '{USER_SHA}'
local seq = tonumber(ARGV[1])
use_db(ARGV[3])
local answer = redo(KEYS[1], seq)
if answer then return answer end
local keys, args = {}, {}
for i = 2, #KEYS do keys[i - 1] = KEYS[i] end
for i = 4, #ARGV do args[i - 3] = ARGV[i] end
local reply = call_user(function() return user_script(keys, args) end, user_sha)
record(KEYS[1], ARGV[1], ARGV[2], reply)
return {1, reply}
"#;

/// The first line of a user script's wrapper: the user's code follows on the same line.
const USER_SCRIPT_HEAD: &str = "local user_script = function(KEYS, ARGV) ";

fn with_prelude(record_db: u32, body: &str) -> String {
    let prelude = PRELUDE.replace("{RECORD_DB}", &record_db.to_string());
    format!("{ENCODER}{prelude}{body}")
}

/// The full text of the update script, for records in database `record_db`.
pub fn apply_script(record_db: u32) -> String {
    with_prelude(record_db, APPLY_BODY)
}

/// The full text of the group script.
pub fn apply_group_script(record_db: u32) -> String {
    with_prelude(record_db, APPLY_GROUP_BODY)
}

/// The full text of the checked-read script.
pub fn checked_read_script(record_db: u32) -> String {
    with_prelude(record_db, CHECKED_READ_BODY)
}

/// The full text of the watch script.
pub fn watch_script(record_db: u32) -> String {
    with_prelude(record_db, WATCH_BODY)
}

/// A user's script without its first line if that is a shebang (`#!lua flags=…`), and
/// whether the shebang declares it read-only (`no-writes`).
pub fn strip_shebang(body: &[u8]) -> (&[u8], bool) {
    if !body.starts_with(b"#!") {
        return (body, false);
    }
    let end = body.iter().position(|&b| b == b'\n').unwrap_or(body.len());
    let line = &body[..end];
    let no_writes = line
        .windows(b"no-writes".len())
        .any(|window| window == b"no-writes");
    (&body[end.min(body.len())..], no_writes)
}

/// The exactly-once wrapper around a user's script body (shebang already stripped, its line
/// kept); `sha` (the SHA-1 of the script as the user gave it) names the script in its error
/// replies, as Redis names it, or is empty for none.
pub fn user_script(record_db: u32, user_body: &[u8], sha: &str) -> Vec<u8> {
    let sha: String = sha.chars().filter(char::is_ascii_hexdigit).collect();
    let rest = with_prelude(record_db, USER_SCRIPT_BODY).replace("{USER_SHA}", &sha);
    let mut out = Vec::with_capacity(USER_SCRIPT_HEAD.len() + user_body.len() + rest.len() + 8);
    out.extend_from_slice(USER_SCRIPT_HEAD.as_bytes());
    out.extend_from_slice(user_body);
    // A last line that is a comment must not swallow the `end` that follows.
    out.extend_from_slice(b"\nend\n");
    out.extend_from_slice(rest.as_bytes());
    out
}

/// What a function library's code runs with in place of Redis's `redis` table: the same
/// table, but `register_function` (both its forms) files the callback by name instead of
/// registering it, so the function can then be called inside the exactly-once wrapper.
const FUNCTION_SHIM: &str = r#"
local registered = {}
local redis = setmetatable({
  register_function = function(name, callback)
    if type(name) == 'table' then registered[name.function_name] = name.callback
    else registered[name] = callback end
  end
}, {__index = redis})
"#;

/// Whether `name` can be a Redis function's name (letters, digits and underscores), and so
/// be written into a script as it is.
pub fn is_function_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The exactly-once wrapper that calls `function` of a library (`FCALL` through the gateway):
/// the library's code (its `#!lua name=…` line stripped) runs with [`FUNCTION_SHIM`], then the
/// function is called with the request's keys and arguments, inside [`user_script`]'s wrapper.
/// `function` must pass [`is_function_name`].
pub fn function_script(record_db: u32, library_code: &[u8], function: &str) -> Vec<u8> {
    assert!(is_function_name(function), "function name {function:?}");
    let (code, _) = strip_shebang(library_code);
    let mut body = Vec::with_capacity(FUNCTION_SHIM.len() + code.len() + 64);
    body.extend_from_slice(FUNCTION_SHIM.as_bytes());
    body.extend_from_slice(code);
    body.extend_from_slice(format!("\nreturn registered['{function}'](KEYS, ARGV)").as_bytes());
    user_script(record_db, &body, "")
}

/// The SHA-1 of a script, in lower-case hex: the name Redis gives it (`EVALSHA`).
pub fn script_sha(body: &[u8]) -> String {
    sha1_smol::Sha1::from(body).digest().to_string()
}

/// The record key of a session.
pub fn record_key(prefix: &str, session_id: u64) -> Vec<u8> {
    format!("{prefix}{session_id:016x}").into_bytes()
}

/// The session id in a record key, if the key is one.
pub fn session_of_key(prefix: &str, key: &[u8]) -> Option<u64> {
    let suffix = key.strip_prefix(prefix.as_bytes())?;
    if suffix.len() != 16 {
        return None;
    }
    let text = std::str::from_utf8(suffix).ok()?;
    u64::from_str_radix(text, 16).ok()
}

/// The hash field of request `seq`'s entry in its session's record: `e<seq mod 64>`, whose
/// value is [`entry_value`] (the request's number, a space, its reply).
pub fn entry_field(seq: u32) -> String {
    format!("e{}", seq % REPLY_RING)
}

/// The value of request `seq`'s entry: its number in decimal, a space, its reply (RESP).
pub fn entry_value(seq: u32, reply: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(11 + reply.len());
    value.extend_from_slice(seq.to_string().as_bytes());
    value.push(b' ');
    value.extend_from_slice(reply);
    value
}

/// The reply an entry's value holds, if it is request `seq`'s (the slot is shared with the
/// requests 64, 128, … before and after it).
pub fn entry_reply(value: &[u8], seq: u32) -> Option<&[u8]> {
    let tag = seq.to_string();
    value.strip_prefix(tag.as_bytes())?.strip_prefix(b" ")
}

/// The field of the reply of request `seq` in records of the earlier layout (a reply and its
/// number in two fields, `r<i>` and `s<i>`), still read so that records written by an earlier
/// version keep answering resent requests.
pub fn legacy_reply_field(seq: u32) -> String {
    format!("r{}", seq % REPLY_RING)
}

/// The field of the number of the request whose reply is in [`legacy_reply_field`].
pub fn legacy_reply_seq_field(seq: u32) -> String {
    format!("s{}", seq % REPLY_RING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_round_trip() {
        let key = record_key(DEFAULT_RECORD_PREFIX, 0xAB);
        assert_eq!(key, b"pmnet:session:00000000000000ab");
        assert_eq!(session_of_key(DEFAULT_RECORD_PREFIX, &key), Some(0xAB));
        assert_eq!(
            session_of_key(DEFAULT_RECORD_PREFIX, b"pmnet:session:xyz"),
            None
        );
        assert_eq!(session_of_key(DEFAULT_RECORD_PREFIX, b"other"), None);
        assert_eq!(legacy_reply_field(65), "r1");
        assert_eq!(entry_field(65), "e1");
        assert_eq!(
            entry_reply(&entry_value(65, b"+OK\r\n"), 65),
            Some(&b"+OK\r\n"[..])
        );
        assert_eq!(entry_reply(&entry_value(65, b"+OK\r\n"), 1), None);
        assert_eq!(entry_reply(&entry_value(165, b":1\r\n"), 16), None);
    }

    #[test]
    fn the_ring_in_the_script_matches_the_constant() {
        assert!(apply_script(1).contains(&format!("local ring = {REPLY_RING}")));
        assert!(apply_script(3).contains("local recdb = 3"));
    }

    #[test]
    fn shebangs_are_stripped_and_read_only_scripts_recognised() {
        assert_eq!(strip_shebang(b"return 1"), (&b"return 1"[..], false));
        assert_eq!(
            strip_shebang(b"#!lua flags=no-writes\nreturn 1"),
            (&b"\nreturn 1"[..], true)
        );
        assert_eq!(
            strip_shebang(b"#!lua\nreturn 1"),
            (&b"\nreturn 1"[..], false)
        );
        assert_eq!(strip_shebang(b"#!lua"), (&b""[..], false));
    }

    #[test]
    fn a_user_script_is_wrapped_whole_and_named_as_redis_names_it() {
        let wrapped = user_script(1, b"return ARGV[1] -- last line", "abc123");
        let text = String::from_utf8(wrapped).unwrap();
        // The user's code is on the first line, as Redis numbers it.
        assert!(text.starts_with(&format!(
            "{USER_SCRIPT_HEAD}return ARGV[1] -- last line\nend\n"
        )));
        assert!(text.contains("local user_sha = 'abc123'"));
        assert!(!text.contains("{USER_SHA}"));
        // Redis's SCRIPT LOAD of "return 1" answers this name.
        assert_eq!(
            script_sha(b"return 1"),
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
    }

    #[test]
    fn a_function_is_called_from_its_library_in_the_wrapper() {
        let library =
            b"#!lua name=lib\nredis.register_function('f', function(keys, args) return 1 end)";
        let text = String::from_utf8(function_script(1, library, "f")).unwrap();
        assert!(!text.contains("#!lua"));
        assert!(text.contains("redis.register_function('f'"));
        assert!(text.contains("return registered['f'](KEYS, ARGV)"));
        assert!(is_function_name("my_func2"));
        assert!(!is_function_name("f']; os.exit() --"));
        assert!(!is_function_name(""));
    }
}

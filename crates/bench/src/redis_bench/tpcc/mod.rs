//! A TPC-C-like workload over Redis hashes and strings: warehouses (`ceil(clients / 10)`), 10
//! districts each, customers per district, items and each warehouse's stock. Each client has
//! a home warehouse and picks districts and customers uniformly.
//!
//! - **New-Order** (45 %): takes the district's lock (`SET lock NX PX 5000`, retried with
//!   backoff; through the gateway a bypass request, ordered after the connection's updates),
//!   reads the district's next order id, the customer and the items' prices, updates the stock
//!   in one `EVAL` (TPC-C's rule: quantity − ordered, plus 91 below 10), writes the district's
//!   next id (`SET`), the order (`SET`), its 5-15 lines (one `MSET`) and the customer's last
//!   order (`SET`), and releases the lock with a compare-and-delete `EVAL`.
//! - **Payment** (43 %): reads the customer, adds the amount to the warehouse's, district's and
//!   customer's totals in one `MULTI`/`EXEC` of `HINCRBY`s, writes a history record (`SET`).
//! - **Order-Status** (12 %): reads the customer, its last order and the order's lines.
//!
//! The records written whole (next ids, orders, lines, last orders, history) are strings
//! written with `SET`/`MSET`, which Redis answers `OK` whatever the data holds: through the
//! gateway they are updates the device acks. Hashes updated in place (`HINCRBY`) and `HMSET`,
//! which Redis may refuse (`WRONGTYPE`), go to Redis as bypass requests.
//!
//! What must hold: each district's order ids are dense, 1 to `next_o_id − 1`, as many as its
//! New-Orders committed (two clients given the same id would leave fewer: the locks ordered
//! them across connections); the totals equal the amounts paid; every order a customer names
//! is stored with its lines; stock stays in TPC-C's range; no lock is lost or left held.

mod check;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pmnet_redis::resp::{SyncClient, Value};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::conn::{as_array, as_int, command, ClientOps, Conn, OpError, OpKind};
use super::workloads::{batched, client_rng, filler, spread, Check, Params, Workload};

const DISTRICTS: u32 = 10;
/// A lock's lease: far above a New-Order's time, so that a held lock never expires.
const LOCK_LEASE_MS: &str = "5000";
/// How long a New-Order tries to take its district's lock before it fails.
const LOCK_PATIENCE: Duration = Duration::from_secs(30);
/// Orders whose ids and lines the check reads, at most (the newest of each district).
const CHECKED_ORDERS: u64 = 200_000;
/// Customers whose payment counts the check adds up, at most (else that check is skipped).
const CHECKED_CUSTOMERS: u64 = 200_000;
const TAG: u64 = 0x7bcc;

const STOCK_SCRIPT: &str = "for i, key in ipairs(KEYS) do \
    local q = tonumber(redis.call('GET', key)) \
    local n = tonumber(ARGV[i]) \
    if q >= n + 10 then q = q - n else q = q - n + 91 end \
    redis.call('SET', key, q) \
  end \
  return #KEYS";

const UNLOCK_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('DEL', KEYS[1]) else return 0 end";

fn warehouse_key(w: u32) -> String {
    format!("tpcc:w:{w}")
}
fn district_key(w: u32, d: u32) -> String {
    format!("tpcc:d:{w}:{d}")
}
/// The district's next order id, a string.
fn next_id_key(w: u32, d: u32) -> String {
    format!("tpcc:d:{w}:{d}:next_o_id")
}
fn customer_key(w: u32, d: u32, c: u64) -> String {
    format!("tpcc:c:{w}:{d}:{c}")
}
/// The customer's last order id, a string.
fn last_order_key(w: u32, d: u32, c: u64) -> String {
    format!("tpcc:c:{w}:{d}:{c}:last_o_id")
}
fn item_key(i: u64) -> String {
    format!("tpcc:i:{i}")
}
fn stock_key(w: u32, i: u64) -> String {
    format!("tpcc:s:{w}:{i}")
}
fn order_key(w: u32, d: u32, o: i64) -> String {
    format!("tpcc:o:{w}:{d}:{o}")
}
fn line_key(w: u32, d: u32, o: i64, n: i64) -> String {
    format!("tpcc:ol:{w}:{d}:{o}:{n}")
}
fn lock_key(w: u32, d: u32) -> String {
    format!("tpcc:lock:d:{w}:{d}")
}

pub struct Tpcc {
    params: Params,
    warehouses: u32,
    items: u64,
    /// Customers per district.
    customers: u64,
    /// New-Orders committed, per district (index `(w − 1) * 10 + d − 1`).
    new_orders: Vec<AtomicU64>,
    /// Cents paid, per district.
    paid: Vec<AtomicU64>,
    payments: AtomicU64,
    order_status: AtomicU64,
    lock_retries: AtomicU64,
    lock_lost: AtomicU64,
    dangling: AtomicU64,
}

impl Tpcc {
    pub fn new(params: &Params) -> Tpcc {
        let warehouses = params.clients.div_ceil(10).max(1);
        let districts = (warehouses * DISTRICTS) as usize;
        Tpcc {
            params: *params,
            warehouses,
            items: params.records.clamp(100, 100_000),
            customers: (params.records / u64::from(warehouses * DISTRICTS)).clamp(10, 3000),
            new_orders: (0..districts).map(|_| AtomicU64::new(0)).collect(),
            paid: (0..districts).map(|_| AtomicU64::new(0)).collect(),
            payments: AtomicU64::new(0),
            order_status: AtomicU64::new(0),
            lock_retries: AtomicU64::new(0),
            lock_lost: AtomicU64::new(0),
            dangling: AtomicU64::new(0),
        }
    }

    fn district_index(w: u32, d: u32) -> usize {
        ((w - 1) * DISTRICTS + d - 1) as usize
    }

    fn districts(&self) -> impl Iterator<Item = (u32, u32)> {
        let warehouses = self.warehouses;
        (1..=warehouses).flat_map(|w| (1..=DISTRICTS).map(move |d| (w, d)))
    }
}

struct TpccClient<'a> {
    workload: &'a Tpcc,
    rng: ChaCha8Rng,
    home: u32,
    /// `client-round`: this client's lock tokens and history keys start with it.
    name: String,
    serial: u64,
}

/// A record written as one string: `name=value` fields separated by `,`.
fn record(fields: &[(&str, String)]) -> String {
    let fields: Vec<String> = fields
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    fields.join(",")
}

/// A record's integer field.
fn record_field(record: &[u8], name: &str) -> Option<i64> {
    std::str::from_utf8(record)
        .ok()?
        .split(',')
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))?
        .parse()
        .ok()
}

fn ok(reply: &Value, what: &str) -> Result<(), OpError> {
    match reply {
        Value::Simple(text) if text == b"OK" => Ok(()),
        other => Err(OpError::Reply(format!("{what} answered {other:?}"))),
    }
}

impl TpccClient<'_> {
    fn now_micros() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64)
    }

    fn lock(&mut self, conn: &mut Conn, key: &str, token: &str) -> Result<(), OpError> {
        let started = Instant::now();
        let mut backoff = Duration::from_micros(50);
        loop {
            match conn.cmd(command!["SET", key, token, "NX", "PX", LOCK_LEASE_MS])? {
                Value::Simple(text) if text == b"OK" => return Ok(()),
                Value::Bulk(None) => {}
                other => return Err(OpError::Reply(format!("SET NX answered {other:?}"))),
            }
            self.workload.lock_retries.fetch_add(1, Ordering::Relaxed);
            if started.elapsed() > LOCK_PATIENCE {
                return Err(OpError::Reply(format!(
                    "{key} not acquired in {} s",
                    LOCK_PATIENCE.as_secs()
                )));
            }
            let jitter = self.rng.random_range(0..=backoff.as_micros() as u64);
            std::thread::sleep(backoff + Duration::from_micros(jitter));
            backoff = (backoff * 2).min(Duration::from_millis(2));
        }
    }

    fn new_order(&mut self, conn: &mut Conn) -> Result<OpKind, OpError> {
        let (w, d) = (self.home, self.rng.random_range(1..=DISTRICTS));
        let lock = lock_key(w, d);
        self.serial += 1;
        let token = format!("{}-{}", self.name, self.serial);
        self.lock(conn, &lock, &token)?;
        let result = self.new_order_locked(conn, w, d);
        let released = conn.cmd(command!["EVAL", UNLOCK_SCRIPT, "1", &lock, &token]);
        result?;
        if as_int(&released?) != Some(1) {
            self.workload.lock_lost.fetch_add(1, Ordering::Relaxed);
            return Err(OpError::Invariant(format!(
                "{lock} was no longer held at release"
            )));
        }
        self.workload.new_orders[Tpcc::district_index(w, d)].fetch_add(1, Ordering::Relaxed);
        Ok(OpKind::Update)
    }

    fn new_order_locked(&mut self, conn: &mut Conn, w: u32, d: u32) -> Result<(), OpError> {
        let workload = self.workload;
        let c = self.rng.random_range(1..=workload.customers);
        let lines = self.rng.random_range(5..=15usize);
        let mut items: Vec<u64> = Vec::with_capacity(lines);
        while items.len() < lines {
            let item = self.rng.random_range(1..=workload.items);
            if !items.contains(&item) {
                items.push(item);
            }
        }
        let quantities: Vec<u64> = (0..lines).map(|_| self.rng.random_range(1..=10)).collect();
        let district = conn.pipeline(vec![
            command!["GET", next_id_key(w, d)],
            command!["HGET", district_key(w, d), "tax"],
        ])?;
        let o_id = district
            .first()
            .and_then(as_int)
            .ok_or_else(|| OpError::Reply(format!("district {w}/{d} has no next_o_id")))?;
        conn.pipeline(vec![
            command!["HMGET", customer_key(w, d, c), "discount"],
            command!["GET", last_order_key(w, d, c)],
        ])?;
        let mut mget = command!["MGET"];
        mget.extend(items.iter().map(|&item| item_key(item).into_bytes()));
        let prices = as_array(conn.cmd(mget)?)?;
        let mut eval = command!["EVAL", STOCK_SCRIPT, lines];
        eval.extend(items.iter().map(|&item| stock_key(w, item).into_bytes()));
        eval.extend(quantities.iter().map(|q| q.to_string().into_bytes()));
        conn.cmd(eval)?;
        ok(
            &conn.cmd(command!["SET", next_id_key(w, d), o_id + 1])?,
            "SET next_o_id",
        )?;
        let mut total = 0i64;
        let mut mset = command!["MSET"];
        for (n, ((item, quantity), price)) in items.iter().zip(&quantities).zip(&prices).enumerate()
        {
            let price = as_int(price)
                .ok_or_else(|| OpError::Reply(format!("item {item} has no price: {price:?}")))?;
            let amount = price * *quantity as i64;
            total += amount;
            mset.push(line_key(w, d, o_id, n as i64 + 1).into_bytes());
            mset.push(
                record(&[
                    ("i_id", item.to_string()),
                    ("quantity", quantity.to_string()),
                    ("amount", amount.to_string()),
                    ("dist_info", "abcdefghijklmnopqrstuvwx".to_owned()),
                ])
                .into_bytes(),
            );
        }
        let order = record(&[
            ("o_id", o_id.to_string()),
            ("c_id", c.to_string()),
            ("ol_cnt", lines.to_string()),
            ("entry_d", Self::now_micros().to_string()),
            ("total", total.to_string()),
        ]);
        ok(
            &conn.cmd(command!["SET", order_key(w, d, o_id), order])?,
            "SET order",
        )?;
        ok(&conn.cmd(mset)?, "MSET order lines")?;
        ok(
            &conn.cmd(command!["SET", last_order_key(w, d, c), o_id])?,
            "SET last order",
        )
    }

    fn payment(&mut self, conn: &mut Conn) -> Result<OpKind, OpError> {
        let workload = self.workload;
        let (w, d) = (self.home, self.rng.random_range(1..=DISTRICTS));
        let c = self.rng.random_range(1..=workload.customers);
        let cents: u64 = self.rng.random_range(100..=500_000);
        let customer = customer_key(w, d, c);
        conn.cmd(command![
            "HMGET",
            &customer,
            "balance",
            "payment_cnt",
            "data"
        ])?;
        conn.transaction(vec![
            command!["HINCRBY", warehouse_key(w), "ytd", cents],
            command!["HINCRBY", district_key(w, d), "ytd", cents],
            command!["HINCRBY", &customer, "balance", -(cents as i64)],
            command!["HINCRBY", &customer, "ytd_payment", cents],
            command!["HINCRBY", &customer, "payment_cnt", "1"],
        ])?;
        self.serial += 1;
        let history = record(&[
            ("c", customer),
            ("amount", cents.to_string()),
            ("date", Self::now_micros().to_string()),
            (
                "data",
                String::from_utf8_lossy(&filler(workload.params.payload)).into_owned(),
            ),
        ]);
        ok(
            &conn.cmd(command![
                "SET",
                format!("tpcc:h:{}-{}", self.name, self.serial),
                history
            ])?,
            "SET history",
        )?;
        workload.paid[Tpcc::district_index(w, d)].fetch_add(cents, Ordering::Relaxed);
        workload.payments.fetch_add(1, Ordering::Relaxed);
        Ok(OpKind::Update)
    }

    fn order_status(&mut self, conn: &mut Conn) -> Result<OpKind, OpError> {
        let workload = self.workload;
        let (w, d) = (self.home, self.rng.random_range(1..=DISTRICTS));
        let c = self.rng.random_range(1..=workload.customers);
        let customer = conn.pipeline(vec![
            command!["HGET", customer_key(w, d, c), "balance"],
            command!["GET", last_order_key(w, d, c)],
        ])?;
        let last = customer.get(1).and_then(as_int).unwrap_or(0);
        if last > 0 {
            let order = conn.cmd(command!["GET", order_key(w, d, last)])?;
            let ol_cnt = order
                .as_bytes()
                .and_then(|order| record_field(order, "ol_cnt"));
            let Some(ol_cnt) = ol_cnt.filter(|&n| (1..=15).contains(&n)) else {
                workload.dangling.fetch_add(1, Ordering::Relaxed);
                return Err(OpError::Invariant(format!(
                    "customer {w}/{d}/{c} names order {last}, which is not stored"
                )));
            };
            let mut mget = command!["MGET"];
            mget.extend((1..=ol_cnt).map(|n| line_key(w, d, last, n).into_bytes()));
            if as_array(conn.cmd(mget)?)?
                .iter()
                .any(|line| line.as_bytes().is_none())
            {
                workload.dangling.fetch_add(1, Ordering::Relaxed);
                return Err(OpError::Invariant(format!(
                    "order {w}/{d}/{last} misses order lines"
                )));
            }
        }
        workload.order_status.fetch_add(1, Ordering::Relaxed);
        Ok(OpKind::Read)
    }
}

impl ClientOps for TpccClient<'_> {
    fn op(&mut self, conn: &mut Conn) -> Result<OpKind, OpError> {
        let pick: f64 = self.rng.random();
        if pick < 0.45 {
            self.new_order(conn)
        } else if pick < 0.88 {
            self.payment(conn)
        } else {
            self.order_status(conn)
        }
    }
}

impl Workload for Tpcc {
    fn load(&self, redis: &mut SyncClient) -> Result<(), String> {
        let mut rng = client_rng(self.params.seed, TAG, u32::MAX, 0);
        let data = filler(self.params.payload);
        let mut commands = Vec::new();
        for i in 1..=self.items {
            commands.push(command![
                "SET",
                item_key(i),
                rng.random_range(100..=10_000u64)
            ]);
        }
        for w in 1..=self.warehouses {
            commands.push(command![
                "HMSET",
                warehouse_key(w),
                "ytd",
                "0",
                "tax",
                "0.1"
            ]);
            for i in 1..=self.items {
                commands.push(command![
                    "SET",
                    stock_key(w, i),
                    rng.random_range(10..=100u64)
                ]);
            }
        }
        for (w, d) in self.districts() {
            commands.push(command![
                "HMSET",
                district_key(w, d),
                "ytd",
                "0",
                "tax",
                "0.05"
            ]);
            commands.push(command!["SET", next_id_key(w, d), "1"]);
            for c in 1..=self.customers {
                commands.push(command![
                    "HMSET",
                    customer_key(w, d, c),
                    "balance",
                    "0",
                    "ytd_payment",
                    "0",
                    "payment_cnt",
                    "0",
                    "discount",
                    "0.1",
                    "data",
                    &data
                ]);
                commands.push(command!["SET", last_order_key(w, d, c), "0"]);
            }
        }
        batched(redis, commands).map(|_| ())
    }

    fn client(&self, index: u32, round: u32) -> Box<dyn ClientOps + '_> {
        Box::new(TpccClient {
            workload: self,
            rng: client_rng(self.params.seed, TAG, index, round),
            home: index % self.warehouses + 1,
            name: format!("{index}-{round}"),
            serial: 0,
        })
    }

    fn check(&self, redis: &mut SyncClient) -> Check {
        let mut check = Check::new();
        if let Err(error) = self.check_state(redis, &mut check) {
            check.fail(error);
        }
        for (name, counter, what) in [
            (
                "lock_lost",
                &self.lock_lost,
                "New-Orders found their lock gone at release",
            ),
            (
                "dangling",
                &self.dangling,
                "Order-Status reads found a named order missing",
            ),
        ] {
            let count = counter.load(Ordering::Relaxed);
            check.expect(count == 0, format!("{name}: 0"), format!("{count} {what}"));
        }
        check
    }

    fn sample_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = (1..=self.warehouses).map(warehouse_key).collect();
        for (w, d) in self.districts() {
            keys.push(district_key(w, d));
            keys.push(next_id_key(w, d));
            keys.push(order_key(w, d, 1));
            keys.push(line_key(w, d, 1, 1));
            keys.push(customer_key(w, d, 1));
            keys.push(last_order_key(w, d, 1));
        }
        keys.extend(
            spread(self.items, 20)
                .into_iter()
                .map(|i| stock_key(1, i + 1)),
        );
        keys
    }

    fn counters(&self) -> BTreeMap<String, u64> {
        let sum = |all: &[AtomicU64]| all.iter().map(|n| n.load(Ordering::Relaxed)).sum::<u64>();
        BTreeMap::from([
            ("new_orders".to_owned(), sum(&self.new_orders)),
            ("payments".to_owned(), self.payments.load(Ordering::Relaxed)),
            (
                "order_status".to_owned(),
                self.order_status.load(Ordering::Relaxed),
            ),
            (
                "lock_retries".to_owned(),
                self.lock_retries.load(Ordering::Relaxed),
            ),
            (
                "lock_lost".to_owned(),
                self.lock_lost.load(Ordering::Relaxed),
            ),
            ("dangling".to_owned(), self.dangling.load(Ordering::Relaxed)),
            ("warehouses".to_owned(), u64::from(self.warehouses)),
            ("districts".to_owned(), self.new_orders.len() as u64),
        ])
    }
}

//! A retwis-like Twitter clone over Redis structures. Users have follower and following sets;
//! a post takes an id (`INCR`), stores the post (`HMSET`) and pushes its id onto the author's
//! and up to [`FANOUT`] followers' timelines (`LPUSH` + `LTRIM`, in one `MULTI`/`EXEC`); a
//! follow adds both set members; a timeline read takes the newest 10 ids and each post.
//!
//! Mix: 50 % timeline, 40 % post, 10 % follow; users drawn uniformly.
//!
//! What must hold: a post id seen on a timeline names a stored post (its `HMSET` was sent
//! before its `LPUSH`es on the author's connection, so Redis applied it first), ids are dense
//! (`tw:next_post` is the load's posts plus every id taken), timelines are trimmed, and
//! following and followers agree.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use pmnet_redis::resp::{SyncClient, Value};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::conn::{as_array, as_int, command, ClientOps, Conn, OpError, OpKind};
use super::workloads::{batched, client_rng, filler, int_of, spread, Check, Params, Workload};

/// Followers a post is pushed to at most (`SRANDMEMBER followers 10`).
pub const FANOUT: usize = 10;
/// Ids a timeline keeps.
const TIMELINE_LEN: usize = 100;
/// Users each user follows in the loaded graph.
const INITIAL_FOLLOWS: u64 = 5;
/// Posts whose existence the check reads one by one, at most (the newest).
const CHECKED_POSTS: u64 = 200_000;
/// Users whose timelines and sets the check reads.
const CHECKED_USERS: u64 = 300;
const TAG: u64 = 0x7717;

const NEXT_POST: &str = "tw:next_post";

fn post_key(id: u64) -> String {
    format!("tw:post:{id}")
}
fn timeline_key(user: u64) -> String {
    format!("tw:timeline:{user}")
}
fn posts_key(user: u64) -> String {
    format!("tw:posts:{user}")
}
fn followers_key(user: u64) -> String {
    format!("tw:followers:{user}")
}
fn following_key(user: u64) -> String {
    format!("tw:following:{user}")
}

pub struct Twitter {
    params: Params,
    users: u64,
    /// Ids taken by `INCR` (each a post stored, unless the op failed after it).
    ids_taken: AtomicU64,
    posts: AtomicU64,
    follows: AtomicU64,
    timelines: AtomicU64,
    dangling: AtomicU64,
}

impl Twitter {
    pub fn new(params: &Params) -> Twitter {
        Twitter {
            params: *params,
            users: (params.records / 10).max(10),
            ids_taken: AtomicU64::new(0),
            posts: AtomicU64::new(0),
            follows: AtomicU64::new(0),
            timelines: AtomicU64::new(0),
            dangling: AtomicU64::new(0),
        }
    }
}

struct TwitterClient<'a> {
    workload: &'a Twitter,
    rng: ChaCha8Rng,
}

fn ids_of(reply: Value) -> Result<Vec<u64>, OpError> {
    as_array(reply)?
        .iter()
        .map(|item| {
            as_int(item)
                .and_then(|id| u64::try_from(id).ok())
                .ok_or_else(|| OpError::Reply(format!("not a post id: {item:?}")))
        })
        .collect()
}

impl TwitterClient<'_> {
    fn timeline(&mut self, conn: &mut Conn, user: u64) -> Result<OpKind, OpError> {
        let ids = ids_of(conn.cmd(command!["LRANGE", timeline_key(user), "0", "9"])?)?;
        if !ids.is_empty() {
            let reads = ids
                .iter()
                .map(|&id| command!["HMGET", post_key(id), "author", "time", "body"])
                .collect();
            let posts = conn.pipeline(reads)?;
            for (id, post) in ids.iter().zip(posts) {
                let fields = as_array(post)?;
                if fields
                    .first()
                    .is_none_or(|author| author == &Value::Bulk(None))
                {
                    self.workload.dangling.fetch_add(1, Ordering::Relaxed);
                    return Err(OpError::Invariant(format!(
                        "post {id} is on timeline {user} but not stored"
                    )));
                }
            }
        }
        self.workload.timelines.fetch_add(1, Ordering::Relaxed);
        Ok(OpKind::Read)
    }

    fn post(&mut self, conn: &mut Conn, user: u64) -> Result<OpKind, OpError> {
        let id = conn.cmd(command!["INCR", NEXT_POST]).and_then(|reply| {
            as_int(&reply).ok_or_else(|| OpError::Reply(format!("INCR answered {reply:?}")))
        })?;
        self.workload.ids_taken.fetch_add(1, Ordering::Relaxed);
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64);
        conn.cmd(command![
            "HMSET",
            post_key(id as u64),
            "author",
            user,
            "time",
            micros,
            "body",
            filler(self.workload.params.payload),
        ])?;
        let followers = ids_of(conn.cmd(command![
            "SRANDMEMBER",
            followers_key(user),
            FANOUT.to_string()
        ])?)?;
        let last = (TIMELINE_LEN - 1).to_string();
        let mut pushes = vec![
            command!["LPUSH", timeline_key(user), id],
            command!["LTRIM", timeline_key(user), "0", &last],
            command!["LPUSH", posts_key(user), id],
            command!["LTRIM", posts_key(user), "0", &last],
        ];
        for follower in followers {
            pushes.push(command!["LPUSH", timeline_key(follower), id]);
            pushes.push(command!["LTRIM", timeline_key(follower), "0", &last]);
        }
        conn.transaction(pushes)?;
        self.workload.posts.fetch_add(1, Ordering::Relaxed);
        Ok(OpKind::Update)
    }

    fn follow(&mut self, conn: &mut Conn, user: u64) -> Result<OpKind, OpError> {
        let users = self.workload.users;
        let other = (user + self.rng.random_range(1..users)) % users;
        conn.cmd(command!["SADD", following_key(user), other])?;
        conn.cmd(command!["SADD", followers_key(other), user])?;
        self.workload.follows.fetch_add(1, Ordering::Relaxed);
        Ok(OpKind::Update)
    }
}

impl ClientOps for TwitterClient<'_> {
    fn op(&mut self, conn: &mut Conn) -> Result<OpKind, OpError> {
        let user = self.rng.random_range(0..self.workload.users);
        let pick: f64 = self.rng.random();
        if pick < 0.5 {
            self.timeline(conn, user)
        } else if pick < 0.9 {
            self.post(conn, user)
        } else {
            self.follow(conn, user)
        }
    }
}

impl Workload for Twitter {
    fn load(&self, redis: &mut SyncClient) -> Result<(), String> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.params.seed ^ TAG);
        let users = self.users;
        let mut followers: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); users as usize];
        let mut commands = Vec::new();
        for user in 0..users {
            for _ in 0..INITIAL_FOLLOWS {
                let other = (user + rng.random_range(1..users)) % users;
                followers[other as usize].insert(user);
                commands.push(command!["SADD", following_key(user), other]);
                commands.push(command!["SADD", followers_key(other), user]);
            }
        }
        // One post by each user: post `user + 1`.
        let body = filler(self.params.payload);
        for user in 0..users {
            let id = user + 1;
            commands.push(command![
                "HMSET",
                post_key(id),
                "author",
                user,
                "time",
                "0",
                "body",
                &body
            ]);
            commands.push(command!["LPUSH", timeline_key(user), id]);
            commands.push(command!["LPUSH", posts_key(user), id]);
            for &follower in followers[user as usize].iter().take(FANOUT) {
                commands.push(command!["LPUSH", timeline_key(follower), id]);
            }
        }
        commands.push(command!["SET", NEXT_POST, users]);
        batched(redis, commands).map(|_| ())
    }

    fn client(&self, index: u32, round: u32) -> Box<dyn ClientOps + '_> {
        Box::new(TwitterClient {
            workload: self,
            rng: client_rng(self.params.seed, TAG, index, round),
        })
    }

    fn check(&self, redis: &mut SyncClient) -> Check {
        let mut check = Check::new();
        if let Err(error) = self.check_state(redis, &mut check) {
            check.fail(error);
        }
        let dangling = self.dangling.load(Ordering::Relaxed);
        check.expect(
            dangling == 0,
            "every post id a timeline read found named a stored post",
            format!("{dangling} timeline reads found a post id with no post"),
        );
        check
    }

    fn sample_keys(&self) -> Vec<String> {
        let mut keys = vec![NEXT_POST.to_owned()];
        for user in spread(self.users, 40) {
            keys.extend([
                timeline_key(user),
                posts_key(user),
                followers_key(user),
                following_key(user),
            ]);
        }
        keys.extend(
            spread(self.users, 40)
                .into_iter()
                .map(|id| post_key(id + 1)),
        );
        keys
    }

    fn counters(&self) -> BTreeMap<String, u64> {
        BTreeMap::from([
            ("posts".to_owned(), self.posts.load(Ordering::Relaxed)),
            ("follows".to_owned(), self.follows.load(Ordering::Relaxed)),
            (
                "timelines".to_owned(),
                self.timelines.load(Ordering::Relaxed),
            ),
            (
                "post_ids_taken".to_owned(),
                self.ids_taken.load(Ordering::Relaxed),
            ),
            (
                "dangling_posts".to_owned(),
                self.dangling.load(Ordering::Relaxed),
            ),
        ])
    }
}

impl Twitter {
    fn check_state(&self, redis: &mut SyncClient, check: &mut Check) -> Result<(), String> {
        let next = batched(redis, vec![command!["GET", NEXT_POST]])?
            .first()
            .and_then(int_of)
            .ok_or("tw:next_post is not a number")?;
        let next = u64::try_from(next).map_err(|_| "tw:next_post is negative")?;
        let expected = self.users + self.ids_taken.load(Ordering::Relaxed);
        check.expect(
            next == expected,
            format!(
                "post ids dense: {next} = {} loaded + every id taken",
                self.users
            ),
            format!("tw:next_post is {next}, the clients took ids up to {expected}"),
        );
        let first = next.saturating_sub(CHECKED_POSTS) + 1;
        let exists = batched(
            redis,
            (first..=next)
                .map(|id| command!["EXISTS", post_key(id)])
                .collect(),
        )?;
        let absent = exists
            .iter()
            .filter(|reply| int_of(reply) != Some(1))
            .count();
        check.expect(
            absent == 0,
            format!("posts {first}..={next} all stored"),
            format!("{absent} of posts {first}..={next} are not stored"),
        );
        let users = spread(self.users, CHECKED_USERS);
        let timelines = batched(
            redis,
            users
                .iter()
                .map(|&user| command!["LRANGE", timeline_key(user), "0", "-1"])
                .collect(),
        )?;
        let mut on_timelines = BTreeSet::new();
        let mut too_long = 0;
        for timeline in timelines {
            let items = match timeline {
                Value::Array(Some(items)) => items,
                other => return Err(format!("LRANGE answered {other:?}")),
            };
            too_long += usize::from(items.len() > TIMELINE_LEN);
            on_timelines.extend(items.iter().filter_map(int_of));
        }
        check.expect(
            too_long == 0,
            format!("{} timelines trimmed to {TIMELINE_LEN}", users.len()),
            format!("{too_long} timelines longer than {TIMELINE_LEN}"),
        );
        let ids: Vec<i64> = on_timelines.into_iter().collect();
        let stored = batched(
            redis,
            ids.iter()
                .map(|&id| command!["EXISTS", format!("tw:post:{id}")])
                .collect(),
        )?;
        let dangling = ids
            .iter()
            .zip(&stored)
            .filter(|(id, reply)| **id < 1 || **id as u64 > next || int_of(reply) != Some(1))
            .count();
        check.expect(
            dangling == 0,
            format!(
                "the {} post ids on those timelines name stored posts",
                ids.len()
            ),
            format!("{dangling} post ids on timelines name no stored post"),
        );
        let mut asymmetric = 0;
        for &user in &users {
            let following = batched(redis, vec![command!["SMEMBERS", following_key(user)]])?;
            let others: Vec<i64> = match following.into_iter().next() {
                Some(Value::Array(Some(items))) => items.iter().filter_map(int_of).collect(),
                other => return Err(format!("SMEMBERS answered {other:?}")),
            };
            let back = batched(
                redis,
                others
                    .iter()
                    .map(|&other| command!["SISMEMBER", format!("tw:followers:{other}"), user])
                    .collect(),
            )?;
            asymmetric += back.iter().filter(|reply| int_of(reply) != Some(1)).count();
        }
        check.expect(
            asymmetric == 0,
            format!("following and followers agree for {} users", users.len()),
            format!("{asymmetric} follows are missing from the followed user's followers"),
        );
        Ok(())
    }
}

//! The control plane's leadership on etcd (docs/netchain.md, "The controller on etcd").
//!
//! Controllers are stateless processes: the state (the chain store's layout) lives in etcd
//! under `PREFIX/chain/state`, and one controller leads, holding `PREFIX/controller/leader`
//! under an etcd lease. A controller that wants to lead creates the key in a transaction (it
//! wins if it does not exist); the others wait for it to go, which it does when the leader
//! resigns (its lease revoked) or dies (its lease not renewed runs out).
//!
//! **Fencing.** Every save of the state is a transaction that goes only while the leader key
//! still has the creation revision it had when this controller won: a deposed leader's save
//! fails, whatever it believes.
//!
//! **A leader stops before the next one can start.** A thread renews the lease every third
//! of its time to live. A renewal sent at `t` that etcd answers with a time to live `ttl`
//! keeps the lease until at least `t + ttl` at etcd, so this controller leads until
//! `t + ttl − margin` by its own clock and stops (sends nothing, grants nothing) after that
//! unless a later renewal answered. etcd lets another controller create the key only once
//! the lease expired, after that instant. With etcd unreachable, the leader goes on until that
//! instant and then stops; no other controller can win until etcd answers again, so nothing
//! is reconfigured meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pmnet_etcd::{Etcd, EtcdError};
use pmnet_proto::Time;

use crate::{Clock, Shutdown};

/// How a controller reaches etcd and leads.
#[derive(Debug, Clone)]
pub struct EtcdPlane {
    pub endpoints: Vec<std::net::SocketAddr>,
    /// The keys' prefix (`/pmnet/CLUSTER`).
    pub prefix: String,
    /// What the leader key holds while this controller leads (its name and address).
    pub name: String,
    /// The leadership lease's time to live asked for, in seconds (etcd may raise it).
    pub ttl_s: i64,
    /// How long one etcd call may take.
    pub timeout: Duration,
}

impl EtcdPlane {
    pub fn leader_key(&self) -> Vec<u8> {
        format!("{}/controller/leader", self.prefix).into_bytes()
    }

    pub fn state_key(&self) -> Vec<u8> {
        format!("{}/chain/state", self.prefix).into_bytes()
    }

    /// The device chains' plan (docs/replication.md, "Automatic failover").
    pub fn devices_key(&self) -> Vec<u8> {
        format!("{}/devices/state", self.prefix).into_bytes()
    }

    pub fn connect(&self) -> Result<Etcd, EtcdError> {
        Etcd::connect(&self.endpoints, self.timeout)
    }
}

/// What a campaign saw while it waited, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CampaignNote {
    /// Another controller leads (the leader key's value).
    Standby(String),
    /// etcd does not answer.
    Unreachable(String),
}

/// Wait until this controller leads (`Ok(Some)`), or `signals` asks to stop (`Ok(None)`).
/// `note` is told of each change in what the wait sees (who leads, etcd unreachable).
pub fn campaign(
    plane: &EtcdPlane,
    clock: Clock,
    signals: &Shutdown,
    mut note: impl FnMut(CampaignNote),
) -> Result<Option<Leadership>, String> {
    let mut etcd: Option<Etcd> = None;
    let mut last_note: Option<CampaignNote> = None;
    let mut tell = |seen: CampaignNote| {
        if last_note.as_ref() != Some(&seen) {
            last_note = Some(seen.clone());
            note(seen);
        }
    };
    while !signals.is_requested() {
        let attempt = (|| -> Result<Option<Leadership>, EtcdError> {
            let client = match etcd.as_mut() {
                Some(client) => client,
                None => etcd.insert(plane.connect()?),
            };
            if let Some(leader) = client.get(&plane.leader_key())? {
                tell(CampaignNote::Standby(
                    String::from_utf8_lossy(&leader.value).into_owned(),
                ));
                return Ok(None);
            }
            let sent = clock.now();
            let lease = client.grant_lease(plane.ttl_s)?;
            if !client.create(&plane.leader_key(), plane.name.as_bytes(), lease.id)? {
                let _ = client.revoke(lease.id);
                return Ok(None);
            }
            let Some(won) = client.get(&plane.leader_key())? else {
                return Ok(None); // gone already (revoked by an operator): try again
            };
            if won.lease != lease.id {
                return Ok(None);
            }
            let saver = plane.connect()?;
            Ok(Some(Leadership::start(
                plane.clone(),
                clock,
                saver,
                lease,
                won.create_revision,
                sent,
            )))
        })();
        match attempt {
            Ok(Some(leadership)) => return Ok(Some(leadership)),
            Ok(None) => {}
            Err(error) => {
                etcd = None;
                tell(CampaignNote::Unreachable(error.0));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(None)
}

/// What the renewing thread shares with the controller's loop.
#[derive(Debug)]
struct Shared {
    /// This controller leads until this instant (nanoseconds of the clock).
    valid_until_ns: AtomicU64,
    /// Why it does not lead any more, once it does not.
    lost: Mutex<Option<String>>,
    stop: AtomicBool,
}

/// This controller leads. See the module docs.
#[derive(Debug)]
pub struct Leadership {
    plane: EtcdPlane,
    clock: Clock,
    etcd: Etcd,
    lease: pmnet_etcd::Lease,
    guard_revision: i64,
    shared: Arc<Shared>,
    keeper: Option<std::thread::JoinHandle<()>>,
}

/// The share of a lease's time to live a leader gives up for clock rates (a tenth, at least
/// 50 ms).
fn margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(50))
}

fn until(sent: Time, ttl_s: i64) -> u64 {
    let ttl = Duration::from_secs(u64::try_from(ttl_s).unwrap_or(0));
    (sent + ttl.saturating_sub(margin(ttl))).as_nanos()
}

impl Leadership {
    fn start(
        plane: EtcdPlane,
        clock: Clock,
        etcd: Etcd,
        lease: pmnet_etcd::Lease,
        guard_revision: i64,
        sent: Time,
    ) -> Leadership {
        let shared = Arc::new(Shared {
            valid_until_ns: AtomicU64::new(until(sent, lease.ttl_s)),
            lost: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let keeper = {
            let shared = Arc::clone(&shared);
            let plane = plane.clone();
            std::thread::Builder::new()
                .name("etcd-lease".to_owned())
                .spawn(move || keep(&plane, clock, lease, &shared))
                .ok()
        };
        if keeper.is_none() {
            *shared.lost.lock().expect("not poisoned") =
                Some("could not start the thread that renews the lease".to_owned());
        }
        Leadership {
            plane,
            clock,
            etcd,
            lease,
            guard_revision,
            shared,
            keeper,
        }
    }

    /// The lease's time to live etcd gave.
    pub fn ttl_s(&self) -> i64 {
        self.lease.ttl_s
    }

    pub fn plane(&self) -> &EtcdPlane {
        &self.plane
    }

    /// `Err(why)` once this controller may no longer act as the leader.
    pub fn check(&self, now: Time) -> Result<(), String> {
        if let Some(why) = self.shared.lost.lock().expect("not poisoned").clone() {
            return Err(why);
        }
        let valid_until = self.shared.valid_until_ns.load(Ordering::Acquire);
        if now.as_nanos() >= valid_until {
            return Err(format!(
                "the leadership lease was not renewed in time (etcd did not answer for {} s)",
                self.lease.ttl_s
            ));
        }
        Ok(())
    }

    /// The state saved by the last leader, if any.
    pub fn load(&mut self) -> Result<Option<Vec<u8>>, String> {
        let key = self.plane.state_key();
        self.etcd
            .get(&key)
            .map(|entry| entry.map(|entry| entry.value))
            .map_err(|error| error.0)
    }

    /// Save `bytes` as the state, fenced by this controller's leadership.
    pub fn save(&mut self, bytes: &[u8]) -> Result<(), String> {
        let key = self.plane.state_key();
        self.save_at(&key, bytes)
    }

    /// Save the device chains' plan, as [`Leadership::save`] saves the chain store's state.
    pub fn save_devices(&mut self, bytes: &[u8]) -> Result<(), String> {
        let key = self.plane.devices_key();
        self.save_at(&key, bytes)
    }

    /// The device chains' plan saved last, if any.
    pub fn load_devices(&mut self) -> Result<Option<Vec<u8>>, String> {
        let key = self.plane.devices_key();
        self.etcd
            .get(&key)
            .map(|entry| entry.map(|entry| entry.value))
            .map_err(|error| error.0)
    }

    fn save_at(&mut self, state: &[u8], bytes: &[u8]) -> Result<(), String> {
        self.check(self.clock.now())?;
        let leader = self.plane.leader_key();
        match self
            .etcd
            .put_if_created(&leader, self.guard_revision, state, bytes, 0)
        {
            Ok(true) => Ok(()),
            Ok(false) => {
                let why = "another controller leads now (the leader key in etcd is not this \
                           controller's)"
                    .to_owned();
                *self.shared.lost.lock().expect("not poisoned") = Some(why.clone());
                Err(why)
            }
            Err(error) => Err(format!("saving the state in etcd: {error}")),
        }
    }

    /// Stop leading now: revoke the lease, so that another controller takes over at once.
    pub fn resign(mut self) {
        self.stop_keeper();
        let _ = self.etcd.revoke(self.lease.id);
    }

    fn stop_keeper(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop_keeper();
    }
}

/// The renewing thread: every third of the time to live (100 ms at least between tries
/// that failed), until stopped or the lease is gone.
fn keep(plane: &EtcdPlane, clock: Clock, lease: pmnet_etcd::Lease, shared: &Shared) {
    let period = Duration::from_secs(u64::try_from(lease.ttl_s).unwrap_or(1)) / 3;
    let mut etcd: Option<Etcd> = None;
    let mut next = clock.now() + period;
    let mut warned = false;
    while !shared.stop.load(Ordering::Acquire) {
        let now = clock.now();
        if now < next {
            std::thread::sleep(clock.until(next).min(Duration::from_millis(20)));
            continue;
        }
        let sent = clock.now();
        let renewed = match etcd.as_mut() {
            Some(client) => client.keep_alive(lease.id),
            None => plane.connect().and_then(|client| {
                let client = etcd.insert(client);
                client.keep_alive(lease.id)
            }),
        };
        match renewed {
            Ok(ttl) if ttl > 0 => {
                shared
                    .valid_until_ns
                    .fetch_max(until(sent, ttl), Ordering::AcqRel);
                if warned {
                    tracing::info!("etcd answers again: the leadership lease is renewed");
                    warned = false;
                }
                next = sent + period;
            }
            Ok(_) => {
                *shared.lost.lock().expect("not poisoned") =
                    Some("the leadership lease expired in etcd".to_owned());
                return;
            }
            Err(error) => {
                etcd = None;
                if !warned {
                    tracing::warn!(
                        "cannot renew the leadership lease: {error}; this controller leads until \
                         the lease runs out, then stops (no reconfiguration until etcd answers)"
                    );
                    warned = true;
                }
                next = clock.now() + Duration::from_millis(100);
            }
        }
    }
}

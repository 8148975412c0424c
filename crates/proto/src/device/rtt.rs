//! How long each server takes to acknowledge what the device forwards, so that the first
//! resend of a logged entry waits about as long as an ack normally takes (RFC 6298's
//! estimator: smoothed round trip plus four times its variation), never less than the
//! configured resend timeout. Only entries sent once are sampled (Karn's rule: the ack of a
//! resent entry may answer either copy). A server whose queue grows (a saturated server, an
//! emulated capacity) gets a longer timeout instead of a storm of duplicates it must answer.

use std::collections::HashMap;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
struct Estimate {
    smoothed: Duration,
    variation: Duration,
}

/// Round-trip estimates by server id.
#[derive(Debug, Default)]
pub(super) struct RoundTrips {
    servers: HashMap<u16, Estimate>,
}

impl RoundTrips {
    /// An entry forwarded once to `server_id` was acked `sample` after it was logged.
    pub(super) fn sample(&mut self, server_id: u16, sample: Duration) {
        match self.servers.get_mut(&server_id) {
            None => {
                self.servers.insert(
                    server_id,
                    Estimate {
                        smoothed: sample,
                        variation: sample / 2,
                    },
                );
            }
            Some(estimate) => {
                let deviation = estimate.smoothed.abs_diff(sample);
                estimate.variation = (estimate.variation * 3 + deviation) / 4;
                estimate.smoothed = (estimate.smoothed * 7 + sample) / 8;
            }
        }
    }

    /// The first resend timeout for an entry to `server_id`: the estimate, within
    /// `[floor, ceiling]` (`floor` until a sample came).
    pub(super) fn timeout(&self, server_id: u16, floor: Duration, ceiling: Duration) -> Duration {
        self.servers
            .get(&server_id)
            .map_or(floor, |estimate| estimate.smoothed + estimate.variation * 4)
            .clamp(floor, ceiling.max(floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOOR: Duration = Duration::from_millis(20);
    const CEILING: Duration = Duration::from_secs(1);

    #[test]
    fn the_timeout_follows_the_acks_within_its_bounds() {
        let mut rtt = RoundTrips::default();
        assert_eq!(rtt.timeout(1, FLOOR, CEILING), FLOOR, "no sample yet");
        for _ in 0..50 {
            rtt.sample(1, Duration::from_micros(100));
        }
        assert_eq!(
            rtt.timeout(1, FLOOR, CEILING),
            FLOOR,
            "fast acks: the floor"
        );
        for _ in 0..50 {
            rtt.sample(1, Duration::from_millis(60));
        }
        let slow = rtt.timeout(1, FLOOR, CEILING);
        assert!(
            slow >= Duration::from_millis(60) && slow < CEILING,
            "{slow:?}"
        );
        assert_eq!(rtt.timeout(2, FLOOR, CEILING), FLOOR, "per server");
        rtt.sample(3, Duration::from_secs(30));
        assert_eq!(rtt.timeout(3, FLOOR, CEILING), CEILING);
    }
}

//! The paper's "ideal request handler": replies OK to everything and does no work.
//!
//! It measures what the network path costs with the application taken out: no decoding, no
//! state, nothing persisted. It keeps no durable state, so a server running it gives no
//! exactly-once guarantee across restarts ([`Application::sessions`] is always empty and
//! [`Application::medium`] is `None`).

use crate::app::{Application, NoSpace, SessionRecord};
use pmnet_pm::MediumInfo;

/// The encoding of `Reply::Ok`, returned for every request.
const REPLY_OK: [u8; 1] = [0];

/// Replies `Reply::Ok` to every request without looking at it. See the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdealHandler {
    applied_count: u64,
}

impl IdealHandler {
    pub fn new() -> IdealHandler {
        IdealHandler::default()
    }

    /// Requests handled since creation.
    pub fn applied_count(&self) -> u64 {
        self.applied_count
    }
}

impl Application for IdealHandler {
    /// Never [`NoSpace`]: nothing is stored.
    fn stage(&mut self, _session_id: u64, _seq: u32, _request: &[u8]) -> Result<Vec<u8>, NoSpace> {
        self.applied_count += 1;
        Ok(REPLY_OK.to_vec())
    }

    /// Nothing to make durable.
    fn commit(&mut self) {}

    /// Nothing is stored: every key is absent.
    fn read(&mut self, _request: &[u8]) -> Vec<u8> {
        crate::codec::Reply::NotFound.to_bytes()
    }

    fn sessions(&self) -> Vec<SessionRecord> {
        Vec::new()
    }

    fn medium(&self) -> Option<MediumInfo> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Reply;

    #[test]
    fn replies_ok_to_anything() {
        let mut handler = IdealHandler::new();
        for (seq, request) in [&b""[..], &[0xff, 0x00], &[0x02, 0x01, 0x00, 0x6b]]
            .iter()
            .enumerate()
        {
            let reply = handler.apply(7, seq as u32, request).unwrap();
            assert_eq!(Reply::decode(&reply).unwrap(), Reply::Ok);
        }
        assert_eq!(handler.applied_count(), 3);
        assert!(handler.sessions().is_empty());
        assert!(handler.medium().is_none());
    }
}

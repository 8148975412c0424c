//! The server's application: the key-value store, a packet-store engine or the ideal handler.

use super::*;

/// The application behind the server.
#[derive(Debug)]
pub enum ServerApp {
    Kv(Box<KvStore<MmapRegion>>),
    /// The packet store or the conventional engine of `pmnet-pktstore` (`--engine`).
    Engine(Box<Store<MmapRegion>>),
    Ideal(IdealHandler),
}

impl ServerApp {
    pub(super) fn as_application(&mut self) -> &mut dyn Application {
        match self {
            ServerApp::Kv(store) => store.as_mut(),
            ServerApp::Engine(store) => store.as_mut(),
            ServerApp::Ideal(handler) => handler,
        }
    }

    /// Requests one commit covers at most.
    pub(super) fn max_staged(&self) -> usize {
        match self {
            ServerApp::Kv(store) => store.max_staged(),
            ServerApp::Engine(store) => store.max_staged(),
            ServerApp::Ideal(handler) => handler.max_staged(),
        }
    }

    pub(super) fn sessions(&self) -> Vec<SessionRecord> {
        match self {
            ServerApp::Kv(store) => store.sessions(),
            ServerApp::Engine(store) => store.sessions(),
            ServerApp::Ideal(handler) => handler.sessions(),
        }
    }

    pub fn medium(&self) -> Option<MediumInfo> {
        match self {
            ServerApp::Kv(store) => store.medium(),
            ServerApp::Engine(store) => store.medium(),
            ServerApp::Ideal(handler) => handler.medium(),
        }
    }

    /// The value of `key` in the store (the ideal handler keeps nothing). The engines of
    /// `pmnet-pktstore` keep a value as one or more packets: see [`ServerApp::value`].
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        match self {
            ServerApp::Kv(store) => store.get(key),
            ServerApp::Engine(store) => match store.get(key) {
                Ok(Some(value)) if value.segments.len() == 1 => Some(value.segments[0]),
                _ => None,
            },
            ServerApp::Ideal(_) => None,
        }
    }

    /// The value of `key`, copied out (checksum-verified for the `pmnet-pktstore` engines).
    pub fn value(&self, key: &[u8]) -> Option<Vec<u8>> {
        match self {
            ServerApp::Kv(store) => store.get(key).map(<[u8]>::to_vec),
            ServerApp::Engine(store) => store.get(key).ok().flatten().map(|v| v.to_vec()),
            ServerApp::Ideal(_) => None,
        }
    }

    /// Which application this is, for banners and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            ServerApp::Kv(_) => "kv",
            ServerApp::Engine(store) => store.engine().name(),
            ServerApp::Ideal(_) => "ideal",
        }
    }
}

/// How many keys the store has room for, for the start-up banner: of 100 bytes and of 1 KiB
/// (key and value together), or for the packet store, of up to one slot's worth.
pub(super) fn capacity_text(app: &ServerApp) -> Option<String> {
    let (small, large) = match app {
        ServerApp::Kv(store) => (store.key_capacity(100), store.key_capacity(1024)),
        ServerApp::Engine(store) if store.engine() == EngineKind::Packet => {
            return Some(format!(
                "room for {} keys of up to {} bytes of key and value (one {}-byte slot each)",
                store.key_capacity(1),
                store.one_slot_key_and_value_len(),
                store.geometry().slot_size
            ));
        }
        ServerApp::Engine(store) => (store.key_capacity(100), store.key_capacity(1024)),
        ServerApp::Ideal(_) => return None,
    };
    Some(format!(
        "room for {small} keys of 100 bytes of key and value, or {large} of 1 KiB"
    ))
}

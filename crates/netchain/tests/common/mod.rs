//! What the chain tests with hand-delivered datagrams share: the members' and the client's
//! addresses and a small table geometry.

use std::net::SocketAddr;

use pmnet_netchain::Geometry;

/// Chain member `index`'s address.
pub fn member(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 5, index as u8 + 1], 7600))
}

/// The client's address.
pub fn client() -> SocketAddr {
    SocketAddr::from(([10, 0, 6, 1], 40000))
}

/// A table small enough for a test.
pub fn geometry() -> Geometry {
    Geometry {
        buckets: 64,
        key_max: 16,
        value_max: 32,
    }
}

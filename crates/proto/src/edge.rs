//! The receiving edge every node shares: a datagram is verified before anything else looks at
//! it (with keys configured; failures dropped by reason and warned of, rate-limited), plain
//! traffic from other hosts is warned of when asked, then the datagram is parsed and a batch
//! unpacked into its entries, each handled as if it had arrived on its own (the batch's trailer
//! covered it). The device's pipeline ([`crate::Pipeline`]) and the server ([`crate::Server`])
//! receive through it.

use std::borrow::Cow;
use std::net::SocketAddr;

use pmnet_wire::{Header, PacketType};

use crate::{AuthWarnings, DropReason, PlainTrafficWarnings, Time};

/// What a received datagram holds, offered in order to the node.
#[derive(Debug)]
pub(crate) enum Arrived<'a> {
    /// A datagram (or a batch's entry): its header, its bytes (header included) and payload.
    Datagram {
        header: Header,
        bytes: &'a [u8],
        payload: &'a [u8],
    },
    /// A batch, before its entries: the sender unpacks batches, so what goes back to it may
    /// be packed too.
    Batch,
    /// Something dropped on the way in, and why.
    Dropped(DropReason),
}

/// The warnings of one node's edge.
#[derive(Debug, Default)]
pub(crate) struct Edge {
    /// Warnings of datagrams that failed authentication (rate-limited).
    pub(crate) auth_warnings: AuthWarnings,
    /// Without keys, and asked to: warnings of datagrams from other hosts (rate-limited).
    pub(crate) plain_warnings: Option<PlainTrafficWarnings>,
}

impl Edge {
    /// Verify `datagram` with `auth` (when keys are configured): the datagram as it is then,
    /// or why it is not believed (warned of at `role`: "device", "server"…).
    pub(crate) fn verify<'a>(
        &mut self,
        now: Time,
        role: &str,
        from: SocketAddr,
        auth: Option<&mut pmnet_auth::Authenticator>,
        datagram: &'a [u8],
    ) -> Result<Cow<'a, [u8]>, DropReason> {
        let authenticated = auth.is_some();
        match crate::drop::verify_datagram(auth, datagram) {
            Ok(inner) => {
                if !authenticated {
                    if let Some(warnings) = self.plain_warnings.as_mut() {
                        warnings.received(now, role, from);
                    }
                }
                Ok(inner)
            }
            Err(reason) => {
                self.auth_warnings.failed(now, role, from, reason);
                Err(reason)
            }
        }
    }
}

/// Parse a verified datagram and offer what it holds to `each`: itself, or a batch's entries
/// one by one (after [`Arrived::Batch`]); what does not parse is offered as
/// [`Arrived::Dropped`] (a batch's entries stop at the first that does not).
pub(crate) fn unpack(datagram: &[u8], mut each: impl FnMut(Arrived<'_>)) {
    let (header, payload) = match Header::parse(datagram) {
        Ok(parsed) => parsed,
        Err(error) => return each(Arrived::Dropped(DropReason::Parse(error))),
    };
    if header.packet_type != PacketType::Batch {
        return each(Arrived::Datagram {
            header,
            bytes: datagram,
            payload,
        });
    }
    each(Arrived::Batch);
    for entry in pmnet_wire::batch_entries(payload) {
        match entry.and_then(|bytes| Header::parse(bytes).map(|parsed| (bytes, parsed))) {
            Ok((_, (inner, _))) if inner.packet_type == PacketType::Batch => {
                each(Arrived::Dropped(DropReason::NestedBatch));
            }
            Ok((bytes, (header, payload))) => each(Arrived::Datagram {
                header,
                bytes,
                payload,
            }),
            Err(error) => {
                each(Arrived::Dropped(DropReason::Parse(error)));
                break;
            }
        }
    }
}

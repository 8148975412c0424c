//! The chain controller's messages (docs/netchain.md, "The controller"), type codes
//! `0x24–0x29`. Integers are big-endian; addresses, keys and values are encoded as in the
//! data messages.
//!
//! | message | field | size |
//! |---|---|---|
//! | configuration (`0x24`, controller → member or client) | epoch | 8 |
//! | | lease in ms | 4 |
//! | | members *n* (1 to 16), then each member's address | 1 + 19 *n* |
//! | | virtual groups *g* (1 to 1 024) | 2 |
//! | | per group: flags (bit 0 paused, bit 1 a member joining) | 1 |
//! | | chain length *c* (1 to *n*), member indices head first | 1 + *c* |
//! | | joining only: the joining member, its source, phase (1 copy, 2 delta), the epoch the phase started in | 1 + 1 + 1 + 8 |
//! | status (`0x25`, member → controller) | the member's epoch (0: none yet) | 8 |
//! | | the member's boot number (random at each start) | 8 |
//! | | stamp (the member's clock, echoed in the grant) | 8 |
//! | | reports *r* (at most 1 024), each: group, kind (1 drained, 2 copied, 3 synced), value | 2 + 11 *r* |
//! | grant (`0x26`, controller → member) | epoch | 8 |
//! | | the stamp of the status it answers | 8 |
//! | sync request (`0x27`, joining member → source) | group | 2 |
//! | | since: send only keys changed after this change number (0: all) | 8 |
//! | | cursor: the first bucket to look at | 4 |
//! | sync data (`0x28`, source → joining member) | group | 2 |
//! | | the cursor asked for | 4 |
//! | | the next cursor (`0xFFFFFFFF`: done) | 4 |
//! | | the source's change number when it read the page | 8 |
//! | | entries *e*, each: version, kind (1 value, 2 deletion), key, value | 2 + … |
//! | fetch (`0x29`, client → controller) | the client's epoch | 8 |

use std::net::SocketAddr;

use super::{push_address, push_key, push_value, ChainParseError, Reader};

/// Type code of the controller's configuration.
pub const CHAIN_CONFIG: u8 = 0x24;
/// Type code of a member's status (its heartbeat).
pub const CHAIN_STATUS: u8 = 0x25;
/// Type code of the controller's answer to a status: the member's lease renewed.
pub const CHAIN_GRANT: u8 = 0x26;
/// Type code of a joining member's request for a page of its source's table.
pub const CHAIN_SYNC: u8 = 0x27;
/// Type code of a page of a source's table.
pub const CHAIN_SYNC_DATA: u8 = 0x28;
/// Type code of a client's request for the configuration.
pub const CHAIN_FETCH: u8 = 0x29;

/// Members of one configuration, at most.
pub const MAX_MEMBERS: usize = 16;
/// Virtual groups of one configuration, at most (the configuration fits one datagram).
pub const MAX_GROUPS: usize = 1024;
/// The next cursor of the last page of a sync.
pub const SYNC_DONE: u32 = u32::MAX;

/// A recovery's phase in one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Copy the source's keys of the group while writes go on.
    Copy = 1,
    /// Writes to the group paused and drained: copy what changed since the copy began.
    Delta = 2,
}

/// A member being brought into a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Joining {
    pub member: u8,
    pub source: u8,
    pub phase: Phase,
    /// The epoch this phase started in: a phase started again is a new one.
    pub since_epoch: u64,
}

/// One virtual group in a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLayout {
    /// Indices into the members, head first.
    pub chain: Vec<u8>,
    /// The head takes no writes (answers them [`super::Status::Paused`]).
    pub paused: bool,
    pub joining: Option<Joining>,
}

/// The controller's configuration of the chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub epoch: u64,
    /// How long a member answers reads after the status its last grant answered.
    pub lease_ms: u32,
    pub members: Vec<SocketAddr>,
    pub groups: Vec<GroupLayout>,
}

/// What a member reports in its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReportKind {
    /// (The head of a paused group.) No write of the group is waiting for its commit.
    Drained = 1,
    /// (A joining member, copy phase.) The copy is durable here; the value is the source's
    /// change number when the copy began.
    Copied = 2,
    /// (A joining member, delta phase.) Everything is durable here.
    Synced = 3,
}

/// One report of a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Report {
    pub group: u16,
    pub kind: ReportKind,
    pub value: u64,
}

/// A member's status: its heartbeat to the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    pub epoch: u64,
    pub boot: u64,
    pub stamp: u64,
    pub reports: Vec<Report>,
}

/// The controller's grant: the member's lease runs from its status's stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub epoch: u64,
    pub stamp: u64,
}

/// A joining member's request for a page of its source's keys of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncRequest {
    pub group: u16,
    pub since: u64,
    pub cursor: u32,
}

/// One key of a sync page: its version (`None`: a deletion).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncEntry<'a> {
    pub version: u64,
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// A page of a source's keys of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncData<'a> {
    pub group: u16,
    pub cursor: u32,
    pub next: u32,
    pub change: u64,
    pub entries: Vec<SyncEntry<'a>>,
}

/// A client's request for the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetch {
    pub epoch: u64,
}

impl Layout {
    /// The configuration a payload holds, checked for consistency (indices in range, no
    /// member twice in a chain). Never panics.
    pub fn parse(payload: &[u8]) -> Result<Layout, ChainParseError> {
        let mut reader = Reader { bytes: payload };
        let epoch = reader.u64()?;
        let lease_ms = u32::from_be_bytes(reader.take(4)?.try_into().expect("4 bytes"));
        let member_count = usize::from(reader.u8()?);
        if member_count == 0 || member_count > MAX_MEMBERS {
            return Err(ChainParseError::Invalid);
        }
        let members = (0..member_count)
            .map(|_| reader.address())
            .collect::<Result<Vec<_>, _>>()?;
        let group_count = usize::from(reader.u16()?);
        if group_count == 0 || group_count > MAX_GROUPS {
            return Err(ChainParseError::Invalid);
        }
        let index = |reader: &mut Reader<'_>| -> Result<u8, ChainParseError> {
            let at = reader.u8()?;
            if usize::from(at) < member_count {
                Ok(at)
            } else {
                Err(ChainParseError::Invalid)
            }
        };
        let mut groups = Vec::with_capacity(group_count);
        for _ in 0..group_count {
            let flags = reader.u8()?;
            if flags & !0b11 != 0 {
                return Err(ChainParseError::BadCode);
            }
            let len = usize::from(reader.u8()?);
            if len == 0 || len > member_count {
                return Err(ChainParseError::Invalid);
            }
            let chain = (0..len)
                .map(|_| index(&mut reader))
                .collect::<Result<Vec<_>, _>>()?;
            if (1..chain.len()).any(|at| chain[..at].contains(&chain[at])) {
                return Err(ChainParseError::Invalid);
            }
            let joining = if flags & 0b10 != 0 {
                let member = index(&mut reader)?;
                let source = index(&mut reader)?;
                let phase = match reader.u8()? {
                    1 => Phase::Copy,
                    2 => Phase::Delta,
                    _ => return Err(ChainParseError::BadCode),
                };
                let since_epoch = reader.u64()?;
                Some(Joining {
                    member,
                    source,
                    phase,
                    since_epoch,
                })
            } else {
                None
            };
            groups.push(GroupLayout {
                chain,
                paused: flags & 1 != 0,
                joining,
            });
        }
        reader.end()?;
        Ok(Layout {
            epoch,
            lease_ms,
            members,
            groups,
        })
    }

    /// The payload. Panics on more members or groups than a configuration holds.
    pub fn emit(&self, out: &mut Vec<u8>) {
        assert!(!self.members.is_empty() && self.members.len() <= MAX_MEMBERS);
        assert!(!self.groups.is_empty() && self.groups.len() <= MAX_GROUPS);
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.lease_ms.to_be_bytes());
        out.push(self.members.len() as u8);
        for member in &self.members {
            push_address(out, *member);
        }
        out.extend_from_slice(&(self.groups.len() as u16).to_be_bytes());
        for group in &self.groups {
            out.push(u8::from(group.paused) | (u8::from(group.joining.is_some()) << 1));
            out.push(group.chain.len() as u8);
            out.extend_from_slice(&group.chain);
            if let Some(joining) = group.joining {
                out.extend_from_slice(&[joining.member, joining.source, joining.phase as u8]);
                out.extend_from_slice(&joining.since_epoch.to_be_bytes());
            }
        }
    }

    /// Each group's chain as addresses, head first.
    pub fn chains(&self) -> Vec<Vec<SocketAddr>> {
        self.groups
            .iter()
            .map(|group| {
                group
                    .chain
                    .iter()
                    .map(|at| self.members[usize::from(*at)])
                    .collect()
            })
            .collect()
    }

    /// A member's index, if it is one.
    pub fn index_of(&self, member: SocketAddr) -> Option<u8> {
        self.members
            .iter()
            .position(|known| *known == member)
            .map(|at| at as u8)
    }
}

impl MemberStatus {
    pub fn parse(payload: &[u8]) -> Result<MemberStatus, ChainParseError> {
        let mut reader = Reader { bytes: payload };
        let epoch = reader.u64()?;
        let boot = reader.u64()?;
        let stamp = reader.u64()?;
        let count = usize::from(reader.u16()?);
        if count > MAX_GROUPS {
            return Err(ChainParseError::Invalid);
        }
        let mut reports = Vec::with_capacity(count);
        for _ in 0..count {
            let group = reader.u16()?;
            let kind = match reader.u8()? {
                1 => ReportKind::Drained,
                2 => ReportKind::Copied,
                3 => ReportKind::Synced,
                _ => return Err(ChainParseError::BadCode),
            };
            let value = reader.u64()?;
            reports.push(Report { group, kind, value });
        }
        reader.end()?;
        Ok(MemberStatus {
            epoch,
            boot,
            stamp,
            reports,
        })
    }

    /// The payload. Panics on more reports than [`MAX_GROUPS`].
    pub fn emit(&self, out: &mut Vec<u8>) {
        assert!(self.reports.len() <= MAX_GROUPS);
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.boot.to_be_bytes());
        out.extend_from_slice(&self.stamp.to_be_bytes());
        out.extend_from_slice(&(self.reports.len() as u16).to_be_bytes());
        for report in &self.reports {
            out.extend_from_slice(&report.group.to_be_bytes());
            out.push(report.kind as u8);
            out.extend_from_slice(&report.value.to_be_bytes());
        }
    }
}

impl Grant {
    pub fn parse(payload: &[u8]) -> Result<Grant, ChainParseError> {
        let mut reader = Reader { bytes: payload };
        let epoch = reader.u64()?;
        let stamp = reader.u64()?;
        reader.end()?;
        Ok(Grant { epoch, stamp })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.stamp.to_be_bytes());
    }
}

impl SyncRequest {
    pub fn parse(payload: &[u8]) -> Result<SyncRequest, ChainParseError> {
        let mut reader = Reader { bytes: payload };
        let group = reader.u16()?;
        let since = reader.u64()?;
        let cursor = u32::from_be_bytes(reader.take(4)?.try_into().expect("4 bytes"));
        reader.end()?;
        Ok(SyncRequest {
            group,
            since,
            cursor,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.group.to_be_bytes());
        out.extend_from_slice(&self.since.to_be_bytes());
        out.extend_from_slice(&self.cursor.to_be_bytes());
    }
}

impl<'a> SyncData<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<SyncData<'a>, ChainParseError> {
        let mut reader = Reader { bytes: payload };
        let group = reader.u16()?;
        let cursor = u32::from_be_bytes(reader.take(4)?.try_into().expect("4 bytes"));
        let next = u32::from_be_bytes(reader.take(4)?.try_into().expect("4 bytes"));
        let change = reader.u64()?;
        let count = usize::from(reader.u16()?);
        let mut entries = Vec::with_capacity(count.min(payload.len() / 12));
        for _ in 0..count {
            let version = reader.u64()?;
            let kind = reader.u8()?;
            let key = reader.key()?;
            let value = reader.value()?;
            let value = match kind {
                1 => Some(value),
                2 if value.is_empty() => None,
                2 => return Err(ChainParseError::UnexpectedValue),
                _ => return Err(ChainParseError::BadCode),
            };
            entries.push(SyncEntry {
                version,
                key,
                value,
            });
        }
        reader.end()?;
        Ok(SyncData {
            group,
            cursor,
            next,
            change,
            entries,
        })
    }

    /// The payload. Panics on more than 65 535 entries.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.group.to_be_bytes());
        out.extend_from_slice(&self.cursor.to_be_bytes());
        out.extend_from_slice(&self.next.to_be_bytes());
        out.extend_from_slice(&self.change.to_be_bytes());
        let count = u16::try_from(self.entries.len()).expect("at most 65 535 entries");
        out.extend_from_slice(&count.to_be_bytes());
        for entry in &self.entries {
            entry.emit(out);
        }
    }
}

impl SyncEntry<'_> {
    /// The bytes this entry takes in a page.
    pub fn encoded_len(&self) -> usize {
        8 + 1 + 1 + self.key.len() + 2 + self.value.map_or(0, <[u8]>::len)
    }

    fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.version.to_be_bytes());
        out.push(if self.value.is_some() { 1 } else { 2 });
        push_key(out, self.key);
        push_value(out, self.value.unwrap_or_default());
    }
}

impl Fetch {
    pub fn parse(payload: &[u8]) -> Result<Fetch, ChainParseError> {
        let mut reader = Reader { bytes: payload };
        let epoch = reader.u64()?;
        reader.end()?;
        Ok(Fetch { epoch })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.epoch.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    fn layout() -> Layout {
        Layout {
            epoch: 9,
            lease_ms: 30,
            members: vec![
                "10.0.0.21:7400".parse().unwrap(),
                "10.0.0.22:7400".parse().unwrap(),
            ],
            groups: vec![
                GroupLayout {
                    chain: vec![0, 1],
                    paused: false,
                    joining: None,
                },
                GroupLayout {
                    chain: vec![1],
                    paused: true,
                    joining: Some(Joining {
                        member: 0,
                        source: 1,
                        phase: Phase::Delta,
                        since_epoch: 8,
                    }),
                },
            ],
        }
    }

    /// The vectors in docs/protocol.md ("NetChain's controller"), byte for byte.
    #[test]
    fn the_documented_vectors() {
        let mut out = Vec::new();
        layout().emit(&mut out);
        assert_eq!(
            hex(&out),
            "0000000000000009\
             0000001e\
             02\
             041ce80a000015000000000000000000000000\
             041ce80a000016000000000000000000000000\
             0002\
             00020001\
             030101000102\
             0000000000000008"
        );
        assert_eq!(Layout::parse(&out).unwrap(), layout());

        out.clear();
        let status = MemberStatus {
            epoch: 9,
            boot: 0xabcd,
            stamp: 1_000,
            reports: vec![Report {
                group: 1,
                kind: ReportKind::Copied,
                value: 42,
            }],
        };
        status.emit(&mut out);
        assert_eq!(
            hex(&out),
            "0000000000000009000000000000abcd00000000000003e8\
             0001000102000000000000002a"
        );
        assert_eq!(MemberStatus::parse(&out).unwrap(), status);

        out.clear();
        Grant {
            epoch: 9,
            stamp: 1_000,
        }
        .emit(&mut out);
        assert_eq!(hex(&out), "000000000000000900000000000003e8");

        out.clear();
        SyncRequest {
            group: 1,
            since: 42,
            cursor: 7,
        }
        .emit(&mut out);
        assert_eq!(hex(&out), "0001000000000000002a00000007");

        out.clear();
        let data = SyncData {
            group: 1,
            cursor: 7,
            next: SYNC_DONE,
            change: 43,
            entries: vec![
                SyncEntry {
                    version: 3,
                    key: b"k",
                    value: Some(b"v"),
                },
                SyncEntry {
                    version: 5,
                    key: b"d",
                    value: None,
                },
            ],
        };
        data.emit(&mut out);
        assert_eq!(
            hex(&out),
            "000100000007ffffffff000000000000002b0002\
             000000000000000301016b000176\
             00000000000000050201640000"
        );
        assert_eq!(SyncData::parse(&out).unwrap(), data);

        out.clear();
        Fetch { epoch: 9 }.emit(&mut out);
        assert_eq!(hex(&out), "0000000000000009");
    }

    #[test]
    fn inconsistent_configurations_are_refused() {
        let mut bad = layout();
        bad.groups[0].chain = vec![0, 0];
        let mut out = Vec::new();
        bad.emit(&mut out);
        assert_eq!(Layout::parse(&out), Err(ChainParseError::Invalid));

        let mut bad = layout();
        bad.groups[1].chain = vec![5];
        out.clear();
        bad.emit(&mut out);
        assert_eq!(Layout::parse(&out), Err(ChainParseError::Invalid));

        let mut bad = layout();
        bad.groups[1].joining.as_mut().unwrap().source = 2;
        out.clear();
        bad.emit(&mut out);
        assert_eq!(Layout::parse(&out), Err(ChainParseError::Invalid));
    }

    #[test]
    fn any_bytes_parse_or_fail_without_panicking() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut valid = Vec::new();
        layout().emit(&mut valid);
        for round in 0..20_000u32 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bytes: Vec<u8> = if round % 2 == 0 {
                let len = (state % 96) as usize;
                (0..len).map(|i| (state >> (i % 57)) as u8).collect()
            } else {
                // A valid configuration with one byte changed, or cut short.
                let mut bytes = valid.clone();
                let at = (state as usize) % bytes.len();
                bytes[at] ^= (state >> 32) as u8 | 1;
                bytes.truncate(bytes.len() - (state >> 40) as usize % 3);
                bytes
            };
            let _ = Layout::parse(&bytes);
            let _ = MemberStatus::parse(&bytes);
            let _ = Grant::parse(&bytes);
            let _ = SyncRequest::parse(&bytes);
            let _ = SyncData::parse(&bytes);
            let _ = Fetch::parse(&bytes);
        }
    }
}

//! RemoteMemory over an in-memory store: its buffer, its calls to the store, its errors, and
//! a model check against a plain byte vector.

use pmnet_memory::{Call, LineError, MemLineStore, RemoteMemory, LINE};
use proptest::prelude::*;

fn patterned(lines: u64) -> MemLineStore {
    let store = MemLineStore::new(lines);
    let bytes: Vec<u8> = (0..lines as usize * LINE)
        .map(|i| (i % 251) as u8)
        .collect();
    store.poke(0, &bytes);
    store
}

#[test]
fn reads_see_the_clients_own_writes() {
    let store = MemLineStore::new(16);
    let mut mem = RemoteMemory::new(store.clone());
    mem.write(100, b"hello").unwrap();
    assert_eq!(mem.read_vec(100, 5).unwrap(), b"hello");
    assert_eq!(mem.read_vec(98, 9).unwrap(), b"\0\0hello\0\0");
    assert_eq!(store.peek(100, 5), [0; 5], "not sent before persist");
    mem.persist().unwrap();
    assert_eq!(store.peek(100, 5), *b"hello");
    assert_eq!(mem.dirty_lines(), 0);
}

#[test]
fn a_partial_line_write_keeps_the_rest_of_the_line() {
    let store = patterned(4);
    let mut mem = RemoteMemory::new(store.clone());
    mem.write(LINE as u64 + 10, &[0xFF; 4]).unwrap();
    assert_eq!(
        store.log(),
        vec![Call::Read { first: 1, count: 1 }],
        "one quorum read"
    );
    mem.persist().unwrap();
    let mut expected: Vec<u8> = (LINE..2 * LINE).map(|i| (i % 251) as u8).collect();
    expected[10..14].fill(0xFF);
    assert_eq!(store.peek(LINE as u64, LINE), expected);

    // Whole lines are not fetched; a line already buffered is not fetched again.
    store.clear_log();
    mem.write(2 * LINE as u64, &[1; LINE]).unwrap();
    mem.write(2 * LINE as u64 + 3, &[2; 3]).unwrap();
    assert!(store.log().is_empty());
    // A write spanning three lines, partial at both ends: two fetches, the middle one not.
    mem.persist().unwrap();
    store.clear_log();
    mem.write(LINE as u64 - 1, &[3; LINE + 2]).unwrap();
    assert_eq!(
        store.log(),
        vec![
            Call::Read { first: 0, count: 1 },
            Call::Read { first: 2, count: 1 }
        ]
    );
}

#[test]
fn reads_go_to_the_quorum_for_clean_lines_in_runs() {
    let store = patterned(8);
    let mut mem = RemoteMemory::new(store.clone());
    mem.write(3 * LINE as u64, &[9; LINE]).unwrap();
    let got = mem.read_vec(LINE as u64, 5 * LINE).unwrap();
    // Lines 1-2 and 4-5 from the store, line 3 from the buffer.
    assert_eq!(
        store.log(),
        vec![
            Call::Read { first: 1, count: 2 },
            Call::Read { first: 4, count: 2 }
        ]
    );
    let mut expected: Vec<u8> = (LINE..6 * LINE).map(|i| (i % 251) as u8).collect();
    expected[2 * LINE..3 * LINE].fill(9);
    assert_eq!(got, expected);
    // Clean lines are not cached: every read asks again, and sees another writer's write.
    store.poke(LINE as u64, &[42]);
    assert_eq!(mem.read_vec(LINE as u64, 1).unwrap(), [42]);
}

#[test]
fn persist_writes_exactly_the_dirty_lines_in_runs() {
    let store = MemLineStore::new(32);
    let mut mem = RemoteMemory::new(store.clone());
    mem.persist().unwrap();
    assert!(store.log().is_empty(), "nothing dirty: nothing sent");
    for line in [2u64, 3, 4, 9, 20, 21] {
        mem.write(line * LINE as u64, &[line as u8; LINE]).unwrap();
    }
    mem.write(3 * LINE as u64 + 1, &[0xAA]).unwrap(); // again: still one dirty line
    assert_eq!(mem.dirty_lines(), 6);
    mem.persist().unwrap();
    assert_eq!(store.write_calls(), vec![vec![(2, 3), (9, 1), (20, 2)]]);
    assert_eq!(store.peek(3 * LINE as u64, 2), [3, 0xAA]);
    mem.persist().unwrap();
    assert_eq!(store.write_calls().len(), 1, "persisted lines are clean");
}

#[test]
fn a_full_buffer_is_persisted_before_another_line_is_dirtied() {
    let store = MemLineStore::new(64);
    let mut mem = RemoteMemory::with_max_dirty(store.clone(), 4);
    for line in 0..4u64 {
        mem.write(line * LINE as u64, &[1; LINE]).unwrap();
    }
    assert!(store.write_calls().is_empty());
    mem.write(0, &[2; LINE]).unwrap(); // a dirty line: no room needed
    assert!(store.write_calls().is_empty());
    mem.write(10 * LINE as u64, &[3; LINE]).unwrap();
    assert_eq!(store.write_calls(), vec![vec![(0, 4)]]);
    assert_eq!(mem.dirty_lines(), 1);
    assert_eq!(store.peek(0, 1), [2]);

    // One write bigger than the buffer goes out in buffer-sized pieces.
    mem.persist().unwrap();
    store.clear_log();
    mem.write(20 * LINE as u64, &[4; 10 * LINE]).unwrap();
    assert_eq!(store.write_calls(), vec![vec![(20, 4)], vec![(24, 4)]]);
    assert_eq!(mem.dirty_lines(), 2);
    assert_eq!(
        mem.read_vec(20 * LINE as u64, 10 * LINE).unwrap(),
        [4; 10 * LINE]
    );
}

#[test]
fn a_flush_midway_keeps_the_rest_of_a_buffered_partial_line() {
    let store = MemLineStore::new(16);
    let mut mem = RemoteMemory::with_max_dirty(store.clone(), 2);
    mem.write(2 * LINE as u64 - 1, &[5; 2]).unwrap(); // lines 1 and 2 dirty
                                                      // Lines 0..3, partial at line 2 (buffered): the buffer is flushed before line 0 and
                                                      // again before line 2, which is no longer buffered then.
    mem.write(10, &[6; 2 * LINE]).unwrap();
    assert_eq!(store.write_calls(), vec![vec![(1, 2)], vec![(0, 2)]]);
    let mut expected = vec![0u8; 4 * LINE];
    expected[2 * LINE - 1..2 * LINE + 1].fill(5);
    expected[10..10 + 2 * LINE].fill(6);
    assert_eq!(mem.read_vec(0, 4 * LINE).unwrap(), expected);
    mem.persist().unwrap();
    assert_eq!(store.peek(0, 4 * LINE), expected);
}

#[test]
fn a_failed_flush_keeps_every_line() {
    let store = MemLineStore::new(64);
    let mut mem = RemoteMemory::with_max_dirty(store.clone(), 2);
    mem.write(0, &[1; 2 * LINE]).unwrap();
    store.fail_next_writes(1);
    assert_eq!(
        mem.write(5 * LINE as u64, &[2; LINE]),
        Err(LineError::Unavailable)
    );
    assert_eq!(
        mem.dirty_lines(),
        2,
        "the buffer is kept, the new line not taken"
    );
    assert_eq!(mem.persist(), Ok(()));
    assert_eq!(store.peek(0, 2 * LINE), [1; 2 * LINE]);
    store.set_down(true);
    mem.write(0, &[7; LINE]).unwrap();
    assert_eq!(mem.persist(), Err(LineError::Unavailable));
    assert_eq!(mem.read_vec(0, 1).unwrap(), [7], "still buffered");
    store.set_down(false);
    mem.persist().unwrap();
    assert_eq!(store.peek(0, 1), [7]);
}

#[test]
fn a_failed_fetch_buffers_nothing() {
    let store = MemLineStore::new(4);
    let mut mem = RemoteMemory::new(store.clone());
    store.fail_next_reads(1);
    assert_eq!(mem.write(70, &[1; 100]), Err(LineError::Unavailable));
    assert_eq!(mem.dirty_lines(), 0);
    store.set_down(true);
    assert_eq!(mem.read_vec(0, 1), Err(LineError::Unavailable));
}

#[test]
fn out_of_range_is_an_error_not_a_panic() {
    let store = MemLineStore::new(4);
    let mut mem = RemoteMemory::new(store.clone());
    let end = 4 * LINE as u64;
    assert_eq!(mem.len(), end);
    assert_eq!(
        mem.read_vec(end - 2, 3),
        Err(LineError::OutOfRange { first: 3, count: 2 })
    );
    assert_eq!(
        mem.write(end, &[1]),
        Err(LineError::OutOfRange { first: 4, count: 1 })
    );
    assert!(matches!(
        mem.write(u64::MAX - 1, &[1; 8]),
        Err(LineError::OutOfRange { .. })
    ));
    assert!(matches!(
        mem.read_vec(u64::MAX, 1),
        Err(LineError::OutOfRange { .. })
    ));
    assert!(matches!(
        mem.read_vec(end + 1, 0),
        Err(LineError::OutOfRange { .. })
    ));
    // Empty accesses inside (or at the end of) the memory are fine and send nothing.
    assert_eq!(mem.read_vec(end, 0), Ok(vec![]));
    mem.write(end, &[]).unwrap();
    assert!(store.log().is_empty());
    assert_eq!(mem.dirty_lines(), 0);
}

fn out_of_range<T>(r: &Result<T, LineError>) -> bool {
    matches!(r, Err(LineError::OutOfRange { .. }))
}

#[derive(Debug, Clone)]
enum Op {
    Read {
        addr: u64,
        len: usize,
    },
    Write {
        addr: u64,
        bytes: Vec<u8>,
    },
    Persist,
    /// Another client's completed write of whole lines, straight into the store.
    Other {
        line: u64,
        byte: u8,
    },
}

const LINES: u64 = 12;
const SIZE: u64 = LINES * LINE as u64;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..SIZE + 20, 0..200usize).prop_map(|(addr, len)| Op::Read { addr, len }),
        4 => (0..SIZE + 20, prop::collection::vec(any::<u8>(), 0..200))
            .prop_map(|(addr, bytes)| Op::Write { addr, bytes }),
        1 => Just(Op::Persist),
        1 => (0..LINES, any::<u8>()).prop_map(|(line, byte)| Op::Other { line, byte }),
    ]
}

proptest! {
    /// RemoteMemory behaves as a byte vector (the client's view: its writes over the store's
    /// lines it has not written), and after each persist the store holds exactly that.
    #[test]
    fn behaves_like_a_vector(ops in prop::collection::vec(op(), 1..60), max_dirty in 1usize..6) {
        let store = MemLineStore::new(LINES);
        let mut mem = RemoteMemory::with_max_dirty(store.clone(), max_dirty);
        // The model: what the store holds, and the client's lines not yet persisted.
        let mut remote = vec![0u8; SIZE as usize];
        let mut buffered: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
        let view = |remote: &[u8], buffered: &std::collections::BTreeMap<u64, Vec<u8>>| {
            let mut v = remote.to_vec();
            for (line, bytes) in buffered {
                v[*line as usize * LINE..][..LINE].copy_from_slice(bytes);
            }
            v
        };
        for op in ops {
            match op {
                Op::Read { addr, len } => {
                    let got = mem.read_vec(addr, len);
                    if addr + len as u64 > SIZE {
                        prop_assert!(out_of_range(&got));
                    } else {
                        let v = view(&remote, &buffered);
                        prop_assert_eq!(got.unwrap(), &v[addr as usize..][..len]);
                    }
                }
                Op::Write { addr, bytes } => {
                    let got = mem.write(addr, &bytes);
                    if addr + bytes.len() as u64 > SIZE {
                        prop_assert!(out_of_range(&got));
                        continue;
                    }
                    got.unwrap();
                    if bytes.is_empty() {
                        continue; // buffers nothing
                    }
                    let first = addr / LINE as u64;
                    let end = (addr + bytes.len() as u64).div_ceil(LINE as u64);
                    let mut v = view(&remote, &buffered);
                    v[addr as usize..][..bytes.len()].copy_from_slice(&bytes);
                    for line in first..end {
                        if !buffered.contains_key(&line) && buffered.len() == max_dirty {
                            // The flush the bound forces.
                            remote = view(&remote, &buffered);
                            buffered.clear();
                        }
                        buffered.insert(line, v[line as usize * LINE..][..LINE].to_vec());
                    }
                }
                Op::Persist => {
                    mem.persist().unwrap();
                    remote = view(&remote, &buffered);
                    buffered.clear();
                    prop_assert_eq!(store.peek(0, SIZE as usize), remote.clone());
                }
                Op::Other { line, byte } => {
                    store.poke(line * LINE as u64, &[byte; LINE]);
                    remote[line as usize * LINE..][..LINE].fill(byte);
                }
            }
            prop_assert_eq!(mem.dirty_lines(), buffered.len());
            prop_assert_eq!(store.peek(0, SIZE as usize), remote.clone());
        }
    }
}

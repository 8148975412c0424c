//! The mmap'ed view over an in-memory store. Tests that need userfaultfd print why and pass
//! where the kernel refuses it.

use std::time::Duration;

use pmnet_memory::{
    Call, FaultPolicy, LineError, MapError, MapOptions, MappedMemory, MemLineStore, Tracking, LINE,
    PAGE, PAGE_LINES,
};

/// A view of `pages` pages over a store of `lines` lines, or None (with a message) where
/// userfaultfd is not available.
fn map(
    store: &MemLineStore,
    pages: usize,
    options: MapOptions,
) -> Option<MappedMemory<MemLineStore>> {
    match MappedMemory::map_with(store.clone(), pages, options) {
        Ok(view) => Some(view),
        Err(MapError::Unsupported(e)) => {
            println!("SKIPPED: userfaultfd is not available here ({e})");
            None
        }
        Err(e) => panic!("map: {e}"),
    }
}

fn patterned(lines: u64) -> MemLineStore {
    let store = MemLineStore::new(lines);
    let bytes: Vec<u8> = (0..lines as usize * LINE)
        .map(|i| (i % 251) as u8)
        .collect();
    store.poke(0, &bytes);
    store
}

/// Reads the byte at `addr` (a read the compiler cannot leave out).
fn touch(view: &MappedMemory<MemLineStore>, addr: usize) -> u8 {
    std::hint::black_box(view.as_slice()[addr])
}

fn page_read(page: usize) -> Call {
    Call::Read {
        first: (page * PAGE_LINES) as u64,
        count: PAGE_LINES as u64,
    }
}

#[test]
fn reports_its_tracking_mode() {
    let store = MemLineStore::new(PAGE_LINES as u64);
    let Some(view) = map(&store, 1, MapOptions::default()) else {
        return;
    };
    println!("write tracking here: {:?}", view.tracking());
    let Some(explicit) = map(
        &store,
        1,
        MapOptions {
            explicit_tracking: true,
            ..MapOptions::default()
        },
    ) else {
        return;
    };
    assert_eq!(explicit.tracking(), Tracking::Explicit);
}

#[test]
fn first_touch_fetches_the_page_once() {
    let store = patterned(4 * PAGE_LINES as u64);
    let Some(view) = map(&store, 4, MapOptions::default()) else {
        return;
    };
    assert!(store.log().is_empty(), "mapping fetches nothing");
    assert_eq!(view.as_slice()[PAGE + 5], ((PAGE + 5) % 251) as u8);
    assert_eq!(store.log(), vec![page_read(1)]);
    // The rest of the page is there without another fetch.
    assert_eq!(
        view.as_slice()[PAGE..2 * PAGE],
        store.peek(PAGE as u64, PAGE)[..]
    );
    assert_eq!(store.log(), vec![page_read(1)]);
    let stats = view.stats();
    assert_eq!(
        (
            stats.missing_faults,
            stats.resident_pages,
            stats.dirty_pages
        ),
        (1, 1, 0)
    );
}

#[test]
fn threads_faulting_on_one_page_fetch_it_once() {
    let store = patterned(PAGE_LINES as u64);
    let Some(view) = map(&store, 1, MapOptions::default()) else {
        return;
    };
    let view = &view;
    std::thread::scope(|s| {
        for i in 0..8 {
            s.spawn(move || assert_eq!(touch(view, i * 500), (i * 500 % 251) as u8));
        }
    });
    assert_eq!(store.log(), vec![page_read(0)]);
}

#[test]
fn the_view_starts_at_its_first_line() {
    let store = patterned(3 * PAGE_LINES as u64);
    let options = MapOptions {
        first_line: PAGE_LINES as u64 + 2,
        ..MapOptions::default()
    };
    let Some(view) = map(&store, 1, options) else {
        return;
    };
    let start = (PAGE_LINES + 2) * LINE;
    assert_eq!(view.as_slice()[..], store.peek(start as u64, PAGE)[..]);
    assert_eq!(
        store.log(),
        vec![Call::Read {
            first: PAGE_LINES as u64 + 2,
            count: 64
        }]
    );
    let Err(MapError::OutOfRange { .. }) = MappedMemory::map_with(
        store.clone(),
        2,
        MapOptions {
            first_line: 65,
            ..MapOptions::default()
        },
    ) else {
        panic!("a view past the store's end maps");
    };
}

#[test]
fn a_write_dirties_its_page_and_persist_writes_only_changed_lines() {
    let store = patterned(2 * PAGE_LINES as u64);
    let Some(mut view) = map(&store, 2, MapOptions::default()) else {
        return;
    };
    if view.tracking() != Tracking::WriteProtect {
        println!("SKIPPED: no write-protect tracking here");
        return;
    }
    touch(&view, 0); // page 0 present, clean
    assert_eq!(view.stats().resident_pages, 1);
    assert_eq!(view.stats().dirty_pages, 0);
    view.as_mut_slice()[3 * LINE + 1] = 0xEE;
    view.as_mut_slice()[4 * LINE] = 0xEF;
    view.as_mut_slice()[10 * LINE] = view.as_slice()[10 * LINE]; // same bytes: not a change
    let stats = view.stats();
    assert_eq!((stats.write_faults, stats.dirty_pages), (1, 1));
    assert!(
        store.write_calls().is_empty(),
        "nothing is written before persist"
    );

    view.persist().unwrap();
    assert_eq!(store.write_calls(), vec![vec![(3, 2)]]);
    assert_eq!(store.peek(3 * LINE as u64 + 1, 1), [0xEE]);
    assert_eq!(store.peek(4 * LINE as u64, 1), [0xEF]);
    assert_eq!(view.stats().dirty_pages, 0);
    assert_eq!(view.stats().persisted_lines, 2);

    // Persisted pages are protected again: the next write is caught as a new change.
    view.as_mut_slice()[63 * LINE] = 1;
    assert_eq!(view.stats().write_faults, 2);
    view.persist().unwrap();
    assert_eq!(store.write_calls()[1], vec![(63, 1)]);

    // Nothing dirty: nothing sent.
    view.persist().unwrap();
    assert_eq!(store.write_calls().len(), 2);
}

#[test]
fn a_write_to_a_missing_page_fetches_it_and_dirties_it() {
    let store = patterned(2 * PAGE_LINES as u64);
    let Some(mut view) = map(&store, 2, MapOptions::default()) else {
        return;
    };
    if view.tracking() != Tracking::WriteProtect {
        println!("SKIPPED: no write-protect tracking here");
        return;
    }
    view.as_mut_slice()[PAGE + 7] = 0xAB;
    // The rest of the line kept the fetched bytes.
    assert_eq!(view.as_slice()[PAGE + 6], ((PAGE + 6) % 251) as u8);
    assert_eq!(store.log(), vec![page_read(1)]);
    assert_eq!(view.stats().dirty_pages, 1);
    view.persist().unwrap();
    assert_eq!(store.write_calls(), vec![vec![(PAGE_LINES as u64, 1)]]);
    let mut expected: Vec<u8> = (PAGE..PAGE + LINE).map(|i| (i % 251) as u8).collect();
    expected[7] = 0xAB;
    assert_eq!(store.peek(PAGE as u64, LINE), expected);
}

#[test]
fn adjacent_changed_lines_across_pages_are_one_run() {
    let store = MemLineStore::new(3 * PAGE_LINES as u64);
    let Some(mut view) = map(&store, 3, MapOptions::default()) else {
        return;
    };
    if view.tracking() != Tracking::WriteProtect {
        println!("SKIPPED: no write-protect tracking here");
        return;
    }
    view.as_mut_slice()[PAGE - 1] = 1; // last line of page 0
    view.as_mut_slice()[PAGE] = 2; // first line of page 1
    view.as_mut_slice()[2 * PAGE + 5 * LINE] = 3;
    view.persist().unwrap();
    assert_eq!(store.write_calls(), vec![vec![(63, 2), (133, 1)]]);
}

#[test]
fn refresh_sees_other_writers() {
    let store = MemLineStore::new(2 * PAGE_LINES as u64);
    let Some(mut view) = map(&store, 2, MapOptions::default()) else {
        return;
    };
    assert_eq!(view.as_slice()[100], 0);
    assert_eq!(view.as_slice()[PAGE], 0);
    // Another client writes both pages; the view reads its cached pages.
    store.poke(100, &[7]);
    store.poke(PAGE as u64, &[8]);
    assert_eq!(view.as_slice()[100], 0);
    assert_eq!(view.refresh().unwrap(), 2);
    assert_eq!(view.stats().resident_pages, 0);
    let reads = store.read_calls();
    assert_eq!(view.as_slice()[100], 7);
    assert_eq!(view.as_slice()[PAGE], 8);
    assert_eq!(store.read_calls(), reads + 2, "each page is fetched again");

    // invalidate drops only the pages its range touches.
    store.poke(101, &[9]);
    store.poke(PAGE as u64 + 1, &[9]);
    assert_eq!(view.invalidate(PAGE..PAGE + 2).unwrap(), 1);
    assert_eq!(view.as_slice()[101], 0);
    assert_eq!(view.as_slice()[PAGE + 1], 9);
    assert!(matches!(
        view.invalidate(0..2 * PAGE + 1),
        Err(LineError::OutOfRange { .. })
    ));
}

#[test]
fn refresh_keeps_dirty_pages() {
    let store = MemLineStore::new(2 * PAGE_LINES as u64);
    let options = MapOptions {
        explicit_tracking: true,
        ..MapOptions::default()
    };
    let Some(mut wp) = map(&store, 2, MapOptions::default()) else {
        return;
    };
    let Some(mut explicit) = map(&store, 2, options) else {
        return;
    };
    for view in [&mut wp, &mut explicit] {
        touch(view, PAGE);
        view.as_mut_slice()[0] = 5;
        if view.tracking() == Tracking::Explicit {
            view.mark_dirty(0..1).unwrap();
        }
        assert_eq!(view.refresh().unwrap(), 1, "only the clean page goes");
        assert_eq!(view.as_slice()[0], 5);
    }
}

#[test]
fn explicit_tracking_persists_marked_lines_only() {
    let store = patterned(PAGE_LINES as u64);
    let options = MapOptions {
        explicit_tracking: true,
        ..MapOptions::default()
    };
    let Some(mut view) = map(&store, 1, options) else {
        return;
    };
    view.as_mut_slice()[0] = 0xAA;
    view.as_mut_slice()[2 * LINE] = 0xBB;
    view.persist().unwrap();
    assert!(
        store.write_calls().is_empty(),
        "unmarked writes are not tracked"
    );
    view.mark_dirty(2 * LINE..2 * LINE + 1).unwrap();
    view.persist().unwrap();
    assert_eq!(store.write_calls(), vec![vec![(2, 1)]]);
    assert_eq!(store.peek(2 * LINE as u64, 1), [0xBB]);
    assert_eq!(store.peek(0, 1), [0], "line 0 was never marked");
    assert!(matches!(
        view.mark_dirty(PAGE - 1..PAGE + 1),
        Err(LineError::OutOfRange { .. })
    ));
}

#[test]
fn a_failed_persist_keeps_the_lines_dirty() {
    let store = MemLineStore::new(PAGE_LINES as u64);
    let Some(mut view) = map(&store, 1, MapOptions::default()) else {
        return;
    };
    view.as_mut_slice()[LINE] = 1;
    view.mark_dirty(LINE..LINE + 1).unwrap(); // for explicit tracking; harmless otherwise
    store.set_down(true);
    assert_eq!(view.persist(), Err(LineError::Unavailable));
    // Written again after the failure: the first change must still go.
    view.as_mut_slice()[2 * LINE] = 2;
    view.mark_dirty(2 * LINE..2 * LINE + 1).unwrap();
    store.set_down(false);
    view.persist().unwrap();
    assert_eq!(store.write_calls().last().unwrap(), &vec![(1, 2)]);
    assert_eq!(
        store.peek(LINE as u64, LINE + 1)[..],
        {
            let mut b = vec![0; LINE + 1];
            b[0] = 1;
            b[LINE] = 2;
            b
        }[..]
    );
}

#[test]
fn a_failed_fetch_is_retried() {
    let store = patterned(PAGE_LINES as u64);
    store.fail_next_reads(3);
    let policy = FaultPolicy {
        attempts: None,
        first_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(2),
    };
    let Some(view) = map(
        &store,
        1,
        MapOptions {
            fault_policy: policy,
            ..MapOptions::default()
        },
    ) else {
        return;
    };
    assert_eq!(view.as_slice()[9], 9);
    let stats = view.stats();
    assert_eq!(stats.fetch_failures, 3);
    assert_eq!(stats.last_fetch_error, Some(LineError::Unavailable));
    assert_eq!(stats.unserved_faults, 0);
    assert_eq!(store.read_calls(), 4);
}

#[test]
fn threads_write_disjoint_pages_and_persist_sends_them_all() {
    let pages = 8;
    let store = MemLineStore::new((pages * PAGE_LINES) as u64);
    let Some(mut view) = map(&store, pages, MapOptions::default()) else {
        return;
    };
    std::thread::scope(|s| {
        for (i, page) in view.as_mut_slice().chunks_mut(PAGE).enumerate() {
            s.spawn(move || page[i * LINE] = i as u8 + 1);
        }
    });
    if view.tracking() == Tracking::Explicit {
        for i in 0..pages {
            view.mark_dirty(i * PAGE + i * LINE..i * PAGE + i * LINE + 1)
                .unwrap();
        }
    }
    view.persist().unwrap();
    let runs: Vec<(u64, u64)> = (0..pages)
        .map(|i| ((i * PAGE_LINES + i) as u64, 1))
        .collect();
    assert_eq!(store.write_calls(), vec![runs]);
    for i in 0..pages {
        assert_eq!(store.peek((i * PAGE + i * LINE) as u64, 1), [i as u8 + 1]);
    }
}

/// A fault the store cannot serve ends in SIGBUS for the faulting thread. Checked in a child
/// process (this test binary again, running only this test), which must die of it.
#[test]
fn an_unserved_fault_raises_sigbus() {
    const CHILD: &str = "PMNET_MEMORY_SIGBUS_CHILD";
    if std::env::var_os(CHILD).is_some() {
        // No core file from the crash this test is after.
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a plain system call on a valid struct.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
        let store = MemLineStore::new(PAGE_LINES as u64);
        store.set_down(true);
        let policy = FaultPolicy {
            attempts: Some(2),
            first_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
        };
        let options = MapOptions {
            fault_policy: policy,
            ..MapOptions::default()
        };
        let view = match MappedMemory::map_with(store, 1, options) {
            Ok(view) => view,
            Err(MapError::Unsupported(_)) => std::process::exit(3),
            Err(e) => panic!("map: {e}"),
        };
        let byte = view.as_slice()[0];
        println!("read {byte} from an unavailable store");
        std::process::exit(0);
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "an_unserved_fault_raises_sigbus",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run the child");
    use std::os::unix::process::ExitStatusExt;
    if status.status.code() == Some(3) {
        println!("SKIPPED: userfaultfd is not available here");
        return;
    }
    assert_eq!(
        status.status.signal(),
        Some(libc::SIGBUS),
        "child: {:?}\n{}",
        status.status,
        String::from_utf8_lossy(&status.stdout)
    );
}

#[test]
fn dropping_the_view_stops_its_thread_and_releases_the_store() {
    let store = MemLineStore::new(PAGE_LINES as u64);
    for _ in 0..20 {
        let Some(mut view) = map(&store, 1, MapOptions::default()) else {
            return;
        };
        view.as_mut_slice()[0] += 1;
        view.mark_dirty(0..1).unwrap();
        view.persist().unwrap();
        assert_eq!(store.handles(), 2);
        drop(view); // joins the fault thread, which holds the other handle
        assert_eq!(store.handles(), 1);
    }
    assert_eq!(store.peek(0, 1), [20]);
}

#[test]
fn views_over_too_little_store_do_not_map() {
    let store = MemLineStore::new(PAGE_LINES as u64 - 1);
    assert!(matches!(
        MappedMemory::map(store.clone(), 1),
        Err(MapError::OutOfRange { .. })
    ));
    assert!(matches!(
        MappedMemory::map(store, 0),
        Err(MapError::OutOfRange { .. })
    ));
}

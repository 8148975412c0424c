//! The PMNet server side inside redis-server (docs/redis.md, "The module"): a Redis module,
//! `libpmnet_redis_module.so`, loaded with
//!
//! ```text
//! redis-server --appendonly yes --appendfsync always \
//!     --loadmodule target/release/libpmnet_redis_module.so listen 127.0.0.1:7500 device 127.0.0.1:7400
//! ```
//!
//! It runs the protocol's [`pmnet_proto::Server`] on Redis's own event loop: the devices'
//! datagrams arrive on a UDP socket Redis watches, requests are applied with their sessions'
//! records in one execution unit before Redis writes its append-only file, and the
//! server-ACKs leave after Redis fsynced it (`node.rs`). No client socket, no Lua, no second
//! process: the Redis thread does the writes and little else.

#![allow(unsafe_code)]

mod apply;
mod call;
mod ffi;
mod log;
mod node;
pub mod options;
mod transaction;

use std::cell::RefCell;
use std::ffi::{c_int, c_void};

use call::Redis;
use ffi::{Ctx, Event, RString};
use node::Node;

thread_local! {
    /// The module's state: Redis calls a module only from its main thread.
    static NODE: RefCell<Option<Node>> = const { RefCell::new(None) };
    static FAILED: RefCell<Option<String>> = const { RefCell::new(None) };
    /// What `INFO pmnet` last showed: what it shows again when Redis asks while the module is
    /// applying a request (a script of the request runs `INFO`), the node itself in use.
    static STATUS: RefCell<Vec<(String, String)>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` on the node unless it is in use: Redis can call back into the module from inside
/// a command the module runs (a long script lets Redis serve events while it runs); such a
/// call finds the node busy and leaves its work for later (datagrams wait in the socket).
/// Never a panic across the C boundary.
fn with_node(f: impl FnOnce(&mut Node)) {
    NODE.with(|cell| {
        if let Ok(mut node) = cell.try_borrow_mut() {
            if let Some(node) = node.as_mut() {
                f(node);
            }
        }
    });
}

extern "C" fn on_readable(_fd: c_int, _data: *mut c_void, _mask: c_int) {
    with_node(Node::on_readable);
}

extern "C" fn on_wake(_fd: c_int, _data: *mut c_void, _mask: c_int) {
    with_node(Node::on_wake);
}

extern "C" fn on_timer(_ctx: *mut Ctx, _data: *mut c_void) {
    with_node(Node::on_timer);
}

pub(crate) fn create_timer(redis: &Redis, millis: i64) {
    // SAFETY: a live context; the callback takes no data.
    unsafe { (ffi::api().create_timer)(redis.ctx(), millis, on_timer, std::ptr::null_mut()) };
}

extern "C" fn on_event_loop(ctx: *mut Ctx, _event: Event, subevent: u64, _data: *mut c_void) {
    if FAILED.with_borrow(Option::is_some) {
        return;
    }
    // SAFETY: the context Redis passed to this callback, used only within it.
    let redis = unsafe { Redis::new(ctx) };
    let mut failure = None;
    with_node(|node| match subevent {
        ffi::SUBEVENT_EVENTLOOP_BEFORE_SLEEP => match node.before_sleep(&redis) {
            Ok(Some(startup)) => ffi::log(
                ctx,
                c"notice",
                &format!(
                    "pmnet: serving as server {} on {} ({} device(s)); traffic: {}; \
                     persistence: {}; {} session(s) recovered from database {} of {}{}",
                    node.options.server_id,
                    node.local_addr(),
                    node.options.devices.len(),
                    node.traffic_text(),
                    startup.durability,
                    startup.sessions_recovered,
                    startup.record_db,
                    startup.databases,
                    if startup.records_skipped > 0 {
                        format!(
                            ", {} key(s) under the prefix not records",
                            startup.records_skipped
                        )
                    } else {
                        String::new()
                    }
                ),
            ),
            Ok(None) => {}
            Err(message) => failure = Some(message),
        },
        ffi::SUBEVENT_EVENTLOOP_AFTER_SLEEP => node.after_sleep(),
        _ => {}
    });
    if let Some(message) = failure {
        ffi::log(ctx, c"warning", &format!("pmnet: cannot serve: {message}"));
        FAILED.with_borrow_mut(|failed| *failed = Some(message));
    }
}

/// Take the node's status for `INFO pmnet` (unless the node is in use: the last one stays).
fn refresh_status() {
    let mut fields = None;
    with_node(|node| fields = Some(node.status_fields()));
    if let Some(fields) = fields {
        STATUS.with(|status| {
            if let Ok(mut status) = status.try_borrow_mut() {
                *status = fields;
            }
        });
    }
}

/// `INFO pmnet`: what the module is doing (`pmnet_listen`, `pmnet_durability`, counters).
extern "C" fn info(ctx: *mut ffi::InfoCtx, _for_crash_report: c_int) {
    let mut fields: Vec<(String, String)> = Vec::new();
    FAILED.with_borrow(|failed| {
        if let Some(message) = failed {
            fields.push(("failed".to_owned(), message.clone()));
        }
    });
    refresh_status();
    STATUS.with(|status| {
        if let Ok(status) = status.try_borrow() {
            fields.extend(status.iter().cloned());
        }
    });
    let api = ffi::api();
    // SAFETY: an info context Redis passed; NULL names the module's own section.
    unsafe { (api.info_add_section)(ctx, std::ptr::null()) };
    for (name, value) in fields {
        let (Ok(name), Ok(value)) = (
            std::ffi::CString::new(name),
            std::ffi::CString::new(value.replace(['\r', '\n'], " ")),
        ) else {
            continue;
        };
        // SAFETY: NUL-terminated strings Redis copies.
        unsafe { (api.info_add_field_cstring)(ctx, name.as_ptr(), value.as_ptr()) };
    }
}

/// The module's arguments as bytes.
///
/// # Safety
/// `argv` holds `argc` strings Redis passed.
unsafe fn arguments(argv: *mut *mut RString, argc: c_int) -> Vec<Vec<u8>> {
    let api = ffi::api();
    (0..usize::try_from(argc).unwrap_or(0))
        .map(|index| {
            let mut len = 0usize;
            // SAFETY: `index < argc`; the string's bytes live while Redis holds it.
            unsafe {
                let ptr = (api.string_ptr_len)(*argv.add(index), &mut len);
                std::slice::from_raw_parts(ptr.cast::<u8>(), len).to_vec()
            }
        })
        .collect()
}

/// Redis calls this at `--loadmodule` (or `MODULE LOAD`).
///
/// # Safety
/// Called by Redis with its load context and the module's arguments.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut Ctx,
    argv: *mut *mut RString,
    argc: c_int,
) -> c_int {
    // SAFETY: the load context.
    let api = match unsafe { ffi::load(ctx) } {
        Ok(api) => api,
        Err(_missing) => return ffi::ERR,
    };
    // SAFETY: the load context and a static name.
    unsafe { (api.set_module_attribs)(ctx, c"pmnet".as_ptr(), 1, ffi::APIVER_1) };
    log::install();
    // SAFETY: Redis's arguments.
    let args = unsafe { arguments(argv, argc) };
    let node = match options::parse(&args).and_then(Node::new) {
        Ok(node) => node,
        Err(message) => {
            ffi::log(ctx, c"warning", &format!("pmnet: {message}"));
            return ffi::ERR;
        }
    };
    // SAFETY: descriptors the node owns for the module's life; static callbacks.
    let added = unsafe {
        (api.event_loop_add)(
            node.socket_fd(),
            ffi::EVENTLOOP_READABLE,
            on_readable,
            std::ptr::null_mut(),
        ) == ffi::OK
            && (api.event_loop_add)(
                node.wake_fd(),
                ffi::EVENTLOOP_READABLE,
                on_wake,
                std::ptr::null_mut(),
            ) == ffi::OK
            && (api.subscribe_to_server_event)(
                ctx,
                Event {
                    id: ffi::EVENT_EVENTLOOP,
                    dataver: 1,
                },
                on_event_loop,
            ) == ffi::OK
            && (api.register_info_func)(ctx, info) == ffi::OK
    };
    if !added {
        ffi::log(
            ctx,
            c"warning",
            "pmnet: Redis refused the module's event handlers or its INFO section",
        );
        return ffi::ERR;
    }
    ffi::log(
        ctx,
        c"notice",
        &format!(
            "pmnet: module loaded: UDP {} as server {}; serving once Redis has loaded its data",
            node.local_addr(),
            node.options.server_id
        ),
    );
    NODE.with_borrow_mut(|slot| *slot = Some(node));
    refresh_status();
    ffi::OK
}

/// Redis calls this at `MODULE UNLOAD`: refused. Devices hold acknowledged requests that only
/// this server side applies; stop Redis to stop it (it recovers at the next start).
///
/// # Safety
/// Called by Redis with a context.
#[no_mangle]
pub unsafe extern "C" fn RedisModule_OnUnload(ctx: *mut Ctx) -> c_int {
    ffi::log(
        ctx,
        c"warning",
        "pmnet: the module cannot be unloaded while Redis runs (devices rely on it); restart \
         redis-server without it",
    );
    ffi::ERR
}

//! The part of Redis's module API (redismodule.h, API version 1) this module calls, declared
//! by hand: Redis hands a module a table of functions looked up by name through the first
//! word of the context it passes to `RedisModule_OnLoad`, so the ABI is a set of C function
//! pointers and a few constants. Declaring the ~20 this module uses keeps its build free of
//! bindgen and libclang (docs/redis.md, "The module").

use std::ffi::{c_char, c_int, c_longlong, c_void, CStr};
use std::sync::OnceLock;

/// Redis's opaque types.
#[repr(C)]
#[derive(Debug)]
pub struct Ctx {
    _private: [u8; 0],
}
#[repr(C)]
#[derive(Debug)]
pub struct CallReply {
    _private: [u8; 0],
}
#[repr(C)]
#[derive(Debug)]
pub struct RString {
    _private: [u8; 0],
}
#[repr(C)]
#[derive(Debug)]
pub struct InfoCtx {
    _private: [u8; 0],
}

pub const OK: c_int = 0;
pub const ERR: c_int = 1;
pub const APIVER_1: c_int = 1;
pub const EVENTLOOP_READABLE: c_int = 1;
pub const EVENT_EVENTLOOP: u64 = 15;
pub const SUBEVENT_EVENTLOOP_BEFORE_SLEEP: u64 = 0;
pub const SUBEVENT_EVENTLOOP_AFTER_SLEEP: u64 = 1;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Event {
    pub id: u64,
    pub dataver: u64,
}

pub type EventLoopFunc = extern "C" fn(fd: c_int, user_data: *mut c_void, mask: c_int);
pub type EventCallback = extern "C" fn(ctx: *mut Ctx, eid: Event, subevent: u64, data: *mut c_void);
pub type InfoFunc = extern "C" fn(ctx: *mut InfoCtx, for_crash_report: c_int);
pub type TimerProc = extern "C" fn(ctx: *mut Ctx, data: *mut c_void);

type GetApi = unsafe extern "C" fn(name: *const c_char, target: *mut c_void) -> c_int;

/// The functions this module calls, looked up once at load.
#[allow(missing_debug_implementations)]
pub struct Api {
    pub set_module_attribs: unsafe extern "C" fn(*mut Ctx, *const c_char, c_int, c_int),
    pub log: unsafe extern "C" fn(*mut Ctx, *const c_char, *const c_char, ...),
    pub event_loop_add: unsafe extern "C" fn(c_int, c_int, EventLoopFunc, *mut c_void) -> c_int,
    pub subscribe_to_server_event: unsafe extern "C" fn(*mut Ctx, Event, EventCallback) -> c_int,
    pub call: unsafe extern "C" fn(*mut Ctx, *const c_char, *const c_char, ...) -> *mut CallReply,
    pub call_reply_proto: unsafe extern "C" fn(*mut CallReply, *mut usize) -> *const c_char,
    pub free_call_reply: unsafe extern "C" fn(*mut CallReply),
    pub create_string: unsafe extern "C" fn(*mut Ctx, *const c_char, usize) -> *mut RString,
    pub free_string: unsafe extern "C" fn(*mut Ctx, *mut RString),
    pub string_ptr_len: unsafe extern "C" fn(*const RString, *mut usize) -> *const c_char,
    pub register_info_func: unsafe extern "C" fn(*mut Ctx, InfoFunc) -> c_int,
    pub info_add_section: unsafe extern "C" fn(*mut InfoCtx, *const c_char) -> c_int,
    pub info_add_field_cstring:
        unsafe extern "C" fn(*mut InfoCtx, *const c_char, *const c_char) -> c_int,
    pub select_db: unsafe extern "C" fn(*mut Ctx, c_int) -> c_int,
    pub create_timer: unsafe extern "C" fn(*mut Ctx, c_longlong, TimerProc, *mut c_void) -> u64,
}

static API: OnceLock<Api> = OnceLock::new();

/// The API table; panics if called before [`load`] succeeded (only Redis calls into the
/// module, and only after its `OnLoad` returned OK).
pub fn api() -> &'static Api {
    API.get().expect("the module API is looked up at load")
}

/// Look up every function this module calls; the name of the first Redis lacks otherwise
/// (an older Redis: `EventLoopAdd` came in 7.0).
///
/// # Safety
/// `ctx` is the context Redis passed to `RedisModule_OnLoad`.
pub unsafe fn load(ctx: *mut Ctx) -> Result<&'static Api, &'static str> {
    // SAFETY: the first word of the load context is `RedisModule_GetApi` (redismodule.h,
    // `RedisModule_InitAPI`).
    let get_api: GetApi =
        unsafe { std::mem::transmute::<*mut c_void, GetApi>(*(ctx as *mut *mut c_void)) };
    macro_rules! lookup {
        ($name:literal) => {{
            let mut pointer: *mut c_void = std::ptr::null_mut();
            let name: &CStr = $name;
            // SAFETY: GetApi writes one function pointer into `pointer`.
            let status =
                unsafe { get_api(name.as_ptr(), (&mut pointer as *mut *mut c_void).cast()) };
            if status != OK || pointer.is_null() {
                return Err(name.to_str().unwrap_or("?"));
            }
            // SAFETY: the function Redis names so has the signature redismodule.h declares,
            // which the field's type repeats.
            unsafe { function_from(pointer) }
        }};
    }
    let api = Api {
        set_module_attribs: lookup!(c"RedisModule_SetModuleAttribs"),
        log: lookup!(c"RedisModule_Log"),
        event_loop_add: lookup!(c"RedisModule_EventLoopAdd"),
        subscribe_to_server_event: lookup!(c"RedisModule_SubscribeToServerEvent"),
        call: lookup!(c"RedisModule_Call"),
        call_reply_proto: lookup!(c"RedisModule_CallReplyProto"),
        free_call_reply: lookup!(c"RedisModule_FreeCallReply"),
        create_string: lookup!(c"RedisModule_CreateString"),
        free_string: lookup!(c"RedisModule_FreeString"),
        string_ptr_len: lookup!(c"RedisModule_StringPtrLen"),
        register_info_func: lookup!(c"RedisModule_RegisterInfoFunc"),
        info_add_section: lookup!(c"RedisModule_InfoAddSection"),
        info_add_field_cstring: lookup!(c"RedisModule_InfoAddFieldCString"),
        select_db: lookup!(c"RedisModule_SelectDb"),
        create_timer: lookup!(c"RedisModule_CreateTimer"),
    };
    Ok(API.get_or_init(|| api))
}

/// A function pointer of type `F` from the address Redis gave.
///
/// # Safety
/// `F` is the function pointer type of the function at `pointer`.
unsafe fn function_from<F: Copy>(pointer: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked); the caller vouches for the type.
    unsafe { std::mem::transmute_copy(&pointer) }
}

/// Write `message` to Redis's log at `level` ("debug", "verbose", "notice", "warning").
pub fn log(ctx: *mut Ctx, level: &CStr, message: &str) {
    let Some(api) = API.get() else { return };
    let text = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
    // SAFETY: "%s" with one NUL-terminated string.
    unsafe { (api.log)(ctx, level.as_ptr(), c"%s".as_ptr(), text.as_ptr()) };
}

//! Running a command inside Redis (`RedisModule_Call`) and taking its reply as the RESP bytes
//! a client would have read (`RedisModule_CallReplyProto`).

use std::ffi::{c_int, CString};

use crate::ffi::{self, Ctx, RString};

/// How a command runs.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    // In this order: `flags` indexes its table by the discriminant.
    /// A request's command: written to the AOF and replicas (`!`), refused as a client would
    /// be refused when Redis is out of memory (`M`), errors as replies (`E`).
    Request,
    /// The module's own write (a session record): to the AOF and replicas, never refused for
    /// memory (it goes with an effect already made).
    Record,
    /// The module's own read.
    Read,
}

impl Mode {
    fn prefix(self) -> &'static str {
        match self {
            Mode::Request => "!EM",
            Mode::Record => "!E",
            Mode::Read => "E",
        }
    }

    /// The format of a call with `count` buffers (at most [`BUFFER_ARGS_MAX`]), made once.
    fn flags(self, count: usize) -> &'static CString {
        static FORMATS: std::sync::OnceLock<Vec<Vec<CString>>> = std::sync::OnceLock::new();
        let formats = FORMATS.get_or_init(|| {
            [Mode::Request, Mode::Record, Mode::Read]
                .iter()
                .map(|mode| {
                    (0..=BUFFER_ARGS_MAX)
                        .map(|count| {
                            let mut format = mode.prefix().to_owned();
                            format.extend(std::iter::repeat_n('b', count));
                            CString::new(format).expect("no NUL")
                        })
                        .collect()
                })
                .collect()
        });
        &formats[self as usize][count]
    }

    /// The format of a call with a vector of module strings.
    fn vector_flags(self) -> CString {
        CString::new(format!("{}v", self.prefix())).expect("no NUL")
    }
}

/// Arguments passed as buffers at most; more go as module strings.
const BUFFER_ARGS_MAX: usize = 24;

/// `RedisModule_Call` with each word as a buffer (a `b` of the format each).
///
/// # Safety
/// `format` has exactly `words.len()` `b`s after its flags; `ctx` is live.
unsafe fn call_buffers(
    api: &ffi::Api,
    ctx: *mut Ctx,
    name: *const std::ffi::c_char,
    format: *const std::ffi::c_char,
    words: &[&[u8]],
) -> *mut ffi::CallReply {
    macro_rules! with {
        ($($i:literal)*) => {
            // SAFETY: per the function's contract.
            unsafe { (api.call)(ctx, name, format $(, words[$i].as_ptr(), words[$i].len())*) }
        };
    }
    match words.len() {
        0 => with!(),
        1 => with!(0),
        2 => with!(0 1),
        3 => with!(0 1 2),
        4 => with!(0 1 2 3),
        5 => with!(0 1 2 3 4),
        6 => with!(0 1 2 3 4 5),
        7 => with!(0 1 2 3 4 5 6),
        8 => with!(0 1 2 3 4 5 6 7),
        9 => with!(0 1 2 3 4 5 6 7 8),
        10 => with!(0 1 2 3 4 5 6 7 8 9),
        11 => with!(0 1 2 3 4 5 6 7 8 9 10),
        12 => with!(0 1 2 3 4 5 6 7 8 9 10 11),
        13 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12),
        14 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13),
        15 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14),
        16 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15),
        17 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16),
        18 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17),
        19 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18),
        20 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19),
        21 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20),
        22 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21),
        23 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22),
        24 => with!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23),
        _ => unreachable!("at most {BUFFER_ARGS_MAX} buffers"),
    }
}

/// A context to run commands in: the one Redis passed to the callback running now.
#[derive(Debug, Clone, Copy)]
pub struct Redis {
    ctx: *mut Ctx,
}

impl Redis {
    /// # Safety
    /// `ctx` is a context Redis passed to the callback running now; the value lives no longer.
    pub unsafe fn new(ctx: *mut Ctx) -> Redis {
        Redis { ctx }
    }

    pub fn ctx(&self) -> *mut Ctx {
        self.ctx
    }

    /// Run `args` (the command's name first) and return its reply.
    pub fn call<A: AsRef<[u8]>>(&self, mode: Mode, args: &[A]) -> Vec<u8> {
        let Some((name, rest)) = args.split_first() else {
            return pmnet_redis::resp::error_reply("ERR empty command");
        };
        let Ok(name) = CString::new(name.as_ref()) else {
            return pmnet_redis::resp::error_reply(&pmnet_redis::table::unknown_command(
                &args.iter().map(|a| a.as_ref().to_vec()).collect::<Vec<_>>(),
            ));
        };
        let api = ffi::api();
        let words: Vec<&[u8]> = rest.iter().map(AsRef::as_ref).collect();
        let mut strings: Vec<*mut RString> = Vec::new();
        // Arguments as buffers (`b`): Redis makes each a string object of its own, which a
        // command may then re-encode (`SET n 12345678` stores an integer, as for a client). As
        // module strings (`v`) they would be shared with the module, and stay as they are.
        let reply = match words.len() {
            count @ 0..=BUFFER_ARGS_MAX => {
                let format = mode.flags(count);
                // SAFETY: the format names `count` buffers, each a pointer and a length.
                unsafe { call_buffers(api, self.ctx, name.as_ptr(), format.as_ptr(), &words) }
            }
            _ => {
                strings = words
                    .iter()
                    .map(|arg| {
                        // SAFETY: Redis copies `len` bytes from `ptr`.
                        unsafe { (api.create_string)(self.ctx, arg.as_ptr().cast(), arg.len()) }
                    })
                    .collect();
                // SAFETY: format "v" takes an array of RedisModuleString pointers and its length.
                unsafe {
                    (api.call)(
                        self.ctx,
                        name.as_ptr(),
                        mode.vector_flags().as_ptr(),
                        strings.as_mut_ptr(),
                        strings.len(),
                    )
                }
            }
        };
        let bytes = if reply.is_null() {
            // With `E`, Redis answers NULL only when it could not run the command at all.
            pmnet_redis::resp::error_reply(&format!(
                "ERR pmnet module: Redis did not run {} (errno {})",
                name.to_string_lossy(),
                std::io::Error::last_os_error()
            ))
        } else {
            let mut len = 0usize;
            // SAFETY: the reply's protocol bytes live until it is freed, below.
            let bytes = unsafe {
                let ptr = (api.call_reply_proto)(reply, &mut len);
                if ptr.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(ptr.cast::<u8>(), len).to_vec()
                }
            };
            // SAFETY: a reply RedisModule_Call returned, freed once.
            unsafe { (api.free_call_reply)(reply) };
            bytes
        };
        for string in strings.drain(..) {
            // SAFETY: created above, freed once.
            unsafe { (api.free_string)(self.ctx, string) };
        }
        bytes
    }

    /// Run later commands in database `db`; false if Redis has no such database.
    pub fn select(&self, db: u32) -> bool {
        let Ok(db) = c_int::try_from(db) else {
            return false;
        };
        // SAFETY: a live context.
        unsafe { (ffi::api().select_db)(self.ctx, db) == ffi::OK }
    }
}

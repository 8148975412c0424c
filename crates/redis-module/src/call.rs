//! Running a command inside Redis (`RedisModule_Call`) and taking its reply as the RESP bytes
//! a client would have read (`RedisModule_CallReplyProto`).

use std::ffi::{c_int, CStr, CString};

use crate::ffi::{self, Ctx, RString};

/// How a command runs.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
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
    fn flags(self) -> &'static CStr {
        match self {
            Mode::Request => c"!EMv",
            Mode::Record => c"!Ev",
            Mode::Read => c"Ev",
        }
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
        let mut strings: Vec<*mut RString> = rest
            .iter()
            .map(|arg| {
                let arg = arg.as_ref();
                // SAFETY: Redis copies `len` bytes from `ptr`.
                unsafe { (api.create_string)(self.ctx, arg.as_ptr().cast(), arg.len()) }
            })
            .collect();
        // SAFETY: format "v" takes an array of RedisModuleString pointers and its length.
        let reply = unsafe {
            (api.call)(
                self.ctx,
                name.as_ptr(),
                mode.flags().as_ptr(),
                strings.as_mut_ptr(),
                strings.len(),
            )
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

//! Functions (`FCALL`) through the adaptor, exactly once.
//!
//! Redis will not run `FCALL` inside a script, so the update script cannot wrap it the way it
//! wraps `EVAL`. Instead the adaptor reads the function's library from Redis (`FUNCTION LIST
//! WITHCODE`) and runs the library's code inside the exactly-once wrapper
//! ([`script::function_script`]), where `register_function` files the callback instead of
//! registering it and the wrapper calls it: the function's effects, the session's sequence
//! number and the reply become durable in one script call, as for `EVAL`.
//!
//! The libraries are read again when a function is not known, when they were read more than
//! [`FRESH_FOR`] ago, and after every `FUNCTION LOAD/DELETE/FLUSH/RESTORE` through the gateway
//! (which the adaptor runs at once, on its lookup connection, so that a later `FCALL` sees the
//! change). A library replaced at Redis directly is seen at most [`FRESH_FOR`] later.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::resp::Value;
use crate::script;

/// How long the libraries read from Redis are used before they are read again.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

/// Library code kept at most (bytes); beyond, the libraries are not cached.
const CODE_CACHED_MAX: usize = 16 << 20;

/// A function as its library registered it.
#[derive(Debug, Clone)]
pub(super) struct Function {
    /// The library's code (shared by the library's functions).
    pub(super) code: Arc<[u8]>,
    /// Declared `no-writes`: Redis runs it as a read (`FCALL_RO` may call it).
    pub(super) no_writes: bool,
}

/// The functions Redis has, as last read.
#[derive(Debug, Default)]
pub(super) struct Functions {
    by_name: HashMap<String, Function>,
    read_at: Option<Instant>,
}

impl Functions {
    /// Forget what was read: the next `FCALL` reads the libraries again.
    pub(super) fn invalidate(&mut self) {
        self.by_name.clear();
        self.read_at = None;
    }

    /// The function `name`, if what was read is fresh and has it.
    pub(super) fn cached(&self, name: &str, now: Instant) -> Option<&Function> {
        let fresh = self
            .read_at
            .is_some_and(|at| now.saturating_duration_since(at) < FRESH_FOR);
        if fresh {
            self.by_name.get(name)
        } else {
            None
        }
    }

    /// Replace what is known with a `FUNCTION LIST WITHCODE` reply read at `now`.
    pub(super) fn refresh(&mut self, list: &Value, now: Instant) -> Result<(), String> {
        let (by_name, code_bytes) = parse_function_list(list)?;
        self.by_name = by_name;
        self.read_at = (code_bytes <= CODE_CACHED_MAX).then_some(now);
        Ok(())
    }

    /// The function `name` as last read, fresh or not.
    pub(super) fn get(&self, name: &str) -> Option<&Function> {
        self.by_name.get(name)
    }
}

/// The fields of a RESP2 map reply (a flat array of name, value, …).
fn fields(value: &Value) -> Result<HashMap<String, &Value>, String> {
    let Value::Array(Some(items)) = value else {
        return Err(format!("expected a map, got {value:?}"));
    };
    let mut map = HashMap::new();
    for pair in items.chunks(2) {
        let [name, value] = pair else {
            return Err("a map with an odd number of items".to_owned());
        };
        let (Value::Bulk(Some(name)) | Value::Simple(name)) = name else {
            return Err(format!("a map key that is not a string: {name:?}"));
        };
        map.insert(String::from_utf8_lossy(name).into_owned(), value);
    }
    Ok(map)
}

fn string(value: Option<&&Value>, what: &str) -> Result<Vec<u8>, String> {
    match value {
        Some(Value::Bulk(Some(bytes)) | Value::Simple(bytes)) => Ok(bytes.clone()),
        other => Err(format!("{what}: expected a string, got {other:?}")),
    }
}

/// Every function of a `FUNCTION LIST WITHCODE` reply (RESP2), by name, and the bytes of
/// library code in all.
pub(super) fn parse_function_list(
    list: &Value,
) -> Result<(HashMap<String, Function>, usize), String> {
    let Value::Array(Some(libraries)) = list else {
        return Err(format!("FUNCTION LIST answered {list:?}"));
    };
    let mut by_name = HashMap::new();
    let mut code_bytes = 0;
    for library in libraries {
        let library = fields(library)?;
        let code: Arc<[u8]> = string(library.get("library_code"), "library_code")?.into();
        code_bytes += code.len();
        let Some(Value::Array(Some(functions))) = library.get("functions") else {
            return Err("a library without its functions".to_owned());
        };
        for function in functions {
            let function = fields(function)?;
            let name = String::from_utf8_lossy(&string(function.get("name"), "name")?).into_owned();
            let no_writes = match function.get("flags") {
                Some(Value::Array(Some(flags))) => flags.iter().any(|flag| {
                    matches!(flag, Value::Bulk(Some(f)) | Value::Simple(f) if f == b"no-writes")
                }),
                _ => false,
            };
            if script::is_function_name(&name) {
                by_name.insert(
                    name,
                    Function {
                        code: code.clone(),
                        no_writes,
                    },
                );
            }
        }
    }
    Ok((by_name, code_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::Bulk(Some(text.as_bytes().to_vec()))
    }

    fn function(name: &str, flags: &[&str]) -> Value {
        Value::Array(Some(vec![
            bulk("name"),
            bulk(name),
            bulk("description"),
            Value::Bulk(None),
            bulk("flags"),
            Value::Array(Some(flags.iter().map(|f| bulk(f)).collect())),
        ]))
    }

    fn list() -> Value {
        Value::Array(Some(vec![Value::Array(Some(vec![
            bulk("library_name"),
            bulk("lib"),
            bulk("engine"),
            bulk("LUA"),
            bulk("functions"),
            Value::Array(Some(vec![
                function("incr_by", &[]),
                function("peek", &["no-writes"]),
            ])),
            bulk("library_code"),
            bulk("#!lua name=lib\n..."),
        ]))]))
    }

    #[test]
    fn a_function_list_gives_each_function_its_library_and_flags() {
        let (by_name, code_bytes) = parse_function_list(&list()).unwrap();
        assert_eq!(code_bytes, "#!lua name=lib\n...".len());
        assert_eq!(by_name.len(), 2);
        assert!(!by_name["incr_by"].no_writes);
        assert!(by_name["peek"].no_writes);
        assert_eq!(&*by_name["peek"].code, b"#!lua name=lib\n...");
        assert!(parse_function_list(&bulk("nope")).is_err());
    }

    #[test]
    fn what_was_read_is_used_while_fresh_and_forgotten_when_invalidated() {
        let mut functions = Functions::default();
        let now = Instant::now();
        assert!(functions.cached("incr_by", now).is_none());
        functions.refresh(&list(), now).unwrap();
        assert!(functions.cached("incr_by", now).is_some());
        assert!(functions.cached("incr_by", now + FRESH_FOR).is_none());
        assert!(functions.get("incr_by").is_some());
        functions.invalidate();
        assert!(functions.get("incr_by").is_none());
    }
}

//! A synchronous RESP connection that counts the requests it sends by the path the pmnet
//! gateway gives them (update or bypass), the commands the workloads build, and what one
//! client's operation returns.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_redis::commands::{route, Policy, Route};
use pmnet_redis::resp::{SyncClient, Value};

/// How long a connection waits for a reply before it counts an error: more than the
/// gateway's own limit for an unacknowledged request (about 13 s).
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);

/// One argument of a command, from the types the workloads build commands of.
pub trait IntoArg {
    fn into_arg(self) -> Vec<u8>;
}

impl IntoArg for &str {
    fn into_arg(self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl IntoArg for String {
    fn into_arg(self) -> Vec<u8> {
        self.into_bytes()
    }
}

impl IntoArg for &String {
    fn into_arg(self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl IntoArg for Vec<u8> {
    fn into_arg(self) -> Vec<u8> {
        self
    }
}

impl IntoArg for &[u8] {
    fn into_arg(self) -> Vec<u8> {
        self.to_vec()
    }
}

impl IntoArg for &Vec<u8> {
    fn into_arg(self) -> Vec<u8> {
        self.clone()
    }
}

macro_rules! into_arg_by_display {
    ($($t:ty),*) => {$(
        impl IntoArg for $t {
            fn into_arg(self) -> Vec<u8> {
                self.to_string().into_bytes()
            }
        }
    )*};
}
into_arg_by_display!(u32, u64, i64, usize);

/// A command: `command!["SET", key, value]`.
macro_rules! command {
    ($($part:expr),+ $(,)?) => {
        vec![$($crate::redis_bench::conn::IntoArg::into_arg($part)),+]
    };
}
pub(crate) use command;

/// Why an operation failed.
#[derive(Debug)]
pub enum OpError {
    /// The connection broke or timed out: reconnect.
    Io(io::Error),
    /// Redis (or the gateway) answered with an error, or with a reply of the wrong shape.
    Reply(String),
    /// What was read breaks the workload's invariant (a post on a timeline that does not
    /// exist, a lock lost while held): counted as an error and as a violation.
    Invariant(String),
}

impl From<io::Error> for OpError {
    fn from(error: io::Error) -> Self {
        OpError::Io(error)
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Io(error) => write!(f, "connection: {error}"),
            OpError::Reply(text) => write!(f, "reply: {text}"),
            OpError::Invariant(text) => write!(f, "invariant: {text}"),
        }
    }
}

/// What an operation was: a read, or an update (it wrote).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Update,
}

/// A client's connection, counting the requests that would reach the device through the
/// gateway: updates (logged and acked by the device) and bypass requests (answered by Redis),
/// by the gateway's own routing table. The counts are the same whichever system it talks to.
pub struct Conn {
    client: SyncClient,
    pub update_requests: u64,
    pub bypass_requests: u64,
}

/// An error reply's text.
fn error_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.chars().take(200).collect()
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> io::Result<Conn> {
        Ok(Conn {
            client: SyncClient::connect(addr, REPLY_TIMEOUT)?,
            update_requests: 0,
            bypass_requests: 0,
        })
    }

    fn count(&mut self, args: &[Vec<u8>]) {
        match route(args, &Policy::default()) {
            Route::Update { .. } => self.update_requests += 1,
            Route::Bypass => self.bypass_requests += 1,
            _ => {}
        }
    }

    /// Send one command; its reply, an error reply as an error.
    pub fn cmd(&mut self, args: Vec<Vec<u8>>) -> Result<Value, OpError> {
        self.count(&args);
        match self.client.command(&args)? {
            Value::Error(text) => Err(OpError::Reply(error_text(&text))),
            value => Ok(value),
        }
    }

    /// Send several commands at once (one round trip); their replies, the first error reply
    /// as an error.
    pub fn pipeline(&mut self, commands: Vec<Vec<Vec<u8>>>) -> Result<Vec<Value>, OpError> {
        for args in &commands {
            self.count(args);
        }
        let replies = self.client.pipeline(&commands)?;
        match replies.iter().find(|reply| reply.is_error()) {
            Some(Value::Error(text)) => Err(OpError::Reply(error_text(text))),
            _ => Ok(replies),
        }
    }

    /// `MULTI`, the commands, `EXEC`, sent at once: the replies of the commands. Through the
    /// gateway this is one bypass request (the gateway queues the commands and sends `EXEC`).
    pub fn transaction(&mut self, commands: Vec<Vec<Vec<u8>>>) -> Result<Vec<Value>, OpError> {
        let count = commands.len();
        let mut all = Vec::with_capacity(count + 2);
        all.push(command!["MULTI"]);
        all.extend(commands);
        all.push(command!["EXEC"]);
        self.bypass_requests += 1;
        let mut replies = self.client.pipeline(&all)?;
        let exec = replies.pop().unwrap_or(Value::Array(None));
        if let Some(Value::Error(text)) = replies.iter().find(|reply| reply.is_error()) {
            return Err(OpError::Reply(error_text(text)));
        }
        match exec {
            Value::Array(Some(items)) if items.len() == count => {
                match items.iter().find(|item| item.is_error()) {
                    Some(Value::Error(text)) => Err(OpError::Reply(error_text(text))),
                    _ => Ok(items),
                }
            }
            Value::Error(text) => Err(OpError::Reply(error_text(&text))),
            other => Err(OpError::Reply(format!(
                "EXEC of {count} commands answered {other:?}"
            ))),
        }
    }
}

/// A reply as an integer (an integer reply, or a string of digits).
pub fn as_int(value: &Value) -> Option<i64> {
    match value {
        Value::Integer(number) => Some(*number),
        other => std::str::from_utf8(other.as_bytes()?).ok()?.parse().ok(),
    }
}

/// A reply as an array of items (a nil array is empty).
pub fn as_array(value: Value) -> Result<Vec<Value>, OpError> {
    match value {
        Value::Array(Some(items)) => Ok(items),
        Value::Array(None) => Ok(Vec::new()),
        other => Err(OpError::Reply(format!("expected an array, got {other:?}"))),
    }
}

/// What one client does, one operation per call.
pub trait ClientOps: Send {
    fn op(&mut self, conn: &mut Conn) -> Result<OpKind, OpError>;
}

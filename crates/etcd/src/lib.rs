//! The control plane's store: a small, blocking client of etcd's v3 API and a one-member etcd of
//! a process's own (docs/replication.md, "The control plane").
//!
//! The client speaks gRPC through tonic's generic client with the few messages of etcd's
//! `rpc.proto` it sends declared in [`rpc`] with prost's derive: no protoc and no build
//! script (the `etcd-client` crate runs protoc at build time). Each [`Etcd`] is one channel
//! (one HTTP/2 connection) on a current-thread tokio runtime of its own, driven by the thread
//! that calls it: a call blocks for at most the timeout it was connected with. Given several
//! endpoints, it talks to the first that answers and moves on to the next when a call fails.

use std::net::SocketAddr;
use std::time::Duration;

use http::uri::PathAndQuery;
use tonic::client::Grpc;
use tonic::transport::{Channel, Endpoint};

mod local;
pub mod rpc;

pub use local::{find_program, stop_child, version_of, LocalEtcd};

/// What went wrong talking to etcd, in words (the endpoint and the call named).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdError(pub String);

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EtcdError {}

/// A key's value and revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Vec<u8>,
    /// The revision that created the key (a new one each time it is created again).
    pub create_revision: i64,
    pub mod_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// A lease etcd granted: its id and the time to live etcd gave it (etcd raises a short one
/// to its minimum, one and a half election timeouts rounded up to a second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    pub ttl_s: i64,
}

/// Parse `--etcd`'s endpoints: comma-separated `HOST:PORT`, each with or without `http://`.
pub fn parse_endpoints(text: &str) -> Result<Vec<SocketAddr>, String> {
    let mut endpoints = Vec::new();
    for part in text
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
    {
        let bare = part.strip_prefix("http://").unwrap_or(part);
        if part.starts_with("https://") {
            return Err(format!(
                "{part:?}: TLS to etcd is not supported; give a plain http:// endpoint"
            ));
        }
        let addr = std::net::ToSocketAddrs::to_socket_addrs(bare)
            .map_err(|error| format!("{part:?}: {error} (want HOST:PORT)"))?
            .next()
            .ok_or_else(|| format!("{part:?}: no address"))?;
        endpoints.push(addr);
    }
    if endpoints.is_empty() {
        return Err("no endpoint (want HOST:PORT[,HOST:PORT...])".to_owned());
    }
    Ok(endpoints)
}

/// A client of an etcd cluster. See the module docs.
#[derive(Debug)]
pub struct Etcd {
    runtime: tokio::runtime::Runtime,
    endpoints: Vec<SocketAddr>,
    /// The endpoint in use and its channel (`None` after a failed call: the next call
    /// connects again, from the endpoint after it).
    channel: Option<(usize, Grpc<Channel>)>,
    next_endpoint: usize,
    timeout: Duration,
}

impl Etcd {
    /// A client of the cluster at `endpoints`; every call (connecting included) gives up
    /// after `timeout`. Connects at once, to the first endpoint that answers.
    pub fn connect(endpoints: &[SocketAddr], timeout: Duration) -> Result<Etcd, EtcdError> {
        assert!(!endpoints.is_empty(), "at least one endpoint");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| EtcdError(format!("etcd client runtime: {error}")))?;
        let mut etcd = Etcd {
            runtime,
            endpoints: endpoints.to_vec(),
            channel: None,
            next_endpoint: 0,
            timeout,
        };
        etcd.grpc()?;
        Ok(etcd)
    }

    /// The endpoint the client talks to now, if connected.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.channel
            .as_ref()
            .map(|(index, _)| self.endpoints[*index])
    }

    /// The channel, connecting (each endpoint in turn, from the one after the last that
    /// failed) if there is none.
    fn grpc(&mut self) -> Result<&mut Grpc<Channel>, EtcdError> {
        if self.channel.is_none() {
            let mut errors = Vec::new();
            for attempt in 0..self.endpoints.len() {
                let index = (self.next_endpoint + attempt) % self.endpoints.len();
                let addr = self.endpoints[index];
                let endpoint = Endpoint::from_shared(format!("http://{addr}"))
                    .map_err(|error| EtcdError(format!("etcd endpoint {addr}: {error}")))?
                    .connect_timeout(self.timeout)
                    .timeout(self.timeout)
                    .tcp_nodelay(true);
                match self.runtime.block_on(endpoint.connect()) {
                    Ok(channel) => {
                        self.channel = Some((index, Grpc::new(channel)));
                        break;
                    }
                    Err(error) => errors.push(format!("{addr}: {error}")),
                }
            }
            if self.channel.is_none() {
                return Err(EtcdError(format!(
                    "etcd unreachable ({})",
                    errors.join("; ")
                )));
            }
        }
        Ok(&mut self.channel.as_mut().expect("connected above").1)
    }

    /// One unary call; a failure drops the channel (the next call tries the next endpoint).
    fn call<Req, Resp>(&mut self, path: &'static str, request: Req) -> Result<Resp, EtcdError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        self.exchange(path, |mut grpc| async move {
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(
                tonic::Request::new(request),
                PathAndQuery::from_static(path),
                codec,
            )
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| status_text(&status))
        })
    }

    /// Run `exchange` on the channel once it is ready, within the timeout; a failure drops the
    /// channel (the next call tries the next endpoint) and names the endpoint and `path`.
    fn exchange<T, F, Fut>(&mut self, path: &'static str, exchange: F) -> Result<T, EtcdError>
    where
        F: FnOnce(Grpc<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let timeout = self.timeout;
        let mut grpc = self.grpc()?.clone();
        let result = self.runtime.block_on(async move {
            tokio::time::timeout(timeout, async {
                grpc.ready().await.map_err(|error| error.to_string())?;
                exchange(grpc).await
            })
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} ms", timeout.as_millis())))
        });
        result.map_err(|why| self.failed(path, why))
    }

    /// Note a failed call: drop the channel and say which endpoint failed.
    fn failed(&mut self, path: &str, why: String) -> EtcdError {
        let at = match self.channel.take() {
            Some((index, _)) => {
                self.next_endpoint = (index + 1) % self.endpoints.len();
                self.endpoints[index].to_string()
            }
            None => "etcd".to_owned(),
        };
        EtcdError(format!("etcd {at} {path}: {why}"))
    }

    /// A linearizable read of `key`.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Entry>, EtcdError> {
        let request = rpc::RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        };
        let response: rpc::RangeResponse = self.call(rpc::RANGE, request)?;
        Ok(response.kvs.into_iter().next().map(entry))
    }

    /// Every key that starts with `prefix`, in key order.
    pub fn get_prefix(&mut self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Entry)>, EtcdError> {
        let request = rpc::RangeRequest {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            ..Default::default()
        };
        let response: rpc::RangeResponse = self.call(rpc::RANGE, request)?;
        Ok(response
            .kvs
            .into_iter()
            .map(|kv| (kv.key.clone(), entry(kv)))
            .collect())
    }

    /// Write `key` (under `lease`, 0: none).
    pub fn put(&mut self, key: &[u8], value: &[u8], lease: i64) -> Result<(), EtcdError> {
        let request = rpc::PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
        };
        let _: rpc::PutResponse = self.call(rpc::PUT, request)?;
        Ok(())
    }

    /// Delete `key`; how many keys went (0 or 1).
    pub fn delete(&mut self, key: &[u8]) -> Result<i64, EtcdError> {
        let request = rpc::DeleteRangeRequest {
            key: key.to_vec(),
            range_end: Vec::new(),
        };
        let response: rpc::DeleteRangeResponse = self.call(rpc::DELETE_RANGE, request)?;
        Ok(response.deleted)
    }

    /// Create `key` with `value` under `lease` if it does not exist; false if it did.
    pub fn create(&mut self, key: &[u8], value: &[u8], lease: i64) -> Result<bool, EtcdError> {
        self.put_if_created(key, 0, key, value, lease)
    }

    /// Write `key` only while `guard` still has `create_revision` (0: does not exist): a
    /// leader's write fenced by its leadership key, which a new leader creates anew.
    pub fn put_if_created(
        &mut self,
        guard: &[u8],
        create_revision: i64,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<bool, EtcdError> {
        let request = rpc::TxnRequest {
            compare: vec![rpc::Compare {
                result: rpc::COMPARE_EQUAL,
                target: rpc::COMPARE_TARGET_CREATE,
                key: guard.to_vec(),
                target_union: Some(rpc::TargetUnion::CreateRevision(create_revision)),
            }],
            success: vec![rpc::RequestOp {
                request: Some(rpc::Request::Put(rpc::PutRequest {
                    key: key.to_vec(),
                    value: value.to_vec(),
                    lease,
                })),
            }],
            failure: Vec::new(),
        };
        let response: rpc::TxnResponse = self.call(rpc::TXN, request)?;
        Ok(response.succeeded)
    }

    /// Grant a lease of `ttl_s` seconds.
    pub fn grant_lease(&mut self, ttl_s: i64) -> Result<Lease, EtcdError> {
        let request = rpc::LeaseGrantRequest { ttl: ttl_s, id: 0 };
        let response: rpc::LeaseGrantResponse = self.call(rpc::LEASE_GRANT, request)?;
        if !response.error.is_empty() {
            return Err(EtcdError(format!("etcd lease grant: {}", response.error)));
        }
        Ok(Lease {
            id: response.id,
            ttl_s: response.ttl,
        })
    }

    /// Renew lease `id`: its time to live from now, in seconds (`Ok(0)`: the lease expired or
    /// was revoked).
    pub fn keep_alive(&mut self, id: i64) -> Result<i64, EtcdError> {
        self.exchange(rpc::LEASE_KEEP_ALIVE, |mut grpc| async move {
            let codec = tonic_prost::ProstCodec::<
                rpc::LeaseKeepAliveRequest,
                rpc::LeaseKeepAliveResponse,
            >::default();
            let requests = tokio_stream::iter([rpc::LeaseKeepAliveRequest { id }]);
            let mut responses = grpc
                .streaming(
                    tonic::Request::new(requests),
                    PathAndQuery::from_static(rpc::LEASE_KEEP_ALIVE),
                    codec,
                )
                .await
                .map_err(|status| status_text(&status))?
                .into_inner();
            match responses.message().await {
                Ok(Some(response)) => Ok(response.ttl.max(0)),
                Ok(None) => Err("the stream ended without an answer".to_owned()),
                Err(status) => Err(status_text(&status)),
            }
        })
    }

    /// Revoke lease `id`: every key attached to it goes at once.
    pub fn revoke(&mut self, id: i64) -> Result<(), EtcdError> {
        let _: rpc::LeaseRevokeResponse =
            self.call(rpc::LEASE_REVOKE, rpc::LeaseRevokeRequest { id })?;
        Ok(())
    }
}

/// A gRPC status in words.
fn status_text(status: &tonic::Status) -> String {
    format!("{}: {}", status.code(), status.message())
}

fn entry(kv: rpc::KeyValue) -> Entry {
    Entry {
        value: kv.value,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        lease: kv.lease,
    }
}

/// The end of the range of keys that start with `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn messages_encode_as_etcd_s_rpc_proto_says() {
        // RangeRequest{key: "k"}: field 1, length-delimited.
        let range = rpc::RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        };
        assert_eq!(range.encode_to_vec(), [0x0a, 1, b'k']);
        // A compare on create_revision == 0: the oneof's zero is sent (field 5).
        let compare = rpc::Compare {
            result: rpc::COMPARE_EQUAL,
            target: rpc::COMPARE_TARGET_CREATE,
            key: b"l".to_vec(),
            target_union: Some(rpc::TargetUnion::CreateRevision(0)),
        };
        assert_eq!(compare.encode_to_vec(), [0x10, 1, 0x1a, 1, b'l', 0x28, 0]);
        // A put inside a RequestOp: field 2 of the oneof.
        let op = rpc::RequestOp {
            request: Some(rpc::Request::Put(rpc::PutRequest {
                key: b"l".to_vec(),
                value: b"o".to_vec(),
                lease: 5,
            })),
        };
        assert_eq!(
            op.encode_to_vec(),
            [0x12, 8, 0x0a, 1, b'l', 0x12, 1, b'o', 0x18, 5]
        );
        // A TxnResponse with succeeded = true and a header we skip parts of.
        let bytes = [0x0a, 2, 0x18, 9, 0x10, 1, 0x1a, 0];
        let txn = rpc::TxnResponse::decode(&bytes[..]).unwrap();
        assert!(txn.succeeded);
        assert_eq!(txn.header.unwrap().revision, 9);
        // LeaseKeepAliveResponse{id: 7, ttl: 2}.
        let keep = rpc::LeaseKeepAliveResponse::decode(&[0x10, 7, 0x18, 2][..]).unwrap();
        assert_eq!((keep.id, keep.ttl), (7, 2));
    }

    #[test]
    fn a_prefix_ends_where_etcd_s_clients_end_it() {
        assert_eq!(prefix_end(b"/pmnet/"), b"/pmnet0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), [0]);
    }

    #[test]
    fn endpoints_parse_with_and_without_a_scheme_and_tls_is_refused() {
        let endpoints = parse_endpoints("127.0.0.1:2379, http://127.0.0.1:22379").unwrap();
        assert_eq!(endpoints.len(), 2);
        assert_eq!(endpoints[1].port(), 22379);
        assert!(parse_endpoints("https://127.0.0.1:2379")
            .unwrap_err()
            .contains("TLS"));
        assert!(parse_endpoints("").unwrap_err().contains("no endpoint"));
        assert!(parse_endpoints("nonsense")
            .unwrap_err()
            .contains("HOST:PORT"));
    }
}

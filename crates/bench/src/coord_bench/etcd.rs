//! etcd as a user runs it: three `etcd` members (Debian's `etcd-server`) on loopback, each
//! with its own data directory and etcd's default durability (the write-ahead log is
//! fsync'd before a write is acknowledged), driven over etcd's gRPC API v3.
//!
//! The client is tonic's generic gRPC client with the few messages of etcd's
//! `etcdserverpb/rpc.proto` it sends declared here with `prost`'s derive (field numbers as in
//! the .proto): no protoc and no build script, so the workspace builds anywhere (the
//! `etcd-client` crate runs protoc at build time). Each client is a gRPC channel (one HTTP/2
//! connection) on a current-thread tokio runtime of its own, driven by the thread that uses
//! it: no thread hop between a request and its reply.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::PathAndQuery;
use pmnet_runtime::Shutdown;
use tonic::client::Grpc;
use tonic::transport::{Channel, Endpoint};

use super::load::CoordClient;
use crate::procs::{file_system, find_program, free_ports, loopback, run_dir, wait_until, Proc};
use pmnet::CliError;

/// etcd's v3 messages, as many fields as this client uses (prost skips the others).
pub mod rpc {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseHeader {
        #[prost(uint64, tag = "1")]
        pub cluster_id: u64,
        #[prost(uint64, tag = "2")]
        pub member_id: u64,
        #[prost(int64, tag = "3")]
        pub revision: i64,
        #[prost(uint64, tag = "4")]
        pub raft_term: u64,
    }

    /// mvccpb.KeyValue.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(int64, tag = "2")]
        pub create_revision: i64,
        #[prost(int64, tag = "3")]
        pub mod_revision: i64,
        #[prost(int64, tag = "4")]
        pub version: i64,
        #[prost(bytes = "vec", tag = "5")]
        pub value: Vec<u8>,
        #[prost(int64, tag = "6")]
        pub lease: i64,
    }

    /// A read of one key (no `range_end`), linearizable (`serializable` false: the default).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
        #[prost(bool, tag = "7")]
        pub serializable: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(message, repeated, tag = "2")]
        pub kvs: Vec<KeyValue>,
        #[prost(int64, tag = "4")]
        pub count: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub lease: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteRangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub range_end: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteRangeResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")]
        pub deleted: i64,
    }

    /// Compare.CompareResult.EQUAL.
    pub const COMPARE_EQUAL: i32 = 0;
    /// Compare.CompareTarget.CREATE: the key's create revision (0: the key does not exist).
    pub const COMPARE_TARGET_CREATE: i32 = 1;

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum TargetUnion {
        #[prost(int64, tag = "4")]
        Version(i64),
        #[prost(int64, tag = "5")]
        CreateRevision(i64),
        #[prost(int64, tag = "6")]
        ModRevision(i64),
        #[prost(bytes, tag = "7")]
        Value(Vec<u8>),
        #[prost(int64, tag = "8")]
        Lease(i64),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Compare {
        /// CompareResult (an enum: a varint on the wire, as an int32).
        #[prost(int32, tag = "1")]
        pub result: i32,
        /// CompareTarget.
        #[prost(int32, tag = "2")]
        pub target: i32,
        #[prost(bytes = "vec", tag = "3")]
        pub key: Vec<u8>,
        #[prost(oneof = "TargetUnion", tags = "4, 5, 6, 7, 8")]
        pub target_union: Option<TargetUnion>,
    }

    /// RequestOp's oneof (`request_range`, `request_put`, `request_delete_range`).
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Request {
        #[prost(message, tag = "1")]
        Range(RangeRequest),
        #[prost(message, tag = "2")]
        Put(PutRequest),
        #[prost(message, tag = "3")]
        DeleteRange(DeleteRangeRequest),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RequestOp {
        #[prost(oneof = "Request", tags = "1, 2, 3")]
        pub request: Option<Request>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnRequest {
        #[prost(message, repeated, tag = "1")]
        pub compare: Vec<Compare>,
        #[prost(message, repeated, tag = "2")]
        pub success: Vec<RequestOp>,
        #[prost(message, repeated, tag = "3")]
        pub failure: Vec<RequestOp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(bool, tag = "2")]
        pub succeeded: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseGrantRequest {
        #[prost(int64, tag = "1")]
        pub ttl: i64,
        #[prost(int64, tag = "2")]
        pub id: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseGrantResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")]
        pub id: i64,
        #[prost(int64, tag = "3")]
        pub ttl: i64,
        #[prost(string, tag = "4")]
        pub error: String,
    }

    pub const RANGE: &str = "/etcdserverpb.KV/Range";
    pub const PUT: &str = "/etcdserverpb.KV/Put";
    pub const DELETE_RANGE: &str = "/etcdserverpb.KV/DeleteRange";
    pub const TXN: &str = "/etcdserverpb.KV/Txn";
    pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
}

/// How etcd is started.
#[derive(Debug, Clone)]
pub struct EtcdSetup {
    /// The etcd binary (`--etcd`).
    pub program: String,
    /// Where the members' data directories go.
    pub dir: PathBuf,
    /// The CPU the members run on (`--pin`).
    pub cpu: Option<usize>,
}

/// Three members running; stopped when dropped.
#[derive(Debug)]
pub struct EtcdCluster {
    pub clients: Vec<SocketAddr>,
    pub version: String,
    pub data_dir: PathBuf,
    procs: Vec<Proc>,
    _dir: tempfile::TempDir,
}

/// The error when etcd is not installed.
fn not_installed(program: &str) -> CliError {
    format!(
        "etcd not found ({program:?} is not a file nor on PATH): install it with `apt-get install \
         etcd-server` (Debian's etcd 3.4), give its path with --etcd, or leave etcd out of \
         --system"
    )
    .into()
}

/// One member's arguments: its own ports and data directory; fsync left at its default (on).
fn member_args(
    index: usize,
    clients: &[SocketAddr],
    peers: &[SocketAddr],
    data: &Path,
    token: &str,
) -> Vec<String> {
    let cluster: Vec<String> = peers
        .iter()
        .enumerate()
        .map(|(other, peer)| format!("m{}=http://{peer}", other + 1))
        .collect();
    let client = format!("http://{}", clients[index]);
    let peer = format!("http://{}", peers[index]);
    [
        "--name",
        &format!("m{}", index + 1),
        "--data-dir",
        &data.display().to_string(),
        "--listen-client-urls",
        &client,
        "--advertise-client-urls",
        &client,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &cluster.join(","),
        "--initial-cluster-token",
        token,
        "--initial-cluster-state",
        "new",
        "--logger",
        "zap",
        "--log-outputs",
        "stderr",
        "--log-level",
        "warn",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect()
}

impl EtcdCluster {
    /// Start three members and wait until a linearizable read succeeds at each (a leader is
    /// elected and every member serves).
    pub fn start(setup: &EtcdSetup, shutdown: &Shutdown) -> Result<EtcdCluster, CliError> {
        let program = find_program(&setup.program).ok_or_else(|| not_installed(&setup.program))?;
        let version = std::process::Command::new(&program)
            .arg("--version")
            .output()
            .ok()
            .and_then(|output| {
                String::from_utf8_lossy(&output.stdout)
                    .lines()
                    .next()
                    .map(|line| line.trim().to_owned())
            })
            .unwrap_or_else(|| "etcd (version unknown)".to_owned());
        let dir = run_dir(&setup.dir, "etcd")?;
        let ports = free_ports(6)?;
        let clients: Vec<SocketAddr> = ports[..3].iter().map(|&port| loopback(port)).collect();
        let peers: Vec<SocketAddr> = ports[3..].iter().map(|&port| loopback(port)).collect();
        let token = format!("pmnet-coord-bench-{}", std::process::id());
        let mut procs = Vec::new();
        for index in 0..3 {
            let data = dir.path().join(format!("m{}", index + 1));
            let args = member_args(index, &clients, &peers, &data, &token);
            let log = dir.path().join(format!("m{}.log", index + 1));
            procs.push(Proc::spawn(
                &format!("etcd member {}", index + 1),
                &program,
                &args,
                &log,
                setup.cpu,
            )?);
        }
        let mut probes: Vec<Option<EtcdClient>> = (0..3).map(|_| None).collect();
        wait_until(
            "the etcd cluster",
            Duration::from_secs(60),
            &mut procs,
            shutdown,
            || {
                for (index, probe) in probes.iter_mut().enumerate() {
                    if probe.is_none() {
                        *probe = Some(EtcdClient::connect(clients[index], 0)?);
                    }
                    let probe = probe.as_mut().expect("made above");
                    probe.get(b"pmnet-coord-bench-ready")?;
                }
                Ok(true)
            },
        )?;
        Ok(EtcdCluster {
            clients,
            version,
            data_dir: dir.path().to_owned(),
            procs,
            _dir: dir,
        })
    }

    /// Client `index`, connected to member `index` modulo 3.
    pub fn client(&self, index: u32) -> Result<EtcdClient, CliError> {
        EtcdClient::connect(self.clients[index as usize % self.clients.len()], index)
    }

    /// The setting: version and durability.
    pub fn durability(&self) -> String {
        format!(
            "{}; 3 members; each write-ahead-log append fsync'd before the write is \
             acknowledged (default: --unsafe-no-fsync not given); data directories on {}; \
             linearizable reads (default)",
            self.version,
            file_system(&self.data_dir)
        )
    }

    /// The processes' ids.
    pub fn pids(&self) -> Vec<u32> {
        crate::procs::pids(&self.procs)
    }

    pub fn stop(&mut self) {
        crate::procs::stop_all(&mut self.procs);
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A client: one gRPC channel on a runtime of its own.
#[derive(Debug)]
pub struct EtcdClient {
    runtime: tokio::runtime::Runtime,
    grpc: Grpc<Channel>,
    owner: Vec<u8>,
    /// The lease this client's locks are held under (granted on first use).
    lease: Option<i64>,
}

/// A lease for the locks: longer than any run.
const LEASE_TTL_S: i64 = 3_600;

/// One unary call.
async fn call<Req, Resp>(
    grpc: &mut Grpc<Channel>,
    path: &'static str,
    request: Req,
) -> Result<Resp, CliError>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    grpc.ready()
        .await
        .map_err(|error| format!("etcd {path}: {error}"))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    let response = grpc
        .unary(
            tonic::Request::new(request),
            PathAndQuery::from_static(path),
            codec,
        )
        .await
        .map_err(|status| format!("etcd {path}: {}: {}", status.code(), status.message()))?;
    Ok(response.into_inner())
}

impl EtcdClient {
    fn connect(addr: SocketAddr, index: u32) -> Result<EtcdClient, CliError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .tcp_nodelay(true);
        let channel = runtime
            .block_on(endpoint.connect())
            .map_err(|error| format!("connecting to etcd at {addr}: {error}"))?;
        Ok(EtcdClient {
            runtime,
            grpc: Grpc::new(channel),
            owner: format!("client-{index}").into_bytes(),
            lease: None,
        })
    }

    /// A linearizable read of `key`: its value, if it has one.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, CliError> {
        let request = rpc::RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        };
        let grpc = &mut self.grpc;
        let response: rpc::RangeResponse =
            self.runtime.block_on(call(grpc, rpc::RANGE, request))?;
        Ok(response.kvs.into_iter().next().map(|kv| kv.value))
    }

    fn lease(&mut self) -> Result<i64, CliError> {
        if let Some(lease) = self.lease {
            return Ok(lease);
        }
        let request = rpc::LeaseGrantRequest {
            ttl: LEASE_TTL_S,
            id: 0,
        };
        let grpc = &mut self.grpc;
        let response: rpc::LeaseGrantResponse =
            self.runtime
                .block_on(call(grpc, rpc::LEASE_GRANT, request))?;
        if !response.error.is_empty() {
            return Err(format!("etcd lease grant: {}", response.error).into());
        }
        self.lease = Some(response.id);
        Ok(response.id)
    }
}

impl CoordClient for EtcdClient {
    fn read(&mut self, key: &str) -> Result<(), CliError> {
        match self.get(key.as_bytes())? {
            Some(_) => Ok(()),
            None => Err(format!("etcd: {key} has no value").into()),
        }
    }

    fn write(&mut self, key: &str, value: &[u8]) -> Result<(), CliError> {
        let request = rpc::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            lease: 0,
        };
        let grpc = &mut self.grpc;
        let _: rpc::PutResponse = self.runtime.block_on(call(grpc, rpc::PUT, request))?;
        Ok(())
    }

    /// A transaction: if the lock's key does not exist, create it with this client's name
    /// under its lease.
    fn acquire(&mut self, name: &str) -> Result<u64, CliError> {
        let lease = self.lease()?;
        let request = rpc::TxnRequest {
            compare: vec![rpc::Compare {
                result: rpc::COMPARE_EQUAL,
                target: rpc::COMPARE_TARGET_CREATE,
                key: name.as_bytes().to_vec(),
                target_union: Some(rpc::TargetUnion::CreateRevision(0)),
            }],
            success: vec![rpc::RequestOp {
                request: Some(rpc::Request::Put(rpc::PutRequest {
                    key: name.as_bytes().to_vec(),
                    value: self.owner.clone(),
                    lease,
                })),
            }],
            failure: Vec::new(),
        };
        let mut attempts = 0;
        loop {
            attempts += 1;
            let grpc = &mut self.grpc;
            let response: rpc::TxnResponse =
                self.runtime
                    .block_on(call(grpc, rpc::TXN, request.clone()))?;
            if response.succeeded {
                return Ok(attempts);
            }
        }
    }

    fn release(&mut self, name: &str) -> Result<(), CliError> {
        let request = rpc::DeleteRangeRequest {
            key: name.as_bytes().to_vec(),
            range_end: Vec::new(),
        };
        let grpc = &mut self.grpc;
        let response: rpc::DeleteRangeResponse =
            self.runtime
                .block_on(call(grpc, rpc::DELETE_RANGE, request))?;
        if response.deleted != 1 {
            return Err(format!("etcd: releasing {name} deleted {} keys", response.deleted).into());
        }
        Ok(())
    }
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
    }

    #[test]
    fn members_get_their_own_ports_and_directories_and_the_default_fsync() {
        let clients: Vec<SocketAddr> = (1..=3).map(|port| loopback(2000 + port)).collect();
        let peers: Vec<SocketAddr> = (1..=3).map(|port| loopback(3000 + port)).collect();
        let args = member_args(1, &clients, &peers, Path::new("/d/m2"), "t").join(" ");
        assert!(args.contains("--name m2 --data-dir /d/m2"), "{args}");
        assert!(
            args.contains("--listen-client-urls http://127.0.0.1:2002"),
            "{args}"
        );
        assert!(
            args.contains("--listen-peer-urls http://127.0.0.1:3002"),
            "{args}"
        );
        assert!(
            args.contains(
                "--initial-cluster m1=http://127.0.0.1:3001,m2=http://127.0.0.1:3002,\
                 m3=http://127.0.0.1:3003"
            ),
            "{args}"
        );
        assert!(!args.contains("fsync"), "{args}");
    }

    #[test]
    fn a_missing_etcd_says_how_to_install_it() {
        let setup = EtcdSetup {
            program: "/nonexistent/etcd".to_owned(),
            dir: std::env::temp_dir(),
            cpu: None,
        };
        let error = EtcdCluster::start(&setup, &Shutdown::new())
            .unwrap_err()
            .to_string();
        assert!(error.contains("apt-get install etcd-server"), "{error}");
    }
}

//! ZooKeeper as a user runs it: a three-server ensemble (Debian's `zookeeper`, 3.8) on
//! loopback, each server with its own configuration, data directory and `myid`, ZooKeeper's
//! default durability (`forceSync=yes`: the transaction log is fsync'd before a write is
//! acknowledged), started as the package's `zkServer.sh` starts one
//! (`java … org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg`) but on ports of
//! its own, never the system service's 2181.
//!
//! The client is the `zookeeper-client` crate. It runs on `async-io`; each client here is
//! driven by the one thread that uses it: its session task and its socket are polled by that
//! thread (`async_io::block_on`), so no thread hop lies between a request and its reply.
//! Reads are plain `getData`, ZooKeeper's ordinary read: served by the server the client is
//! connected to, not linearizable (a `sync` first would make it so, at the price of a round
//! through the leader).

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::{pin, Pin};
use std::sync::Mutex;
use std::time::Duration;

use pmnet_runtime::Shutdown;
use zookeeper_client as zk;

use super::load::CoordClient;
use crate::procs::{file_system, find_program, free_ports, loopback, run_dir, wait_until, Proc};
use pmnet::CliError;

/// How ZooKeeper is started.
#[derive(Debug, Clone)]
pub struct ZooKeeperSetup {
    /// The `java` binary.
    pub java: String,
    /// ZooKeeper's jar (its manifest names the jars it needs).
    pub jar: PathBuf,
    /// Where the servers' directories go.
    pub dir: PathBuf,
    /// The CPU the servers run on (`--pin`).
    pub cpu: Option<usize>,
}

/// Three servers running; stopped when dropped.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    pub clients: Vec<SocketAddr>,
    pub version: String,
    pub data_dir: PathBuf,
    procs: Vec<Proc>,
    _dir: tempfile::TempDir,
}

/// A server's configuration: ZooKeeper's sample `zoo.cfg` (tick, init and sync limits) with
/// this ensemble's ports and directory; the admin web server off (it would take port 8080);
/// durability left at its defaults.
fn config(client: SocketAddr, peers: &[(u16, u16)], data: &Path) -> String {
    let mut text = format!(
        "tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={}\n\
         clientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxClientCnxns=0\n",
        data.display(),
        client.port()
    );
    for (other, (quorum, election)) in peers.iter().enumerate() {
        text.push_str(&format!(
            "server.{}=127.0.0.1:{quorum}:{election}\n",
            other + 1
        ));
    }
    text
}

/// The error when ZooKeeper (or Java) is not installed.
fn not_installed(what: &str) -> CliError {
    format!(
        "ZooKeeper not found ({what}): install it with `apt-get install zookeeper` (Debian's \
         ZooKeeper 3.8 and a Java runtime; zookeeperd, the system service, is not needed), give \
         --zookeeper-jar and --java, or leave zookeeper out of --system"
    )
    .into()
}

impl ZooKeeperEnsemble {
    /// Start three servers and wait until a client of each is connected and a write went
    /// through the quorum.
    pub fn start(
        setup: &ZooKeeperSetup,
        shutdown: &Shutdown,
    ) -> Result<ZooKeeperEnsemble, CliError> {
        if !setup.jar.is_file() {
            return Err(not_installed(&format!("no {}", setup.jar.display())));
        }
        let java = find_program(&setup.java)
            .ok_or_else(|| not_installed(&format!("no {:?} on PATH", setup.java)))?;
        let dir = run_dir(&setup.dir, "zookeeper")?;
        let ports = free_ports(9)?;
        let clients: Vec<SocketAddr> = ports[..3].iter().map(|&port| loopback(port)).collect();
        let peers: Vec<(u16, u16)> = (0..3).map(|i| (ports[3 + i], ports[6 + i])).collect();
        let mut classpath = setup.jar.display().to_string();
        // A logger for ZooKeeper's warnings (without one, slf4j drops them).
        let simple = Path::new("/usr/share/java/slf4j-simple.jar");
        if simple.is_file() {
            classpath.push_str(&format!(":{}", simple.display()));
        }
        let mut procs = Vec::new();
        for (index, &client) in clients.iter().enumerate() {
            let home = dir.path().join(format!("zk{}", index + 1));
            let data = home.join("data");
            std::fs::create_dir_all(&data)?;
            std::fs::write(data.join("myid"), format!("{}\n", index + 1))?;
            let cfg = home.join("zoo.cfg");
            std::fs::write(&cfg, config(client, &peers, &data))?;
            let args: Vec<String> = [
                // zkServer.sh's default heap.
                "-Xmx1000m",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp",
                &classpath,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                &cfg.display().to_string(),
            ]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
            let log = home.join("server.log");
            procs.push(Proc::spawn(
                &format!("ZooKeeper server {}", index + 1),
                &java,
                &args,
                &log,
                setup.cpu,
            )?);
        }
        let mut probes: Vec<Option<ZooKeeperClient>> = (0..3).map(|_| None).collect();
        wait_until(
            "the ZooKeeper ensemble",
            Duration::from_secs(120),
            &mut procs,
            shutdown,
            || {
                for (index, probe) in probes.iter_mut().enumerate() {
                    if probe.is_none() {
                        *probe = Some(ZooKeeperClient::connect(clients[index], 0)?);
                    }
                }
                let probe = probes[0].as_mut().expect("made above");
                probe.create("pmnet-coord-bench-ready", b"")?;
                Ok(true)
            },
        )?;
        // The version as the server says it ("Zookeeper version: 3.8.0-..., built on ...").
        let version = srvr(clients[0])
            .ok()
            .and_then(|text| {
                let line = text
                    .lines()
                    .find(|line| line.starts_with("Zookeeper version:"))?;
                let version = line.trim_start_matches("Zookeeper version:").trim();
                // Debian's build says "3.8.0-${mvngit.commit.id}": the release is before the '-'.
                let version = version.split([',', '-']).next()?.trim();
                Some(format!("ZooKeeper {version}"))
            })
            .unwrap_or_else(|| "ZooKeeper (version unknown)".to_owned());
        Ok(ZooKeeperEnsemble {
            clients,
            version,
            data_dir: dir.path().to_owned(),
            procs,
            _dir: dir,
        })
    }

    /// Client `index`, connected to server `index` modulo 3.
    pub fn client(&self, index: u32) -> Result<ZooKeeperClient, CliError> {
        ZooKeeperClient::connect(self.clients[index as usize % self.clients.len()], index)
    }

    /// The setting: version and durability.
    pub fn durability(&self) -> String {
        format!(
            "{}; 3 servers; each transaction-log append fsync'd before the write is \
             acknowledged (default forceSync=yes); data directories on {}; plain getData reads \
             (served by the client's server, not linearizable)",
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

impl Drop for ZooKeeperEnsemble {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The answer of a server to the four-letter command `srvr` (allowed by default).
fn srvr(addr: SocketAddr) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"srvr")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The tasks the client library spawns (its session), polled by the thread that runs a
/// request, together with the request.
#[derive(Default)]
struct LocalTasks {
    tasks: Mutex<Vec<Task>>,
}

impl asyncs::task::Spawn for LocalTasks {
    fn spawn(&self, task: asyncs::task::Task) {
        self.lock().push(Box::into_pin(task.future));
    }
}

impl std::fmt::Debug for LocalTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTasks").finish_non_exhaustive()
    }
}

impl LocalTasks {
    /// Run `future` to completion on this thread, polling the spawned tasks too; the socket
    /// and timers are driven here as well (`async_io::block_on` drives the reactor).
    fn block_on<F: Future>(&self, future: F) -> F::Output {
        let _scope = asyncs::task::enter(self);
        let mut future = pin!(future);
        async_io::block_on(std::future::poll_fn(|context| {
            // The session task first: it may complete the request's reply.
            let mut running = std::mem::take(&mut *self.lock());
            running.retain_mut(|task| task.as_mut().poll(context).is_pending());
            let output = future.as_mut().poll(context);
            let mut tasks = self.lock();
            if !tasks.is_empty() {
                // Spawned while polling: poll them at once.
                context.waker().wake_by_ref();
            }
            running.append(&mut tasks);
            *tasks = running;
            output
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Task>> {
        self.tasks.lock().unwrap_or_else(|error| error.into_inner())
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// A client: one session.
#[derive(Debug)]
pub struct ZooKeeperClient {
    tasks: LocalTasks,
    client: Option<zk::Client>,
    owner: Vec<u8>,
}

fn path_of(key: &str) -> String {
    format!("/{key}")
}

fn zk_error(what: &str, error: zk::Error) -> CliError {
    format!("ZooKeeper {what}: {error}").into()
}

impl ZooKeeperClient {
    fn connect(addr: SocketAddr, index: u32) -> Result<ZooKeeperClient, CliError> {
        let tasks = LocalTasks::default();
        let cluster = addr.to_string();
        let connect = zk::Client::connector()
            .with_session_timeout(Duration::from_secs(30))
            .with_connection_timeout(Duration::from_secs(5))
            .with_fail_eagerly()
            .connect(&cluster);
        let client = tasks
            .block_on(connect)
            .map_err(|error| format!("connecting to ZooKeeper at {addr}: {error}"))?;
        Ok(ZooKeeperClient {
            tasks,
            client: Some(client),
            owner: format!("client-{index}").into_bytes(),
        })
    }

    fn session(&self) -> &zk::Client {
        self.client.as_ref().expect("open until dropped")
    }
}

impl Drop for ZooKeeperClient {
    /// Close the session (its ephemeral nodes go at once), waiting a little for it.
    fn drop(&mut self) {
        drop(self.client.take());
        let tasks = &self.tasks;
        tasks.block_on(async {
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while !tasks.is_empty() && std::time::Instant::now() < deadline {
                async_io::Timer::after(Duration::from_millis(1)).await;
            }
        });
    }
}

impl CoordClient for ZooKeeperClient {
    fn read(&mut self, key: &str) -> Result<(), CliError> {
        let path = path_of(key);
        self.tasks
            .block_on(self.session().get_data(&path))
            .map(|_| ())
            .map_err(|error| zk_error(&format!("getData {path}"), error))
    }

    fn write(&mut self, key: &str, value: &[u8]) -> Result<(), CliError> {
        let path = path_of(key);
        self.tasks
            .block_on(self.session().set_data(&path, value, None))
            .map(|_| ())
            .map_err(|error| zk_error(&format!("setData {path}"), error))
    }

    /// A persistent node (or its value set, if it exists).
    fn create(&mut self, key: &str, value: &[u8]) -> Result<(), CliError> {
        let path = path_of(key);
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        match self
            .tasks
            .block_on(self.session().create(&path, value, &options))
        {
            Ok(_) => Ok(()),
            Err(zk::Error::NodeExists) => self.write(key, value),
            Err(error) => Err(zk_error(&format!("create {path}"), error)),
        }
    }

    /// An ephemeral node: made by one client, the others told it exists.
    fn acquire(&mut self, name: &str) -> Result<u64, CliError> {
        let path = path_of(name);
        let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        let mut attempts = 0;
        loop {
            attempts += 1;
            let created = self
                .tasks
                .block_on(self.session().create(&path, &self.owner, &options));
            match created {
                Ok(_) => return Ok(attempts),
                Err(zk::Error::NodeExists) => {}
                Err(error) => return Err(zk_error(&format!("create {path}"), error)),
            }
        }
    }

    fn release(&mut self, name: &str) -> Result<(), CliError> {
        let path = path_of(name);
        self.tasks
            .block_on(self.session().delete(&path, None))
            .map_err(|error| zk_error(&format!("delete {path}"), error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_server_gets_its_ports_and_directory_and_the_default_durability() {
        let peers = [(3001, 4001), (3002, 4002), (3003, 4003)];
        let text = config(loopback(2002), &peers, Path::new("/d/zk2/data"));
        assert!(text.contains("dataDir=/d/zk2/data\n"), "{text}");
        assert!(text.contains("clientPort=2002\n"), "{text}");
        assert!(text.contains("server.3=127.0.0.1:3003:4003\n"), "{text}");
        assert!(text.contains("admin.enableServer=false"), "{text}");
        assert!(!text.contains("forceSync"), "{text}");
    }

    #[test]
    fn a_missing_zookeeper_says_how_to_install_it() {
        let setup = ZooKeeperSetup {
            java: "java".to_owned(),
            jar: PathBuf::from("/nonexistent/zookeeper.jar"),
            dir: std::env::temp_dir(),
            cpu: None,
        };
        let error = ZooKeeperEnsemble::start(&setup, &Shutdown::new())
            .unwrap_err()
            .to_string();
        assert!(error.contains("apt-get install zookeeper`"), "{error}");
    }
}

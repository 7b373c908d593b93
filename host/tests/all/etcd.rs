//! Real etcd clusters for tests: three members on free loopback ports, each with its own data
//! dir, started and killed by the test (`etcd` is Debian's `etcd-server`, which
//! `scripts/setup` installs). Everything a cluster started is killed when it is dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

const ETCD: &str = "/usr/bin/etcd";

/// Makes the process `command` starts die with the thread that starts it, so that a test
/// killed half-way (a timeout, Ctrl-C) leaves no etcd member or agent running: `Drop` does
/// not run then.
#[allow(unsafe_code)]
pub fn dies_with_its_parent(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, and makes one system call
    // (prctl), which is async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        })
    }
}

/// One member's ports, files and process.
struct Member {
    name: String,
    /// The network namespace it runs in, on a host of a multi-host test; `None`: this one.
    netns: Option<String>,
    client_url: String,
    peer_url: String,
    data_dir: PathBuf,
    log: PathBuf,
    process: Option<Child>,
}

/// A three-member etcd cluster on loopback (or as many as [`EtcdCluster::start_with`] asks).
pub struct EtcdCluster {
    members: Vec<Member>,
    initial_cluster: String,
    /// Flags every member is started with, beyond its name, ports and data dir.
    extra_flags: Vec<String>,
    /// How the harness itself connects: TLS (and later a user) for a secured cluster.
    access: Option<etcd_client::ConnectOptions>,
    _dir: tempfile::TempDir,
}

/// A port nothing listens on now, below the ephemeral range (32768 and up on Linux), where
/// outgoing connections (etcd's own, other tests') take theirs: each test process starts at
/// its own offset, and no port is handed out twice by one process.
pub fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 100) as u16 * 120;
    loop {
        let port = start + NEXT.fetch_add(1, Ordering::Relaxed) % 12_000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A member's flags to serve clients over TLS with `member`'s certificate and key, taking
/// only clients with a certificate from `ca`.
fn secured_member_flags(
    ca: &std::path::Path,
    member: (&std::path::Path, &std::path::Path),
) -> [String; 7] {
    let text = |path: &std::path::Path| path.to_str().unwrap().to_string();
    [
        "--cert-file".into(),
        text(member.0),
        "--key-file".into(),
        text(member.1),
        "--trusted-ca-file".into(),
        text(ca),
        "--client-cert-auth".into(),
    ]
}

/// The harness's own connection options for members that require a client certificate.
fn client_tls(
    ca: &std::path::Path,
    client: (&std::path::Path, &std::path::Path),
) -> etcd_client::ConnectOptions {
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(
            std::fs::read(ca).unwrap(),
        ))
        .identity(etcd_client::Identity::from_pem(
            std::fs::read(client.0).unwrap(),
            std::fs::read(client.1).unwrap(),
        ));
    etcd_client::ConnectOptions::new().with_tls(tls)
}

/// Sends a test's own raw etcd call (`$call`, an expression made again for each try) until
/// etcd answers it, and gives the answer. etcd answers "leader changed", or times out,
/// while its members, starved of CPU by the tests around them, elect a new leader: a test
/// that unwrapped such a call failed for it. Only for calls that may land twice (a put of
/// the same value, a delete, a read); anything else etcd says fails the test, named.
macro_rules! until_answered {
    ($what:expr, $call:expr) => {{
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match $call.await {
                Ok(answer) => break answer,
                Err(etcd_client::Error::GRpcStatus(status))
                    if matches!(
                        status.code(),
                        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                    ) && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(error) => panic!("{}: {error}", $what),
            }
        }
    }};
}

/// [`until_answered!`] for the harness's set-up calls, which a lost answer may have landed
/// already: a retry that finds its work done ("already exists") is taken too.
macro_rules! until_taken {
    ($what:expr, $call:expr) => {
        until_answered!($what, async {
            match $call.await {
                Err(error) if error.to_string().contains("already exists") => Ok(None),
                answer => answer.map(Some),
            }
        })
    };
}

impl EtcdCluster {
    /// Starts three members and waits until the cluster answers.
    pub async fn start() -> EtcdCluster {
        EtcdCluster::start_with(3, &[]).await
    }

    /// Starts `count` members, each with `extra_flags` (`--quota-backend-bytes=N`, say), and
    /// waits until the cluster answers.
    pub async fn start_with(count: usize, extra_flags: &[&str]) -> EtcdCluster {
        EtcdCluster::start_as(count, extra_flags, "http", None).await
    }

    /// Three members serving `https://` with `server`'s certificate (and key), trusting
    /// `ca` and requiring a client certificate from it (`--client-cert-auth`); the harness
    /// connects with `client`'s.
    pub async fn start_secured(
        ca: &std::path::Path,
        server: (&std::path::Path, &std::path::Path),
        client: (&std::path::Path, &std::path::Path),
    ) -> EtcdCluster {
        let flags = secured_member_flags(ca, server);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        EtcdCluster::start_as(3, &flags, "https", Some(client_tls(ca, client))).await
    }

    async fn start_as(
        count: usize,
        extra_flags: &[&str],
        scheme: &str,
        access: Option<etcd_client::ConnectOptions>,
    ) -> EtcdCluster {
        assert!(
            std::path::Path::new(ETCD).exists(),
            "{ETCD} is missing: run scripts/setup (it installs Debian's etcd-server)"
        );
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<Member> = (1..=count)
            .map(|n| Member {
                name: format!("m{n}"),
                netns: None,
                client_url: format!("{scheme}://127.0.0.1:{}", free_port()),
                peer_url: format!("http://127.0.0.1:{}", free_port()),
                data_dir: dir.path().join(format!("m{n}")),
                log: dir.path().join(format!("m{n}.log")),
                process: None,
            })
            .collect();
        EtcdCluster::launch_all(members, extra_flags, access, dir).await
    }

    /// One member on each host, given as its network namespace, its address (the member
    /// listens on ports 2379 and 2380 there) and its own directory (the member's data and
    /// log go there), serving clients over TLS with `member`'s certificate (valid for every
    /// host's address) and requiring a certificate from `ca` (`--client-cert-auth`); the
    /// harness connects with `member`'s too. Waits until the cluster answers.
    pub async fn start_on_hosts(
        hosts: &[(String, std::net::Ipv4Addr, PathBuf)],
        ca: &std::path::Path,
        member: (&std::path::Path, &std::path::Path),
    ) -> EtcdCluster {
        let flags = secured_member_flags(ca, member);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let dir = tempfile::tempdir().unwrap();
        let members = hosts
            .iter()
            .enumerate()
            .map(|(i, (netns, addr, host_dir))| Member {
                name: format!("m{}", i + 1),
                netns: Some(netns.clone()),
                client_url: format!("https://{addr}:2379"),
                peer_url: format!("http://{addr}:2380"),
                data_dir: host_dir.join("etcd"),
                log: host_dir.join("etcd.log"),
                process: None,
            })
            .collect();
        let access = client_tls(ca, member);
        EtcdCluster::launch_all(members, &flags, Some(access), dir).await
    }

    async fn launch_all(
        members: Vec<Member>,
        extra_flags: &[&str],
        access: Option<etcd_client::ConnectOptions>,
        dir: tempfile::TempDir,
    ) -> EtcdCluster {
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let count = members.len();
        let mut cluster = EtcdCluster {
            members,
            initial_cluster,
            extra_flags: extra_flags.iter().map(|f| f.to_string()).collect(),
            access,
            _dir: dir,
        };
        for i in 0..count {
            cluster.launch(i);
        }
        cluster.wait_until_serving().await;
        cluster
    }

    /// Waits until every member serves a linearizable read, for at most 30 s; a member that
    /// exits meanwhile fails the test with its log.
    async fn wait_until_serving(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        for i in 0..self.members.len() {
            loop {
                self.check_alive(i);
                if self.serves(i).await {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "etcd member {} did not serve within 30 s; its log:\n{}",
                    self.members[i].name,
                    std::fs::read_to_string(&self.members[i].log).unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    async fn serves(&self, i: usize) -> bool {
        let endpoint = [self.members[i].client_url.as_str()];
        let read = async {
            let mut client = etcd_client::Client::connect(endpoint, self.access.clone()).await?;
            client.get("/", None).await
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(1), read).await,
            Ok(Ok(_))
        )
    }

    fn check_alive(&mut self, i: usize) {
        let member = &mut self.members[i];
        if let Some(process) = member.process.as_mut()
            && let Ok(Some(status)) = process.try_wait()
        {
            panic!(
                "etcd member {} exited ({status}); its log:\n{}",
                member.name,
                std::fs::read_to_string(&member.log).unwrap_or_default()
            );
        }
    }

    fn launch(&mut self, i: usize) {
        let member = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&member.log)
            .unwrap();
        let mut command = match &member.netns {
            None => Command::new(ETCD),
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, ETCD]);
                command
            }
        };
        let process = dies_with_its_parent(&mut command)
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--listen-client-urls", &member.client_url])
            .args(["--advertise-client-urls", &member.client_url])
            .args(["--listen-peer-urls", &member.peer_url])
            .args(["--initial-advertise-peer-urls", &member.peer_url])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "caravan-test"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(&self.extra_flags)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.members[i].process = Some(process);
    }

    /// The process id of every member running now.
    #[allow(dead_code)] // The nodesim bench's, which includes this file; no test needs it.
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.process.as_ref().map(Child::id))
            .collect()
    }

    /// What member `i` counts (its `/metrics`, Prometheus' text, served on its plain client
    /// URL); empty when it does not answer.
    pub fn metrics(&self, i: usize) -> String {
        use std::io::{Read, Write};
        let Some(address) = self.members[i].client_url.strip_prefix("http://") else {
            return String::new();
        };
        let Ok(mut stream) = std::net::TcpStream::connect(address) else {
            return String::new();
        };
        let _ = write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n"
        );
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// A store connected to every member.
    pub async fn store(&self) -> caravan_host::cluster::EtcdStore {
        caravan_host::cluster::EtcdStore::connect(&self.endpoints())
            .await
            .expect("the cluster serves")
    }

    /// The index of the member that leads the etcd cluster now.
    pub async fn leader(&self) -> usize {
        for (i, member) in self.members.iter().enumerate() {
            let status = async {
                let mut client =
                    etcd_client::Client::connect([member.client_url.as_str()], None).await?;
                client.status().await
            };
            if let Ok(Ok(status)) = tokio::time::timeout(Duration::from_secs(2), status).await
                && status.header().map(|h| h.member_id()) == Some(status.leader())
            {
                return i;
            }
        }
        panic!("no etcd member says it leads")
    }

    /// Turns etcd's authentication on, as an operator would: a root user, and `user` with
    /// `password` and a role that may read and write `/caravan/` only (docs/cluster.md's).
    pub async fn enable_auth(&mut self, user: &str, password: &str) {
        use etcd_client::Permission;
        let mut client = etcd_client::Client::connect(self.endpoints(), self.access.clone())
            .await
            .unwrap();
        until_taken!("adding the root role", client.role_add("root"));
        until_taken!(
            "adding the root user",
            client.user_add("root", "root-password", None)
        );
        until_taken!(
            "granting root its role",
            client.user_grant_role("root", "root")
        );
        until_taken!("adding the caravan role", client.role_add("caravan"));
        let prefix = Permission::read_write("/caravan/").with_prefix();
        until_taken!(
            "granting the caravan role /caravan/",
            client.role_grant_permission("caravan", prefix.clone())
        );
        until_taken!("adding the user", client.user_add(user, password, None));
        until_taken!(
            "granting the user its role",
            client.user_grant_role(user, "caravan")
        );
        // Not `until_taken!`: a try whose answer was lost may have turned authentication on,
        // and the next try, sent without a user, is then refused; root getting in tells.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let refusal = match client.auth_enable().await {
                Ok(_) => break,
                Err(refusal) => refusal,
            };
            let as_root = self
                .access
                .clone()
                .unwrap_or_default()
                .with_user("root", "root-password");
            if etcd_client::Client::connect(self.endpoints(), Some(as_root))
                .await
                .is_ok()
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "enabling authentication: {refusal}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.access = self
            .access
            .take()
            .map(|options| options.with_user("root", "root-password"));
    }

    /// Compacts etcd's history up to its current revision, as an operator's retention would.
    pub async fn compact(&self) {
        let mut client = etcd_client::Client::connect(self.endpoints(), None)
            .await
            .unwrap();
        let read = until_answered!("reading etcd's revision", client.get("/", None));
        let revision = read.header().unwrap().revision();
        until_answered!("compacting etcd", client.compact(revision, None));
    }

    /// Kills member `i` as a crash would.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut process) = self.members[i].process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// Starts member `i` again on its data dir and its ports.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.launch(i);
    }

    /// Waits until member `i` serves again.
    pub async fn wait_for_member(&mut self, i: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !self.serves(i).await {
            self.check_alive(i);
            assert!(
                tokio::time::Instant::now() < deadline,
                "etcd member {i} did not serve again within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

//! A real OCI registry for tests: the CNCF distribution registry (Debian's `docker-registry`,
//! which `scripts/setup` installs), serving plain HTTP on a free loopback port (or on a host
//! of a multi-host test), with its storage in a directory of its own; optionally asking for
//! a user and password (htpasswd, bcrypt). Killed when dropped.

use std::path::Path;
use std::process::{Child, Command};

const REGISTRY: &str = "/usr/bin/docker-registry";

/// A running registry.
pub struct Registry {
    /// `HOST:PORT`, as a reference names it.
    pub host: String,
    process: Child,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// A registry on loopback that anyone may pull from and push to.
    pub async fn start() -> Registry {
        Registry::launch(Command::new(REGISTRY), "127.0.0.1", None).await
    }

    /// A registry on loopback that asks for `user` and `password`.
    pub async fn start_with_password(user: &str, password: &str) -> Registry {
        Registry::launch(Command::new(REGISTRY), "127.0.0.1", Some((user, password))).await
    }

    /// A registry run by `command` (a namespace's `ip netns exec`, say, ending in the
    /// registry's path) on `ip`.
    pub async fn start_with(command: Command, ip: &str) -> Registry {
        Registry::launch(command, ip, None).await
    }

    async fn launch(mut command: Command, ip: &str, credentials: Option<(&str, &str)>) -> Registry {
        assert!(
            Path::new(REGISTRY).exists(),
            "{REGISTRY} is missing: run scripts/setup (it installs Debian's docker-registry)"
        );
        let dir = tempfile::tempdir().unwrap();
        let port = crate::etcd::free_port();
        let host = format!("{ip}:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
             delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
            dir.path().join("storage").display()
        );
        if let Some((user, password)) = credentials {
            let htpasswd = dir.path().join("htpasswd");
            let made = Command::new("htpasswd")
                .args(["-Bbc", htpasswd.to_str().unwrap(), user, password])
                .output()
                .expect("htpasswd runs (apache2-utils, which scripts/setup installs)");
            assert!(
                made.status.success(),
                "{}",
                String::from_utf8_lossy(&made.stderr)
            );
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: caravan-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = dir.path().join("registry.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let process = crate::etcd::dies_with_its_parent(&mut command)
            .arg("serve")
            .arg(&config_path)
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("the registry starts");
        let mut registry = Registry {
            host,
            process,
            log,
            _dir: dir,
        };
        registry.wait_until_serving().await;
        registry
    }

    async fn wait_until_serving(&mut self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.process.try_wait() {
                panic!(
                    "the registry exited ({status}); its log:\n{}",
                    self.log_text()
                );
            }
            if tokio::net::TcpStream::connect(&self.host).await.is_ok() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the registry did not listen within 30 s; its log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// What the registry logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `oci://HOST:PORT/PATH`.
    pub fn reference(&self, path: &str) -> String {
        format!("oci://{}/{path}", self.host)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

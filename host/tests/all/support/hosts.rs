//! Hosts that share nothing but a network, on one machine: each a network namespace with its
//! own private address and its own directory, joined by a bridge the test makes
//! (`scripts/hosts`, which the cluster demo uses too). Nothing routes off the machine.
//!
//! Making namespaces needs root. Where they cannot be made, [`Hosts::make`] says why and
//! returns `None` (the test then ends there), except under CI (`CI=true`), where it fails the
//! test: a multi-host test never passes without having run. Every namespace, link and process
//! of a set is removed when its `Hosts` is dropped, a failing test's too, and a set left by a
//! test killed outright is taken over and cleaned by the next one to pick its number.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/hosts");

/// A set of hosts, removed when dropped.
pub struct Hosts {
    set: u8,
    dir: tempfile::TempDir,
}

impl Hosts {
    /// Makes `count` hosts (`0..count`), or says why it cannot (see the module's docs).
    pub fn make(count: usize) -> Option<Hosts> {
        let check = Command::new(SCRIPT).arg("check").output().unwrap();
        if !check.status.success() {
            let why = String::from_utf8_lossy(&check.stdout).trim().to_string();
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "multi-host tests must run under CI, and cannot: {why}"
            );
            eprintln!("skipped: {why}");
            return None;
        }
        let owner = std::process::id().to_string();
        let first = std::process::id() % 250;
        for offset in 0..250 {
            let set = ((first + offset) % 250 + 1) as u8;
            let up = Command::new(SCRIPT)
                .args(["up", &set.to_string(), &count.to_string()])
                .env("CARAVAN_HOSTS_OWNER", &owner)
                .output()
                .unwrap();
            match up.status.code() {
                Some(0) => {
                    let dir = tempfile::tempdir().unwrap();
                    for i in 0..count {
                        std::fs::create_dir_all(dir.path().join(format!("host-{}", i + 1)))
                            .unwrap();
                    }
                    return Some(Hosts { set, dir });
                }
                Some(3) => continue,
                _ => panic!(
                    "scripts/hosts up {set} {count} failed: {}",
                    String::from_utf8_lossy(&up.stderr)
                ),
            }
        }
        panic!("every set of hosts is in use");
    }

    /// Host `i`'s address (from 0).
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.set, 11 + i as u8)
    }

    /// Host `i`'s own directory: its disk, which no other host reads.
    pub fn dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("host-{}", i + 1))
    }

    /// `program` to be run on host `i`, in its namespace, with its own compile cache and the
    /// CLI's pinned time zone (as [`super::caravan_command`] sets them).
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.namespace(i)])
            .arg(program)
            .env("CARAVAN_CACHE_DIR", self.dir(i).join("compile-cache"))
            .env("TZ", "UTC0");
        command
    }

    /// Host `i`'s network namespace.
    pub fn namespace(&self, i: usize) -> String {
        format!("caravan-{}-{}", self.set, i + 1)
    }

    /// Takes host `i`'s link down: it reaches no other host, and none reaches it.
    pub fn cut(&self, i: usize) {
        self.script(&["cut", &self.set.to_string(), &(i + 1).to_string()]);
    }

    /// Brings host `i`'s link back.
    pub fn mend(&self, i: usize) {
        self.script(&["mend", &self.set.to_string(), &(i + 1).to_string()]);
    }

    fn script(&self, args: &[&str]) {
        let out = Command::new(SCRIPT).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "scripts/hosts {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Where host `i`'s directory is, as a string for arguments.
    pub fn dir_arg(&self, i: usize, name: &str) -> String {
        self.dir(i).join(name).to_str().unwrap().to_string()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT)
            .args(["down", &self.set.to_string()])
            .output();
    }
}

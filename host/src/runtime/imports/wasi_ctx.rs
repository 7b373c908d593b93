//! The WASI context of one alloc's sandbox: what the guest sees of the world.
//!
//! By default that is its alloc directory at `/alloc` (read-write), stdout and stderr into the
//! agent's log, tokio's clock, and nothing else: no environment, no other directory, no
//! sockets. A runner that imports no `wasi:filesystem` interface is opened no directory at
//! all, as it could not reach one. The alloc's [`Grants`] add network destinations, read-only
//! volumes and environment variables (see [`crate::model::capabilities`]). This module builds the
//! context only; it decides nothing about what is granted.

use crate::model::capabilities::Grants;
use crate::runtime::imports::logging::{GuestLogSink, GuestOutput};
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use wasmtime_wasi::sockets::SocketAddrUse;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder};

/// The guest's monotonic clock is tokio's, so paused-time tests move guest time too.
struct TokioClock {
    start: tokio::time::Instant,
}

impl wasmtime_wasi::HostMonotonicClock for TokioClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Whether the sandbox opens its directories (the alloc dir and the granted volumes) for the
/// guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::runtime) enum Directories {
    /// Opened, each held as a host descriptor while the sandbox lives.
    Open,
    /// Not opened: the runner imports no `wasi:filesystem` interface, so no call could reach
    /// them, and a live alloc of it holds no descriptor for them. Tens of thousands of such
    /// allocs would otherwise hit the process's open-files limit long before its memory.
    Unreachable,
}

/// `wasi:random/random`'s bytes, from the calling thread's generator (`rand`'s `ThreadRng`:
/// ChaCha12, seeded and reseeded from the kernel). wasmtime-wasi's default gives each sandbox
/// a generator of its own, 336 bytes held for the alloc's whole life; this one holds nothing.
struct ThreadSecureRandom;

impl rand::TryRng for ThreadSecureRandom {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(rand::Rng::next_u32(&mut rand::rng()))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(rand::Rng::next_u64(&mut rand::rng()))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), Self::Error> {
        rand::Rng::fill_bytes(&mut rand::rng(), dest);
        Ok(())
    }
}

/// The context for an alloc whose directory is `alloc_dir`, given `grants`, with its output
/// going to `sink`. An error names the directory that could not be opened.
pub(in crate::runtime) fn sandbox_wasi(
    alloc_dir: &Path,
    directories: Directories,
    grants: &Grants,
    sink: &GuestLogSink,
) -> anyhow::Result<WasiCtx> {
    let mut builder = WasiCtxBuilder::new();
    if directories == Directories::Open {
        open_directories(&mut builder, alloc_dir, grants)?;
    }
    builder
        .envs(&grants.env)
        .stdout(GuestOutput::stdout(sink.clone()))
        .stderr(GuestOutput::stderr(sink.clone()))
        .monotonic_clock(TokioClock {
            start: tokio::time::Instant::now(),
        })
        .secure_random(ThreadSecureRandom);
    // Without a destination, no socket is made at all (each would hold a host descriptor).
    let networked = !grants.network.is_empty();
    builder.allow_tcp(networked).allow_udp(networked);
    if networked {
        let destinations: Arc<[SocketAddr]> = grants.network.clone().into();
        builder.socket_addr_check(move |addr, usage| {
            let allowed = socket_use_allowed(&destinations, addr, usage);
            Box::pin(std::future::ready(allowed))
                as Pin<Box<dyn Future<Output = bool> + Send + Sync>>
        });
    }
    Ok(builder.build())
}

/// Opens the alloc dir read-write at `/alloc` and each granted volume read-only at its path.
fn open_directories(
    builder: &mut WasiCtxBuilder,
    alloc_dir: &Path,
    grants: &Grants,
) -> anyhow::Result<()> {
    builder
        .preopened_dir(alloc_dir, "/alloc", FsPerms::ReadWrite)
        .map_err(|e| anyhow::anyhow!("cannot open alloc dir {}: {e}", alloc_dir.display()))?;
    for volume in &grants.volumes {
        builder
            .preopened_dir(&volume.host_dir, &volume.guest_path, FsPerms::ReadOnly)
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot open volume {:?} ({}): {e}",
                    volume.name,
                    volume.host_dir.display()
                )
            })?;
    }
    Ok(())
}

/// Whether a guest may use `addr` for `usage`: talk to a granted destination, or bind the
/// local side of such a conversation to an ephemeral port; never listen or accept.
fn socket_use_allowed(destinations: &[SocketAddr], addr: SocketAddr, usage: SocketAddrUse) -> bool {
    match usage {
        SocketAddrUse::TcpConnect | SocketAddrUse::UdpSend | SocketAddrUse::UdpReceive => {
            destinations.contains(&addr)
        }
        SocketAddrUse::TcpBind | SocketAddrUse::UdpBind => {
            addr.ip().is_unspecified() && addr.port() == 0
        }
        SocketAddrUse::TcpListen | SocketAddrUse::TcpAccept => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secure_random_bytes_differ_from_call_to_call() {
        use rand::Rng;
        let (mut first, mut second) = ([0u8; 32], [0u8; 32]);
        ThreadSecureRandom.fill_bytes(&mut first);
        ThreadSecureRandom.fill_bytes(&mut second);
        assert_ne!(first, [0; 32]);
        assert_ne!(first, second);
    }

    #[test]
    fn only_granted_destinations_and_ephemeral_binds_are_allowed() {
        let granted: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let other: SocketAddr = "127.0.0.1:8081".parse().unwrap();
        let wildcard: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let fixed_port: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let allowed = |addr, usage| socket_use_allowed(&[granted], addr, usage);
        assert!(allowed(granted, SocketAddrUse::TcpConnect));
        assert!(allowed(granted, SocketAddrUse::UdpSend));
        assert!(!allowed(other, SocketAddrUse::TcpConnect));
        assert!(!allowed(other, SocketAddrUse::UdpReceive));
        assert!(allowed(wildcard, SocketAddrUse::TcpBind));
        assert!(!allowed(fixed_port, SocketAddrUse::TcpBind));
        assert!(!allowed(granted, SocketAddrUse::TcpBind));
        assert!(!allowed(wildcard, SocketAddrUse::TcpListen));
        assert!(!allowed(granted, SocketAddrUse::TcpAccept));
    }
}

//! The agent's listening socket, with room for thousands of connections arriving at once.
//!
//! Rust's standard library and tokio (through mio) listen with a backlog of 128. When more
//! nodes than that connect together (`caravan nodesim --nodes 5000` registering, or a
//! cluster's clients coming back after their agent restarts), Linux finds the accept queue
//! full and drops the handshake's SYNs and last ACKs; the client's first request then waits
//! out the retransmit back-off, long enough for nodesim's 30 s call timeout to give up and
//! retry. Nomad listens through Go, which asks for `net.core.somaxconn` (4,096 by default);
//! this asks for 4,096, which the kernel caps at `somaxconn` where that is lower.
//!
//! Owns only the socket's setup; what is served on it is [`super::http`]'s.

use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpSocket};

/// Connections the kernel may hold for the agent to accept. Linux caps it, silently, at
/// `net.core.somaxconn` (4096 by default since 5.4).
pub const LISTEN_BACKLOG: u32 = 4096;

/// Listens on `addr` as [`TcpListener::bind`] does (address reuse on Unix, so a restarted
/// agent can take its port back at once), but with [`LISTEN_BACKLOG`].
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More connections than std's backlog of 128 all complete while the agent accepts
    /// none: with a backlog of 128, the 130th and later would wait for SYN retransmits.
    /// (Linux only: elsewhere `somaxconn` is read differently, and often 128.)
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn connections_beyond_the_default_backlog_complete_before_any_accept() {
        // Linux before 5.4 defaulted `somaxconn` to 128, which caps any listener.
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok());
        // Well over 128, and few enough descriptors for a test among others (two each).
        let connections = 300;
        if somaxconn.is_some_and(|cap| cap < connections + 1) {
            eprintln!(
                "skipped: net.core.somaxconn is {somaxconn:?}, below the {connections} connections this test makes"
            );
            return;
        }
        let listener = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut connecting = tokio::task::JoinSet::new();
        for _ in 0..connections {
            connecting.spawn(tokio::net::TcpStream::connect(addr));
        }
        let mut connected = Vec::new();
        // Not a timing measure: with the backlog full and nobody accepting, a connect is
        // never answered (its SYNs are dropped until it gives up, minutes later), so the
        // bound only turns that hang into a failure. Loopback handshakes take microseconds.
        let all = async {
            while let Some(stream) = connecting.join_next().await {
                connected.push(stream.unwrap().unwrap());
            }
        };
        let within = std::time::Duration::from_secs(30);
        let finished = tokio::time::timeout(within, all).await;
        assert!(
            finished.is_ok(),
            "only {} of {connections} connections completed within {within:?} with none accepted: the backlog is too small",
            connected.len()
        );
        drop(listener);
    }
}

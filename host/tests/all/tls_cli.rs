//! `caravan tls`: a CA and certificates written by the real binary, as an operator makes
//! them for a cluster, and refusals that change nothing.

use crate::support::run_caravan;

fn caravan_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    let dir = dir.to_str().unwrap();
    all.extend(["--dir", dir]);
    run_caravan(&all, None)
}

#[test]
fn an_operator_makes_a_ca_and_certificates_for_each_role() {
    let dir = tempfile::tempdir().unwrap();
    let ca = caravan_in(dir.path(), &["tls", "ca", "create"]);
    assert_eq!(
        ca.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ca.stderr)
    );
    let (ca_file, ca_key) = (
        dir.path().join("caravan-agent-ca.pem"),
        dir.path().join("caravan-agent-ca-key.pem"),
    );
    assert!(ca_file.is_file() && ca_key.is_file());
    for (role, file) in [
        ("--server", "global-server-caravan"),
        ("--client", "global-client-caravan"),
        ("--cli", "global-cli-caravan"),
    ] {
        let made = caravan_in(
            dir.path(),
            &[
                "tls",
                "cert",
                "create",
                role,
                "--node",
                "node-1",
                "--additional-ipaddress",
                "10.213.1.11",
                "--ca",
                ca_file.to_str().unwrap(),
                "--key",
                ca_key.to_str().unwrap(),
            ],
        );
        assert_eq!(
            made.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let cert = std::fs::read_to_string(dir.path().join(format!("{file}.pem"))).unwrap();
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
        use std::os::unix::fs::PermissionsExt as _;
        let key = std::fs::metadata(dir.path().join(format!("{file}-key.pem"))).unwrap();
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
    }

    // Nothing is overwritten, and a bad flag is one line; each exits 2, as a local command.
    let again = caravan_in(dir.path(), &["tls", "ca", "create"]);
    let said = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(2));
    assert!(said.contains("caravan-agent-ca.pem exists"), "{said}");
    assert_eq!(said.trim().lines().count(), 1, "{said}");
    let no_ca = caravan_in(
        dir.path(),
        &[
            "tls",
            "cert",
            "create",
            "--server",
            "--ca",
            "/nonexistent/ca.pem",
        ],
    );
    assert_eq!(no_ca.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_ca.stderr).contains("cannot read /nonexistent/ca.pem"));
    let two_roles = caravan_in(dir.path(), &["tls", "cert", "create", "--server", "--cli"]);
    assert_eq!(two_roles.status.code(), Some(2));
}

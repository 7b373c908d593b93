//! The config file and flags, read as operators write them.

use super::*;

#[test]
fn limit_caps_are_read_and_the_defaults_must_fit_under_them() {
    let mut config = AgentConfig::default();
    apply_file(
        &mut config,
        "agent.toml",
        "[client.limit_caps]\nmemory = \"256MiB\"\nkill_timeout = \"10s\"",
    )
    .unwrap();
    assert_eq!(config.limit_caps.memory_bytes, 256 << 20);
    assert_eq!(config.limit_caps.kill_timeout, Duration::from_secs(10));

    let mut config = AgentConfig::default();
    let error = apply_file(
        &mut config,
        "agent.toml",
        "[client.limits]\nmemory = \"2GiB\"\n[client.limit_caps]\nmemory = \"1GiB\"",
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "agent.toml: client.limits.memory: at most client.limit_caps.memory (1 GiB), not 2 GiB"
    );

    let mut config = AgentConfig::default();
    apply_file(
        &mut config,
        "agent.toml",
        "[client.limits]\ndisk = \"256MiB\"\nopen_files = 64\n[client.limit_caps]\ndisk = \"512MiB\"",
    )
    .unwrap();
    assert_eq!(
        (config.limits.disk_bytes, config.limit_caps.disk_bytes),
        (256 << 20, 512 << 20)
    );
    assert_eq!(config.limits.open_files, 64);
    let asked = LimitOverrides {
        disk_bytes: Some(1 << 30),
        ..LimitOverrides::default()
    };
    assert_eq!(
        config.limit_caps.check(&asked).unwrap_err().to_string(),
        "job.limits.disk: 1 GiB is over this agent's cap of 512 MiB (client.limit_caps.disk)"
    );
}
use std::time::Duration;

#[test]
fn a_file_sets_nomads_knobs_and_keeps_the_rest() {
    let mut config = AgentConfig::default();
    let text = "bind = \"127.0.0.1:0\"\n[client]\ngc_max_allocs = 10\ngc_interval = \"30s\"\n[client.limits]\nmemory = \"32MiB\"\n[server]\njob_gc_threshold = \"1h\"\n";
    apply_file(&mut config, "agent.toml", text).unwrap();
    assert_eq!(config.gc.max_allocs, 10);
    assert_eq!(config.gc.interval, Duration::from_secs(30));
    assert_eq!(
        config.gc.parallel_destroys, 2,
        "unset keys keep their defaults"
    );
    assert_eq!(config.limits.memory_bytes, 32 << 20);
    assert_eq!(config.server.job_gc_threshold, Duration::from_secs(3600));
    assert_eq!(config.bind.port(), 0);
    assert_eq!(
        config.collection_interval,
        crate::agent::series::SAMPLE_INTERVAL
    );
    let mut sampled = AgentConfig::default();
    apply_file(
        &mut sampled,
        "agent.toml",
        "[telemetry]\ncollection_interval = \"1s\"\n",
    )
    .unwrap();
    assert_eq!(sampled.collection_interval, Duration::from_secs(1));
}

#[test]
fn unknown_keys_and_bad_values_name_the_key() {
    let error = |text: &str| {
        apply_file(&mut AgentConfig::default(), "agent.toml", text)
            .unwrap_err()
            .to_string()
    };
    assert!(error("[client]\ngc_max_alloc = 3\n").contains("gc_max_alloc"));
    assert!(error("[client]\ngc_interval = \"soon\"\n").contains("client.gc_interval"));
    assert!(
        error("[client]\ngc_disk_usage_threshold = 120.0\n")
            .contains("client.gc_disk_usage_threshold")
    );
    assert!(error("bind = \"everywhere\"\n").contains("bind"));
    let too_often = error("[telemetry]\ncollection_interval = \"10ms\"\n");
    assert!(
        too_often.contains("telemetry.collection_interval") && too_often.contains("100ms"),
        "{too_often}"
    );
    assert!(
        error("[telemetry]\ncollection_interval = \"often\"\n")
            .contains("telemetry.collection_interval")
    );
    assert!(error("[client]\ngc_max_allocs = \"many\"\n").starts_with("agent.toml: "));
}

#[test]
fn errors_read_as_they_always_have() {
    let error = |text: &str| {
        apply_file(&mut AgentConfig::default(), "agent.toml", text)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        error("[client]\ngc_interval = \"soon\"\n"),
        "agent.toml: client.gc_interval: \"soon\" does not start with a whole number"
    );
    assert_eq!(
        error("[client]\ngc_interval = \"0s\"\n"),
        "agent.toml: client.gc_interval: must be longer than 0"
    );
    assert_eq!(
        error("[client]\ngc_inode_usage_threshold = -1.0\n"),
        "agent.toml: client.gc_inode_usage_threshold: -1 is not a percentage from 0 to 100"
    );
    assert_eq!(
        error("[client]\nmemory = \"64MiB\"\n"),
        "agent.toml: client.memory: moved to [client.limits] (the keys of [job.limits]): write memory there"
    );
    assert_eq!(
        error("[client.limits]\nlog_rate = 0\n"),
        "agent.toml: client.limits.log_rate: expected a whole number above 0, not \"0\""
    );
    assert_eq!(
        error("[client.limits]\nlog_rat = 10\n"),
        format!(
            "agent.toml: client.limits: unknown limit \"log_rat\"; known limits are {}",
            LimitOverrides::KEYS.join(", ")
        )
    );
    assert_eq!(
        error("[client.limits]\ncheckpoint_size = \"8MiB\"\n"),
        "agent.toml: client.limits: checkpoint_size (8 MiB) is over hostcall_size (4 MiB): \
         a checkpoint is one host call"
    );
    assert_eq!(
        error("bind = \"everywhere\"\n"),
        "agent.toml: bind: \"everywhere\" is not an address such as 127.0.0.1:4646"
    );
    let missing = AgentFlags {
        config_file: Some("/nonexistent/agent.toml".into()),
        ..AgentFlags::default()
    };
    assert!(
        missing
            .load()
            .unwrap_err()
            .to_string()
            .starts_with("cannot read config file /nonexistent/agent.toml: "),
    );
}

/// A config file setting every key the flags can also set.
fn file_setting_everything() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(
        &path,
        "data_dir = \"/from/file\"\nbind = \"127.0.0.1:1111\"\nlog_level = \"warn\"\nlog_json = true\nacl_token = \"file-token\"\n",
    )
    .unwrap();
    (dir, path)
}

#[test]
fn flags_given_win_over_the_file() {
    let (_dir, path) = file_setting_everything();
    let config = AgentFlags {
        config_file: Some(path),
        data_dir: Some("/from/flag".into()),
        bind: Some("127.0.0.1:2222".into()),
        dev: true,
        acl_token: Some("flag-token".into()),
        log_level: Some("debug".into()),
        log_json: false,
        ..AgentFlags::default()
    }
    .load()
    .unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/from/flag"));
    assert_eq!(config.bind.port(), 2222);
    assert!(config.dev);
    assert_eq!(config.acl_token.as_deref(), Some("flag-token"));
    assert_eq!(config.log_level, "debug");
    assert!(
        config.log_json,
        "--log-json can only turn JSON on, so the file's `true` stays"
    );
}

#[test]
fn flags_left_out_keep_the_file_and_the_file_keeps_the_defaults() {
    let (_dir, path) = file_setting_everything();
    let config = AgentFlags {
        config_file: Some(path),
        acl_token: Some(String::new()),
        ..AgentFlags::default()
    }
    .load()
    .unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/from/file"));
    assert_eq!(config.bind.port(), 1111);
    assert_eq!(config.log_level, "warn");
    assert!(config.log_json);
    assert_eq!(
        config.acl_token.as_deref(),
        Some("file-token"),
        "an empty --acl-token counts as not given"
    );
    assert!(!config.dev);
    assert_eq!(
        config.max_live_allocs,
        AgentConfig::default().max_live_allocs
    );

    let without_file = AgentFlags::default().load().unwrap();
    assert_eq!(without_file.data_dir, AgentConfig::default().data_dir);
    assert_eq!(without_file.bind, AgentConfig::default().bind);
}

#[test]
fn a_bad_bind_flag_names_the_flag() {
    let error = AgentFlags {
        bind: Some("everywhere".into()),
        ..AgentFlags::default()
    }
    .load()
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "--bind: \"everywhere\" is not an address such as 127.0.0.1:4646"
    );
}

#[test]
fn the_capabilities_offered_are_read_and_a_bad_entry_names_its_key() {
    let mut config = AgentConfig::default();
    assert_eq!(config.capabilities, CapabilityPolicy::default());
    apply_file(
        &mut config,
        "agent.toml",
        "[client.capabilities]\nnetwork = [\"127.0.0.1\", \"10.0.0.5:5432\"]\n\
         volumes = { shared = \"/srv/shared\" }\n",
    )
    .unwrap();
    assert_eq!(config.capabilities.network.len(), 2);
    assert_eq!(
        config.capabilities.volumes["shared"],
        PathBuf::from("/srv/shared")
    );
    let error = apply_file(
        &mut AgentConfig::default(),
        "agent.toml",
        "[client.capabilities]\nnetwork = [\"db.internal:5432\"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("agent.toml: client.capabilities.network[0]: \"db.internal:5432\""),
        "{error}"
    );
}

fn cluster_of(file: &str, flags: AgentFlags) -> Result<AgentConfig, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    std::fs::write(&path, file).unwrap();
    AgentFlags {
        config_file: Some(path),
        ..flags
    }
    .load()
    .map_err(|e| {
        e.to_string()
            .replace(&dir.path().display().to_string(), "DIR")
    })
}

#[test]
fn cluster_mode_comes_from_the_file_or_the_flags_and_flags_win() {
    let file = "[cluster]\nmode = \"etcd\"\netcd_endpoints = [\"http://127.0.0.1:2379\"]\nnode_name = \"from-file\"\nnode_ttl = \"4s\"\n";
    let config = cluster_of(file, AgentFlags::default()).unwrap();
    let cluster = config.cluster.expect("cluster mode");
    assert_eq!(cluster.node_name, "from-file");
    assert_eq!(cluster.node_ttl, std::time::Duration::from_secs(4));
    let flags = AgentFlags {
        etcd_endpoints: Some("http://10.0.0.1:2379, http://10.0.0.2:2379".into()),
        node_name: Some("from-flag".into()),
        ..AgentFlags::default()
    };
    let cluster = cluster_of(file, flags).unwrap().cluster.unwrap();
    assert_eq!(cluster.node_name, "from-flag");
    assert_eq!(
        cluster.etcd_endpoints,
        ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
    );
    let embedded = AgentFlags {
        cluster: Some("embedded".into()),
        ..AgentFlags::default()
    };
    assert!(cluster_of(file, embedded).unwrap().cluster.is_none());
    assert!(
        cluster_of("", AgentFlags::default())
            .unwrap()
            .cluster
            .is_none()
    );
}

#[test]
fn bad_cluster_settings_name_the_key_or_flag_at_fault() {
    let etcd = |endpoints: &str, name: &str| AgentFlags {
        cluster: Some("etcd".into()),
        etcd_endpoints: Some(endpoints.into()),
        node_name: Some(name.into()),
        ..AgentFlags::default()
    };
    let cases = [
        (
            "",
            etcd("localhost:2379", "n1"),
            "--etcd-endpoints: \"localhost:2379\" is not an etcd client URL such as http://127.0.0.1:2379 (https:// with cluster.etcd_ca_file)",
        ),
        (
            "",
            etcd("http://127.0.0.1:2379", "a/b"),
            "--node-name: node name \"a/b\" may hold only letters, digits, '-', '_' and '.', not '/'",
        ),
        (
            "",
            AgentFlags {
                cluster: Some("raft".into()),
                ..AgentFlags::default()
            },
            "--cluster: \"raft\" is not a mode: \"embedded\" or \"etcd\"",
        ),
        (
            "",
            AgentFlags {
                cluster: Some("etcd".into()),
                ..AgentFlags::default()
            },
            "cluster mode etcd needs every etcd member's URL: --etcd-endpoints http://HOST:PORT,... (or cluster.etcd_endpoints)",
        ),
        (
            "",
            AgentFlags {
                advertise: Some("10.0.0.1".into()),
                ..etcd("http://127.0.0.1:2379", "n1")
            },
            "--advertise: \"10.0.0.1\" is not a URL other agents can reach, such as http://10.0.0.11:4646 (https:// with [tls])",
        ),
        (
            "[cluster]\nnode_ttl = \"1s\"\n",
            AgentFlags::default(),
            "DIR/agent.toml: cluster.node_ttl: at least 2s (etcd's shortest lease), not 1s",
        ),
        (
            "[cluster]\netcd_endpoints = [\"http://127.0.0.1:2379\"]\n",
            AgentFlags::default(),
            "DIR/agent.toml: cluster.etcd_endpoints: needs cluster mode etcd (--cluster etcd)",
        ),
        (
            "[acl]\nenabled = true\n",
            etcd("http://127.0.0.1:2379", "n1"),
            "[acl] enabled in cluster mode needs [tls] http = true: agents fetch runner builds and checkpoints from each other with their certificates",
        ),
    ];
    for (file, flags, expected) in cases {
        assert_eq!(cluster_of(file, flags).unwrap_err(), expected);
    }
}

#[test]
fn acls_are_turned_on_by_the_file_or_the_flag() {
    assert!(
        cluster_of("[acl]\nenabled = true\n", AgentFlags::default())
            .unwrap()
            .acl_enabled
    );
    let flag = AgentFlags {
        acl_enabled: true,
        ..AgentFlags::default()
    };
    assert!(cluster_of("", flag).unwrap().acl_enabled);
    assert!(!cluster_of("", AgentFlags::default()).unwrap().acl_enabled);
    let unknown = cluster_of("[acl]\nenable = true\n", AgentFlags::default()).unwrap_err();
    assert!(unknown.contains("enable"), "{unknown}");
}

#[test]
fn a_single_agent_may_run_without_a_client_and_time_out_silent_nodes() {
    let mut config = AgentConfig::default();
    let text = "[client]\nenabled = false\n[server]\nnode_ttl = \"5s\"\n";
    apply_file(&mut config, "agent.toml", text).unwrap();
    assert!(!config.client_enabled);
    assert_eq!(config.server.node_ttl, Duration::from_secs(5));

    let error = |text: &str| {
        apply_file(&mut AgentConfig::default(), "agent.toml", text)
            .unwrap_err()
            .to_string()
    };
    assert!(error("[server]\nnode_ttl = \"500ms\"\n").contains("server.node_ttl"));
    assert!(error("[client]\nenabled = \"no\"\n").contains("expected a boolean"));

    let in_cluster = "[client]\nenabled = false\n[cluster]\nmode = \"etcd\"\netcd_endpoints = [\"http://127.0.0.1:2379\"]\nnode_name = \"n1\"\n";
    let refused = cluster_of(in_cluster, AgentFlags::default()).unwrap_err();
    assert!(refused.contains("client.enabled = false"), "{refused}");
}

#[test]
fn a_nodes_class_meta_and_memory_are_read_and_what_it_says_of_itself_follows() {
    let mut config = AgentConfig::default();
    let text = "[client]\nnode_class = \"edge\"\nnode_pool = \"batch\"\nmemory_total = \"4GiB\"\n\
                max_live_allocs = 50\n[client.reserved]\nmemory = \"1GiB\"\n[client.meta]\nrack = \"r1\"\n\
                [client.limits]\nmemory = \"32MiB\"\n";
    apply_file(&mut config, "agent.toml", text).unwrap();
    let info = config.node_info();
    assert_eq!((info.class.as_str(), info.pool.as_str()), ("edge", "batch"));
    assert_eq!(info.meta.get("rack").map(String::as_str), Some("r1"));
    assert_eq!(
        info.resources.memory_bytes,
        Some(3 << 30),
        "4 GiB less 1 GiB reserved"
    );
    assert_eq!(info.resources.alloc_slots, Some(50));
    assert_eq!(info.resources.default_alloc_memory_bytes, Some(32 << 20));
    assert!(info.attributes.contains_key("cpu.arch"));

    let machine = AgentConfig::default().node_info().resources.memory_bytes;
    assert!(
        machine.is_some_and(|m| m > 0),
        "a share of the machine's memory"
    );

    let refused = |text: &str| {
        apply_file(&mut AgentConfig::default(), "agent.toml", text)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        refused("[client]\nmemory_total = \"1GiB\"\n[client.reserved]\nmemory = \"1GiB\"\n"),
        "agent.toml: client.reserved.memory: 1 GiB leaves nothing of client.memory_total (1 GiB)"
    );
    assert!(
        refused("[client]\nmemory_total = \"lots\"\n")
            .starts_with("agent.toml: client.memory_total: ")
    );
    assert_eq!(
        refused("[client]\nnode_class = \"a\\nb\"\n"),
        "agent.toml: client.node_class: \"a\\nb\" has a control character"
    );
}

#[test]
fn tls_is_read_with_its_files_and_a_missing_one_or_a_bad_region_is_named() {
    let mut config = AgentConfig::default();
    assert_eq!(
        (config.region.as_str(), config.tls.is_none()),
        ("global", true)
    );
    let text = "region = \"EU-west\"\n[tls]\nhttp = true\nca_file = \"ca.pem\"\n\
                cert_file = \"server.pem\"\nkey_file = \"server-key.pem\"\nverify_https_client = true\n";
    apply_file(&mut config, "agent.toml", text).unwrap();
    assert_eq!(config.region, "eu-west");
    let tls = config.tls.clone().expect("TLS on");
    assert!(tls.verify_https_client);
    assert_eq!(tls.files.ca.path, std::path::Path::new("ca.pem"));
    let (cert, key) = tls.files.identity.expect("the agent's certificate");
    assert_eq!(
        (cert.setting.as_str(), key.setting.as_str()),
        ("tls.cert_file", "tls.key_file")
    );

    // Files without `http = true` leave TLS off, as in Nomad.
    let mut off = AgentConfig::default();
    apply_file(&mut off, "agent.toml", "[tls]\nca_file = \"ca.pem\"\n").unwrap();
    assert!(off.tls.is_none());

    for (text, expected) in [
        (
            "[tls]\nhttp = true\nca_file = \"ca.pem\"\ncert_file = \"c.pem\"\n",
            "agent.toml: tls.key_file is required with tls.http = true (caravan tls ... writes one)",
        ),
        (
            "region = \"eu.west\"\n",
            "agent.toml: region: \"eu.west\" must be 1 to 63 letters, digits or '-' (it goes into a DNS name)",
        ),
        (
            "[tls]\nhttps = true\n",
            "agent.toml: unknown field `https`, expected one of `http`, `ca_file`, `cert_file`, `key_file`, `verify_https_client`",
        ),
    ] {
        let error = apply_file(&mut AgentConfig::default(), "agent.toml", text).unwrap_err();
        assert_eq!(error.to_string(), expected, "{text}");
    }
}

#[test]
fn etcd_tls_and_user_settings_must_agree_with_each_other_and_the_endpoints() {
    let etcd = "[cluster]\nmode = \"etcd\"\nnode_name = \"n1\"\n";
    let cases = [
        (
            "etcd_endpoints = [\"https://127.0.0.1:2379\"]\n",
            "DIR/agent.toml: cluster.etcd_endpoints: https:// endpoints need cluster.etcd_ca_file (the CA etcd's certificates chain to)",
        ),
        (
            "etcd_endpoints = [\"https://127.0.0.1:2379\", \"http://127.0.0.1:22379\"]\netcd_ca_file = \"ca.pem\"\n",
            "DIR/agent.toml: cluster.etcd_ca_file: given, but not every endpoint of DIR/agent.toml: cluster.etcd_endpoints is https://",
        ),
        (
            "etcd_endpoints = [\"https://127.0.0.1:2379\"]\netcd_ca_file = \"ca.pem\"\netcd_cert_file = \"c.pem\"\n",
            "DIR/agent.toml: cluster.etcd_cert_file: needs cluster.etcd_key_file too",
        ),
        (
            "etcd_endpoints = [\"http://127.0.0.1:2379\"]\netcd_password_file = \"pw\"\n",
            "DIR/agent.toml: cluster.etcd_password_file: needs cluster.etcd_username",
        ),
    ];
    for (keys, expected) in cases {
        let error = cluster_of(&format!("{etcd}{keys}"), AgentFlags::default()).unwrap_err();
        assert_eq!(error, expected, "{keys}");
    }
    let secured = format!(
        "{etcd}etcd_endpoints = [\"https://127.0.0.1:2379\"]\netcd_ca_file = \"ca.pem\"\n\
         etcd_cert_file = \"c.pem\"\netcd_key_file = \"k.pem\"\netcd_username = \"caravan\"\n"
    );
    let config = cluster_of(&secured, AgentFlags::default()).unwrap();
    let security = &config.cluster.expect("cluster mode").etcd_security;
    assert_eq!(
        format!("{security:?}").matches("PemFile").count(),
        3,
        "{security:?}"
    );
}

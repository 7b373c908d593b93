use super::*;

#[test]
fn every_key_parses_its_kind_and_names_itself_when_wrong() {
    let mut overrides = LimitOverrides::default();
    overrides.set("memory", "32MiB").unwrap();
    overrides.set("kill_timeout", "2s").unwrap();
    overrides.set("cpu_share", "25%").unwrap();
    overrides.set("open_files", "64").unwrap();
    overrides.set("wall_time", "1h").unwrap();
    assert_eq!(overrides.memory_bytes, Some(32 * MIB));
    assert_eq!(overrides.kill_timeout, Some(Duration::from_secs(2)));
    assert_eq!(overrides.cpu_share, Some(25));
    assert_eq!(overrides.open_files, Some(64));
    assert_eq!(overrides.wall_time, Some(Duration::from_secs(3600)));
    for (key, text, expected) in [
        ("disk", "0", Bytes::EXPECTED),
        ("cpu", "60", Time::EXPECTED),
        ("cpu_share", "101", Percent::EXPECTED),
        ("log_rate", "-1", Count::EXPECTED),
    ] {
        let error = overrides.set(key, text).unwrap_err();
        assert_eq!(error.key(), Some(key));
        assert_eq!(
            error.to_string(),
            format!("{key}: expected {expected}, not {text:?}")
        );
    }
    assert_eq!(overrides.check_values(), Ok(()));
    let stored = LimitOverrides {
        cpu_share: Some(0),
        ..LimitOverrides::default()
    };
    assert_eq!(
        stored.check_values().unwrap_err().to_string(),
        "cpu_share: expected a whole percentage from 1 to 100, not \"0%\""
    );
    let unknown = overrides.set("memroy", "1MiB").unwrap_err().to_string();
    assert!(unknown.starts_with("unknown limit \"memroy\"; known limits are memory, cpu,"));
}

#[test]
fn a_document_may_leave_a_key_null_and_a_wrongly_typed_value_names_its_key() {
    let raw: RawLimits =
        serde_json::from_str(r#"{"memory": null, "cpu_share": 1.5, "kill_timeout": "0s"}"#)
            .unwrap();
    let error = LimitOverrides::from_raw(&raw).unwrap_err();
    assert_eq!(error.field("job.limits"), "job.limits.cpu_share");
    assert_eq!(
        error.problem(),
        "expected a whole percentage from 1 to 100, not \"1.5\""
    );
    let raw: RawLimits = serde_json::from_str(r#"{"memory": null, "kill_timeout": "0s"}"#).unwrap();
    let overrides = LimitOverrides::from_raw(&raw).unwrap();
    assert_eq!(overrides.memory_bytes, None);
    assert_eq!(
        overrides.kill_timeout,
        Some(Duration::ZERO),
        "0 means at once"
    );
    assert_eq!(overrides.check_values(), Ok(()));
}

#[test]
fn a_limit_is_said_back_as_written_and_how_it_was_written_changes_nothing() {
    let mut asked = LimitOverrides::default();
    asked.set("kill_timeout", " 60s ").unwrap();
    let caps = LimitCaps::default();
    assert_eq!(
        caps.check(&asked).unwrap_err().to_string(),
        "job.limits.kill_timeout: 60s is over this agent's cap of 30s \
         (client.limit_caps.kill_timeout)"
    );
    let mut same = LimitOverrides::default();
    same.set("kill_timeout", "1m").unwrap();
    assert_eq!(asked, same, "the same limit, written another way");
    assert_eq!(same.written.get("kill_timeout"), Some("1m"));
    let saved = serde_json::to_string(&LimitOverrides::default()).unwrap();
    assert!(
        !saved.contains("written"),
        "nothing written, nothing saved: {saved}"
    );
}

#[test]
fn caps_name_the_first_limit_over_and_defaults_fit_under_them() {
    let caps = LimitCaps::default();
    assert_eq!(caps.check(&Limits::default().as_overrides()), Ok(()));
    let asked = LimitOverrides {
        memory_bytes: Some(2 * GIB),
        open_files: Some(100_000),
        ..LimitOverrides::default()
    };
    assert_eq!(
        caps.check(&asked).unwrap_err().to_string(),
        "job.limits.memory: 2 GiB is over this agent's cap of 1 GiB (client.limit_caps.memory)"
    );
}

#[test]
fn records_saved_before_a_limit_existed_read_it_as_its_default() {
    let old: Limits = serde_json::from_str(
        r#"{"memory_bytes":1024,"cpu":{"secs":1,"nanos":0},"wall_time":null,
            "kill_timeout":{"secs":5,"nanos":0},"log_lines_per_second":10}"#,
    )
    .unwrap();
    assert_eq!(old.memory_bytes, 1024);
    assert_eq!(old.open_files, Limits::default().open_files);
    let old: LimitOverrides = serde_json::from_str(r#"{"memory_bytes":1024}"#).unwrap();
    assert_eq!(old.disk_entries, None);
}

#[test]
fn limits_that_contradict_each_other_are_a_conflict() {
    assert_eq!(Limits::default().conflict(), None);
    let limits = Limits {
        checkpoint_bytes: 8 * MIB,
        ..Limits::default()
    };
    assert_eq!(
        limits.conflict().unwrap(),
        "checkpoint_size (8 MiB) is over hostcall_size (4 MiB): a checkpoint is one host call"
    );
    let limits = Limits {
        log_bytes_per_second: 8 * KIB,
        ..Limits::default()
    };
    assert_eq!(
        limits.conflict().unwrap(),
        "log_line_size and log_field_size together (8448 bytes) are over log_bytes_rate \
         (8 KiB): a line that long would never be kept"
    );
}

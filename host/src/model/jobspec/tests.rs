//! Job file parsing: each field's errors, the hints, and the blocks.

use super::*;

/// A one-alloc job of `job_type` with `[job.NAME]` holding `block`, parsed.
fn job_with_block(job_type: &str, name: &str, block: &str) -> Result<JobSpec, SpecError> {
    parse_toml(&format!(
        "[job]\nid = \"web\"\ntype = \"{job_type}\"\ncount = 1\nrunner = \"r.wasm\"\n\
         [job.{name}]\n{block}\n"
    ))
}

#[test]
fn toml_errors_say_where_and_hint_at_the_usual_mistakes() {
    let single_brackets = "[job]\nid = \"web\"\ntype = \"service\"\ncount = 1\n\
                           runner = \"r.wasm\"\n[job.tasks]\nname = \"main\"\n";
    let refused = check_toml(single_brackets).unwrap_err()[0].to_string();
    assert!(
        refused.starts_with("line 6, column 6: job.tasks: invalid type: map, expected a sequence")
            && refused.ends_with("write each one under `[[job.tasks]]`, with two brackets"),
        "{refused}"
    );
    let no_table = parse_toml("id = \"web\"\n").unwrap_err().to_string();
    assert!(
        no_table.ends_with("a job file starts with a `[job]` table"),
        "{no_table}"
    );
    let bad_value = parse_toml("[job]\nid = \"web\"\ncount = three\n").unwrap_err();
    assert!(
        bad_value
            .message
            .starts_with("invalid TOML at line 3, column 9: "),
        "{bad_value}"
    );
    let no_count = parse_toml("[job]\nid = \"web\"\ntype = \"batch\"\nrunner = \"r.wasm\"\n");
    assert_eq!(
        no_count.unwrap_err().to_string(),
        "job.count: missing; how many allocs to run, such as `count = 3`"
    );
}

#[test]
fn a_reschedule_block_parses_and_a_bad_key_is_named_under_it() {
    let with_block = |block: &str| job_with_block("batch", "reschedule", block);
    let policy = with_block("attempts = 1\ndelay = \"30s\"\nmax_delay = \"1m\"")
        .unwrap()
        .reschedule
        .unwrap();
    assert_eq!(
        (policy.attempts, policy.delay, policy.max_delay),
        (
            1,
            std::time::Duration::from_secs(30),
            std::time::Duration::from_secs(60)
        )
    );
    let refused = with_block("delay = \"0s\"").unwrap_err();
    assert_eq!(refused.field, "job.reschedule.delay");
    assert!(
        refused.message.contains("would spin a crashing runner"),
        "{refused}"
    );
    let unknown = with_block("retries = 3").unwrap_err();
    assert!(
        unknown.message.contains("unknown key `retries`"),
        "{unknown}"
    );
}

#[test]
fn a_restart_block_parses_into_the_job_and_a_bad_key_is_named_under_it() {
    let with_block = |block: &str| job_with_block("service", "restart", block);
    let policy = with_block("attempts = 3\nmode = \"delay\"")
        .unwrap()
        .restart
        .unwrap();
    assert_eq!(
        (policy.attempts, policy.mode),
        (3, crate::model::restart::RestartMode::Delay)
    );
    let refused = with_block("mode = \"never\"").unwrap_err();
    assert_eq!(refused.field, "job.restart.mode");
    let without =
        parse_toml("[job]\nid = \"web\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n")
            .unwrap();
    assert_eq!(without.restart, None, "no restarts in place unless asked");
}

#[test]
fn a_task_name_with_a_control_character_is_refused() {
    let refused = parse_toml(
        "[job]\nid = \"web\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n\
         [[job.tasks]]\nname = \"we\\u0000b\"\n",
    )
    .unwrap_err();
    assert_eq!(refused.field, "job.tasks[0].name");
    assert!(refused.message.contains("control character"), "{refused}");
}

#[test]
fn an_update_block_opts_in_to_carrying_checkpoints_and_an_unknown_key_is_named() {
    let with_block = |block: &str| job_with_block("service", "update", block);
    assert!(
        with_block("carry_checkpoint = true")
            .unwrap()
            .update
            .carry_checkpoint
    );
    assert_eq!(with_block("").unwrap().update, UpdatePolicy::default());
    let refused = with_block("carry = true").unwrap_err().to_string();
    assert!(
        refused.contains("unknown key `carry`") && refused.contains("carry_checkpoint"),
        "{refused}"
    );
    let spec = with_block("carry_checkpoint = false").unwrap();
    assert_eq!(spec.runner_sha256, None, "none unless the file names one");
}

#[test]
fn runner_paths_are_normalised_without_touching_the_disk() {
    for (written, stored) in [
        (
            "/opt/runners/../caravan/./sleeper.wasm",
            "/opt/caravan/sleeper.wasm",
        ),
        ("/../x.wasm", "/x.wasm"),
        ("../a/./b/../r.wasm", "../a/r.wasm"),
        ("r.wasm", "r.wasm"),
        ("./", "."),
    ] {
        assert_eq!(normalise_path(written), stored, "{written}");
    }
}

#[test]
fn a_job_too_large_to_store_is_refused() {
    let big = "x".repeat(MAX_JOB_BYTES);
    let text = format!(
        "[job]\nid = \"big\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n[job.meta]\nnote = \"{big}\"\n"
    );
    let refused = parse_toml(&text).unwrap_err();
    assert_eq!(refused.field, "job");
    assert!(refused.message.contains("at most 256 KiB"), "{refused}");
}

#[test]
fn the_smallest_file_parses_with_one_task_named_after_the_job() {
    let spec =
        parse_toml("[job]\nid = \"hello\"\ntype = \"service\"\ncount = 3\nrunner = \"r.wasm\"\n")
            .unwrap();
    assert_eq!(
        (spec.id.as_str(), spec.job_type, spec.count),
        ("hello", JobType::Service, 3)
    );
    assert_eq!(
        spec.tasks,
        [Task {
            name: "hello".into(),
            config: vec![]
        }]
    );
}

#[test]
fn tasks_limits_and_meta_parse_and_config_values_become_text() {
    let spec = parse_toml(
        r#"
        [job]
        id = "web"
        type = "batch"
        count = 1
        runner = "sleeper.wasm"
        [job.limits]
        memory = "32MiB"
        kill_timeout = "2s"
        disk = "100MiB"
        [[job.tasks]]
        name = "main"
        config = { run_for = "5s", exit_code = 1, loud = true }
        [job.meta]
        team = "infra"
        "#,
    )
    .unwrap();
    assert_eq!(spec.limits.memory_bytes, Some(32 << 20));
    assert_eq!(spec.limits.disk_bytes, Some(100 << 20));
    assert_eq!(
        spec.limits.kill_timeout,
        Some(std::time::Duration::from_secs(2))
    );
    let config = &spec.tasks[0].config;
    assert!(config.contains(&("run_for".into(), "5s".into())));
    assert!(config.contains(&("exit_code".into(), "1".into())));
    assert!(config.contains(&("loud".into(), "true".into())));
    assert_eq!(spec.meta, [("team".to_string(), "infra".to_string())]);
}

#[test]
fn capabilities_parse_and_a_bad_one_names_its_key() {
    let spec = parse_toml(
        r#"
        [job]
        id = "net"
        type = "service"
        count = 1
        runner = "r.wasm"
        [job.capabilities]
        network = ["127.0.0.1:8080"]
        volumes = { "/data" = "shared" }
        env = { GREETING = "hello" }
        "#,
    )
    .unwrap();
    assert_eq!(spec.capabilities.network[0].port(), 8080);
    assert_eq!(spec.capabilities.volumes[0].path, "/data");
    assert_eq!(spec.capabilities.env[0].1, "hello");
    let refused = parse_toml(
        "[job]\nid = \"j\"\ntype = \"batch\"\ncount = 1\nrunner = \"r\"\n\
         [job.capabilities]\nnetwork = [\"example.com:80\"]\n",
    )
    .unwrap_err();
    assert_eq!(refused.field, "job.capabilities.network[0]");
    let unknown = parse_toml(
        "[job]\nid = \"j\"\ntype = \"batch\"\ncount = 1\nrunner = \"r\"\n\
         [job.capabilities]\nsockets = true\n",
    )
    .unwrap_err();
    assert!(unknown.message.contains("sockets"), "{unknown}");
}

#[test]
fn json_is_the_same_document() {
    let spec =
        parse_json(r#"{"job": {"id": "j", "type": "batch", "count": 2, "runner": "r.wasm"}}"#)
            .unwrap();
    assert_eq!(spec.count, 2);
}

#[test]
fn each_bad_spec_names_its_field() {
    let base = |extra: &str| {
        format!("[job]\nid = \"j\"\ntype = \"service\"\nrunner = \"r.wasm\"\n{extra}")
    };
    let field_of = |text: &str| parse_toml(text).unwrap_err().field;
    assert_eq!(field_of(&base("count = -1")), "job.count");
    assert_eq!(
        field_of("[job]\nid = \"j\"\ntype = \"service\"\ncount = 1\n"),
        "job.runner"
    );
    assert_eq!(
        field_of(&base("count = 1\n").replace("service", "cron")),
        "job.type"
    );
    assert_eq!(
        field_of(&base("count = 1\n[job.limits]\nmemory = \"lots\"")),
        "job.limits.memory"
    );
    assert_eq!(
        field_of(&base("count = 1\n[[job.tasks]]\nconfig = {}")),
        "job.tasks[0].name"
    );
    let unknown = parse_toml(&base("count = 1\ncolour = \"red\"")).unwrap_err();
    assert!(unknown.message.contains("colour"), "{unknown}");
    let malformed = parse_toml("[job\nid=").unwrap_err();
    assert!(malformed.message.starts_with("invalid TOML"), "{malformed}");
    let json = parse_json("{\"job\": ").unwrap_err();
    assert!(json.message.starts_with("invalid JSON"), "{json}");
    assert_eq!(
        parse_json(r#"{"job": {"id": "../x", "type": "batch", "count": 1, "runner": "r"}}"#)
            .unwrap_err()
            .field,
        "job.id"
    );
}

#[test]
fn constraints_and_the_placement_algorithm_parse_and_a_bad_one_is_named_by_index() {
    let job = |extra: &str| {
        parse_toml(&format!(
            "[job]\nid = \"web\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n{extra}"
        ))
    };
    let parsed = job("placement = \"spread\"\n[[job.constraint]]\nattribute = \"${node.class}\"\nvalue = \"edge\"\n\
         [[job.constraint]]\noperator = \"distinct_hosts\"\n")
    .unwrap();
    assert_eq!(parsed.placement, Algorithm::Spread);
    assert_eq!(
        parsed
            .constraints
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["${node.class} = edge", "distinct_hosts"]
    );
    assert_eq!(job("").unwrap().placement, Algorithm::Binpack);
    let refused = |extra: &str| job(extra).unwrap_err().to_string();
    assert_eq!(
        refused(
            "[[job.constraint]]\nattribute = \"${node.class}\"\nvalue = \"a\"\n[[job.constraint]]\nattribute = \"${meta.v}\"\noperator = \"~\"\n"
        ),
        "job.constraint[1].operator: unknown operator \"~\"; expected =, !=, regexp, set_contains, \
         version or distinct_hosts"
    );
    assert!(
        refused("[[job.constraint]]\nattribute = \"${node.class}\"\noperator = \"regexp\"\nvalue = \"[\"\n")
            .starts_with("job.constraint[0].value: not a regexp: ")
    );
    assert!(
        refused("[[job.constraint]]\nattribute = \"${nodes.class}\"\nvalue = \"a\"\n")
            .starts_with("job.constraint[0].attribute: unknown attribute \"${nodes.class}\"")
    );
    assert_eq!(
        refused("placement = \"random\"\n"),
        "job.placement: unknown placement \"random\"; expected \"binpack\" or \"spread\""
    );
    let many = "[[job.constraint]]\noperator = \"distinct_hosts\"\n".repeat(33);
    assert_eq!(refused(&many), "job.constraint: 33 constraints; at most 32");
}

#[test]
fn a_disconnect_block_parses_and_a_bad_key_is_named_under_it() {
    let parsed = job_with_block(
        "service",
        "disconnect",
        "lost_after = \"5m\"\nreplace = false\nreconcile = \"longest_running\"",
    )
    .unwrap();
    let policy = parsed.disconnect.unwrap();
    assert_eq!(policy.lost_after, std::time::Duration::from_secs(300));
    assert!(!policy.replace);
    assert_eq!(
        policy.reconcile,
        crate::model::disconnect::Reconcile::LongestRunning
    );
    assert_eq!(
        job_with_block("service", "disconnect", "lost_after = \"0s\"")
            .unwrap()
            .disconnect,
        None,
        "lost at once, as without the block"
    );
    let refused = |block: &str| {
        job_with_block("service", "disconnect", block)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        refused("lost_after = \"5m\"\nreconcile = \"newest\""),
        "job.disconnect.reconcile: unknown rule \"newest\"; expected best_score, \
         keep_original, keep_replacement or longest_running"
    );
    assert!(refused("lost_after = \"soon\"").starts_with("job.disconnect.lost_after: "));
    assert_eq!(
        refused("lost_after = \"200h\""),
        "job.disconnect.lost_after: 200h is over the most, 168h"
    );
}

//! Which of a returning unknown alloc and its stand-in stays, rule by rule.

use super::*;
use crate::server::testkit::{alloc_on, nodes, spec};

#[test]
fn each_reconcile_rule_picks_which_of_a_returning_alloc_and_its_stand_in_stays() {
    use crate::model::disconnect::Reconcile;
    use crate::model::structs::{AllocState, TaskEvent, TaskLifecycle, TaskState};
    let web = spec("web", JobType::Service, 2);
    let original = alloc_on("web", 1, Some("n1"));
    let stand_in = alloc_on("web", 2, Some("n2"));
    let both = nodes(&["n1", "n2"]);
    let keep = |rule, original: &AllocRecord, stand_in: &AllocRecord, nodes| {
        keep_original(rule, &web, original, stand_in, nodes, [original, stand_in])
    };
    assert!(keep(Reconcile::KeepOriginal, &original, &stand_in, &both));
    assert!(!keep(
        Reconcile::KeepReplacement,
        &original,
        &stand_in,
        &both
    ));
    assert!(
        keep(Reconcile::LongestRunning, &original, &stand_in, &both),
        "neither restarted: the older alloc"
    );
    let since = |record: &AllocRecord, kind: &str, time_unix_ms| AllocRecord {
        client_state: Some(AllocState {
            client_status: ClientStatus::Running,
            description: String::new(),
            task_states: vec![TaskState {
                name: "main".into(),
                state: TaskLifecycle::Running,
                failed: false,
                restarts: 0,
                events: vec![TaskEvent {
                    kind: kind.into(),
                    message: String::new(),
                    time_unix_ms,
                }],
            }],
        }),
        ..record.clone()
    };
    let restarted = since(&original, "Restarting", 5_000);
    let started_before = since(&stand_in, "Started", 3_000);
    assert!(
        !keep(
            Reconcile::LongestRunning,
            &restarted,
            &started_before,
            &both
        ),
        "the original restarted after the stand-in started: the stand-in ran longer"
    );
    assert!(
        keep(
            Reconcile::LongestRunning,
            &since(&original, "Started", 1_000),
            &started_before,
            &both
        ),
        "the original started first and never restarted"
    );
    assert!(
        keep(Reconcile::LongestRunning, &restarted, &stand_in, &both),
        "a stand-in that said nothing of its start counts as just started"
    );
    assert!(
        keep(Reconcile::BestScore, &original, &stand_in, &both),
        "equal nodes: a tie keeps the original"
    );
    assert!(
        !keep(Reconcile::BestScore, &original, &stand_in, &nodes(&["n2"])),
        "the original's node can take nothing now (ineligible, draining): the stand-in"
    );
}

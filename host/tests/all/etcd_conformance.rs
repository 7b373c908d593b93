//! The simulated etcd answers as etcd does: one scenario of every operation the cluster code
//! makes (creates, guarded and fenced writes, leases, listings in pages at a revision,
//! watches across a compaction) runs through `EtcdStore` on a real etcd member and on
//! `testing::simulated_etcd`, and the two transcripts must be equal, revisions counted from
//! where each started. The simulated etcd's own behaviour under faults and on the paused
//! clock is in `simulated_etcd`.

use crate::etcd::EtcdCluster;
use caravan_host::cluster::{
    Change, EtcdStore, Fence, FencedOp, FencedWriter, GuardedPut, KeyValue, LeaseState, PrefixWatch,
};
use caravan_host::testing::simulated_etcd::SimulatedEtcd;
use std::time::Duration;

/// What the scenario saw, one line per answer, revisions relative to the first.
struct Transcript {
    base: i64,
    lines: Vec<String>,
}

impl Transcript {
    fn rev(&self, revision: i64) -> i64 {
        revision - self.base
    }

    fn kv(&self, kv: &KeyValue) -> String {
        // A sequence key holds its writer's random token.
        let value = match kv.key.ends_with("/sequence") {
            true => "<token>".into(),
            false => String::from_utf8_lossy(&kv.value),
        };
        format!(
            "{}={} mod {} create {} leased {}",
            kv.key,
            value,
            self.rev(kv.mod_revision),
            self.rev(kv.create_revision),
            kv.lease != 0
        )
    }

    fn say(&mut self, what: &str, answer: impl std::fmt::Debug) {
        self.lines.push(format!("{what}: {answer:?}"));
    }

    fn changes(&mut self, what: &str, changes: &[Change]) {
        let shown: Vec<String> = changes
            .iter()
            .map(|change| match change {
                Change::Put(kv) => format!("put {}", self.kv(kv)),
                Change::Delete { key, mod_revision } => {
                    format!("delete {key} at {}", self.rev(*mod_revision))
                }
                Change::Relisted { entries, revision } => format!(
                    "relisted at {}: {:?}",
                    self.rev(*revision),
                    entries.iter().map(|kv| self.kv(kv)).collect::<Vec<_>>()
                ),
            })
            .collect();
        self.say(what, shown);
    }
}

/// Every store operation the cluster code makes, under `/conformance/`.
async fn scenario(store: &EtcdStore) -> Vec<String> {
    let base = store.revision().await.unwrap();
    let mut t = Transcript {
        base,
        lines: Vec::new(),
    };
    let key = |k: &str| format!("/conformance/{k}");

    t.say("create", store.create(&key("a"), b"1").await);
    t.say("create again", store.create(&key("a"), b"1").await);
    t.say("create other", store.create(&key("a"), b"2").await);
    let puts = [(key("b"), b"2".to_vec()), (key("c"), b"3".to_vec())];
    t.say(
        "create_with",
        store.create_with(&key("m"), b"x", &puts).await,
    );
    t.say(
        "create_with again",
        store.create_with(&key("m"), b"y", &puts).await,
    );
    let guarded = |guard: &str, k: &str| GuardedPut {
        guard: key(guard),
        key: key(k),
        value: b"g".to_vec(),
    };
    let writes = [guarded("a", "ga"), guarded("gone", "gb")];
    t.say("put_where_present", store.put_where_present(&writes).await);
    t.say("put", store.put(&key("b"), b"22").await);
    t.say("delete", store.delete(&key("c")).await);
    t.say("delete gone", store.delete(&key("c")).await);
    let many = store
        .get_many(&[key("a"), key("c"), key("b")])
        .await
        .unwrap();
    let shown: Vec<String> = many.iter().map(|kv| t.kv(kv)).collect();
    t.say("get_many", shown);
    let after_writes = store.revision().await.unwrap();
    t.say("revision", t.rev(after_writes));

    let (listed, at) = store.list_in_pages("/conformance/", 2).await.unwrap();
    let shown: Vec<String> = listed.iter().map(|kv| t.kv(kv)).collect();
    t.say("list in pages", (shown, t.rev(at)));

    // Leases: a leased key, a create-or-read under a lease, revocation and what follows it.
    let lease = store.grant_lease(Duration::from_secs(60)).await.unwrap();
    t.say(
        "put_leased",
        store.put_leased(&key("live"), b"l", lease).await,
    );
    let held = store
        .create_leased(&key("leader"), b"me", lease)
        .await
        .unwrap();
    t.say("create_leased", t.kv(&held));
    let other = store.grant_lease(Duration::from_secs(60)).await.unwrap();
    let found = store
        .create_leased(&key("leader"), b"you", other)
        .await
        .unwrap();
    t.say("create_leased taken", (t.kv(&found), found.lease == lease));
    let renewer = store.lease_renewer(lease);
    t.say("renew", renewer.renew().await);
    t.say(
        "lease_age alive",
        store.lease_age(lease).await.map(|a| a.is_some()),
    );

    // Fenced writes land only while the fence's key has the create revision it was won at.
    let fence = Fence {
        key: key("leader"),
        create_revision: held.create_revision,
    };
    let ops = [
        FencedOp::Put {
            key: key("fenced"),
            value: b"f".to_vec(),
        },
        FencedOp::Delete { key: key("b") },
    ];
    t.say("write_fenced", store.write_fenced(&fence, &ops).await);
    let sequence = key("sequence");
    let mut writer = FencedWriter::start(store, fence.clone(), &sequence)
        .await
        .unwrap();
    let put = |value: &str| {
        [FencedOp::Put {
            key: key("sequenced"),
            value: value.as_bytes().to_vec(),
        }]
    };
    t.say("sequenced write", writer.write(&put("1")).await);
    t.say("sequenced write again", writer.write(&put("2")).await);
    t.say("revoke", store.revoke_lease(lease).await);
    t.say("revoke again", store.revoke_lease(lease).await);
    t.say(
        "renew revoked",
        renewer.renew().await.map(|s| s == LeaseState::Expired),
    );
    t.say("lease_age revoked", store.lease_age(lease).await);
    let refused = store.put_leased(&key("late"), b"l", lease).await;
    t.say(
        "put_leased revoked",
        refused.map_err(|e| e.to_string().contains("lease not found")),
    );
    t.say("write_fenced lost", store.write_fenced(&fence, &ops).await);
    t.say("sequenced write lost", writer.write(&put("3")).await);
    let (listed, at) = store.list("/conformance/").await.unwrap();
    let shown: Vec<String> = listed.iter().map(|kv| t.kv(kv)).collect();
    t.say("list after revoke", (shown, t.rev(at)));
    store.revoke_lease(other).await.unwrap();

    // A watch delivers every change from a revision; after a compaction past it, a re-list.
    let mut watch = PrefixWatch::from_revision(store, "/conformance/", after_writes);
    let changes = next_changes(&mut watch).await;
    t.changes("watch", &changes);
    let now = store.revision().await.unwrap();
    t.say("compact", store.compact(now).await);
    t.say("compact again", store.compact(now).await);
    let mut late = PrefixWatch::from_revision(store, "/conformance/", after_writes);
    let changes = next_changes(&mut late).await;
    t.changes("watch after compaction", &changes);
    t.say("put after", store.put(&key("after"), b"z").await);
    let changes = next_changes(&mut late).await;
    t.changes("watch carries on", &changes);
    t.lines
}

/// The watch's next changes; a watch that says nothing for 10 s fails the test.
async fn next_changes(watch: &mut PrefixWatch) -> Vec<Change> {
    tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch said nothing for 10 s")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulated_etcd_answers_every_store_operation_as_etcd_does() {
    let cluster = EtcdCluster::start_with(1, &[]).await;
    let real = scenario(&cluster.store().await).await;
    let simulated = scenario(&SimulatedEtcd::new().store()).await;
    for (line, (on_etcd, in_simulation)) in real.iter().zip(&simulated).enumerate() {
        assert_eq!(
            on_etcd,
            in_simulation,
            "line {line} differs; etcd said:\n{}\nthe simulation said:\n{}",
            real.join("\n"),
            simulated.join("\n")
        );
    }
    assert_eq!(real.len(), simulated.len());
}

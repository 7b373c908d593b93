//! The simulated etcd's own behaviour, on tokio's paused clock: leases that end when their
//! time is out, watches that see it, and the faults the simulation draws (an answer lost
//! before or after the write, a write applied late). That it answers as etcd does is
//! `etcd_conformance`.

use caravan_host::cluster::{
    Change, EtcdStore, Fence, FencedOp, FencedWriter, LeaseState, PrefixWatch,
};
use caravan_host::testing::simulated_etcd::{CallFate, CallKind, SimulatedEtcd};
use std::time::Duration;

/// From now on, `etcd` applies the next write `after` this long, its caller hearing at
/// once that the answer was lost; every other call is answered.
fn first_write_applied_late(etcd: &SimulatedEtcd, after: Duration) {
    let mut first = true;
    etcd.set_fates(move |_, kind| match kind {
        CallKind::Write if std::mem::take(&mut first) => CallFate::AppliedLater(after),
        _ => CallFate::Answered,
    });
}

async fn value_of(store: &EtcdStore, key: &str) -> Option<Vec<u8>> {
    let found = store.get_many(&[key.to_string()]).await.unwrap();
    found.into_iter().next().map(|kv| kv.value)
}

#[tokio::test(start_paused = true)]
async fn a_lease_not_renewed_within_its_ttl_ends_and_its_keys_go_with_it() {
    let etcd = SimulatedEtcd::new();
    let store = etcd.store();
    let lease = store.grant_lease(Duration::from_secs(5)).await.unwrap();
    store.put_leased("/live/a", b"up", lease).await.unwrap();
    let (_, mut watch) = PrefixWatch::start(&store, "/live/").await.unwrap();
    let renewer = store.lease_renewer(lease);

    // Renewed before its TTL is out, it lives on past it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(renewer.renew().await.unwrap(), LeaseState::Alive);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        value_of(&store, "/live/a").await.as_deref(),
        Some(&b"up"[..])
    );

    // Left alone, it ends 5 s after the last renewal, and the watch sees its key deleted
    // then, not before.
    let started = tokio::time::Instant::now();
    let changes = watch.next().await.unwrap();
    assert!(
        matches!(changes.as_slice(), [Change::Delete { key, .. }] if key == "/live/a"),
        "{changes:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(renewer.renew().await.unwrap(), LeaseState::Expired);
    assert_eq!(store.lease_age(lease).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn an_answer_lost_after_the_write_leaves_the_write_made_once() {
    let etcd = SimulatedEtcd::new();
    let store = etcd.store();
    let mut fates = vec![CallFate::LostAfter, CallFate::LostBefore].into_iter();
    etcd.set_fates(move |_, kind| match kind {
        CallKind::Write => fates.next().unwrap_or(CallFate::Answered),
        _ => CallFate::Answered,
    });
    let before = etcd.current_revision();
    // The store retries the create; the first attempt landed, so the retry finds its own
    // value and says so.
    assert!(store.create("/once", b"mine").await.unwrap());
    assert_eq!(
        etcd.current_revision(),
        before + 1,
        "one write, however many attempts"
    );
    assert!(!store.create("/once", b"theirs").await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_write_applied_late_lands_after_newer_writes() {
    let etcd = SimulatedEtcd::new();
    let store = etcd.store();
    first_write_applied_late(&etcd, Duration::from_secs(3));
    // The first attempt is held; the retry lands; a newer write follows it.
    store.put("/k", b"old").await.unwrap();
    store.put("/k", b"new").await.unwrap();
    assert_eq!(value_of(&store, "/k").await.as_deref(), Some(&b"new"[..]));
    // Then the held attempt lands: what a plain retry risks, and what fenced writes must
    // not let happen.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(value_of(&store, "/k").await.as_deref(), Some(&b"old"[..]));
}

#[tokio::test(start_paused = true)]
async fn a_watch_whose_history_is_compacted_while_it_is_away_relists() {
    let etcd = SimulatedEtcd::new();
    let store = etcd.store();
    store.put("/w/a", b"1").await.unwrap();
    let (listed, mut watch) = PrefixWatch::start(&store, "/w/").await.unwrap();
    assert_eq!(listed.len(), 1);
    store.put("/w/b", b"2").await.unwrap();
    store.delete("/w/a").await.unwrap();
    store.compact(etcd.current_revision()).await.unwrap();
    let changes = watch.next().await.unwrap();
    let [Change::Relisted { entries, revision }] = changes.as_slice() else {
        panic!("a re-list expected: {changes:?}");
    };
    assert_eq!(*revision, etcd.current_revision());
    let keys: Vec<&str> = entries.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/w/b"]);
}

/// A leader's fence on `etcd`: its lease, its leader key, and a writer under it.
async fn leader_on(store: &EtcdStore) -> (i64, FencedWriter) {
    let lease = store.grant_lease(Duration::from_secs(60)).await.unwrap();
    let held = store.create_leased("/leader", b"me", lease).await.unwrap();
    let fence = Fence {
        key: "/leader".into(),
        create_revision: held.create_revision,
    };
    let writer = FencedWriter::start(store, fence, "/sequence")
        .await
        .unwrap();
    (lease, writer)
}

fn put(key: &str, value: &str) -> Vec<FencedOp> {
    vec![FencedOp::Put {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }]
}

#[tokio::test(start_paused = true)]
async fn a_fenced_write_applied_late_changes_nothing_after_a_newer_one() {
    let etcd = SimulatedEtcd::new();
    let store = etcd.store();
    let (_, mut writer) = leader_on(&store).await;
    first_write_applied_late(&etcd, Duration::from_secs(3));
    // The first attempt is held; its retry lands; a newer write follows.
    assert!(writer.write(&put("/k", "old")).await.unwrap());
    assert!(writer.write(&put("/k", "new")).await.unwrap());
    // The held attempt lands after both, and changes nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(value_of(&store, "/k").await.as_deref(), Some(&b"new"[..]));
    // And the writer goes on.
    assert!(writer.write(&put("/k", "newer")).await.unwrap());
    assert_eq!(value_of(&store, "/k").await.as_deref(), Some(&b"newer"[..]));
}

#[tokio::test(start_paused = true)]
async fn a_fenced_writes_retry_takes_its_earlier_attempt_that_landed_as_its_own() {
    let etcd = SimulatedEtcd::new();
    let store = etcd.store();
    let (lease, mut writer) = leader_on(&store).await;
    let mut first = true;
    etcd.set_fates(move |_, kind| match kind {
        CallKind::Write if std::mem::take(&mut first) => CallFate::LostAfter,
        _ => CallFate::Answered,
    });
    let before = etcd.current_revision();
    assert!(writer.write(&put("/k", "once")).await.unwrap());
    assert_eq!(etcd.current_revision(), before + 1, "written once");
    assert!(writer.write(&put("/k", "twice")).await.unwrap());

    // Once the fence is gone (its lease revoked), nothing more lands.
    store.revoke_lease(lease).await.unwrap();
    assert!(!writer.write(&put("/k", "deposed")).await.unwrap());
    assert_eq!(value_of(&store, "/k").await.as_deref(), Some(&b"twice"[..]));
}

#[tokio::test(start_paused = true)]
async fn a_leased_put_applied_late_does_not_tie_the_key_to_an_old_lease() {
    // Found by the leadership simulation (seeds 17,631, 25,785 and 68,941 of 100,000): a
    // node's live key, written again under a new lease, was taken back by a late attempt
    // of an earlier write to a lease nobody renewed, and vanished with it while its agent
    // ran on.
    let etcd = SimulatedEtcd::new();
    let store = etcd.store();
    first_write_applied_late(&etcd, Duration::from_secs(3));
    let old = store.grant_lease(Duration::from_secs(60)).await.unwrap();
    store.put_leased("/live/node", b"me", old).await.unwrap();
    let new = store.grant_lease(Duration::from_secs(60)).await.unwrap();
    store.put_leased("/live/node", b"me", new).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    store.revoke_lease(old).await.unwrap();
    let live = store.get_many(&["/live/node".to_string()]).await.unwrap();
    assert_eq!(live.len(), 1, "the live key went with the old lease");
    assert_eq!(live[0].lease, new);
}

#[tokio::test(start_paused = true)]
async fn a_tokens_save_applied_late_does_not_bring_it_back_after_its_revocation() {
    use caravan_host::acl::{Role, TokenRequest, TokenStore};
    use caravan_host::cluster::EtcdTokens;
    let etcd = SimulatedEtcd::new();
    let tokens = EtcdTokens::new(etcd.store());
    first_write_applied_late(&etcd, Duration::from_secs(3));
    let request = TokenRequest {
        name: "ci".into(),
        role: Role::Read,
        namespace: None,
        ttl: None,
    };
    let (token, _secret) = request.make(0).unwrap();
    // The first attempt is held; the retry saves the token; then it is revoked.
    tokens.insert(&token).await.unwrap();
    assert!(tokens.find(&token.secret_sha256).await.unwrap().is_some());
    assert!(tokens.revoke(&token.accessor_id).await.unwrap());
    // The held attempt lands after the revocation, and changes nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(tokens.find(&token.secret_sha256).await.unwrap().is_none());
    assert!(tokens.list().await.unwrap().is_empty());
    assert!(!tokens.revoke(&token.accessor_id).await.unwrap());
}

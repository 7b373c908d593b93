use super::*;
use std::collections::HashSet;
use std::time::Duration;

/// A tiny "component": the header and some bytes. The store checks the header only.
fn component(body: &[u8]) -> Vec<u8> {
    let mut bytes = COMPONENT_HEADER.to_vec();
    bytes.extend_from_slice(body);
    bytes
}

fn chunks(bytes: &[u8], size: usize) -> impl Stream<Item = Result<Bytes, String>> + use<> {
    let pieces: Vec<Result<Bytes, String>> = bytes
        .chunks(size)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    futures_util::stream::iter(pieces)
}

fn no_temporaries_left(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir.join("runners/tmp"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

#[tokio::test]
async fn a_build_is_stored_under_its_hash_once_and_refused_under_another() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunnerStore::open(dir.path()).unwrap();
    let bytes = component(b"web v1");
    let sha256 = sha256_hex(&bytes);

    let put = store.put_stream(&sha256, chunks(&bytes, 3)).await.unwrap();
    assert_eq!(put, Put::Stored);
    assert_eq!(store.read(&sha256).unwrap().unwrap(), bytes);
    let again = store.put_stream(&sha256, chunks(&bytes, 5)).await.unwrap();
    assert_eq!(again, Put::AlreadyHad, "a second upload is a no-op");

    let other = component(b"web v2");
    let error = store
        .put_stream(&"0".repeat(64), chunks(&other, 4))
        .await
        .unwrap_err();
    let PutError::Mismatch { expected, actual } = &error else {
        panic!("expected a mismatch, got {error}");
    };
    assert_eq!(
        (expected.as_str(), actual.as_str()),
        (&*"0".repeat(64), &*sha256_hex(&other))
    );
    assert!(
        !store.has(&"0".repeat(64)),
        "nothing stored under the wrong name"
    );
    let listed: Vec<String> = store
        .list()
        .unwrap()
        .into_iter()
        .map(|b| b.sha256)
        .collect();
    assert_eq!(listed, [sha256]);
    no_temporaries_left(dir.path());
}

#[tokio::test]
async fn bytes_over_the_cap_or_not_a_component_or_cut_short_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunnerStore::open(dir.path())
        .unwrap()
        .with_max_build_bytes(64);
    let big = component(&[7u8; 100]);
    let error = store
        .put_stream(&sha256_hex(&big), chunks(&big, 16))
        .await
        .unwrap_err();
    assert!(matches!(error, PutError::TooLarge(64)), "{error}");

    let module = b"\0asm\x01\0\0\0 a core module".to_vec();
    let error = store
        .put_stream(&sha256_hex(&module), chunks(&module, 2))
        .await
        .unwrap_err();
    assert!(matches!(error, PutError::NotAComponent), "{error}");

    let bytes = component(b"cut");
    let broken = futures_util::stream::iter(vec![
        Ok(Bytes::copy_from_slice(&bytes[..4])),
        Err("connection reset".to_string()),
    ]);
    let error = store
        .put_stream(&sha256_hex(&bytes), broken)
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "the upload broke off: connection reset");

    let error = store
        .put_stream("../../etc/passwd", chunks(&bytes, 4))
        .await
        .unwrap_err();
    assert!(matches!(error, PutError::BadName(_)), "{error}");
    assert!(store.list().unwrap().is_empty());
    no_temporaries_left(dir.path());
}

#[test]
fn a_file_is_stored_by_the_hash_of_its_bytes_and_survives_its_removal() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunnerStore::open(&dir.path().join("data")).unwrap();
    let file = dir.path().join("web.wasm");
    let bytes = component(b"from a file");
    std::fs::write(&file, &bytes).unwrap();
    let sha256 = store.put_file(&file).unwrap();
    assert_eq!(sha256, sha256_hex(&bytes));
    std::fs::remove_file(&file).unwrap();
    assert_eq!(store.read(&sha256).unwrap().unwrap(), bytes);

    std::fs::write(&file, b"not wasm at all").unwrap();
    assert!(matches!(
        store.put_file(&file),
        Err(PutError::NotAComponent)
    ));
    no_temporaries_left(&dir.path().join("data"));
}

#[test]
fn opening_clears_what_a_crash_left_half_written() {
    let dir = tempfile::tempdir().unwrap();
    RunnerStore::open(dir.path()).unwrap();
    let half = dir.path().join("runners/tmp/put-crashed");
    std::fs::write(&half, b"half a build").unwrap();
    RunnerStore::open(dir.path()).unwrap();
    assert!(!half.exists());
}

#[tokio::test]
async fn the_collector_removes_only_unreferenced_builds_past_their_grace() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunnerStore::open(dir.path()).unwrap();
    let mut names = Vec::new();
    for body in [b"kept: referenced".as_slice(), b"kept: recent", b"removed"] {
        let bytes = component(body);
        let sha256 = sha256_hex(&bytes);
        store.put_stream(&sha256, chunks(&bytes, 8)).await.unwrap();
        names.push(sha256);
    }
    let grace = Duration::from_secs(3600);
    let referenced = HashSet::from([names[0].clone()]);
    let now = SystemTime::now();
    let removed = gc::collect_unused(&store, &referenced, grace, now).unwrap();
    assert!(removed.is_empty(), "every build is in its grace period");

    // An hour and a bit later, the recent one having been used meanwhile.
    let later = now + grace + Duration::from_secs(60);
    let touched = std::fs::File::options()
        .append(true)
        .open(store.path(&names[1]).unwrap())
        .unwrap();
    touched.set_modified(later).unwrap();
    let removed = gc::collect_unused(&store, &referenced, grace, later).unwrap();
    assert_eq!(removed, [names[2].clone()]);
    assert!(store.has(&names[0]) && store.has(&names[1]) && !store.has(&names[2]));
}

#[tokio::test]
async fn a_store_without_peers_says_there_is_no_one_to_ask() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunnerStore::open(dir.path()).unwrap();
    let missing = "ab".repeat(32);
    let error = store.get_or_fetch(&missing, None).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "runner build sha256:{missing} is not on this agent, and there is no other agent \
             to fetch it from"
        )
    );
}

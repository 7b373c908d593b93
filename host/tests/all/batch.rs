//! The batch runner of every language (`guests/batch` and its twins on the other SDKs) is a
//! correct batch runner as `caravan runner check` judges one: it ends on its own, `complete`,
//! by returning. What they report alike is `conformance.rs`'s.

use crate::support::run_caravan;
use caravan_test_artifacts::{BATCH, OTHER_LANGUAGES, TEST_CACHE_DIR, other_language_runner};

#[test]
fn every_languages_batch_runner_passes_the_check_as_a_batch_runner() {
    let runners = std::iter::once(BATCH.to_string()).chain(
        OTHER_LANGUAGES
            .iter()
            .map(|language| other_language_runner(language, "batch").0),
    );
    for runner in runners {
        let check = run_caravan(
            &[
                "runner",
                "check",
                &runner,
                "--cache-dir",
                TEST_CACHE_DIR,
                "--config",
                "numbers=5000",
            ],
            None,
        );
        let out = String::from_utf8_lossy(&check.stdout);
        assert_eq!(check.status.code(), Some(0), "{runner}: {out}");
        assert!(
            out.contains("PASS  ends on its own: ended complete (All tasks have completed)")
                && out.contains("(judged as a batch runner)"),
            "{runner}: {out}"
        );
        assert!(
            out.contains("every required check passed"),
            "{runner}: {out}"
        );
    }
}

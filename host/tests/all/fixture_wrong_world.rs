//! A component that is not a runner is refused at load, naming what it exports.

use crate::support::*;
use caravan_test_artifacts::FIXTURE_WRONG_WORLD;
use std::path::Path;

#[test]
fn a_component_without_the_runner_export_is_refused_naming_what_it_exports() {
    let error = runtime()
        .load_file(Path::new(FIXTURE_WRONG_WORLD))
        .err()
        .expect("refused")
        .to_string();
    assert_eq!(
        error,
        format!(
            "{FIXTURE_WRONG_WORLD} does not export `caravan:runner/runner@0.1.0`, so it is not a Caravan runner; it exports: wasi:cli/run@0.2.0"
        )
    );
}

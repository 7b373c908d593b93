//! A runner that imports an interface this host does not offer is refused at load, naming
//! the import; under a real agent, its alloc fails alone (see `hostile_agent.rs`).

use crate::support::*;
use caravan_test_artifacts::FIXTURE_UNKNOWN_IMPORT;
use std::path::Path;

#[test]
fn a_runner_importing_an_interface_the_host_lacks_is_refused_naming_the_import() {
    let error = runtime()
        .load_file(Path::new(FIXTURE_UNKNOWN_IMPORT))
        .err()
        .expect("refused")
        .to_string();
    assert!(
        error.starts_with(&format!(
            "{FIXTURE_UNKNOWN_IMPORT} does not fit the `caravan:runner/alloc-runner` world: "
        )) && error.contains("fixture:elsewhere/secrets"),
        "{error}"
    );
}

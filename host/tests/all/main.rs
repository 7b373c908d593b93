//! Integration tests of the host: real guests (built by `caravan-test-artifacts`) driven
//! through the factory, the seam's contract, and the real `caravan` binary.

#[macro_use]
mod etcd;
mod support;

mod acl;
mod agent_api;
mod agent_cli;
mod agent_connections;
mod agent_restart;
mod alloc_actions;
mod audit;
mod batch;
mod capabilities;
mod cli;
mod client;
mod cluster;
mod cluster_simulation;
mod cluster_store;
mod conformance;
mod embedded_server;
mod empty_runner;
mod etcd_conformance;
mod etcd_history;
mod fixture_hostile;
mod fixture_log_flood;
mod fixture_memory_hog;
mod fixture_spin_loop;
mod fixture_trap;
mod fixture_unknown_import;
mod fixture_wrong_world;
mod fuzz;
mod fuzz_credentials;
mod hostile_agent;
mod leadership_simulation;
mod live_upgrade;
mod loading;
mod many_memories;
mod minimal;
mod module_map;
mod multi_host;
mod nodesim;
mod oci_registry;
mod other_languages;
mod otlp_export;
mod readme_tour;
mod registry;
mod restart_in_place;
mod restore;
mod runner_builds;
mod runner_check;
mod runner_new;
mod sim;
mod simulated_etcd;
mod simulation;
mod sleeper;
mod stateful;
mod tls_api;
mod tls_cli;
mod web_ui;

/// Every guest in `guests/` must have a test module of the same name: a guest nobody tests
/// fails to compile here.
macro_rules! assert_test_exists {
    ($name:ident) => {
        #[allow(unused_imports)]
        use crate::$name as _;
    };
}
caravan_test_artifacts::foreach_guest!(assert_test_exists);

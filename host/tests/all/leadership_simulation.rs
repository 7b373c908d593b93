//! The simulation of membership and leader election over the simulated etcd
//! (`caravan_host::testing::simulation::simulate_leadership`): real `Member`s of three
//! agents under crashes, clean leaves, agents cut off from etcd, lost and late answers and
//! compactions, on simulated time; checked at every moment (no agent believes it leads,
//! lease fresh, unless etcd says so) and once the faults stop (one leader, named by all).
//!
//! `scripts/simulate --leadership` runs a campaign of many more seeds, or replays one.

use crate::simulation::{
    assert_each_seed_replays, assert_every_seed_holds, assert_regression_seeds_hold, env_u64,
    run_campaign,
};
use caravan_host::testing::simulation::{LeadershipConfig, simulate_leadership};

/// How many seeds `./run-tests` runs.
const SEEDS_PER_TEST_RUN: u64 = 300;

#[test]
fn one_leader_and_no_false_belief_for_three_hundred_seeds() {
    assert_every_seed_holds(
        0..SEEDS_PER_TEST_RUN,
        "scripts/simulate --leadership --seed S --trace",
        |seed| simulate_leadership(&LeadershipConfig::new(seed)),
    );
}

/// Seeds that found a defect, fixed since (the simulation has changed under them, so the
/// defect has a test of its own too: `simulated_etcd::a_leased_put_applied_late_...`).
const REGRESSION_SEEDS: [(u64, &str); 3] = [
    (
        17_631,
        "a node's live key tied back to an old lease by a late write, and gone with it",
    ),
    (25_785, "the same"),
    (68_941, "the same"),
];

#[test]
fn the_leadership_seeds_that_found_defects_keep_every_invariant() {
    assert_regression_seeds_hold(&REGRESSION_SEEDS, |seed| {
        simulate_leadership(&LeadershipConfig::new(seed))
    });
}

#[test]
fn a_leadership_seed_gives_the_same_trace_every_time() {
    assert_each_seed_replays((0..30).map(|n| n * 7_919), 10, |seed| {
        simulate_leadership(&LeadershipConfig {
            keep_trace: true,
            ..LeadershipConfig::new(seed)
        })
    });
}

#[test]
fn an_etcd_whose_leases_end_early_is_caught_believing_in_a_leader_it_dropped() {
    // Leases ending at half their TTL leave a leader believing its lease fresh (for three
    // quarters of a TTL after a renewal) after etcd dropped its key: the every-moment check
    // must see it within a few seeds.
    let caught = (0..20).find_map(|seed| {
        let config = LeadershipConfig {
            leases_end_early: true,
            ..LeadershipConfig::new(seed)
        };
        simulate_leadership(&config).violation
    });
    let violation = caught.expect("no seed of 20 saw the leases end early");
    assert!(violation.contains("believes it leads"), "{violation}");
}

/// A campaign, as `simulation::campaign`'s (`CARAVAN_SIM_NODES`: agents). Run by
/// `scripts/simulate --leadership`.
#[test]
#[ignore = "a campaign, run by scripts/simulate --leadership"]
fn campaign() {
    run_campaign("campaign (leadership)", |seed, keep_trace| {
        simulate_leadership(&LeadershipConfig {
            agents: env_u64("CARAVAN_SIM_NODES").map_or(3, |n| n as usize),
            keep_trace,
            ..LeadershipConfig::new(seed)
        })
    });
}

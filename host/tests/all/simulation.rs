//! The deterministic simulation of the control plane (`caravan_host::testing::simulation`):
//! many seeds, each a whole run of server, clients, operators and faults on simulated time,
//! checked against the invariants; and the same seed twice giving the same trace.
//!
//! `scripts/simulate` runs a campaign of many more seeds, or replays one with its trace.

use caravan_host::testing::simulation::{SimConfig, SimOutcome, simulate};

/// How many seeds `./run-tests` runs.
const SEEDS_PER_TEST_RUN: u64 = 500;

pub fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a whole number")),
    )
}

/// Runs each of `seeds`, printing each that broke an invariant with its trace; then fails
/// naming them, and how to replay one (`replay`: the command, `S` for the seed).
pub fn assert_every_seed_holds(
    seeds: impl Iterator<Item = u64>,
    replay: &str,
    simulate: impl Fn(u64) -> SimOutcome,
) {
    let (mut ran, mut failed) = (0, Vec::new());
    for seed in seeds {
        ran += 1;
        let outcome = simulate(seed);
        if outcome.violation.is_some() {
            println!("{outcome}");
            failed.push(seed);
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {ran} seeds broke an invariant: {failed:?} (each printed above; replay one \
         with `{replay}`)",
        failed.len()
    );
}

/// Each seed that found a defect (with what it found) keeps every invariant.
pub fn assert_regression_seeds_hold(seeds: &[(u64, &str)], simulate: impl Fn(u64) -> SimOutcome) {
    for (seed, found) in seeds {
        let outcome = simulate(*seed);
        assert!(
            outcome.violation.is_none(),
            "seed {seed} (found: {found}):\n{outcome}"
        );
    }
}

/// Each of `seeds`, run twice keeping its whole trace (`simulate` keeps it), gives the same
/// trace, of more than `min_lines` lines; where two runs part is shown.
pub fn assert_each_seed_replays(
    seeds: impl Iterator<Item = u64>,
    min_lines: u64,
    simulate: impl Fn(u64) -> SimOutcome,
) {
    for seed in seeds {
        let first = simulate(seed);
        let second = simulate(seed);
        if (&first.trace_hash, first.trace_lines) != (&second.trace_hash, second.trace_lines) {
            let diverged = first
                .trace
                .iter()
                .zip(&second.trace)
                .position(|(a, b)| a != b)
                .unwrap_or(first.trace.len().min(second.trace.len()));
            let from = diverged.saturating_sub(5);
            panic!(
                "seed {seed} gave two traces ({} and {}); they part at line {diverged}:\n\
                 first run:\n  {}\nsecond run:\n  {}",
                first.trace_hash,
                second.trace_hash,
                first.trace[from..(diverged + 5).min(first.trace.len())].join("\n  "),
                second.trace[from..(diverged + 5).min(second.trace.len())].join("\n  "),
            );
        }
        assert!(
            first.trace_lines > min_lines,
            "seed {seed} did little:\n{first}"
        );
    }
}

#[test]
fn every_invariant_holds_for_five_hundred_seeds() {
    assert_every_seed_holds(
        0..SEEDS_PER_TEST_RUN,
        "scripts/simulate --seed S --trace",
        |seed| simulate(&SimConfig::new(seed)),
    );
}

/// Seeds that found a defect, each fixed since: they run as they are in every test run. The
/// simulation may change under them and leave a seed testing something else, so each
/// defect has a test of its own too (in `server::intake::tests`, `client::alloc_map` and
/// `client::stops`).
const REGRESSION_SEEDS: [(u64, &str); 7] = [
    (
        84,
        "a scale refused on a failing disk landed with the next change",
    ),
    (
        60_459,
        "an alloc moved off a drained node was failed by a second, slow watch answer while it \
         started, then destroyed by the GC while it ran",
    ),
    (
        1_156,
        "a node taken down before a server restart came back, unknown, as saying nothing of \
         itself",
    ),
    (
        66,
        "an alloc moved off a drained node, stopped while it fetched its checkpoint, started \
         as it arrived and ran on",
    ),
    (
        282,
        "a stop waited behind a new alloc's commit, which a failing disk held through the \
         persister's backoff",
    ),
    (
        683,
        "a stop fetched while a moved alloc's runner started was dropped as a duplicate add",
    ),
    (
        1_584,
        "an alloc shut down to move, its node restarted before its replacement fetched the \
         checkpoint, was collected with it",
    ),
];

#[test]
fn the_seeds_that_found_defects_keep_every_invariant() {
    assert_regression_seeds_hold(&REGRESSION_SEEDS, |seed| simulate(&SimConfig::new(seed)));
}

#[test]
fn a_seed_gives_the_same_trace_every_time() {
    assert_each_seed_replays((0..20).map(|n| n * 7_919), 20, |seed| {
        simulate(&SimConfig {
            keep_trace: true,
            ..SimConfig::new(seed)
        })
    });
}

/// A campaign: `CARAVAN_SIM_SEEDS` seeds from `CARAVAN_SIM_FIRST_SEED` (default 0), or the
/// one `CARAVAN_SIM_SEED` with every line of its trace; `CARAVAN_SIM_NODES` nodes (default
/// 3). Run by `scripts/simulate`.
#[test]
#[ignore = "a campaign, run by scripts/simulate"]
fn campaign() {
    run_campaign("campaign", |seed, keep_trace| {
        simulate(&SimConfig {
            nodes: env_u64("CARAVAN_SIM_NODES").map_or(3, |n| n as usize),
            keep_trace,
            ..SimConfig::new(seed)
        })
    });
}

/// Runs the campaign the environment asks for (see [`campaign`]) of `simulate(seed,
/// keep_trace)`, printing each failing seed and one `label:` line of figures; fails when a
/// seed did.
pub fn run_campaign(label: &str, simulate: impl Fn(u64, bool) -> SimOutcome) {
    if let Some(seed) = env_u64("CARAVAN_SIM_SEED") {
        // What the host logged, printed after the trace when the seed fails.
        let _logs = crate::support::LogCapture::start();
        let outcome = simulate(seed, true);
        println!("{outcome}");
        assert!(
            outcome.violation.is_none(),
            "seed {seed} broke an invariant"
        );
        return;
    }
    let count = env_u64("CARAVAN_SIM_SEEDS").unwrap_or(10_000);
    let first = env_u64("CARAVAN_SIM_FIRST_SEED").unwrap_or(0);
    let started = std::time::Instant::now();
    let (mut failed, mut simulated) = (Vec::new(), std::time::Duration::ZERO);
    for seed in first..first + count {
        let outcome = simulate(seed, false);
        simulated += outcome.simulated;
        if outcome.violation.is_some() {
            println!("{outcome}");
            failed.push(seed);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{label}: {count} seeds from {first} in {seconds:.1} s: {:.0} seeds per minute, \
         {:.0} simulated seconds per second; {} failed: {failed:?}",
        count as f64 * 60.0 / seconds,
        simulated.as_secs_f64() / seconds,
        failed.len(),
    );
    assert!(failed.is_empty());
}

/// The checks can fail: each defect planted in the simulation's own runners or checks is
/// reported by some seed among the first hundred, with the invariant it breaks.
#[test]
fn each_planted_defect_is_caught() {
    use caravan_host::testing::simulation::Sabotage;
    let expected = [
        (Sabotage::RunnersIgnoreKills, "still run"),
        (Sabotage::CountCheckOneTooLow, "past its count"),
        (Sabotage::RestoredRunnersForgetTheyFinished, "ran again"),
        (Sabotage::DestroyBoundOneTooLow, "destroys at once"),
        (Sabotage::KillTimeoutNotEnforced, "past its kill timeout"),
        (
            Sabotage::RestoredRunnersLoseTheirCheckpoint,
            "without checkpoint",
        ),
        (Sabotage::MovedAllocsStartOneCheckpointBack, "not at least"),
    ];
    for (sabotage, breaks) in expected {
        let caught = (0..100).find_map(|seed| {
            let outcome = simulate(&SimConfig {
                sabotage: Some(sabotage),
                ..SimConfig::new(seed)
            });
            outcome
                .violation
                .filter(|violation| violation.contains(breaks))
        });
        assert!(
            caught.is_some(),
            "{sabotage:?} went unnoticed in 100 seeds: no violation saying {breaks:?}"
        );
    }
}

//! Placement as tables: nodes and allocs in, placements (or why not) out.

use super::*;
use crate::model::constraint::Constraint;
use crate::model::jobspec::JobType;
use crate::model::node::NodeResources;
use crate::server::testkit::{alloc_on, nodes, spec, terminal};

const MIB: u64 = 1 << 20;

/// A node with `memory_mib` MiB for allocs and `slots` slots, of class `class`.
fn node(memory_mib: u64, slots: u32, class: &str) -> NodeInfo {
    NodeInfo {
        class: class.into(),
        resources: NodeResources {
            memory_bytes: Some(memory_mib * MIB),
            default_alloc_memory_bytes: Some(64 * MIB),
            alloc_slots: Some(slots),
        },
        ..NodeInfo::default()
    }
}

fn cluster(table: &[(&str, NodeInfo)]) -> Nodes {
    table
        .iter()
        .map(|(name, info)| (name.to_string(), info.clone()))
        .collect()
}

/// A job of `count` allocs, each with a memory limit of `memory_mib` MiB.
fn job(id: &str, count: u32, memory_mib: u64) -> JobSpec {
    let mut job = spec(id, JobType::Service, count);
    job.limits.memory_bytes = Some(memory_mib * MIB);
    job
}

fn constraint(attribute: &str, operator: &str, value: &str) -> Constraint {
    Constraint {
        attribute: attribute.into(),
        operator: operator.into(),
        value: value.into(),
    }
}

fn placed(nodes: &Nodes, allocs: &[AllocRecord], job: &JobSpec) -> Vec<Option<String>> {
    Placer::new(nodes, allocs).place(Ask::new(job, job.count as usize))
}

fn names(placements: &[Option<String>]) -> Vec<&str> {
    placements
        .iter()
        .map(|n| n.as_deref().unwrap_or("-"))
        .collect()
}

#[test]
fn binpack_fills_the_fullest_node_that_fits_and_spread_the_emptiest() {
    let nodes = cluster(&[("a", node(1024, 100, "")), ("b", node(1024, 100, ""))]);
    // "a" already holds 512 MiB of another job.
    let mut busy = alloc_on("other", 1, Some("a"));
    std::sync::Arc::make_mut(&mut busy.alloc)
        .limits
        .memory_bytes = Some(512 * MIB);
    let allocs = [busy];
    let binpack = job("web", 1, 256);
    assert_eq!(names(&placed(&nodes, &allocs, &binpack)), ["a"]);
    let spread = JobSpec {
        placement: Algorithm::Spread,
        ..binpack.clone()
    };
    assert_eq!(names(&placed(&nodes, &allocs, &spread)), ["b"]);
}

#[test]
fn a_jobs_allocs_go_to_different_nodes_while_there_is_room_for_them() {
    let nodes = cluster(&[
        ("a", node(4096, 100, "")),
        ("b", node(4096, 100, "")),
        ("c", node(4096, 100, "")),
    ]);
    assert_eq!(
        names(&placed(&nodes, &[], &job("web", 3, 64))),
        ["a", "b", "c"],
        "job anti-affinity outweighs binpack on empty nodes"
    );
    assert_eq!(
        names(&placed(&nodes, &[], &job("web", 6, 64))),
        ["a", "b", "c", "a", "b", "c"]
    );
}

#[test]
fn nodes_that_say_nothing_of_their_size_share_a_large_job_evenly_under_either_algorithm() {
    // As nodesim's nodes without --node-memory or --node-slots: never full, size unknown.
    let nodes: Nodes = (0..100)
        .map(|n| (format!("sim-{n:03}"), NodeInfo::default()))
        .collect();
    for placement in [Algorithm::Binpack, Algorithm::Spread] {
        let big = JobSpec {
            placement,
            ..spec("big", JobType::Service, 1_000)
        };
        let mut per_node = BTreeMap::<String, usize>::new();
        for node in placed(&nodes, &[], &big).into_iter().flatten() {
            *per_node.entry(node).or_default() += 1;
        }
        assert_eq!(per_node.len(), 100, "{placement:?}: every node used");
        assert!(
            per_node.values().all(|&n| n == 10),
            "{placement:?}: 10 each, not piled onto a few: {per_node:?}"
        );
    }
    // One-alloc jobs, one after another: the least loaded node each time.
    let mut allocs = Vec::new();
    for n in 0..3 {
        let one = spec(&format!("one-{n}"), JobType::Service, 1);
        let at = placed(&nodes, &allocs, &one).remove(0);
        assert_eq!(at.as_deref(), Some(format!("sim-{n:03}").as_str()));
        allocs.push(alloc_on(&one.id, 1, at.as_deref()));
    }
}

#[test]
fn over_unsized_nodes_already_loaded_a_job_still_spreads_and_one_alloc_goes_to_the_emptiest() {
    let nodes: Nodes = (0..10)
        .map(|n| (format!("n{n}"), NodeInfo::default()))
        .collect();
    // Node n holds 30 n allocs of another job: the fuller nodes must not draw the new job.
    let mut allocs = Vec::new();
    for n in 0..10 {
        for _ in 0..30 * n {
            let sequence = allocs.len() as u64 + 1;
            allocs.push(alloc_on("old", sequence, Some(&format!("n{n}"))));
        }
    }
    for placement in [Algorithm::Binpack, Algorithm::Spread] {
        let job = JobSpec {
            placement,
            ..spec("new", JobType::Service, 20)
        };
        let mut per_node = BTreeMap::<String, usize>::new();
        for node in placed(&nodes, &allocs, &job).into_iter().flatten() {
            *per_node.entry(node).or_default() += 1;
        }
        let counts: Vec<usize> = (0..10).map(|n| per_node[&format!("n{n}")]).collect();
        match placement {
            // Among such nodes the job's anti-affinity decides first: an even spread.
            Algorithm::Binpack => assert_eq!(counts, [2; 10], "binpack"),
            // Spread also evens the nodes' whole load: the emptier take more, none nothing.
            Algorithm::Spread => assert!(
                counts.windows(2).all(|pair| pair[0] >= pair[1]) && counts[9] >= 1,
                "spread: {counts:?}"
            ),
        }
        let one = JobSpec {
            placement,
            ..spec("one", JobType::Service, 1)
        };
        assert_eq!(
            names(&placed(&nodes, &allocs, &one)),
            ["n0"],
            "{placement:?}"
        );
    }
}

#[test]
fn nodes_that_cannot_hold_the_alloc_are_filtered_and_the_rest_left_unplaced() {
    let nodes = cluster(&[
        ("small", node(256, 100, "")),
        ("few-slots", node(8192, 1, "")),
        ("big", node(1024, 100, "")),
    ]);
    let allocs = [alloc_on("other", 1, Some("few-slots"))];
    let job = job("web", 3, 512);
    assert_eq!(names(&placed(&nodes, &allocs, &job)), ["big", "big", "-"]);
    let why = Placer::new(&nodes, &allocs).explain(&job);
    assert_eq!(
        why.exhausted,
        BTreeMap::from([(Dimension::Memory, 1), (Dimension::Slots, 1)])
    );
    assert_eq!(why.feasible, 1, "big can hold one more right now");
}

#[test]
fn terminal_allocs_hold_nothing_and_unknown_nodes_are_never_chosen() {
    let nodes = cluster(&[("a", node(128, 100, ""))]);
    let allocs = [
        terminal(alloc_on("other", 1, Some("a"))),
        alloc_on("other", 2, Some("gone")),
    ];
    assert_eq!(
        names(&placed(&nodes, &allocs, &job("web", 2, 64))),
        ["a", "a"]
    );
    assert_eq!(placed(&Nodes::new(), &[], &job("web", 1, 64)), [None]);
}

#[test]
fn a_node_that_says_nothing_holds_any_memory_and_any_number_of_allocs() {
    let crowded: Vec<AllocRecord> = (1..=1_500)
        .map(|n| alloc_on("other", n, Some("a")))
        .collect();
    let one = nodes(&["a"]);
    assert_eq!(names(&placed(&one, &crowded, &job("web", 1, 64))), ["a"]);
    let nodes = nodes(&["a", "b"]);
    let huge = job("web", 4, 1 << 20);
    assert_eq!(names(&placed(&nodes, &[], &huge)), ["a", "b", "a", "b"]);
}

#[test]
fn an_alloc_without_a_memory_limit_reserves_the_nodes_default() {
    let mut small_default = node(256, 100, "");
    small_default.resources.default_alloc_memory_bytes = Some(128 * MIB);
    let nodes = cluster(&[("a", small_default)]);
    let unset = spec("web", JobType::Service, 3);
    assert_eq!(names(&placed(&nodes, &[], &unset)), ["a", "a", "-"]);
}

#[test]
fn constraints_filter_nodes_and_name_themselves_when_nothing_is_left() {
    let nodes = cluster(&[
        ("core-1", node(1024, 100, "core")),
        ("core-2", node(1024, 100, "core")),
        ("edge-1", node(128, 100, "edge")),
    ]);
    let mut edge = job("web", 2, 128);
    edge.constraints = vec![constraint("${node.class}", "=", "edge")];
    assert_eq!(names(&placed(&nodes, &[], &edge)), ["edge-1", "-"]);
    let mut placer = Placer::new(&nodes, &[]);
    placer.place(Ask::new(&edge, 1));
    let why = placer.explain(&edge);
    assert_eq!(
        why.to_string(),
        "no node has 128 MiB free: 1 node exhausted memory, 2 nodes filtered by \
         constraint ${node.class} = edge"
    );
    let mut nowhere = job("web", 1, 64);
    nowhere.constraints = vec![constraint("${meta.rack}", "=", "r9")];
    assert_eq!(
        Placer::new(&nodes, &[]).explain(&nowhere).to_string(),
        "no node meets the job's constraints: 3 nodes filtered by constraint ${meta.rack} = r9"
    );
    assert_eq!(
        Placer::new(&Nodes::new(), &[])
            .explain(&nowhere)
            .to_string(),
        "no node is registered yet"
    );
}

#[test]
fn distinct_hosts_puts_at_most_one_of_the_jobs_allocs_on_a_node() {
    let nodes = cluster(&[("a", node(4096, 100, "")), ("b", node(4096, 100, ""))]);
    let mut job = job("web", 3, 64);
    job.constraints = vec![constraint("", "distinct_hosts", "")];
    assert_eq!(names(&placed(&nodes, &[], &job)), ["a", "b", "-"]);
    let allocs = [alloc_on("web", 1, Some("a"))];
    let one_more = JobSpec { count: 1, ..job };
    assert_eq!(names(&placed(&nodes, &allocs, &one_more)), ["b"]);
    assert_eq!(
        Placer::new(
            &nodes,
            &[alloc_on("web", 1, Some("a")), alloc_on("web", 2, Some("b"))]
        )
        .explain(&one_more)
        .to_string(),
        "no node meets the job's constraints: 2 nodes filtered by constraint distinct_hosts"
    );
}

#[test]
fn allocs_the_plan_stops_do_not_count_as_the_jobs_for_distinct_hosts() {
    let nodes = cluster(&[("a", node(4096, 100, ""))]);
    let mut job = job("web", 1, 64);
    job.constraints = vec![constraint("", "distinct_hosts", "")];
    let old = [alloc_on("web", 1, Some("a"))];
    let stopping = [old[0].alloc.id.clone()];
    let mut placer = Placer::new(&nodes, &old);
    let ask = Ask {
        stopping: &stopping,
        ..Ask::new(&job, 1)
    };
    assert_eq!(names(&placer.place(ask)), ["a"]);
}

#[test]
fn a_replacement_avoids_where_its_chain_failed_unless_nowhere_else_can_hold_it() {
    let nodes = cluster(&[
        ("a", node(1024, 100, "")),
        ("b", node(1024, 100, "")),
        ("c", node(64, 100, "")),
    ]);
    let job = job("web", 1, 128);
    let place = |avoid: &[&str]| {
        let ask = Ask {
            avoid,
            ..Ask::new(&job, 1)
        };
        names(&Placer::new(&nodes, &[]).place(ask)).join(",")
    };
    assert_eq!(place(&["a"]), "b");
    assert_eq!(place(&["b"]), "a");
    assert_eq!(
        place(&["a", "b"]),
        "a",
        "c cannot hold it: a failed one is better than none"
    );
    assert_eq!(place(&[]), "a");
}

#[test]
fn waiting_allocs_are_placed_oldest_first_with_their_jobs_rules() {
    let nodes = cluster(&[
        ("edge-1", node(256, 100, "edge")),
        ("core-1", node(256, 100, "core")),
    ]);
    let mut edge = job("edge-job", 2, 128);
    edge.constraints = vec![constraint("${node.class}", "=", "edge")];
    let plain = job("plain", 1, 256);
    let waiting = [
        alloc_on("edge-job", 1, None),
        alloc_on("plain", 2, None),
        alloc_on("edge-job", 3, None),
        alloc_on("edge-job", 4, None),
        alloc_on("unknown", 5, None),
    ];
    let refs: Vec<&AllocRecord> = waiting.iter().collect();
    let jobs = BTreeMap::from([("edge-job", &edge), ("plain", &plain)]);
    let placed = place_unplaced(&nodes, &waiting, &refs, |id| jobs.get(id).copied());
    let placed: Vec<&str> = placed
        .iter()
        .map(|(_, n)| n.as_deref().unwrap_or("-"))
        .collect();
    assert_eq!(placed, ["edge-1", "core-1", "edge-1", "-", "-"]);
}

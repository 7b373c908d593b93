//! Placement: which node each new alloc goes to. Pure functions over plain data (the
//! registered nodes and the current [`AllocRecord`]s), so the embedded server and a
//! distributed scheduler decide alike; they must not touch a store, a lock or a clock.
//!
//! Invariants, each for the reason given:
//! - A new alloc goes to the least loaded node, ties broken by node id, and each placement
//!   counts toward the load of the next one: allocs spread evenly, and the same inputs always
//!   give the same answer.
//! - Load is every non-terminal alloc on a node, whatever its job or desired status: an alloc
//!   asked to stop still holds its node until its client reports it terminal.
//! - With no node registered an alloc is left unplaced (`None`), not refused: it waits for
//!   the first node to register and is placed then.
//! - The replacement of a failed alloc goes to a node none of its chain failed on when there
//!   is one: what failed it there (a runner build the node could not fetch, a full disk) may
//!   fail its replacement too.

use super::records::AllocRecord;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// Node id -> how many non-terminal allocs it holds.
pub type NodeLoad = BTreeMap<String, usize>;

/// The load of each registered node. Allocs on nodes not in `nodes` are not counted.
pub fn node_load<'a>(
    nodes: &BTreeSet<String>,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
) -> NodeLoad {
    let mut load: NodeLoad = nodes.iter().map(|n| (n.clone(), 0)).collect();
    for record in allocs.into_iter().filter(|a| !a.is_terminal()) {
        if let Some(n) = record.node_id.as_ref().and_then(|node| load.get_mut(node)) {
            *n += 1;
        }
    }
    load
}

/// Chooses a node for each of `count` new allocs: the least loaded first, ties by name, so
/// allocs spread evenly. Returns `None`s when there is no node yet. A heap keeps it at
/// O(count x log nodes): a job of 50,000 allocs over 5,000 nodes is placed in milliseconds.
pub fn place(load: &NodeLoad, count: usize) -> Vec<Option<String>> {
    if load.is_empty() {
        return vec![None; count];
    }
    let mut least_loaded: BinaryHeap<Reverse<(usize, &String)>> =
        load.iter().map(|(name, n)| Reverse((*n, name))).collect();
    (0..count)
        .map(|_| {
            let Reverse((n, name)) = least_loaded.pop()?;
            least_loaded.push(Reverse((n + 1, name)));
            Some(name.clone())
        })
        .collect()
}

/// A node for the replacement of an alloc that failed: the least loaded node other than
/// those its chain failed on (`failed_on`), as Nomad's rescheduling penalises the nodes an
/// alloc failed on (its runner may not be fetchable there, its disk may be full), or the
/// least loaded of all when every node is one of those.
pub fn place_replacement(load: &NodeLoad, failed_on: &[&str]) -> Option<String> {
    let elsewhere: NodeLoad = load
        .iter()
        .filter(|(node, _)| !failed_on.contains(&node.as_str()))
        .map(|(node, n)| (node.clone(), *n))
        .collect();
    let candidates = if elsewhere.is_empty() {
        load
    } else {
        &elsewhere
    };
    place(candidates, 1).pop().flatten()
}

/// A node for every alloc still waiting for one, as `(alloc id, node)` in the order the
/// allocs were given (`None` when there is still no node).
pub fn place_unplaced<'a>(
    nodes: &BTreeSet<String>,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
) -> Vec<(String, Option<String>)> {
    let allocs: Vec<&AllocRecord> = allocs.into_iter().collect();
    let unplaced: Vec<String> = allocs
        .iter()
        .filter(|a| a.node_id.is_none())
        .map(|a| a.alloc.id.clone())
        .collect();
    let chosen = place(&node_load(nodes, allocs), unplaced.len());
    unplaced.into_iter().zip(chosen).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::testkit::{alloc_on, terminal};

    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn placement_spreads_allocs_over_the_least_loaded_nodes() {
        let load = BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 0)]);
        let nodes: Vec<_> = place(&load, 4).into_iter().map(Option::unwrap).collect();
        assert_eq!(nodes, ["b", "b", "a", "b"]);
        assert_eq!(
            place(&BTreeMap::new(), 2),
            [None, None],
            "no node yet: unplaced"
        );
    }

    #[test]
    fn a_replacement_goes_elsewhere_than_where_its_alloc_failed_unless_nowhere_else() {
        let load = BTreeMap::from([
            ("a".to_string(), 0),
            ("b".to_string(), 5),
            ("c".to_string(), 9),
        ]);
        assert_eq!(place_replacement(&load, &["a"]).as_deref(), Some("b"));
        assert_eq!(place_replacement(&load, &["b"]).as_deref(), Some("a"));
        assert_eq!(place_replacement(&load, &["a", "b"]).as_deref(), Some("c"));
        assert_eq!(place_replacement(&load, &[]).as_deref(), Some("a"));
        assert_eq!(
            place_replacement(&load, &["a", "b", "c"]).as_deref(),
            Some("a"),
            "failed everywhere: the least loaded of all"
        );
        assert_eq!(place_replacement(&BTreeMap::new(), &["a"]), None);
    }

    #[test]
    fn load_counts_non_terminal_allocs_on_registered_nodes_only() {
        let allocs = [
            alloc_on("web", 1, Some("a")),
            alloc_on("web", 2, Some("a")),
            terminal(alloc_on("web", 3, Some("b"))),
            alloc_on("web", 4, Some("gone")),
            alloc_on("web", 5, None),
        ];
        let load = node_load(&nodes(&["a", "b"]), &allocs);
        assert_eq!(
            load,
            BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 0)])
        );
    }

    #[test]
    fn allocs_waiting_for_a_node_are_placed_where_the_load_is_lowest() {
        let allocs = [
            alloc_on("web", 1, Some("a")),
            alloc_on("web", 2, None),
            alloc_on("web", 3, None),
        ];
        let placed = place_unplaced(&nodes(&["a", "b"]), &allocs);
        let ids = |seq: u64| allocs[seq as usize - 1].alloc.id.clone();
        assert_eq!(
            placed,
            [
                (ids(2), Some("b".to_string())),
                (ids(3), Some("a".to_string()))
            ]
        );
        assert_eq!(
            place_unplaced(&BTreeSet::new(), &allocs),
            [(ids(2), None), (ids(3), None)],
            "still no node: still waiting"
        );
    }
}

//! Placement: which node each new alloc goes to, Nomad's way: nodes that cannot hold the
//! alloc are filtered out (a constraint not met, not enough memory free, no alloc slot
//! left), the rest are ranked, and the best takes it. Pure functions over plain data (the
//! registered nodes with what each said of itself, the current [`AllocRecord`]s, the job),
//! so the embedded server and a distributed scheduler decide alike; they must not touch a
//! store, a lock or a clock.
//!
//! Invariants, each for the reason given:
//! - Every non-terminal alloc on a node holds its memory and its slot, whatever its job or
//!   desired status: an alloc asked to stop still runs until its client reports it
//!   terminal. An alloc reserves its memory limit: its job's, or, when the job sets none,
//!   the node's default (what its client will give it there).
//! - Ranking is Nomad's: `binpack` (the default) scores a node by how full it would be
//!   (memory and slots), `spread` by how empty (slots a node does not state rank it by how
//!   empty, whatever the algorithm); either way a node that already runs allocs
//!   of the job is penalised by how many (Nomad's job anti-affinity), so a job's allocs
//!   land on different nodes while there is room. Ties go to the node named first: the same
//!   inputs always give the same placements.
//! - Each placement counts toward the next, within one job and across the jobs of one
//!   [`Placer`].
//! - An alloc no node can hold is left unplaced (`None`), not refused: it is blocked until
//!   capacity appears, and [`Placer::explain`] says why in Nomad's words.
//! - The replacement of a failed alloc goes to a node none of its chain failed on when one
//!   can hold it: what failed it there (a runner build the node could not fetch, a full
//!   disk) may fail its replacement too.

use super::records::AllocRecord;
use crate::model::constraint::{Algorithm, Compiled};
use crate::model::jobspec::JobSpec;
use crate::model::limits::{LimitOverrides, Limits};
use crate::model::node::NodeInfo;
use crate::util::determinism::HashMap;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// The registered nodes, by id, with what each said of itself.
pub type Nodes = BTreeMap<String, NodeInfo>;

/// The scale of load on a node that does not say how many allocs it holds (the agent's
/// default `max_live_allocs`): such a node is never full, and ranks emptier first.
const UNSAID_SLOTS: u32 = 1_000;

/// What a node's non-terminal allocs hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// How many.
    pub allocs: u32,
    /// The memory they reserve, in bytes.
    pub memory_bytes: u64,
}

/// The memory an alloc with `limits` reserves on `node`: its memory limit, or the node's
/// default for allocs whose job sets none.
pub fn reserved_memory(limits: &LimitOverrides, node: &NodeInfo) -> u64 {
    limits
        .memory_bytes
        .or(node.resources.default_alloc_memory_bytes)
        .unwrap_or(Limits::default().memory_bytes)
}

/// What `count` new allocs of a job need placing for.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The job (its limits, constraints, count and placement algorithm).
    pub job: &'a JobSpec,
    /// How many allocs to place.
    pub count: usize,
    /// Nodes to place on only when no other can hold the alloc (where its chain failed).
    pub avoid: &'a [&'a str],
    /// The job's allocs the same plan stops: they do not count as the job's on their node
    /// (for `distinct_hosts` and anti-affinity), though they hold their memory until gone.
    pub stopping: &'a [String],
}

impl<'a> Ask<'a> {
    /// `count` allocs of `job`, nothing avoided or stopping.
    pub fn new(job: &'a JobSpec, count: usize) -> Self {
        Ask {
            job,
            count,
            avoid: &[],
            stopping: &[],
        }
    }
}

/// Places allocs over one view of the cluster, each placement counting toward the next.
pub struct Placer<'a> {
    nodes: &'a Nodes,
    usage: BTreeMap<&'a str, Usage>,
    allocs: Vec<&'a AllocRecord>,
    /// Allocs this placer placed, per (job, node): they count as the job's on the node.
    placed: HashMap<(String, &'a str), u32>,
}

impl<'a> Placer<'a> {
    /// A placer over `nodes` holding `allocs` (every alloc the server holds; terminal ones
    /// and those on nodes not in `nodes` hold nothing).
    pub fn new(nodes: &'a Nodes, allocs: impl IntoIterator<Item = &'a AllocRecord>) -> Self {
        let mut usage: BTreeMap<&'a str, Usage> = nodes
            .keys()
            .map(|n| (n.as_str(), Usage::default()))
            .collect();
        let allocs: Vec<&'a AllocRecord> = allocs
            .into_iter()
            .filter(|a| !a.is_terminal() && a.node_id.is_some())
            .collect();
        for record in &allocs {
            let node_id = record.node_id.as_deref().unwrap_or_default();
            if let (Some(used), Some(info)) = (usage.get_mut(node_id), nodes.get(node_id)) {
                used.allocs += 1;
                used.memory_bytes = used
                    .memory_bytes
                    .saturating_add(reserved_memory(&record.alloc.limits, info));
            }
        }
        Placer {
            nodes,
            usage,
            allocs,
            placed: HashMap::default(),
        }
    }

    /// What each node holds now, with this placer's placements.
    pub fn usage(&self) -> &BTreeMap<&'a str, Usage> {
        &self.usage
    }

    /// A node for each of `ask.count` new allocs (`None` for those no node can hold), and
    /// each placement counted toward the next.
    pub fn place(&mut self, ask: Ask<'_>) -> Vec<Option<String>> {
        let job = Job::new(self, &ask);
        let avoided = |node: &str| ask.avoid.contains(&node);
        let mut placed = Vec::with_capacity(ask.count);
        let mut ranked = self.rank(&job, |node| !avoided(node));
        let mut fell_back = false;
        while placed.len() < ask.count {
            let Some(Reverse((_, Reverse(node)))) = ranked.pop().map(Reverse) else {
                if !fell_back && !ask.avoid.is_empty() {
                    // None elsewhere can hold it: where its chain failed is better than nowhere.
                    fell_back = true;
                    ranked = self.rank(&job, avoided);
                    continue;
                }
                break;
            };
            self.take(&job, node);
            placed.push(Some(node.to_string()));
            if let Some(score) = self.score(&job, node) {
                ranked.push((score, Reverse(node)));
            }
        }
        placed.resize(ask.count, None);
        placed
    }

    /// Why a new alloc of `job` fits nowhere, as Nomad's placement failures say it.
    pub fn explain(&self, job: &JobSpec) -> Blocked {
        let ask = Ask::new(job, 1);
        let job_view = Job::new(self, &ask);
        let mut blocked = Blocked {
            nodes: self.nodes.len(),
            ..Blocked::default()
        };
        for (node_id, info) in self.nodes {
            if let Some(index) = job_view
                .constraints
                .iter()
                .position(|c| !c.admits(node_id, info))
            {
                let text = job.constraints[job_view.constraint_index[index]].to_string();
                *blocked.filtered.entry(text).or_default() += 1;
                continue;
            }
            if job_view.distinct_hosts && self.count_on(&job_view, node_id) > 0 {
                *blocked
                    .filtered
                    .entry("distinct_hosts".to_string())
                    .or_default() += 1;
                continue;
            }
            let used = self
                .usage
                .get(node_id.as_str())
                .copied()
                .unwrap_or_default();
            let memory = reserved_memory(&job.limits, info);
            blocked.memory_asked = blocked.memory_asked.max(memory);
            match exhausted(info, used, memory) {
                Some(dimension) => *blocked.exhausted.entry(dimension).or_default() += 1,
                None => blocked.feasible += 1,
            }
        }
        blocked
    }

    /// How good a home `node` is for one more alloc of `job`, as placement ranks nodes
    /// (higher is better); `None` when it cannot hold it or is not among this placer's.
    pub fn score_for(&self, job: &JobSpec, node: &str) -> Option<i64> {
        let ask = Ask::new(job, 1);
        self.score(&Job::new(self, &ask), node)
    }

    /// The nodes `admit` lets through that can hold one more alloc of `job`, best last.
    fn rank(&self, job: &Job, admit: impl Fn(&str) -> bool) -> BinaryHeap<(i64, Reverse<&'a str>)> {
        self.nodes
            .keys()
            .map(String::as_str)
            .filter(|node| admit(node))
            .filter_map(|node| Some((self.score(job, node)?, Reverse(node))))
            .collect()
    }

    /// How good a home `node_id` is for one more alloc of `job` (higher is better), or
    /// `None` when it cannot hold it.
    fn score(&self, job: &Job, node_id: &str) -> Option<i64> {
        let info = self.nodes.get(node_id)?;
        if !job.constraints.iter().all(|c| c.admits(node_id, info)) {
            return None;
        }
        let on_node = self.count_on(job, node_id);
        if job.distinct_hosts && on_node > 0 {
            return None;
        }
        let used = self.usage.get(node_id).copied().unwrap_or_default();
        let memory = reserved_memory(&job.spec.limits, info);
        if exhausted(info, used, memory).is_some() {
            return None;
        }
        // Nomad's fit: each dimension's free share after placing, as 10^free; binpack
        // prefers little free (a full dimension scores 1), spread much; the fit is the mean
        // of the dimensions', from 0 to 1 (never below: the job's anti-affinity below halves
        // it with its penalty, which only penalises a fit that is not negative).
        let free = |used: f64, total: f64| (1.0 - used / total).clamp(0.0, 1.0);
        let by_algorithm = |free: f64| match job.spec.placement {
            Algorithm::Binpack => (10.0 - 10f64.powf(free)) / 9.0,
            Algorithm::Spread => (10f64.powf(free) - 1.0) / 9.0,
        };
        // Memory a node does not state is all free: the same for every such node.
        let memory_fit = by_algorithm(info.resources.memory_bytes.map_or(1.0, |total| {
            free(
                used.memory_bytes.saturating_add(memory) as f64,
                total as f64,
            )
        }));
        let slots_fit = match info.resources.alloc_slots {
            Some(slots) => by_algorithm(free(f64::from(used.allocs + 1), f64::from(slots))),
            // A node that does not say how many allocs it holds is never full and has no size
            // to pack toward: the emptier the better, however loaded (binpacking toward an
            // assumed size piled a job of 10,000 onto two of 1,000 such nodes). Under binpack
            // it counts for little, below any stated node's packing, so that among such nodes
            // the job's anti-affinity decides first and their load second.
            None => {
                let empty = f64::from(UNSAID_SLOTS) / f64::from(UNSAID_SLOTS + used.allocs + 1);
                match job.spec.placement {
                    Algorithm::Binpack => empty * 1e-3,
                    Algorithm::Spread => empty,
                }
            }
        };
        let fit = (memory_fit + slots_fit) / 2.0;
        let score = if on_node == 0 {
            fit
        } else {
            let penalty = -f64::from(on_node + 1) / job.spec.count.max(1) as f64;
            (fit + penalty) / 2.0
        };
        Some((score * 1e9) as i64)
    }

    /// Counts one alloc of `job` placed on `node`.
    fn take(&mut self, job: &Job, node: &'a str) {
        if let (Some(used), Some(info)) = (self.usage.get_mut(node), self.nodes.get(node)) {
            used.allocs += 1;
            used.memory_bytes = used
                .memory_bytes
                .saturating_add(reserved_memory(&job.spec.limits, info));
        }
        *self.placed.entry((job.spec.id.clone(), node)).or_default() += 1;
    }

    /// How many of `job`'s allocs `node` holds, with this placer's placements.
    fn count_on(&self, job: &Job, node: &str) -> u32 {
        let placed = self
            .placed
            .get(&(job.spec.id.clone(), node))
            .copied()
            .unwrap_or(0);
        job.existing.get(node).copied().unwrap_or(0) + placed
    }
}

/// The dimension `node` lacks to hold one more alloc reserving `memory` bytes, if any.
fn exhausted(node: &NodeInfo, used: Usage, memory: u64) -> Option<Dimension> {
    if node
        .resources
        .alloc_slots
        .is_some_and(|slots| used.allocs >= slots)
    {
        return Some(Dimension::Slots);
    }
    match node.resources.memory_bytes {
        Some(total) if used.memory_bytes.saturating_add(memory) > total => Some(Dimension::Memory),
        _ => None,
    }
}

/// A job as one [`Placer::place`] sees it: its compiled constraints and how many of its
/// allocs each node holds.
struct Job<'s> {
    spec: &'s JobSpec,
    constraints: Vec<Compiled>,
    /// For each of `constraints`, its index in the spec (for naming it).
    constraint_index: Vec<usize>,
    distinct_hosts: bool,
    /// The job's wanted allocs per node, before this placer placed any.
    existing: HashMap<String, u32>,
}

impl<'s> Job<'s> {
    fn new(placer: &Placer<'_>, ask: &Ask<'s>) -> Self {
        let mut constraints = Vec::new();
        let mut constraint_index = Vec::new();
        let mut distinct_hosts = false;
        for (i, constraint) in ask.job.constraints.iter().enumerate() {
            // A stored job's constraints were compiled at submit; one that no longer
            // compiles (a later build refusing it) admits nothing rather than anything.
            match constraint.compile() {
                Ok(Compiled::DistinctHosts) => distinct_hosts = true,
                Ok(Compiled::Always) => {}
                Ok(compiled) => {
                    constraints.push(compiled);
                    constraint_index.push(i);
                }
                Err(_) => {
                    constraints.push(Compiled::Check {
                        target: crate::model::node::Target::NodeName,
                        test: crate::model::constraint::Test::Equal(String::new()),
                    });
                    constraint_index.push(i);
                }
            }
        }
        let mut existing: HashMap<String, u32> = HashMap::default();
        for record in &placer.allocs {
            if record.alloc.job_id == ask.job.id
                && record.is_wanted()
                && !ask.stopping.contains(&record.alloc.id)
                && let Some(node) = &record.node_id
            {
                *existing.entry(node.clone()).or_default() += 1;
            }
        }
        Job {
            spec: ask.job,
            constraints,
            constraint_index,
            distinct_hosts,
            existing,
        }
    }
}

/// A resource a node can run out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dimension {
    /// Memory for allocs.
    Memory,
    /// Alloc slots (`max_live_allocs`).
    Slots,
}

/// Why an alloc fits nowhere: Nomad's placement metrics, counted over the registered nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Blocked {
    /// Nodes registered.
    pub nodes: usize,
    /// Nodes filtered out, per constraint (`${node.class} = edge`, `distinct_hosts`).
    pub filtered: BTreeMap<String, usize>,
    /// Nodes that met the constraints but lacked room, per dimension.
    pub exhausted: BTreeMap<Dimension, usize>,
    /// The most memory the alloc reserves on any node that met the constraints.
    pub memory_asked: u64,
    /// Nodes that could hold it now (it will be placed at the next chance).
    pub feasible: usize,
    /// Registered nodes left out before any of this: ineligible or draining.
    pub ineligible: usize,
}

impl Blocked {
    /// These metrics, with `ineligible` registered nodes that placement did not consider.
    pub fn with_ineligible(self, ineligible: usize) -> Blocked {
        Blocked { ineligible, ..self }
    }
}

impl std::fmt::Display for Blocked {
    /// `no node has 512 MiB free: 3 nodes exhausted memory, 1 filtered by constraint
    /// ${node.class} = edge`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes = |n: usize| {
            if n == 1 {
                "1 node".to_string()
            } else {
                format!("{n} nodes")
            }
        };
        let ineligible = || format!("{} ineligible or draining", nodes(self.ineligible));
        if self.nodes == 0 && self.ineligible == 0 {
            return f.write_str("no node is registered yet");
        }
        if self.nodes == 0 {
            return write!(f, "no node is eligible: {}", ineligible());
        }
        if self.feasible > 0 {
            return write!(
                f,
                "waiting to be placed: {} nodes can hold it",
                self.feasible
            );
        }
        let memory = self.exhausted.get(&Dimension::Memory).copied().unwrap_or(0);
        let slots = self.exhausted.get(&Dimension::Slots).copied().unwrap_or(0);
        if memory > 0 {
            write!(f, "no node has {} free", readable_bytes(self.memory_asked))?;
        } else if slots > 0 {
            f.write_str("no node has an alloc slot free")?;
        } else {
            f.write_str("no node meets the job's constraints")?;
        }
        let mut parts = Vec::new();
        if memory > 0 {
            parts.push(format!("{} exhausted memory", nodes(memory)));
        }
        if slots > 0 {
            parts.push(format!("{} exhausted alloc slots", nodes(slots)));
        }
        for (constraint, n) in &self.filtered {
            parts.push(format!("{} filtered by constraint {constraint}", nodes(*n)));
        }
        if self.ineligible > 0 {
            parts.push(ineligible());
        }
        write!(f, ": {}", parts.join(", "))
    }
}

/// `512 MiB` for a whole number of a unit, `500.5 MiB` otherwise.
fn readable_bytes(bytes: u64) -> String {
    use crate::util::units::{format_bytes, format_bytes_approx};
    let exact = format_bytes(bytes);
    if exact.ends_with("bytes") && bytes >= 1024 {
        format_bytes_approx(bytes)
    } else {
        exact
    }
}

/// A node for every alloc still waiting for one, as `(alloc id, node)` in the order the
/// allocs were given (`None` when none can hold it yet). `job_of` gives each alloc's job
/// (its current spec: an alloc of an older version is stopped, never left waiting); an
/// alloc without one is left waiting.
pub fn place_unplaced<'a>(
    nodes: &'a Nodes,
    allocs: impl IntoIterator<Item = &'a AllocRecord>,
    waiting: &[&AllocRecord],
    job_of: impl Fn(&str) -> Option<&'a JobSpec>,
) -> Vec<(String, Option<String>)> {
    let mut placer = Placer::new(nodes, allocs);
    // One placement per job, of all its waiting allocs, in the order the first was given.
    let mut by_job: Vec<(&str, Vec<&AllocRecord>)> = Vec::new();
    let mut index_of: HashMap<&str, usize> = HashMap::default();
    for record in waiting {
        let job_id = record.alloc.job_id.as_str();
        let index = *index_of.entry(job_id).or_insert_with(|| {
            by_job.push((job_id, Vec::new()));
            by_job.len() - 1
        });
        by_job[index].1.push(record);
    }
    let mut chosen: HashMap<&str, Option<String>> = HashMap::default();
    for (job_id, records) in by_job {
        let nodes = match job_of(job_id) {
            Some(job) => placer.place(Ask::new(job, records.len())),
            None => vec![None; records.len()],
        };
        for (record, node) in records.into_iter().zip(nodes) {
            chosen.insert(record.alloc.id.as_str(), node);
        }
    }
    waiting
        .iter()
        .map(|record| {
            let node = chosen.remove(record.alloc.id.as_str()).flatten();
            (record.alloc.id.clone(), node)
        })
        .collect()
}

#[cfg(test)]
mod tests;

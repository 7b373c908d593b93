//! Fuzzing, bounded: mutated inputs into every parser a user or a guest can reach, asserting
//! that none panics and that the agent keeps answering.
//!
//! These are the fast, seeded regression set that `./run-tests` runs; the coverage-guided
//! targets of the same entry points are in `fuzz/` (`scripts/fuzz`, on a nightly compiler,
//! outside the test command). Each target here is a plain test: a seed corpus (`host/tests/fuzz-corpus/`, plus real records and components
//! made by the test), a deterministic mutator, and a fixed number of runs, so a failure
//! reproduces with the same command. `CARAVAN_FUZZ_RUNS=N` multiplies the runs for a longer
//! session and `CARAVAN_FUZZ_SEED=N` changes the sequence; a panicking input is written to
//! `target/fuzz-failures/` and named in the failure. Figures are in `docs/security.md`.

use crate::support::*;
use caravan_host::model::jobspec;
use caravan_host::model::structs::{Alloc, AllocState, ClientStatus};
use caravan_host::rpc::ServerApi;
use caravan_host::server::{EmbeddedServer, ServerConfig};
use caravan_host::state::{MemoryStateDb, ServerTable, StateDb, Write};
use caravan_test_artifacts::{MINIMAL, SLEEPER};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuzz-corpus");

/// Runs per target, times `CARAVAN_FUZZ_RUNS` (default 1).
pub(crate) fn runs(base: usize) -> usize {
    let factor = std::env::var("CARAVAN_FUZZ_RUNS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1);
    base * factor.max(1)
}

/// A small, fast, deterministic generator (xorshift64*): the same seed, the same inputs.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(target: &str) -> Rng {
        let seed = std::env::var("CARAVAN_FUZZ_SEED")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0x5eed);
        // Each target gets its own sequence from the one seed.
        let mixed = target.bytes().fold(seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        Rng(mixed | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Tokens that parsers of job files, JSON bodies and query strings treat specially.
const DICTIONARY: &[&str] = &[
    "\"",
    "'",
    "[",
    "]",
    "{",
    "}",
    "=",
    ":",
    ",",
    "\n",
    "\\",
    "\\u0000",
    "\u{0}",
    "\u{1b}",
    "-1",
    "0",
    "1e999",
    "18446744073709551616",
    "-9223372036854775809",
    "NaN",
    "inf",
    "null",
    "true",
    "\"\"",
    "[[job.tasks]]",
    "[job.limits]",
    "count",
    "memory",
    "99999999999GiB",
    "0s",
    "-5s",
    "1000000000000h",
    "type",
    "batch",
    "service",
    "runner",
    "%",
    "%00",
    "&",
    "?",
    "é",
    "\u{202e}",
];

/// One mutation of `input`: flip, overwrite, insert, delete, duplicate, splice or a token.
pub(crate) fn mutate(rng: &mut Rng, input: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] = [0, 0x7f, 0x80, 0xff, b'"', b'\n'][rng.below(6)];
            }
            2 => {
                let token = DICTIONARY[rng.below(DICTIONARY.len())].as_bytes();
                out.splice(at..at, token.iter().copied());
            }
            3 if !out.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            4 if !out.is_empty() => {
                let start = rng.below(out.len());
                let end = (start + 1 + rng.below(64)).min(out.len());
                let copy = out[start..end].to_vec();
                out.splice(at..at, copy);
            }
            5 if !others.is_empty() => {
                let other = &others[rng.below(others.len())];
                let start = rng.below(other.len() + 1);
                out.truncate(at);
                out.extend_from_slice(&other[start..]);
            }
            _ => {
                let random: Vec<u8> = (0..rng.below(8) + 1).map(|_| rng.next() as u8).collect();
                out.splice(at..at, random);
            }
        }
    }
    out
}

/// The seed files of one corpus directory.
fn corpus(name: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(CORPUS).join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read the corpus {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

/// Runs `check` on `input`, keeping the input on disk if it panics.
pub(crate) fn guarded(target: &str, run: usize, input: &[u8], check: impl FnOnce()) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check));
    if let Err(panic) = outcome {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-failures");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{target}-{run}"));
        std::fs::write(&path, input).unwrap();
        std::panic::resume_unwind(Box::new(format!(
            "{target}: run {run} panicked ({:?}); its input is in {}",
            panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or(panic.downcast_ref::<&str>().copied()),
            path.display()
        )));
    }
}

/// Valid inputs must parse (so the seeds are worth mutating); mutants must not panic.
fn fuzz_parser(target: &str, seeds: Vec<Vec<u8>>, base_runs: usize, parse: impl Fn(&str) -> bool) {
    let valid = seeds
        .iter()
        .filter(|seed| parse(&String::from_utf8_lossy(seed)))
        .count();
    assert!(valid > 0, "{target}: no seed parses; the corpus is stale");
    let mut rng = Rng::new(target);
    let (mut accepted, total) = (0, runs(base_runs));
    for run in 0..total {
        let seed = &seeds[rng.below(seeds.len())];
        let input = mutate(&mut rng, seed, &seeds);
        let text = String::from_utf8_lossy(&input).into_owned();
        guarded(target, run, &input, || {
            if parse(&text) {
                accepted += 1;
            }
        });
    }
    println!("{target}: {total} inputs, {accepted} accepted, no panic");
}

#[test]
fn fuzz_job_files_in_toml() {
    let mut seeds = corpus("jobspec-toml");
    for example in ["minimal", "sleeper", "stateful"] {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/{example}.toml"));
        seeds.push(std::fs::read(path).unwrap());
    }
    fuzz_parser("jobspec-toml", seeds, 5_000, |text| {
        jobspec::parse_toml(text).is_ok()
    });
}

#[test]
fn fuzz_job_documents_in_json() {
    fuzz_parser("jobspec-json", corpus("jobspec-json"), 5_000, |text| {
        jobspec::parse_json(text).is_ok()
    });
}

/// Every import a guest calls, with arbitrary arguments and in any order, on one alloc's real
/// import state (`testing::drive_host_imports`): nothing panics, and what the host keeps or
/// hands on stays within the alloc's limits. The coverage-guided target of the same driver
/// is `fuzz/fuzz_targets/host_imports.rs` (`scripts/fuzz`).
#[test]
fn fuzz_host_imports() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let mut rng = Rng::new("host-imports");
    let (mut calls, mut refusals, mut lines, total) = (0, 0, 0, runs(10_000));
    for run in 0..total {
        let input: Vec<u8> = (0..rng.below(2048)).map(|_| rng.next() as u8).collect();
        guarded("host-imports", run, &input, || {
            let drive = runtime.block_on(caravan_host::testing::drive_host_imports(&input));
            calls += drive.calls;
            refusals += drive.refusals;
            lines += drive.lines_logged;
        });
    }
    println!(
        "host-imports: {total} inputs, {calls} calls, {refusals} refused, {lines} guest lines \
         logged, no panic"
    );
    assert!(
        refusals > 0 && calls > refusals && lines > 0,
        "{calls} calls, {refusals} refused, {lines} lines: the inputs miss part of the imports"
    );
}

/// Real server records (a job and its allocs on a node), each mutated in turn, then loaded.
#[tokio::test]
async fn fuzz_saved_server_records() {
    let db = Arc::new(MemoryStateDb::new());
    let server = EmbeddedServer::open(ServerConfig::default(), db.clone()).unwrap();
    server
        .register_node("fuzz-node", &Default::default())
        .await
        .unwrap();
    for seed in corpus("jobspec-toml") {
        if let Ok(mut spec) = jobspec::parse_toml(&String::from_utf8_lossy(&seed)) {
            spec.runner = SLEEPER.into();
            let _ = server.register_job(spec);
        }
    }
    let tables = [ServerTable::Jobs, ServerTable::Allocs, ServerTable::Meta];
    let records: Vec<(ServerTable, String, Vec<u8>)> = tables
        .iter()
        .flat_map(|&table| {
            db.server_records(table)
                .unwrap()
                .into_iter()
                .map(move |(key, value)| (table, key, value))
        })
        .collect();
    assert!(
        records.len() >= 3,
        "the seed server saved too little: {records:?}"
    );
    let values: Vec<Vec<u8>> = records.iter().map(|(_, _, v)| v.clone()).collect();
    let mut rng = Rng::new("server-records");
    let (mut opened, total) = (0, runs(400));
    for run in 0..total {
        let target = rng.below(records.len());
        let copy = Arc::new(MemoryStateDb::new());
        let mut mutated = Vec::new();
        for (i, (table, key, value)) in records.iter().enumerate() {
            let value = if i == target {
                mutated = mutate(&mut rng, value, &values);
                mutated.clone()
            } else {
                value.clone()
            };
            copy.apply(vec![Write::PutServer {
                table: *table,
                key: key.clone(),
                value,
            }])
            .unwrap();
        }
        guarded("server-records", run, &mutated, || {
            if let Ok(server) = EmbeddedServer::open(ServerConfig::default(), copy) {
                opened += 1;
                for job in server.jobs() {
                    let _ = server.job_allocs(&job.spec.id);
                }
                let _ = server.collect_garbage(true);
            }
        });
    }
    println!("server-records: {total} inputs, {opened} opened, no panic");
}

/// The client's own records (an alloc with limits and capabilities, its state, its
/// acknowledged state), one mutated in turn, then restored by a real client with the wasm
/// runtime beside an intact alloc: the mutant is refused or runs, the intact one runs, and
/// nothing panics, in the restore or in a runner it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_saved_client_records() {
    let _logs = LogCapture::start();
    let mut alloc = alloc(MINIMAL, &["main", "side"], &[("log_every", "1s")]);
    alloc.limits.memory_bytes = Some(32 << 20);
    alloc.limits.cpu_share = Some(50);
    alloc.limits.kill_timeout = Some(std::time::Duration::from_secs(1));
    let intact = Alloc {
        id: "intact".into(),
        ..alloc.clone()
    };
    let mut state = AllocState::failed("a description");
    state.client_status = ClientStatus::Running;
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        ("alloc", serde_json::to_vec(&alloc).unwrap()),
        ("state", serde_json::to_vec(&state).unwrap()),
        ("acked", serde_json::to_vec(&state).unwrap()),
    ];
    let others: Vec<Vec<u8>> = seeds.iter().map(|(_, bytes)| bytes.clone()).collect();
    let server = caravan_host::testing::InMemoryServer::new();
    let mut rng = Rng::new("client-records");
    let (mut restored, total) = (0, runs(400));
    for run in 0..total {
        let (record, seed) = &seeds[rng.below(seeds.len())];
        let input = mutate(&mut rng, seed, &others);
        let db = Arc::new(MemoryStateDb::new());
        let mut writes = Vec::new();
        for alloc in [&alloc, &intact] {
            writes.push(Write::PutAlloc(Arc::new(alloc.clone())));
            for acked in [false, true] {
                writes.push(match acked {
                    false => Write::PutAllocState {
                        alloc_id: alloc.id.clone(),
                        state: state.clone().into(),
                    },
                    true => Write::PutAckedState {
                        alloc_id: alloc.id.clone(),
                        state: state.clone().into(),
                    },
                });
            }
        }
        db.apply(writes).unwrap();
        db.garble_client_record(&alloc.id, record, &input);
        let data_dir = tempfile::tempdir().unwrap();
        let client = wasm_client(data_dir.path(), server.clone(), db);
        // Restored in a task of its own, so a panic is caught as the task's, with its input.
        let restoring = client.clone();
        let restore = tokio::spawn(async move { restoring.restore().await });
        let outcome = restore.await;
        guarded("client-records", run, &input, || {
            assert!(outcome.expect("the restore panicked").is_ok());
        });
        let runners: Vec<_> = client
            .alloc_ids()
            .iter()
            .filter_map(|id| client.runner(id))
            .collect();
        assert!(client.runner("intact").is_some(), "the intact alloc runs");
        restored += usize::from(runners.len() == 2);
        // A runner task that panicked would never stop.
        for runner in runners {
            runner.shutdown();
            within("a restored runner to stop", runner.wait().wait()).await;
        }
    }
    println!("client-records: {total} inputs, {restored} restored both allocs, no panic");
}

/// Mutated bytes of a real component, then arbitrary bytes: refused or loaded, never a panic.
#[test]
fn fuzz_component_loading() {
    let runtime = runtime();
    let seed = std::fs::read(MINIMAL).unwrap();
    let mut rng = Rng::new("component");
    let (mut loaded, total) = (0, runs(150));
    for run in 0..total {
        let input = if run % 10 == 9 {
            (0..rng.below(256)).map(|_| rng.next() as u8).collect()
        } else {
            // Few mutations: most inputs should get past the header to wasmtime's validator.
            let mut input = seed.clone();
            for _ in 0..=rng.below(3) {
                let at = rng.below(input.len());
                input[at] = rng.next() as u8;
            }
            input
        };
        guarded("component", run, &input, || {
            if runtime.load_bytes(Path::new("fuzzed.wasm"), &input).is_ok() {
                loaded += 1;
            }
        });
    }
    println!("component: {total} inputs, {loaded} loaded, no panic");
}

/// Every API body and query string, mutated, against one real agent: never a 5xx, and the
/// agent still answers its health check after all of them.
#[tokio::test]
async fn fuzz_http_bodies_and_queries() {
    let _logs = LogCapture::start();
    let (agent, _data_dir) = agent(|_| {}).await;
    let bodies = corpus("http-bodies");
    let queries = corpus("http-queries");
    let body_paths = [
        ("POST", "/v1/jobs"),
        ("POST", "/v1/client/allocation/nope/signal"),
        ("POST", "/v1/client/allocation/nope/restart"),
        ("POST", "/v1/job/nope/scale"),
    ];
    let query_paths = [
        "/v1/jobs",
        "/v1/allocations",
        "/v1/job/nope",
        "/v1/client/allocation/nope/logs",
        "/v1/agent/health",
    ];
    let mut rng = Rng::new("http");
    let mut statuses = std::collections::BTreeMap::new();
    let total = runs(600);
    for run in 0..total {
        let (method, path, body) = if run % 2 == 0 {
            let (method, path) = body_paths[rng.below(body_paths.len())];
            let seed = &bodies[rng.below(bodies.len())];
            let body = String::from_utf8_lossy(&mutate(&mut rng, seed, &bodies)).into_owned();
            // A mutant may be a valid job of up to 100,000 allocs: worth parsing, not placing.
            if jobspec::parse_json(&body).is_ok_and(|spec| spec.count > 5) {
                continue;
            }
            (method, path.to_string(), Some(body))
        } else {
            let seed = &queries[rng.below(queries.len())];
            let query: String = String::from_utf8_lossy(&mutate(&mut rng, seed, &queries))
                .chars()
                .filter(|c| c.is_ascii_graphic())
                .collect();
            let path = query_paths[rng.below(query_paths.len())];
            ("GET", format!("{path}?{query}"), None)
        };
        let (status, answer) = raw_request(agent.addr, method, &path, body.as_deref()).await;
        *statuses.entry(status).or_insert(0) += 1;
        assert!(
            status < 500,
            "run {run}: {method} {path} with {body:?} answered {status}: {answer}"
        );
    }
    let (health, _) = http(agent.addr, "GET", "/v1/agent/health", None, None).await;
    assert_eq!(health, 200);
    println!("http: {total} requests, statuses {statuses:?}, no 5xx");
    agent.stop().await;
}

/// One request written byte for byte over a fresh connection, and the status and text of
/// the answer (its framing left in): a fuzzed path may hold what an HTTP client refuses to
/// send (a quote, a space), and the agent must still answer it with no 5xx.
async fn raw_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = within(&format!("{method} {path}"), async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("the agent accepts connections");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    (status, answer)
}

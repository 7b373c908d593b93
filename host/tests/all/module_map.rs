//! The host crate's rooms and their one-way doors, as the README's architecture map draws
//! them, checked against the code: every top-level module has a level, a module uses only
//! modules of lower levels (so no two use each other and nothing uses what is above it), and
//! a new module fails this test until it is given its place here and in the map.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of `host/src` and its level: a module may use only modules of a
/// lower level. Same order as the README's map, from the top.
const LEVELS: &[(&str, u32)] = &[
    ("cli", 8),
    ("agent", 7),
    ("nodesim", 6),
    ("run", 6),
    ("check", 6),
    ("cluster", 5),
    ("runtime", 5),
    ("client", 4),
    ("server", 4),
    ("acl", 3),
    ("allocrunner", 3),
    ("runner_store", 3),
    ("state", 2),
    ("rpc", 2),
    ("alloc_logs", 2),
    ("telemetry", 2),
    ("model", 1),
    ("util", 0),
    ("alloc_fs", 0),
    ("shutdown", 0),
    ("scaffold", 0),
    ("tls", 0),
];

/// Test tools (feature `testing`): any room's tests may use them, and they may use any room;
/// no production path reaches them.
const TEST_TOOLS: &str = "testing";

/// Every `.rs` file of `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The top-level modules `text` names as `crate::NAME`, outside comments (a doc link is not
/// a door).
fn used_modules(text: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            // `crate::{a::X, b}` names several, on one line (rustfmt's way when it fits).
            let names = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
                None => vec![rest],
            };
            for name in names {
                let name: String = name
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != "self" {
                    used.insert(name);
                }
            }
        }
    }
    used
}

/// Each top-level module of `host/src` and the top-level modules its code uses.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || name == "main" {
            continue;
        }
        let files = if path.is_dir() {
            sources(&path)
        } else {
            vec![path.clone()]
        };
        let uses = graph.entry(name.clone()).or_default();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            uses.extend(used_modules(&text).into_iter().filter(|m| *m != name));
        }
    }
    graph
}

#[test]
fn every_module_uses_only_modules_below_it() {
    let graph = module_graph();
    let levels: BTreeMap<&str, u32> = LEVELS.iter().copied().collect();
    let mut wrong = Vec::new();
    for (module, uses) in &graph {
        if module == TEST_TOOLS {
            continue;
        }
        let Some(&level) = levels.get(module.as_str()) else {
            wrong.push(format!(
                "{module} has no level: give it one in LEVELS and a line in the README's map"
            ));
            continue;
        };
        for used in uses {
            if used == TEST_TOOLS || !graph.contains_key(used) {
                continue;
            }
            let used_level = levels.get(used.as_str()).copied().unwrap_or(u32::MAX);
            if used_level >= level {
                wrong.push(format!(
                    "{module} (level {level}) uses {used} (level {used_level}): a door pointing up or sideways"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_two_modules_use_each_other() {
    let graph = module_graph();
    let mut pairs = Vec::new();
    for (module, uses) in &graph {
        for used in uses {
            // The test tools are the one room both ways: rooms' tests use them, and they
            // drive the rooms (the simulator runs the client and the server).
            if module == TEST_TOOLS || used == TEST_TOOLS {
                continue;
            }
            if module < used && graph.get(used).is_some_and(|back| back.contains(module)) {
                pairs.push(format!("{module} <-> {used}"));
            }
        }
    }
    assert!(pairs.is_empty(), "{}", pairs.join("\n"));
}

#[test]
fn the_reader_of_uses_sees_code_and_not_comments() {
    let text = "use crate::model::structs;\n/// see [`crate::runtime::Runtime`]\nlet x = crate::util::text::cut(a, 1); // crate::agent\nuse crate::{rpc::X, state};\n";
    let used: Vec<String> = used_modules(text).into_iter().collect();
    assert_eq!(used, ["model", "rpc", "state", "util"]);
}

/// The runtime's rooms and their levels, as its module docs draw them.
const RUNTIME_LEVELS: &[(&str, u32)] = &[
    ("runner", 3),
    ("component", 2),
    ("imports", 1),
    ("sandbox", 0),
];

/// Each file of `host/src/runtime` by its module path under it (`sandbox::disk_ledger`,
/// `runner::wasm_runner::restarts`), and the runtime modules its code names: through
/// `crate::runtime::...`, or a sibling through `super::`.
fn runtime_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/runtime");
    let module_of = |path: &Path| -> String {
        let relative = path.strip_prefix(&root).unwrap().with_extension("");
        let parts: Vec<String> = relative
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .filter(|p| p != "mod")
            .collect();
        parts.join("::")
    };
    let files: Vec<PathBuf> = sources(&root);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let module = module_of(file);
        let parent = module.rsplit_once("::").map_or("", |(parent, _)| parent);
        let text = std::fs::read_to_string(file).unwrap();
        let mut uses = BTreeSet::new();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for (marker, base) in [
                ("crate::runtime::", String::new()),
                ("super::", parent.to_string()),
            ] {
                let mut rest = code;
                while let Some(at) = rest.find(marker) {
                    rest = &rest[at + marker.len()..];
                    let path: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    // The longest known module the path starts with.
                    let mut named = base.clone();
                    let mut found = None;
                    for segment in path.split("::").filter(|s| !s.is_empty()) {
                        named = if named.is_empty() {
                            segment.to_string()
                        } else {
                            format!("{named}::{segment}")
                        };
                        if modules.contains(&named) {
                            found = Some(named.clone());
                        }
                    }
                    if let Some(found) = found.filter(|f| *f != module) {
                        uses.insert(found);
                    }
                }
            }
        }
        graph.insert(module, uses);
    }
    graph
}

#[test]
fn the_runtimes_rooms_use_only_rooms_below_them_and_no_two_files_use_each_other() {
    let graph = runtime_graph();
    let levels: BTreeMap<&str, u32> = RUNTIME_LEVELS.iter().copied().collect();
    let room = |module: &str| module.split("::").next().unwrap_or("").to_string();
    let mut wrong = Vec::new();
    for (module, uses) in &graph {
        // The facade (`mod.rs` at the root) wires every room.
        let Some(&level) = levels
            .get(room(module).as_str())
            .filter(|_| !module.is_empty())
        else {
            if !module.is_empty() {
                wrong.push(format!("{module} is in no room of RUNTIME_LEVELS"));
            }
            continue;
        };
        for used in uses {
            let used_room = room(used);
            if used_room == room(module) {
                continue;
            }
            let used_level = levels.get(used_room.as_str()).copied().unwrap_or(u32::MAX);
            if used_level >= level {
                wrong.push(format!(
                    "{module} uses {used}: a door pointing up or sideways"
                ));
            }
        }
        for used in uses {
            // A parent and its child may use each other (the child is the parent's room).
            let related = used.starts_with(&format!("{module}::"))
                || module.starts_with(&format!("{used}::"));
            if !related && module < used && graph.get(used).is_some_and(|u| u.contains(module)) {
                wrong.push(format!("{module} <-> {used}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

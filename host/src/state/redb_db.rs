//! [`RedbStateDb`]: the durable [`StateDb`], one redb file under the data dir.
//!
//! Opening is where an operator's data is most at risk, so it refuses rather than guesses:
//! - a file that is not a redb database (wrong magic) or is shorter than its own header says
//!   (truncated) is refused before redb opens it, because redb would otherwise try to repair
//!   it in place (or assert);
//! - the schema version is read through a read-only open first, so a newer file is refused
//!   without a byte written to it;
//! - an older schema is upgraded only after a backup copy is written beside the file.
//!
//! A file left by a crash (`kill -9`) is normal: redb repairs its allocator state on open, and
//! every committed batch is there. The repair is tried on a copy first, so a crashed file that
//! turns out to be refused is still untouched.
//!
//! What this may touch: the state file, its backup, and a temporary copy beside them.

use super::{SCHEMA_VERSION, SavedAlloc, ServerTable, StateDb, StateError, Table, Write};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The state file's name under the data dir (Nomad's name for the same file).
pub const STATE_FILE: &str = "state.db";

/// Holds the schema version under [`VERSION_KEY`].
const META: TableDefinition<&str, u32> = TableDefinition::new("caravan_meta");
const VERSION_KEY: &str = "schema_version";

/// Upgrades the store by one schema version, inside the upgrade's write transaction.
type Migration = fn(&redb::WriteTransaction) -> Result<(), redb::Error>;

/// `MIGRATIONS[n]` upgrades schema version `n + 1` to `n + 2`. Empty while version 1 is the
/// only one that ever shipped.
const MIGRATIONS: &[Migration] = &[];

/// redb's read cache; state is small, and the default (1 GiB) is sized for databases.
const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// The durable store.
pub struct RedbStateDb {
    db: redb::Database,
    path: PathBuf,
}

fn table_def(table: Table) -> TableDefinition<'static, &'static str, &'static [u8]> {
    TableDefinition::new(table.name())
}

fn io(error: impl std::fmt::Display) -> StateError {
    StateError::Io(error.to_string())
}

impl RedbStateDb {
    /// Opens `<data_dir>/state.db`, creating it when missing (see the module docs for what is
    /// refused).
    pub fn open(data_dir: &Path) -> Result<RedbStateDb, StateError> {
        open_with(&data_dir.join(STATE_FILE), SCHEMA_VERSION, MIGRATIONS)
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Every row of `table` as of the read transaction `read`.
fn rows_in(
    read: &redb::ReadTransaction,
    table: Table,
) -> Result<Vec<(String, Vec<u8>)>, StateError> {
    let table = match read.open_table(table_def(table)) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(error) => return Err(io(error)),
    };
    let mut rows = Vec::with_capacity(table.len().map_err(io)? as usize);
    for row in table.iter().map_err(io)? {
        let (key, value) = row.map_err(io)?;
        rows.push((key.value().to_string(), value.value().to_vec()));
    }
    Ok(rows)
}

fn refused(path: &Path, reason: impl Into<String>) -> StateError {
    StateError::Refused {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// Opens `path` for schema `version`, upgrading older files with `migrations`.
fn open_with(
    path: &Path,
    version: u32,
    migrations: &[Migration],
) -> Result<RedbStateDb, StateError> {
    let mut builder = redb::Builder::new();
    builder.set_cache_size(CACHE_BYTES);
    // An empty file holds nothing to lose: a crash in the instant between creating the file
    // and redb's first write leaves one.
    let fresh = match std::fs::metadata(path) {
        Ok(meta) => meta.len() == 0,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => true,
        Err(error) => {
            return Err(refused(
                path,
                format!("cannot read the state store: {error}"),
            ));
        }
    };
    if fresh {
        let db = guarded_open(path, || builder.create(path))?;
        write_version(&db, version)?;
        return Ok(RedbStateDb {
            db,
            path: path.to_path_buf(),
        });
    }
    check_header(path)?;
    let found = match probe_version(path) {
        Ok(found) => found?,
        Err(NeedsRepair) => probe_version_after_crash(path, &builder)?,
    };
    match found {
        Some(0) => {
            return Err(refused(
                path,
                "schema version 0 is not one any Caravan wrote",
            ));
        }
        Some(found) if found > version => {
            return Err(refused(
                path,
                format!(
                    "schema version {found} is newer than this build supports ({version}); \
                     run the caravan that wrote it, or move the file away to start empty"
                ),
            ));
        }
        Some(found) if found < version => {
            let backup = backup_path(path, found);
            std::fs::copy(path, &backup)
                .and_then(|_| std::fs::File::open(&backup)?.sync_all())
                .map_err(|e| {
                    refused(
                        path,
                        format!("cannot write the backup {}: {e}", backup.display()),
                    )
                })?;
            tracing::info!(from = found, to = version, backup = %backup.display(), "upgrading the state store");
            let db = guarded_open(path, || builder.open(path))?;
            migrate(&db, found, version, migrations).map_err(|e| {
                refused(
                    path,
                    format!(
                        "upgrade from schema version {found} failed: {e}; the backup is {}",
                        backup.display()
                    ),
                )
            })?;
            return Ok(RedbStateDb {
                db,
                path: path.to_path_buf(),
            });
        }
        Some(_) => {}
        None => {
            return Err(refused(
                path,
                "a redb database, but not a Caravan state store (it has no schema version)",
            ));
        }
    }
    let db = guarded_open(path, || builder.open(path))?;
    Ok(RedbStateDb {
        db,
        path: path.to_path_buf(),
    })
}

/// The backup written before upgrading from `version`.
pub fn backup_path(path: &Path, version: u32) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".v{version}.backup"));
    path.with_file_name(name)
}

/// Reads the schema version of a file left by a crash. redb repairs such a file on open,
/// which writes to it; so the repair is done on a copy first, and the file itself is opened
/// (and repaired) only once the copy shows it is a store this build may use.
fn probe_version_after_crash(
    path: &Path,
    builder: &redb::Builder,
) -> Result<Option<u32>, StateError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let cannot_copy = |e: std::io::Error| {
        refused(
            path,
            format!("cannot copy the state store to check it: {e}"),
        )
    };
    let copy = tempfile::Builder::new()
        .prefix(".state-probe-")
        .tempfile_in(dir)
        .map_err(cannot_copy)?;
    std::fs::copy(path, copy.path()).map_err(cannot_copy)?;
    drop(guarded_open(path, || builder.open(copy.path()))?);
    probe_version(copy.path())
        .map_err(|NeedsRepair| refused(path, "the state store cannot be repaired"))?
}

/// redb asserts on some damaged files instead of returning an error; turn that into a refusal
/// so a bad file is reported, not a crash.
fn guarded_open(
    path: &Path,
    open: impl FnOnce() -> Result<redb::Database, redb::DatabaseError>,
) -> Result<redb::Database, StateError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(open)) {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(error)) => Err(open_refusal(path, error)),
        Err(_) => Err(refused(path, "not a readable state store (damaged)")),
    }
}

fn open_refusal(path: &Path, error: redb::DatabaseError) -> StateError {
    match error {
        redb::DatabaseError::DatabaseAlreadyOpen => refused(
            path,
            "the state store is in use by another process (is another agent running on this data dir?)",
        ),
        error => refused(path, format!("not a readable state store: {error}")),
    }
}

/// redb's file header (format version 3): magic, then the page size and region layout, from
/// which the file's expected length follows.
const MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
const HEADER_BYTES: usize = 320;

/// Refuses a file that is not a redb database, or is shorter than its header says.
fn check_header(path: &Path) -> Result<(), StateError> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| refused(path, format!("cannot read the state store: {e}")))?;
    let len = file
        .metadata()
        .map_err(|e| refused(path, e.to_string()))?
        .len();
    let mut header = [0u8; HEADER_BYTES];
    if file.read_exact(&mut header).is_err() || header[..MAGIC.len()] != MAGIC {
        return Err(refused(
            path,
            format!("not a Caravan state store ({len} bytes that are not a redb database)"),
        ));
    }
    let field = |at: usize| u64::from(u32::from_le_bytes(header[at..at + 4].try_into().unwrap()));
    let (page, region_header_pages, region_data_pages) = (field(12), field(16), field(20));
    let (full_regions, trailing_pages) = (field(24), field(28));
    // Each field is a u32, so only a damaged header overflows a u64; checked arithmetic turns
    // that into a refusal.
    let full_region = (region_header_pages + region_data_pages).checked_mul(page);
    let trailing = (region_header_pages + trailing_pages).checked_mul(page);
    let expected = match (full_regions, trailing_pages) {
        (0, 0) => None,
        (full, 0) => full_region
            .and_then(|r| r.checked_mul(full))
            .and_then(|r| r.checked_add(page)),
        (full, _) => full_region
            .and_then(|r| r.checked_mul(full))
            .and_then(|r| r.checked_add(trailing?))
            .and_then(|r| r.checked_add(page)),
    };
    match expected {
        Some(expected) if page > 0 && len < expected => Err(refused(
            path,
            format!("truncated: the file is {len} bytes, its header says {expected}"),
        )),
        Some(_) if page > 0 => Ok(()),
        _ => Err(refused(
            path,
            "not a Caravan state store (its header is damaged)",
        )),
    }
}

struct NeedsRepair;

/// Reads the schema version without writing a byte: `Ok(None)` when there is none.
fn probe_version(path: &Path) -> Result<Result<Option<u32>, StateError>, NeedsRepair> {
    let opened = std::panic::catch_unwind(|| redb::Builder::new().open_read_only(path));
    let db = match opened {
        Ok(Ok(db)) => db,
        Ok(Err(redb::DatabaseError::RepairAborted)) => return Err(NeedsRepair),
        Ok(Err(error)) => return Ok(Err(open_refusal(path, error))),
        Err(_) => return Ok(Err(refused(path, "not a readable state store (damaged)"))),
    };
    let version = (|| {
        let read = db.begin_read().map_err(io)?;
        match read.open_table(META) {
            Ok(meta) => Ok(meta.get(VERSION_KEY).map_err(io)?.map(|v| v.value())),
            Err(redb::TableError::TableDoesNotExist(_)) => {
                // An empty file redb initialised: a crash before our first commit.
                let tables = read.list_tables().map_err(io)?.count();
                Ok((tables == 0).then_some(SCHEMA_VERSION))
            }
            Err(error) => Err(io(error)),
        }
    })();
    Ok(version.map_err(|e| refused(path, format!("not a readable state store: {e}"))))
}

fn write_version(db: &redb::Database, version: u32) -> Result<(), StateError> {
    let write = db.begin_write().map_err(io)?;
    {
        let mut meta = write.open_table(META).map_err(io)?;
        meta.insert(VERSION_KEY, version).map_err(io)?;
    }
    write.commit().map_err(io)
}

fn migrate(
    db: &redb::Database,
    from: u32,
    to: u32,
    migrations: &[Migration],
) -> Result<(), StateError> {
    let write = db.begin_write().map_err(io)?;
    for version in from..to {
        let migration = migrations
            .get(version as usize - 1)
            .ok_or_else(|| io(format!("no migration from schema version {version}")))?;
        migration(&write).map_err(io)?;
    }
    {
        let mut meta = write.open_table(META).map_err(io)?;
        meta.insert(VERSION_KEY, to).map_err(io)?;
    }
    write.commit().map_err(io)
}

/// A key and its new value (`None`: delete), within one table.
type RowChangeInTable = (String, Option<Vec<u8>>);

impl StateDb for RedbStateDb {
    fn reads_back_saved_state(&self) -> bool {
        true
    }

    fn apply(&self, writes: Vec<Write>) -> Result<(), StateError> {
        // Rows grouped by table, each table's rows in order: one open per table per batch.
        let mut by_table: BTreeMap<Table, Vec<RowChangeInTable>> = BTreeMap::new();
        for (table, key, value) in super::rows_of(writes) {
            by_table
                .entry(table)
                .or_default()
                .push((key, value.map(super::RowValue::into_bytes)));
        }
        let write = self.db.begin_write().map_err(io)?;
        for (table, rows) in by_table {
            let mut table = write.open_table(table_def(table)).map_err(io)?;
            for (key, value) in rows {
                match value {
                    Some(value) => table.insert(key.as_str(), value.as_slice()).map(|_| ()),
                    None => table.remove(key.as_str()).map(|_| ()),
                }
                .map_err(io)?;
            }
        }
        write.commit().map_err(io)
    }

    fn client_allocs(&self) -> Result<Vec<SavedAlloc>, StateError> {
        // One read transaction for every table: one consistent snapshot.
        let read = self.db.begin_read().map_err(io)?;
        super::assemble_client_allocs(|table| rows_in(&read, table))
    }

    fn server_records(&self, table: ServerTable) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        let read = self.db.begin_read().map_err(io)?;
        rows_in(&read, Table::Server(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::structs::AllocState;

    fn state_write(id: &str) -> Write {
        Write::PutAllocState {
            alloc_id: id.into(),
            state: AllocState::pending().into(),
        }
    }

    #[test]
    fn an_older_schema_is_backed_up_then_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        let v1 = open_with(&path, 1, &[]).unwrap();
        v1.apply(vec![state_write("a")]).unwrap();
        drop(v1);
        let before = std::fs::read(&path).unwrap();

        fn add_marker(write: &redb::WriteTransaction) -> Result<(), redb::Error> {
            let mut meta = write.open_table(META)?;
            meta.insert("migrated_to_2", 1)?;
            Ok(())
        }
        let v2 = open_with(&path, 2, &[add_marker]).unwrap();

        assert_eq!(std::fs::read(backup_path(&path, 1)).unwrap(), before);
        let read = v2.db.begin_read().unwrap();
        let meta = read.open_table(META).unwrap();
        assert_eq!(meta.get(VERSION_KEY).unwrap().unwrap().value(), 2);
        assert!(meta.get("migrated_to_2").unwrap().is_some());
        assert_eq!(v2.client_allocs().unwrap().len(), 1, "data kept");
    }

    #[test]
    fn a_file_in_use_by_another_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = RedbStateDb::open(dir.path()).unwrap();
        let error = RedbStateDb::open(dir.path()).err().expect("refused");
        assert!(error.to_string().contains("in use"), "{error}");
    }
}

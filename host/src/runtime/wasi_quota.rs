//! The alloc directory's quota at the write: the host's own layer over wasmtime-wasi's
//! `wasi:filesystem/types`.
//!
//! Every call that can add bytes or entries is shadowed in the linker by one that first
//! reserves them in the alloc's [`DiskLedger`], then hands the call to wasmtime-wasi's own
//! implementation: `descriptor.write`, `set-size` (the growth), `open-at` with `create`,
//! `create-directory-at`, `symlink-at` and `link-at`. Streams a guest opens on a file
//! (`write-via-stream`, `append-via-stream`) are wrapped so each write through them reserves
//! too. A reservation past the quota fails in the guest with `insufficient-space` (`ENOSPC`)
//! and reports the limit, which ends the run with the alloc described as over its quota; a
//! call that fails after reserving gives the reservation back.
//!
//! Only the accounting is ours: paths, permissions and the writes themselves stay
//! wasmtime-wasi's. This module touches nothing but the store's WASI state and its ledger.

use super::StoreData;
use super::disk_ledger::{DiskLedger, DiskUse};
use bytes::Bytes;
use std::sync::Arc;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self as fs, DescriptorFlags, ErrorCode, HostDescriptor, OpenFlags, PathFlags,
};
use wasmtime_wasi::p2::{
    DynOutputStream, FsResult, OutputStream, Pollable, StreamError, StreamResult,
};

/// The interface shadowed, at the version wasmtime-wasi defines it (a guest importing any
/// `0.2.x` is linked to it). A wasmtime upgrade that moves it fails the runtime's start, and
/// the disk-fill test says so, rather than silently losing the quota.
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// What a shadowed call returns to the guest.
type WitResult<T> = wasmtime::Result<(Result<T, ErrorCode>,)>;

/// Shadows the calls that add to an alloc directory; call after wasmtime-wasi's
/// `add_to_linker_async`.
pub(super) fn add_to_linker(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.write",
        |mut store, (fd, buffer, offset): (Resource<Descriptor>, Vec<u8>, u64)| {
            Box::new(async move {
                let data = store.data_mut();
                let bytes = buffer.len() as u64;
                let reserved = DiskUse { bytes, entries: 0 };
                if data.disk.reserve_bytes(bytes).is_err() {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let ledger = data.disk.clone();
                let mut view = filesystem(data);
                let written = HostDescriptor::write(&mut view, fd, buffer, offset).await;
                if written.is_err() {
                    ledger.release(reserved);
                }
                to_wit(&mut view, written)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.set-size",
        |mut store, (fd, size): (Resource<Descriptor>, u64)| {
            Box::new(async move {
                let data = store.data_mut();
                let ledger = data.disk.clone();
                let mut view = filesystem(data);
                let current = HostDescriptor::stat(&mut view, borrow(&fd)).await;
                let growth = match current {
                    Ok(stat) => size.saturating_sub(stat.size),
                    Err(error) => return to_wit(&mut view, Err(error)),
                };
                if ledger.reserve_bytes(growth).is_err() {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let resized = HostDescriptor::set_size(&mut view, fd, size).await;
                if resized.is_err() {
                    ledger.release(DiskUse {
                        bytes: growth,
                        entries: 0,
                    });
                }
                to_wit(&mut view, resized)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.write-via-stream",
        |mut store, (fd, offset): (Resource<Descriptor>, u64)| {
            Box::new(async move {
                let data = store.data_mut();
                let ledger = data.disk.clone();
                let mut view = filesystem(data);
                let stream = match HostDescriptor::write_via_stream(&mut view, fd, offset) {
                    Ok(stream) => metered(&mut view, stream, ledger),
                    Err(error) => Err(error),
                };
                to_wit(&mut view, stream)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.append-via-stream",
        |mut store, (fd,): (Resource<Descriptor>,)| {
            Box::new(async move {
                let data = store.data_mut();
                let ledger = data.disk.clone();
                let mut view = filesystem(data);
                let stream = match HostDescriptor::append_via_stream(&mut view, fd) {
                    Ok(stream) => metered(&mut view, stream, ledger),
                    Err(error) => Err(error),
                };
                to_wit(&mut view, stream)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store,
         (fd, path_flags, path, open_flags, flags): (
            Resource<Descriptor>,
            PathFlags,
            String,
            OpenFlags,
            DescriptorFlags,
        )| {
            Box::new(async move {
                let data = store.data_mut();
                let creates = open_flags.contains(OpenFlags::CREATE);
                if creates && data.disk.reserve_entry().is_err() {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let ledger = data.disk.clone();
                let mut view = filesystem(data);
                let opened =
                    HostDescriptor::open_at(&mut view, fd, path_flags, path, open_flags, flags)
                        .await;
                if creates && opened.is_err() {
                    ledger.release(ONE_ENTRY);
                }
                to_wit(&mut view, opened)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.create-directory-at",
        |mut store, (fd, path): (Resource<Descriptor>, String)| {
            Box::new(async move {
                let data = store.data_mut();
                if data.disk.reserve_entry().is_err() {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let ledger = data.disk.clone();
                let mut view = filesystem(data);
                let made = HostDescriptor::create_directory_at(&mut view, fd, path).await;
                if made.is_err() {
                    ledger.release(ONE_ENTRY);
                }
                to_wit(&mut view, made)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.symlink-at",
        |mut store, (fd, old_path, new_path): (Resource<Descriptor>, String, String)| {
            Box::new(async move {
                let data = store.data_mut();
                if data.disk.reserve_entry().is_err() {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let ledger = data.disk.clone();
                let mut view = filesystem(data);
                let made = HostDescriptor::symlink_at(&mut view, fd, old_path, new_path).await;
                if made.is_err() {
                    ledger.release(ONE_ENTRY);
                }
                to_wit(&mut view, made)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.link-at",
        |mut store,
         (fd, old_flags, old_path, new_fd, new_path): (
            Resource<Descriptor>,
            PathFlags,
            String,
            Resource<Descriptor>,
            String,
        )| {
            Box::new(async move {
                let data = store.data_mut();
                if data.disk.reserve_entry().is_err() {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let ledger = data.disk.clone();
                let mut view = filesystem(data);
                let made =
                    HostDescriptor::link_at(&mut view, fd, old_flags, old_path, new_fd, new_path)
                        .await;
                if made.is_err() {
                    ledger.release(ONE_ENTRY);
                }
                to_wit(&mut view, made)
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

const ONE_ENTRY: DiskUse = DiskUse {
    bytes: 0,
    entries: 1,
};

fn filesystem(data: &mut StoreData) -> WasiFilesystemCtxView<'_> {
    WasiFilesystemCtxView {
        ctx: data.wasi.filesystem(),
        table: &mut data.table,
    }
}

/// A second handle to the same descriptor, for a call made before the one that takes it.
fn borrow(fd: &Resource<Descriptor>) -> Resource<Descriptor> {
    Resource::new_borrow(fd.rep())
}

/// An `FsResult` as the guest receives it: wasmtime-wasi's error code, or a trap.
fn to_wit<T>(view: &mut WasiFilesystemCtxView<'_>, result: FsResult<T>) -> WitResult<T> {
    match result {
        Ok(value) => Ok((Ok(value),)),
        Err(error) => Ok((Err(fs::Host::convert_error_code(view, error)?),)),
    }
}

/// Replaces the file stream `stream` in the table with one that reserves each write in
/// `ledger`.
fn metered(
    view: &mut WasiFilesystemCtxView<'_>,
    stream: Resource<DynOutputStream>,
    ledger: Arc<DiskLedger>,
) -> FsResult<Resource<DynOutputStream>> {
    let inner = view.table.delete(stream)?;
    let metered: DynOutputStream = Box::new(MeteredStream { inner, ledger });
    Ok(view.table.push(metered)?)
}

/// A file stream whose writes are reserved in the alloc's ledger first.
struct MeteredStream {
    inner: DynOutputStream,
    ledger: Arc<DiskLedger>,
}

impl MeteredStream {
    fn reserve(&self, bytes: usize) -> StreamResult<()> {
        self.ledger.reserve_bytes(bytes as u64).map_err(|_| {
            let no_space =
                std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
            StreamError::LastOperationFailed(wasmtime::Error::from(no_space))
        })
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for MeteredStream {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for MeteredStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.reserve(bytes.len())?;
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    async fn blocking_write_and_flush(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.reserve(bytes.len())?;
        self.inner.blocking_write_and_flush(bytes).await
    }

    fn write_zeroes(&mut self, count: usize) -> StreamResult<()> {
        self.reserve(count)?;
        self.inner.write_zeroes(count)
    }

    async fn write_ready(&mut self) -> StreamResult<usize> {
        self.inner.write_ready().await
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::disk_ledger::DiskQuota;

    #[tokio::test]
    async fn a_stream_write_past_the_quota_fails_with_no_space() {
        let (ledger, _exceeded) = DiskLedger::new(DiskQuota::of_bytes(10));
        let mut stream = MeteredStream {
            inner: Box::new(wasmtime_wasi::p2::pipe::SinkOutputStream),
            ledger,
        };
        stream.write(Bytes::from_static(b"0123456789")).unwrap();
        let Err(StreamError::LastOperationFailed(error)) = stream.write(Bytes::from_static(b"x"))
        else {
            panic!("the eleventh byte must fail the write");
        };
        let io = error
            .downcast_ref::<std::io::Error>()
            .expect("an io::Error");
        assert_eq!(ErrorCode::from(io), ErrorCode::InsufficientSpace);
    }
}

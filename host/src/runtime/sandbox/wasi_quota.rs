//! The alloc directory's quota at the write: the host's own layer over wasmtime-wasi's
//! `wasi:filesystem/types`.
//!
//! Every call that can add blocks or entries is shadowed in the linker by one that first
//! reserves them in the alloc's [`DiskLedger`], then hands the call to wasmtime-wasi's own
//! implementation: `descriptor.write` (every block the write touches), `set-size` (the
//! growth), `open-at` with `create` (an entry), `create-directory-at` and `symlink-at` (an
//! entry and a block), `link-at` (an entry). Streams a guest opens on a file
//! (`write-via-stream`, `append-via-stream`) are wrapped so each write through them reserves
//! too. A reservation the ledger cannot fit even after looking at the directory again fails
//! in the guest with `insufficient-space` (`ENOSPC`) and reports the limit, which ends the
//! run with the alloc described as over its quota; a call that fails gives its reservation
//! back.
//!
//! Each `open-at` also takes a descriptor from the budget all runners share, and each
//! descriptor dropped gives it back (`descriptors`): an open past the budget fails in the
//! guest with `quota`.
//!
//! Only the accounting is ours: paths, permissions and the writes themselves stay
//! wasmtime-wasi's. This module touches nothing but the store's WASI state and its ledger.

use crate::runtime::StoreData;
use crate::runtime::sandbox::disk_ledger::{DiskLedger, DiskUse, Reservation};
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
/// `add_to_linker_async`. Fails when wasmtime-wasi does not define the interface at
/// [`FILESYSTEM_TYPES`]: a guest would then reach wasmtime-wasi's own calls, unmetered.
pub(in crate::runtime) fn add_to_linker(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    if types
        .func_wrap("[method]descriptor.write", |_, (): ()| Ok(()))
        .is_ok()
    {
        wasmtime::bail!(
            "{FILESYSTEM_TYPES} is not wasmtime-wasi's: update FILESYSTEM_TYPES in \
             runtime/sandbox/wasi_quota.rs to the version it defines"
        );
    }
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    // A descriptor the guest drops goes back to the budget every runner shares (see
    // `descriptors`); then wasmtime-wasi closes it, as its own destructor does.
    types.resource(
        "descriptor",
        wasmtime::component::ResourceType::host::<Descriptor>(),
        |mut store, handle| {
            let data = store.data_mut();
            data.descriptors.dropped(handle);
            HostDescriptor::drop(&mut filesystem(data), Resource::new_own(handle))
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.write",
        |mut store, (fd, buffer, offset): (Resource<Descriptor>, Vec<u8>, u64)| {
            Box::new(async move {
                let data = store.data_mut();
                let amount = data
                    .disk
                    .blocks_for_write(Some(offset), buffer.len() as u64);
                let Some((reservation, mut view)) = reserve(data, amount) else {
                    return no_space();
                };
                let written = HostDescriptor::write(&mut view, fd, buffer, offset).await;
                finish(&mut view, reservation, written)
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
                let current = match HostDescriptor::stat(&mut view, borrow(&fd)).await {
                    Ok(stat) => stat.size,
                    Err(error) => return to_wit(&mut view, Err(error)),
                };
                let amount = ledger.blocks_for_write(Some(current), size.saturating_sub(current));
                let Ok(reservation) = ledger.reserve(amount) else {
                    return no_space();
                };
                let resized = HostDescriptor::set_size(&mut view, fd, size).await;
                finish(&mut view, reservation, resized)
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
                    Ok(stream) => metered(&mut view, stream, ledger, Some(offset)),
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
                // Appends start at the end: where that is now, as far as the stream knows.
                let end = HostDescriptor::stat(&mut view, borrow(&fd))
                    .await
                    .ok()
                    .map(|stat| stat.size);
                let stream = match HostDescriptor::append_via_stream(&mut view, fd) {
                    Ok(stream) => metered(&mut view, stream, ledger, end),
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
                // A descriptor of the agent's, from the budget every runner shares.
                if !data.descriptors.reserve() {
                    return Ok((Err(ErrorCode::Quota),));
                }
                let creates = open_flags.contains(OpenFlags::CREATE);
                let amount = if creates { ENTRY } else { DiskUse::default() };
                let Some((reservation, mut view)) = reserve(data, amount) else {
                    data.descriptors.not_opened();
                    return no_space();
                };
                let opened =
                    HostDescriptor::open_at(&mut view, fd, path_flags, path, open_flags, flags)
                        .await;
                let handle = opened.as_ref().ok().map(Resource::rep);
                let answer = finish(&mut view, reservation, opened);
                match handle {
                    Some(handle) => data.descriptors.opened(handle),
                    None => data.descriptors.not_opened(),
                }
                answer
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.create-directory-at",
        |mut store, (fd, path): (Resource<Descriptor>, String)| {
            Box::new(async move {
                let data = store.data_mut();
                let amount = entry_with_block(&data.disk);
                let Some((reservation, mut view)) = reserve(data, amount) else {
                    return no_space();
                };
                let made = HostDescriptor::create_directory_at(&mut view, fd, path).await;
                finish(&mut view, reservation, made)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.symlink-at",
        |mut store, (fd, old_path, new_path): (Resource<Descriptor>, String, String)| {
            Box::new(async move {
                let data = store.data_mut();
                let amount = entry_with_block(&data.disk);
                let Some((reservation, mut view)) = reserve(data, amount) else {
                    return no_space();
                };
                let made = HostDescriptor::symlink_at(&mut view, fd, old_path, new_path).await;
                finish(&mut view, reservation, made)
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
                let Some((reservation, mut view)) = reserve(data, ENTRY) else {
                    return no_space();
                };
                let made =
                    HostDescriptor::link_at(&mut view, fd, old_flags, old_path, new_fd, new_path)
                        .await;
                finish(&mut view, reservation, made)
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A file, directory or link more.
const ENTRY: DiskUse = DiskUse {
    bytes: 0,
    entries: 1,
};

/// A directory or symbolic link more, with the block it may take.
fn entry_with_block(ledger: &DiskLedger) -> DiskUse {
    DiskUse {
        bytes: ledger.block(),
        entries: 1,
    }
}

fn filesystem(data: &mut StoreData) -> WasiFilesystemCtxView<'_> {
    WasiFilesystemCtxView {
        ctx: data.wasi.filesystem(),
        table: &mut data.table,
    }
}

/// Reserves `amount` in the store's ledger, and gives the filesystem view to run the call
/// with; `None` when the quota refuses it.
fn reserve(
    data: &mut StoreData,
    amount: DiskUse,
) -> Option<(Reservation, WasiFilesystemCtxView<'_>)> {
    let reservation = data.disk.reserve(amount).ok()?;
    Some((reservation, filesystem(data)))
}

/// A second handle to the same descriptor, for a call made before the one that takes it.
fn borrow(fd: &Resource<Descriptor>) -> Resource<Descriptor> {
    Resource::new_borrow(fd.rep())
}

/// What the guest gets when its reservation is refused.
fn no_space<T>() -> WitResult<T> {
    Ok((Err(ErrorCode::InsufficientSpace),))
}

/// Settles `reservation` when the operation succeeded (a failed one reserved nothing it
/// used: dropping it gives it back), and hands the result to the guest.
fn finish<T>(
    view: &mut WasiFilesystemCtxView<'_>,
    reservation: Reservation,
    result: FsResult<T>,
) -> WitResult<T> {
    if result.is_ok() {
        reservation.settle();
    }
    to_wit(view, result)
}

/// An `FsResult` as the guest receives it: wasmtime-wasi's error code, or a trap.
fn to_wit<T>(view: &mut WasiFilesystemCtxView<'_>, result: FsResult<T>) -> WitResult<T> {
    match result {
        Ok(value) => Ok((Ok(value),)),
        Err(error) => Ok((Err(fs::Host::convert_error_code(view, error)?),)),
    }
}

/// Replaces the file stream `stream` in the table with one that reserves each write in
/// `ledger`; `position` is where its next write lands, when known.
fn metered(
    view: &mut WasiFilesystemCtxView<'_>,
    stream: Resource<DynOutputStream>,
    ledger: Arc<DiskLedger>,
    position: Option<u64>,
) -> FsResult<Resource<DynOutputStream>> {
    let inner = view.table.delete(stream)?;
    let metered: DynOutputStream = Box::new(MeteredStream {
        inner,
        ledger,
        position,
        pending: None,
    });
    Ok(view.table.push(metered)?)
}

/// A file stream whose writes are reserved in the alloc's ledger first.
///
/// A stream's `write` only starts the write; it has completed once the stream is ready for
/// more (`check-write` grants bytes), is flushed, or is dropped. Until then its reservation
/// is pending, in flight. A write that fails may have written part of its bytes, so a
/// stream's reservations are always settled, never given back: the next look corrects them.
struct MeteredStream {
    inner: DynOutputStream,
    ledger: Arc<DiskLedger>,
    position: Option<u64>,
    pending: Option<Reservation>,
}

impl MeteredStream {
    fn reserve(&mut self, len: usize) -> StreamResult<Reservation> {
        let len = len as u64;
        let amount = self.ledger.blocks_for_write(self.position, len);
        let reservation = self.ledger.reserve(amount).map_err(|_| {
            let no_space =
                std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
            StreamError::LastOperationFailed(wasmtime::Error::from(no_space))
        })?;
        self.position = self.position.map(|position| position.saturating_add(len));
        Ok(reservation)
    }

    fn hold(&mut self, reservation: Reservation) {
        match &mut self.pending {
            Some(pending) => pending.merge(reservation),
            None => self.pending = Some(reservation),
        }
    }

    fn settle_pending(&mut self) {
        if let Some(pending) = self.pending.take() {
            pending.settle();
        }
    }
}

impl Drop for MeteredStream {
    fn drop(&mut self) {
        self.settle_pending();
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
        let reservation = self.reserve(bytes.len())?;
        self.hold(reservation);
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        let permit = self.inner.check_write();
        if !matches!(permit, Ok(0)) {
            self.settle_pending();
        }
        permit
    }

    async fn blocking_write_and_flush(&mut self, bytes: Bytes) -> StreamResult<()> {
        let reservation = self.reserve(bytes.len())?;
        self.hold(reservation);
        let written = self.inner.blocking_write_and_flush(bytes).await;
        self.settle_pending();
        written
    }

    fn write_zeroes(&mut self, count: usize) -> StreamResult<()> {
        let reservation = self.reserve(count)?;
        self.hold(reservation);
        self.inner.write_zeroes(count)
    }

    async fn write_ready(&mut self) -> StreamResult<usize> {
        let permit = self.inner.write_ready().await;
        self.settle_pending();
        permit
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await;
        self.settle_pending();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::sandbox::disk_ledger::DiskQuota;

    #[tokio::test]
    async fn a_stream_write_past_the_quota_fails_with_no_space() {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, _exceeded) =
            DiskLedger::new(dir.path().to_path_buf(), DiskQuota::of_bytes(1 << 20));
        let mut stream = MeteredStream {
            inner: Box::new(wasmtime_wasi::p2::pipe::SinkOutputStream),
            ledger,
            position: Some(0),
            pending: None,
        };
        stream.write(Bytes::from(vec![0u8; 1 << 20])).unwrap();
        let Err(StreamError::LastOperationFailed(error)) = stream.write(Bytes::from_static(b"x"))
        else {
            panic!("the byte past the quota must fail the write");
        };
        let io = error
            .downcast_ref::<std::io::Error>()
            .expect("an io::Error");
        assert_eq!(ErrorCode::from(io), ErrorCode::InsufficientSpace);
    }
}

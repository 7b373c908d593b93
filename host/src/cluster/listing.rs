//! Reading many keys: a prefix in pages, and a whole cluster's ranges at once, all at one
//! revision, so that what is read is one consistent view however many responses it takes.

use super::backend::RangeRead;
use super::store::{EtcdStore, KeyValue, LIST_PAGE, StoreError, prefix_end};

impl EtcdStore {
    /// Every key under `prefix`, and the revision the read was made at: a watch from the
    /// revision after it sees every later change, and nothing twice. Read in pages of
    /// `LIST_PAGE` keys.
    pub async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), StoreError> {
        self.list_in_pages(prefix, LIST_PAGE).await
    }

    /// [`EtcdStore::list`], `page` keys per response, every page read at the revision of
    /// the first, so the whole listing is one consistent read. A compaction past that
    /// revision before the last page fails the listing (etcd refuses the old revision): the
    /// caller lists again.
    pub async fn list_in_pages(
        &self,
        prefix: &str,
        page: i64,
    ) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let end = prefix_end(prefix.as_bytes());
        self.list_range(prefix.as_bytes(), &end, 0, page).await
    }

    /// Every key of each range `[start, end)` of `ranges`, all read at one revision (the
    /// cluster's now), the ranges at once (each in pages of `LIST_PAGE`), and that
    /// revision: a whole cluster read as fast as etcd's members serve it, in one consistent
    /// view. A compaction past that revision before the last page fails the whole read
    /// (etcd refuses the old revision): the caller reads again, or gives up (a new leader
    /// steps down, and the next takeover reads afresh).
    pub async fn list_ranges(
        &self,
        ranges: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let revision = self.revision().await?;
        if revision <= 0 {
            // Without it each range would be read at its own "now": not one view.
            return Err(StoreError::Unreachable {
                endpoints: self.endpoints(),
                reason: "etcd answered without a revision".into(),
            });
        }
        let lists = futures_util::future::try_join_all(
            ranges
                .iter()
                .map(|(start, end)| self.list_range(start, end, revision, LIST_PAGE)),
        )
        .await?;
        Ok((
            lists.into_iter().flat_map(|(keys, _)| keys).collect(),
            revision,
        ))
    }

    /// Every key of `[start, end)` at `revision` (0: now, the first page's), `page` keys
    /// per response, and the revision read at.
    async fn list_range(
        &self,
        start: &[u8],
        end: &[u8],
        mut revision: i64,
        page: i64,
    ) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let mut entries = Vec::new();
        let mut from = start.to_vec();
        loop {
            let (start, end) = (&from, &end);
            let answer = self
                .retrying("listing a prefix", |etcd| async move {
                    let read = RangeRead {
                        start: start.clone(),
                        end: end.to_vec(),
                        revision,
                        limit: page.max(1),
                        count_only: false,
                    };
                    etcd.range(read).await
                })
                .await?;
            if revision == 0 {
                revision = answer.revision;
            }
            let next = match answer.kvs.last() {
                Some(last) if answer.more => {
                    let mut next = last.key.as_bytes().to_vec();
                    next.push(0);
                    Some(next)
                }
                _ => None,
            };
            entries.extend(answer.kvs);
            match next {
                Some(next) => from = next,
                None => return Ok((entries, revision)),
            }
        }
    }
}

//! What a deterministic simulation must own and the rest of the host takes from the world:
//! randomness (new ids, backoff jitter), the wall clock, and threads of the blocking pool.
//! Each is the real thing here; built with the `testing` feature, a simulation
//! (`testing::simulation`) can replace them for the one thread it runs on, which no other
//! thread sees:
//! - random numbers come from a generator seeded by the simulation's seed;
//! - the wall clock is a fixed start plus tokio's (paused) clock's time since;
//! - hash maps made while it runs iterate in an order fixed by what was put in them
//!   ([`HashMap`], [`HashSet`]: std's, whose keys are random in production as ever);
//! - work for the blocking pool runs in place, on that thread, so no other thread's
//!   timing can reorder what the simulation sees.
//!
//! A leaf: it knows nothing of what asks it.

/// A new random id: a UUID v4 in text, from the system's random source, or from the
/// simulation's draws.
pub fn new_id() -> String {
    #[cfg(feature = "testing")]
    if let (Some(high), Some(low)) = (simulated::next_draw(), simulated::next_draw()) {
        let bits = (u128::from(high) << 64) | u128::from(low);
        return uuid::Builder::from_random_bytes(bits.to_be_bytes())
            .into_uuid()
            .to_string();
    }
    uuid::Uuid::new_v4().to_string()
}

/// 64 random bits (not for secrets), or the simulation's next draw. std's hasher keys are
/// random per `RandomState`: hashing a counter with fresh ones draws them.
pub fn random_u64() -> u64 {
    #[cfg(feature = "testing")]
    if let Some(draw) = simulated::next_draw() {
        return draw;
    }
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    std::collections::hash_map::RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// The wall clock, or the simulation's.
pub fn wall_clock() -> std::time::SystemTime {
    #[cfg(feature = "testing")]
    if let Some(now) = simulated::wall_clock() {
        return now;
    }
    std::time::SystemTime::now()
}

/// `tokio::task::spawn_blocking`, but in a simulation a task on the runtime's own thread:
/// a pool thread would finish at a moment of the machine's choosing, and the simulation's
/// tasks would see it at a different point of their run each time.
pub fn spawn_blocking<F, R>(work: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if blocking_work_runs_in_place() {
        return tokio::spawn(async move { work() });
    }
    tokio::task::spawn_blocking(work)
}

/// Whether work meant for the blocking pool runs in place instead (only in a simulation).
pub fn blocking_work_runs_in_place() -> bool {
    #[cfg(feature = "testing")]
    if simulated::installed() {
        return true;
    }
    false
}

/// A runtime for a thread of the host's own, which runs work the caller waits for (the
/// scheduler's etcd writer), with what it needs to be part of the caller's simulation when
/// there is one: the thread's draws are forked from this thread's (so they replay), and its
/// clock is paused, so that the simulated time a wait takes there passes at once. The
/// simulation's own clock stands still meanwhile: it waits, blocked, for the answer.
pub fn runtime_for_thread() -> std::io::Result<ThreadRuntime> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    #[cfg(feature = "testing")]
    if let (Some(seed), Some(wall_start)) = (simulated::next_draw(), simulated::wall_clock()) {
        builder.start_paused(true);
        return Ok(ThreadRuntime {
            runtime: builder.build()?,
            simulated: Some((seed, wall_start)),
        });
    }
    Ok(ThreadRuntime {
        runtime: builder.build()?,
        #[cfg(feature = "testing")]
        simulated: None,
    })
}

/// A runtime from [`runtime_for_thread`], to move to the thread it is for.
pub struct ThreadRuntime {
    runtime: tokio::runtime::Runtime,
    #[cfg(feature = "testing")]
    simulated: Option<(u64, std::time::SystemTime)>,
}

impl ThreadRuntime {
    /// Runs `work` to its end on this thread, in the simulated world forked for it if any.
    pub fn block_on<F: std::future::Future>(self, work: F) -> F::Output {
        #[cfg(feature = "testing")]
        return self.runtime.block_on(async move {
            let _world = self
                .simulated
                .map(|(seed, wall_start)| simulated::install(seed, wall_start));
            work.await
        });
        #[cfg(not(feature = "testing"))]
        self.runtime.block_on(work)
    }
}

/// std's `HashMap` with [`HashState`]: for maps whose iteration order reaches what the
/// host does (which alloc is destroyed first), so that a simulation replays.
pub type HashMap<K, V> = std::collections::HashMap<K, V, HashState>;

/// std's `HashSet` with [`HashState`].
pub type HashSet<T> = std::collections::HashSet<T, HashState>;

/// std's `RandomState` (random keys, so no one can choose keys that collide), except in a
/// simulation, where the keys are fixed.
#[derive(Clone, Debug)]
pub struct HashState(Option<std::collections::hash_map::RandomState>);

impl Default for HashState {
    fn default() -> Self {
        #[cfg(feature = "testing")]
        if simulated::installed() {
            return HashState(None);
        }
        HashState(Some(std::collections::hash_map::RandomState::new()))
    }
}

impl std::hash::BuildHasher for HashState {
    type Hasher = std::collections::hash_map::DefaultHasher;

    fn build_hasher(&self) -> Self::Hasher {
        match &self.0 {
            Some(random) => random.build_hasher(),
            None => std::collections::hash_map::DefaultHasher::new(),
        }
    }
}

/// What a simulation installs on its thread.
#[cfg(feature = "testing")]
pub mod simulated {
    use std::cell::RefCell;
    use std::time::{Duration, SystemTime};

    struct World {
        /// SplitMix64's state: draws need only be spread and replayable.
        draws: u64,
        wall_start: SystemTime,
        clock_start: tokio::time::Instant,
    }

    thread_local! {
        static WORLD: RefCell<Option<World>> = const { RefCell::new(None) };
    }

    /// Uninstalls the world when dropped.
    pub struct Installed(());

    impl Drop for Installed {
        fn drop(&mut self) {
            WORLD.with(|world| world.borrow_mut().take());
        }
    }

    /// Installs a simulated world on this thread, inside a tokio runtime whose clock the
    /// simulation drives: random draws from `seed`, and a wall clock that reads `wall_start`
    /// now and moves with tokio's clock.
    pub fn install(seed: u64, wall_start: SystemTime) -> Installed {
        WORLD.with(|world| {
            *world.borrow_mut() = Some(World {
                draws: seed,
                wall_start,
                clock_start: tokio::time::Instant::now(),
            })
        });
        Installed(())
    }

    pub(super) fn installed() -> bool {
        WORLD.with(|world| world.borrow().is_some())
    }

    pub(super) fn next_draw() -> Option<u64> {
        WORLD.with(|world| {
            let mut world = world.borrow_mut();
            let world = world.as_mut()?;
            Some(splitmix64(&mut world.draws))
        })
    }

    pub(super) fn wall_clock() -> Option<SystemTime> {
        WORLD.with(|world| {
            let world = world.borrow();
            let world = world.as_ref()?;
            let since: Duration = tokio::time::Instant::now() - world.clock_start;
            Some(world.wall_start + since)
        })
    }

    /// SplitMix64's next draw from `state`.
    pub fn splitmix64(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

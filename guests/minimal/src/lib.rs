//! The smallest valid Caravan runner: reports `running`, waits for `kill` or `shutdown`,
//! returns. See README.md for why each line is there.

use caravan_guest::{Alloc, AllocState, ClientStatus, Event, Guest, RunnerError, host};

struct Minimal;

impl Guest for Minimal {
    fn run(_alloc: Alloc, _restored: Option<Vec<u8>>) -> Result<(), RunnerError> {
        report(ClientStatus::Running, "waiting for kill")?;
        loop {
            match host::next_event(None) {
                Some(Event::Kill) => return report(ClientStatus::Complete, "killed"),
                Some(Event::Shutdown) => return Ok(()),
                _ => continue,
            }
        }
    }
}

fn report(client_status: ClientStatus, description: &str) -> Result<(), RunnerError> {
    let state = AllocState {
        client_status,
        description: description.into(),
        task_states: vec![],
    };
    host::update_state(&state).map_err(RunnerError::Failed)
}

caravan_guest::export!(Minimal);

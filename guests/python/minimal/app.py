"""The smallest valid Caravan runner, in Python: reports `running`, waits for `kill` or
`shutdown`, returns. The same contract as guests/minimal (Rust), line for line."""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host
from wit_world.imports.types import (
    AllocState,
    ClientStatus,
    Event_Kill,
    Event_Shutdown,
    RunnerError_Failed,
)

# `next-event` waits at most this many milliseconds; this value means "as long as it takes".
FOREVER = 0xFFFF_FFFF_FFFF_FFFF


def report(status: ClientStatus, description: str) -> None:
    try:
        host.update_state(AllocState(status, description, []))
    except Err as refused:
        # The host refused the report: end the run with its reason as the error.
        raise Err(RunnerError_Failed(refused.value))


class Runner(exports.Runner):
    def run(self, alloc, restored):
        report(ClientStatus.RUNNING, "waiting for kill")
        while True:
            event = host.next_event(FOREVER)
            if isinstance(event, Event_Kill):
                report(ClientStatus.COMPLETE, "killed")
                return
            if isinstance(event, Event_Shutdown):
                return

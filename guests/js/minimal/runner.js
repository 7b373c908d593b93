// The smallest valid Caravan runner, in JavaScript: reports `running`, waits for `kill` or
// `shutdown`, returns. The same contract as guests/minimal (Rust), line for line.

import { nextEvent, updateState } from "caravan:runner/host@0.1.0";

// `next-event` waits at most this many milliseconds; this value means "as long as it takes".
const FOREVER = 0xffffffffffffffffn;

function report(clientStatus, description) {
  try {
    updateState({ clientStatus, description, taskStates: [] });
  } catch (refused) {
    // The host refused the report: end the run with its reason as the error.
    throw { tag: "failed", val: String(refused.payload ?? refused) };
  }
}

export const runner = {
  run(alloc, restored) {
    report("running", "waiting for kill");
    for (;;) {
      const event = nextEvent(FOREVER);
      if (event?.tag === "kill") {
        report("complete", "killed");
        return;
      }
      if (event?.tag === "shutdown") {
        return;
      }
    }
  },
};

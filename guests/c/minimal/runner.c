// The smallest valid Caravan runner, in C: reports `running`, waits for `kill` or `shutdown`,
// returns. The same contract as guests/minimal (Rust), line for line.
//
// Ownership, as wit-bindgen's C bindings define it: `run`'s arguments are ours to free;
// what an import returns is ours to free; what we return in `err` is freed by the host.

#include "alloc_runner.h"

// `next-event` waits at most this many milliseconds; this value means "as long as it takes".
#define FOREVER UINT64_MAX

static bool report(caravan_runner_types_client_status_t status, const char *description,
                   exports_caravan_runner_runner_runner_error_t *err) {
  caravan_runner_host_alloc_state_t state = {.client_status = status};
  alloc_runner_string_set(&state.description, description);
  alloc_runner_string_t refusal;
  if (caravan_runner_host_update_state(&state, &refusal)) {
    return true;
  }
  // The host refused the report: end the run with its reason as the error.
  err->tag = CARAVAN_RUNNER_TYPES_RUNNER_ERROR_FAILED;
  err->val.failed = refusal;
  return false;
}

bool exports_caravan_runner_runner_run(exports_caravan_runner_runner_alloc_t *alloc,
                                       alloc_runner_list_u8_t *maybe_restored,
                                       exports_caravan_runner_runner_runner_error_t *err) {
  exports_caravan_runner_runner_alloc_free(alloc);
  if (maybe_restored) {
    alloc_runner_list_u8_free(maybe_restored);
  }
  if (!report(CARAVAN_RUNNER_TYPES_CLIENT_STATUS_RUNNING, "waiting for kill", err)) {
    return false;
  }
  for (;;) {
    caravan_runner_host_event_t event;
    if (!caravan_runner_host_next_event(FOREVER, &event)) {
      continue;
    }
    uint8_t tag = event.tag;
    caravan_runner_host_event_free(&event);
    if (tag == CARAVAN_RUNNER_TYPES_EVENT_KILL) {
      return report(CARAVAN_RUNNER_TYPES_CLIENT_STATUS_COMPLETE, "killed", err);
    }
    if (tag == CARAVAN_RUNNER_TYPES_EVENT_SHUTDOWN) {
      return true;
    }
  }
}

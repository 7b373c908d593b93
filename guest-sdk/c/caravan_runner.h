// Write Caravan alloc runners in C: the event loop, the alloc's state with its status rules
// and task events, versioned checkpoints, task config and logging, with the same shape as the
// Rust SDK (`caravan-guest`) and the Python and JavaScript ones. Compile caravan_runner.c with
// your runner and the bindings `componentize-c bindings wit alloc-runner DIR` writes
// (`alloc_runner.h`, `alloc_runner.c`), as guests/c/build does.
//
// A runner is a `caravan_runner_t` of handlers (each may be NULL for the default) and a
// struct of your own that they share (`self`); `CARAVAN_EXPORT_RUNNER(handlers, your_type)`
// exports it. The loop's rules, the same as every SDK's:
//
// 1. `on_start(self, alloc, restored, state, err)`; if the status is still `pending`
//    afterwards it becomes `running` ("Runner started"). The state is reported.
// 2. While the state is not terminal, wait for an event for at most `next_wakeup_ms(self)`
//    (for ever on CARAVAN_NO_WAKEUP), then call the handler: no event in time, `on_wakeup`;
//    `update`, `on_update`; `signal`, `on_signal` (default: a `Signaling` event);
//    `restart-task`, `on_restart_task` (default: a restart counted); `kill`, `on_kill`
//    (default: every task killed, the alloc `complete`); `shutdown`, `on_shutdown`, whose
//    bytes (if it sets any) are saved as the checkpoint, and the run returns at once. After
//    each handler the state is reported when it changed.
// 3. The run returns when the state is terminal, after `drop(self)`. A handler that returns
//    false (having called `caravan_invalid_config` or `caravan_failed`) ends the alloc
//    `failed` with that message; `abort()` is a crash, which the host reports with the last
//    lines you wrote to stderr.
//
// Strings handed to handlers (task names, signals) are NUL-terminated and live until the
// handler returns; so does an `update`'s alloc, while the alloc `on_start` is given lives for
// the whole run. Texts are kept to CARAVAN_TEXT_BYTES (cut on a character boundary).

#ifndef CARAVAN_RUNNER_H
#define CARAVAN_RUNNER_H

#include "alloc_runner.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The host keeps the last 10 events of each task; so does the state.
#define CARAVAN_MAX_EVENTS_PER_TASK 10
// Longest description or event message kept (the host's default cut is 1 KiB too).
#define CARAVAN_TEXT_BYTES 1024
// Longest event kind kept (the host cuts at 64 bytes).
#define CARAVAN_KIND_BYTES 64
// `next_wakeup_ms`'s "wait for ever".
#define CARAVAN_NO_WAKEUP UINT64_MAX

// Statuses and lifecycles are the bindings' constants, with shorter names.
#define CARAVAN_PENDING CARAVAN_RUNNER_TYPES_CLIENT_STATUS_PENDING
#define CARAVAN_RUNNING CARAVAN_RUNNER_TYPES_CLIENT_STATUS_RUNNING
#define CARAVAN_COMPLETE CARAVAN_RUNNER_TYPES_CLIENT_STATUS_COMPLETE
#define CARAVAN_FAILED CARAVAN_RUNNER_TYPES_CLIENT_STATUS_FAILED
#define CARAVAN_TASK_PENDING CARAVAN_RUNNER_TYPES_TASK_LIFECYCLE_PENDING
#define CARAVAN_TASK_RUNNING CARAVAN_RUNNER_TYPES_TASK_LIFECYCLE_RUNNING
#define CARAVAN_TASK_DEAD CARAVAN_RUNNER_TYPES_TASK_LIFECYCLE_DEAD

typedef caravan_runner_types_alloc_t caravan_alloc_t;
typedef caravan_runner_types_task_t caravan_task_t;

typedef struct {
  char kind[CARAVAN_KIND_BYTES];
  char message[CARAVAN_TEXT_BYTES];
  uint64_t time_unix_ms;
} caravan_event_t;

typedef struct {
  char *name; // NUL-terminated
  caravan_runner_types_task_lifecycle_t lifecycle;
  bool failed;
  uint32_t restarts;
  caravan_event_t events[CARAVAN_MAX_EVENTS_PER_TASK]; // oldest first
  size_t event_count;
} caravan_task_state_t;

// The alloc's state as the runner reports it. Its status follows the tasks: `running` once any
// task runs, `complete` when every task is dead and none failed, `failed` when every task is
// dead and one failed. A status set with `caravan_state_set_status` holds until the next task
// change; a terminal one is final.
typedef struct {
  caravan_runner_types_client_status_t client_status;
  char description[CARAVAN_TEXT_BYTES];
  caravan_task_state_t *tasks; // one per task of the alloc, in job order
  size_t task_count;
  bool changed; // since the last report the host took
} caravan_state_t;

// Why a handler failed: fill it with `caravan_invalid_config` or `caravan_failed`.
typedef struct {
  uint8_t kind; // CARAVAN_RUNNER_TYPES_RUNNER_ERROR_*
  char message[CARAVAN_TEXT_BYTES];
} caravan_error_t;

// Bytes the SDK frees (checkpoints): `ptr` from malloc, or NULL.
typedef struct {
  uint8_t *ptr;
  size_t len;
} caravan_bytes_t;

typedef struct {
  bool (*on_start)(void *self, const caravan_alloc_t *alloc, const caravan_bytes_t *restored,
                   caravan_state_t *state, caravan_error_t *err); // restored: NULL if none
  uint64_t (*next_wakeup_ms)(void *self);                         // CARAVAN_NO_WAKEUP: for ever
  bool (*on_wakeup)(void *self, caravan_state_t *state, caravan_error_t *err);
  bool (*on_update)(void *self, const caravan_alloc_t *alloc, caravan_state_t *state,
                    caravan_error_t *err);
  bool (*on_signal)(void *self, const char *task, const char *signal, caravan_state_t *state,
                    caravan_error_t *err); // task: NULL for every task
  bool (*on_restart_task)(void *self, const char *task, caravan_state_t *state, caravan_error_t *err);
  void (*on_kill)(void *self, caravan_state_t *state);
  // The bytes to resume from (`caravan_encode_checkpoint` them), or leave `checkpoint` empty
  // to save nothing; the state is not reported after this, so it is not handed over.
  void (*on_shutdown)(void *self, caravan_bytes_t *checkpoint);
  void (*drop)(void *self); // the run is over: free what `self` holds
} caravan_runner_t;

// Runs the loop; what `exports_caravan_runner_runner_run` returns. Frees `alloc` and
// `restored` when done.
bool caravan_run(const caravan_runner_t *runner, void *self, caravan_alloc_t *alloc,
                 alloc_runner_list_u8_t *restored, caravan_runner_types_runner_error_t *err);

// Exports `handlers` (a caravan_runner_t) with a zeroed `self_type` as `self`.
#define CARAVAN_EXPORT_RUNNER(handlers, self_type)                                             \
  bool exports_caravan_runner_runner_run(exports_caravan_runner_runner_alloc_t *alloc,          \
                                         alloc_runner_list_u8_t *restored,                      \
                                         exports_caravan_runner_runner_runner_error_t *err) {   \
    self_type self = {0};                                                                       \
    return caravan_run(&(handlers), &self, alloc, restored, err);                              \
  }

// ---- errors ------------------------------------------------------------------------------

// Fill `err` (printf-style) and return false: `return caravan_failed(err, "...", ...);`.
bool caravan_invalid_config(caravan_error_t *err, const char *format, ...)
    __attribute__((format(printf, 2, 3)));
bool caravan_failed(caravan_error_t *err, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

// ---- state -------------------------------------------------------------------------------

bool caravan_state_is_terminal(const caravan_state_t *state);
// Sets the status and description yourself; after a terminal one, changes nothing.
void caravan_state_set_status(caravan_state_t *state, caravan_runner_types_client_status_t status,
                              const char *description);
// Task `name`'s state, to read: change it only through the calls below, which mark the state
// changed (a report is sent only then).
const caravan_task_state_t *caravan_state_task(caravan_state_t *state, const char *name);
// Task running, with a `Started` event.
void caravan_state_task_started(caravan_state_t *state, const char *name);
// Task dead, with a `Terminated` event saying `message`.
void caravan_state_task_finished(caravan_state_t *state, const char *name, bool failed,
                                 const char *message);
// A restart counted, with a `Restarting` event saying `reason`; the task runs.
void caravan_state_task_restarted(caravan_state_t *state, const char *name, const char *reason);
// Nomad's `Signaling` event.
void caravan_state_task_signaled(caravan_state_t *state, const char *name, const char *signal);
// An event of your own kind.
void caravan_state_task_event(caravan_state_t *state, const char *name, const char *kind,
                              const char *message);
// Every task not dead killed (`Killing`, `Killed`); the alloc `complete` with `description`.
void caravan_state_kill_all(caravan_state_t *state, const char *description);
// Sends the state when it changed; false, with the host's reason in `refusal`, when refused.
bool caravan_state_report(caravan_state_t *state, char *refusal, size_t refusal_size);

// ---- task config -------------------------------------------------------------------------

// The first value of `key` in the task's config, or NULL.
const alloc_runner_string_t *caravan_config_get(const caravan_task_t *task, const char *key);
// `key` as a duration (`500ms`, `5s`, `2m`, `1h`) in `*ms`, `*set` saying whether it was
// given; false with `err` naming the task and the key when it is not a duration.
bool caravan_config_duration_ms(const caravan_task_t *task, const char *key, uint64_t *ms,
                                bool *set, caravan_error_t *err);
// `key` as a whole number that fits an i64, as above.
bool caravan_config_whole_number(const caravan_task_t *task, const char *key, int64_t *value,
                                 bool *set, caravan_error_t *err);
bool caravan_parse_duration_ms(const char *text, size_t len, uint64_t *ms);
// Fills `err` with `task "NAME": KEY: WHY` (WHY printf-style) and returns false: a config
// error worded as every SDK words it.
bool caravan_config_invalid(caravan_error_t *err, const caravan_task_t *task, const char *key,
                            const char *format, ...) __attribute__((format(printf, 4, 5)));
// `text` quoted into `out` as every SDK's errors quote it (Rust's `{:?}`: `"we\"b"`, control
// characters as `\n` or `\u{1b}`), cut to fit.
void caravan_quote(const uint8_t *text, size_t len, char *out, size_t size);
// The task's name, NUL-terminated, as the state holds it.
const char *caravan_task_name(const caravan_state_t *state, size_t index);

// ---- checkpoints -------------------------------------------------------------------------

// `data` under a header naming its `version` (`caravan-checkpoint v1\n`): the same bytes
// every Caravan SDK writes. False when out of memory.
bool caravan_encode_checkpoint(uint32_t version, const void *data, size_t len, caravan_bytes_t *out);
// The version and data (pointing into `raw`) of a checkpoint written so; false otherwise.
bool caravan_decode_checkpoint(const caravan_bytes_t *raw, uint32_t *version, const uint8_t **data,
                               size_t *len);

// ---- logging and time --------------------------------------------------------------------

void caravan_log(wasi_logging_logging_level_t level, const char *context, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
#define caravan_info(context, ...) caravan_log(WASI_LOGGING_LOGGING_LEVEL_INFO, context, __VA_ARGS__)
#define caravan_warn(context, ...) caravan_log(WASI_LOGGING_LOGGING_LEVEL_WARN, context, __VA_ARGS__)
#define caravan_error(context, ...) caravan_log(WASI_LOGGING_LOGGING_LEVEL_ERROR, context, __VA_ARGS__)

// The host's monotonic clock in milliseconds (paused-time tests move it too).
uint64_t caravan_now_ms(void);
// Milliseconds since the Unix epoch.
uint64_t caravan_now_unix_ms(void);

#endif

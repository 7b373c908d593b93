// Sleeper, in C: each task "runs" for a configured time, then exits with a configured code.
// It behaves as guests/sleeper (Rust) does: the same config, log lines and task events.
//
// Task config (all optional), named after Nomad's mock driver:
// - `run_for`: how long the task runs, such as `500ms`, `5s`, `2m` (default: until killed).
// - `exit_code`: the code it exits with; anything but 0 fails the task (default 0).
// - `log_every`: log a progress line this often while running (default: never).
// - `crash_after`: crash this long after the task starts, as a bug would: a message on stderr,
//   then abort() (default: never). The host fails the alloc naming the trap and the message.

#include "alloc_runner.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FOREVER UINT64_MAX
#define NO_TIME UINT64_MAX
// The host keeps the last 10 events of each task; so does the runner.
#define MAX_EVENTS 10
#define TEXT 160

// A task's name as printf arguments, for "%.*s".
#define NAME(task) (int)(task)->name.len, (char *)(task)->name.ptr

typedef struct {
  char kind[16];
  char message[TEXT];
  uint64_t time_unix_ms;
} event_t;

typedef struct {
  alloc_runner_string_t name; // borrowed from the alloc, which outlives the run
  bool running, failed;
  uint32_t restarts;
  int64_t exit_code;
  uint64_t ends_at, log_every, next_log, crash_after, crashes_at; // ms; NO_TIME when unset
  event_t events[MAX_EVENTS];
  size_t event_count;
} task_t;

static uint64_t clock_ms(clockid_t clock) {
  struct timespec now;
  clock_gettime(clock, &now);
  return (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
}

// WASI's monotonic clock: the host's, so a test with paused time moves it too.
static uint64_t now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

static void log_line(wasi_logging_logging_level_t level, const char *format, ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof message, format, args);
  va_end(args);
  alloc_runner_string_t context, text;
  alloc_runner_string_set(&context, "sleeper");
  alloc_runner_string_set(&text, message);
  wasi_logging_logging_log(level, &context, &text);
}

static void add_event(task_t *task, const char *kind, const char *message) {
  if (task->event_count == MAX_EVENTS) {
    memmove(&task->events[0], &task->events[1], (MAX_EVENTS - 1) * sizeof(event_t));
    task->event_count--;
  }
  event_t *event = &task->events[task->event_count++];
  snprintf(event->kind, sizeof event->kind, "%s", kind);
  snprintf(event->message, sizeof event->message, "%s", message);
  event->time_unix_ms = clock_ms(CLOCK_REALTIME);
}

static void finish(task_t *task, bool failed, const char *kind, const char *message) {
  task->running = false;
  task->failed = failed;
  add_event(task, kind, message);
}

// Parses `500ms`, `5s`, `2m`, `1h` into milliseconds; false when it is none of those or does
// not fit.
static bool parse_duration_ms(const char *text, size_t len, uint64_t *ms) {
  size_t start = len > 0 && text[0] == '+', digits = start;
  uint64_t number = 0;
  while (digits < len && text[digits] >= '0' && text[digits] <= '9') {
    uint64_t digit = (uint64_t)(text[digits++] - '0');
    if (number > (UINT32_MAX - digit) / 10) return false; // far beyond any useful duration
    number = number * 10 + digit;
  }
  size_t unit = len - digits;
  const char *u = text + digits;
  if (digits == start) return false;
  if (unit == 2 && !strncmp(u, "ms", 2)) *ms = number;
  else if (unit == 1 && *u == 's') *ms = number * 1000;
  else if (unit == 1 && *u == 'm') *ms = number * 60000;
  else if (unit == 1 && *u == 'h') *ms = number * 3600000;
  else return false;
  return true;
}

// Parses a whole number that fits an i64, nothing else around it.
static bool parse_exit_code(const char *text, size_t len, int64_t *code) {
  char number[24], *end;
  if (len == 0 || len >= sizeof number || text[0] == ' ') return false;
  memcpy(number, text, len);
  number[len] = '\0';
  errno = 0;
  *code = strtoll(number, &end, 10);
  return errno == 0 && *end == '\0';
}

static bool invalid_config(exports_caravan_runner_runner_runner_error_t *err, const task_t *task,
                           const char *key, const char *value, size_t len, const char *expected) {
  char message[TEXT * 2];
  snprintf(message, sizeof message, "task \"%.*s\": %s: \"%.*s\" is not %s", (int)task->name.len,
           (char *)task->name.ptr, key, (int)len, value, expected);
  err->tag = CARAVAN_RUNNER_TYPES_RUNNER_ERROR_INVALID_CONFIG;
  alloc_runner_string_dup(&err->val.invalid_config, message);
  return false;
}

static bool start_task(task_t *task, const caravan_runner_types_task_t *spec, uint64_t started,
                       exports_caravan_runner_runner_runner_error_t *err) {
  memset(task, 0, sizeof *task);
  task->name = spec->name;
  task->running = true;
  task->ends_at = task->log_every = task->next_log = task->crash_after = task->crashes_at = NO_TIME;
  uint64_t run_for = NO_TIME;
  bool seen_run_for = false, seen_log_every = false, seen_exit_code = false, seen_crash_after = false;
  // The first setting of a key counts, as in the Rust runner.
  for (size_t i = 0; i < spec->config.len; i++) {
    const alloc_runner_string_t *key = &spec->config.ptr[i].f0, *value = &spec->config.ptr[i].f1;
    const char *v = (const char *)value->ptr;
    if (key->len == 7 && !memcmp(key->ptr, "run_for", 7) && !seen_run_for) {
      seen_run_for = true;
      if (!parse_duration_ms(v, value->len, &run_for))
        return invalid_config(err, task, "run_for", v, value->len, "a duration such as 500ms, 5s or 2m");
    } else if (key->len == 9 && !memcmp(key->ptr, "log_every", 9) && !seen_log_every) {
      seen_log_every = true;
      if (!parse_duration_ms(v, value->len, &task->log_every))
        return invalid_config(err, task, "log_every", v, value->len, "a duration such as 500ms, 5s or 2m");
    } else if (key->len == 9 && !memcmp(key->ptr, "exit_code", 9) && !seen_exit_code) {
      seen_exit_code = true;
      if (!parse_exit_code(v, value->len, &task->exit_code))
        return invalid_config(err, task, "exit_code", v, value->len, "a whole number");
    } else if (key->len == 11 && !memcmp(key->ptr, "crash_after", 11) && !seen_crash_after) {
      seen_crash_after = true;
      if (!parse_duration_ms(v, value->len, &task->crash_after))
        return invalid_config(err, task, "crash_after", v, value->len, "a duration such as 500ms, 5s or 2m");
    }
  }
  if (run_for != NO_TIME) task->ends_at = started + run_for;
  if (task->log_every != NO_TIME) task->next_log = started + task->log_every;
  if (task->crash_after != NO_TIME) task->crashes_at = started + task->crash_after;
  add_event(task, "Received", "Task received by client");
  add_event(task, "Started", "Task started by client");
  if (run_for == NO_TIME) {
    log_line(WASI_LOGGING_LOGGING_LEVEL_INFO, "task %.*s started; runs until killed", NAME(task));
  } else {
    log_line(WASI_LOGGING_LOGGING_LEVEL_INFO, "task %.*s started; runs for %llums", NAME(task),
             (unsigned long long)run_for);
  }
  return true;
}

static bool out_of_memory(exports_caravan_runner_runner_runner_error_t *err) {
  err->tag = CARAVAN_RUNNER_TYPES_RUNNER_ERROR_FAILED;
  alloc_runner_string_dup(&err->val.failed, "out of memory");
  return false;
}

// Reports every task's state, with the status given, or (when `description` is NULL) the one
// Nomad derives: running while any task runs; then failed if any failed, else complete. An
// alloc without tasks runs until it is killed.
static bool report(task_t *tasks, size_t count, caravan_runner_types_client_status_t status,
                   const char *description, exports_caravan_runner_runner_runner_error_t *err) {
  // Room for "Failed tasks: " and every name with its ", ".
  size_t room = 64;
  for (size_t i = 0; i < count; i++) room += tasks[i].name.len + 2;
  char *derived = malloc(room);
  caravan_runner_types_task_state_t *states = calloc(count ? count : 1, sizeof *states);
  caravan_runner_types_task_event_t *events =
      calloc(count ? count * MAX_EVENTS : 1, sizeof *events);
  if (!derived || !states || !events) {
    free(derived), free(states), free(events);
    return out_of_memory(err);
  }
  if (description == NULL) {
    bool any_running = false;
    for (size_t i = 0; i < count; i++) any_running |= tasks[i].running;
    if (count == 0) {
      status = CARAVAN_RUNNER_TYPES_CLIENT_STATUS_RUNNING;
      snprintf(derived, room, "Runner started");
    } else if (any_running) {
      status = CARAVAN_RUNNER_TYPES_CLIENT_STATUS_RUNNING;
      snprintf(derived, room, "Tasks are running");
    } else {
      status = CARAVAN_RUNNER_TYPES_CLIENT_STATUS_COMPLETE;
      snprintf(derived, room, "All tasks have completed");
      for (size_t i = 0; i < count; i++) {
        if (!tasks[i].failed) continue;
        bool first = status != CARAVAN_RUNNER_TYPES_CLIENT_STATUS_FAILED;
        size_t used = first ? 0 : strlen(derived);
        snprintf(derived + used, room - used, first ? "Failed tasks: %.*s" : ", %.*s",
                 NAME(&tasks[i]));
        status = CARAVAN_RUNNER_TYPES_CLIENT_STATUS_FAILED;
      }
    }
    description = derived;
  }
  for (size_t i = 0; i < count; i++) {
    task_t *task = &tasks[i];
    caravan_runner_types_task_event_t *task_events = &events[i * MAX_EVENTS];
    for (size_t e = 0; e < task->event_count; e++) {
      alloc_runner_string_set(&task_events[e].kind, task->events[e].kind);
      alloc_runner_string_set(&task_events[e].message, task->events[e].message);
      task_events[e].time_unix_ms = task->events[e].time_unix_ms;
    }
    states[i].name = task->name;
    states[i].state = task->running ? CARAVAN_RUNNER_TYPES_TASK_LIFECYCLE_RUNNING
                                    : CARAVAN_RUNNER_TYPES_TASK_LIFECYCLE_DEAD;
    states[i].failed = task->failed;
    states[i].restarts = task->restarts;
    states[i].events.ptr = task_events;
    states[i].events.len = task->event_count;
  }
  caravan_runner_host_alloc_state_t state = {.client_status = status};
  alloc_runner_string_set(&state.description, description);
  state.task_states.ptr = states;
  state.task_states.len = count;
  alloc_runner_string_t refusal;
  bool accepted = caravan_runner_host_update_state(&state, &refusal);
  free(derived), free(states), free(events);
  if (accepted) {
    return true;
  }
  char message[TEXT * 2];
  snprintf(message, sizeof message, "host refused state: %.*s", (int)refusal.len,
           (char *)refusal.ptr);
  alloc_runner_string_free(&refusal);
  err->tag = CARAVAN_RUNNER_TYPES_RUNNER_ERROR_FAILED;
  alloc_runner_string_dup(&err->val.failed, message);
  return false;
}

static bool wake_up(task_t *tasks, size_t count, exports_caravan_runner_runner_runner_error_t *err) {
  uint64_t now = now_ms();
  for (size_t i = 0; i < count; i++) {
    task_t *task = &tasks[i];
    if (!task->running) continue;
    if (task->crashes_at != NO_TIME && task->crashes_at <= now) {
      fprintf(stderr, "task %.*s crashed on purpose (crash_after %llums)\n", NAME(task),
              (unsigned long long)task->crash_after);
      abort();
    }
    if (task->ends_at != NO_TIME && task->ends_at <= now) {
      char message[64];
      snprintf(message, sizeof message, "Exit Code: %lld", (long long)task->exit_code);
      if (task->exit_code == 0) {
        log_line(WASI_LOGGING_LOGGING_LEVEL_INFO, "task %.*s finished: %s", NAME(task), message);
      } else {
        log_line(WASI_LOGGING_LOGGING_LEVEL_WARN, "task %.*s failed: %s", NAME(task), message);
      }
      finish(task, task->exit_code != 0, "Terminated", message);
      if (!report(tasks, count, 0, NULL, err)) return false;
    } else if (task->next_log != NO_TIME && task->next_log <= now) {
      log_line(WASI_LOGGING_LOGGING_LEVEL_INFO, "task %.*s still running", NAME(task));
      task->next_log += task->log_every;
    }
  }
  return true;
}

static bool run(const exports_caravan_runner_runner_alloc_t *alloc, task_t *tasks,
                exports_caravan_runner_runner_runner_error_t *err) {
  size_t count = alloc->tasks.len;
  uint64_t started = now_ms();
  for (size_t i = 0; i < count; i++) {
    if (!start_task(&tasks[i], &alloc->tasks.ptr[i], started, err)) return false;
  }
  if (!report(tasks, count, 0, NULL, err)) return false;
  for (;;) {
    uint64_t next = NO_TIME, now = now_ms();
    for (size_t i = 0; i < count; i++) {
      if (!tasks[i].running) continue;
      if (tasks[i].ends_at < next) next = tasks[i].ends_at;
      if (tasks[i].next_log < next) next = tasks[i].next_log;
      if (tasks[i].crashes_at < next) next = tasks[i].crashes_at;
    }
    uint64_t timeout = next == NO_TIME ? FOREVER : (next > now ? next - now : 0);
    caravan_runner_host_event_t event;
    if (!caravan_runner_host_next_event(timeout, &event)) {
      if (!wake_up(tasks, count, err)) return false;
    } else {
      uint8_t tag = event.tag;
      if (tag == CARAVAN_RUNNER_TYPES_EVENT_SIGNAL || tag == CARAVAN_RUNNER_TYPES_EVENT_RESTART_TASK) {
        bool signal = tag == CARAVAN_RUNNER_TYPES_EVENT_SIGNAL;
        const alloc_runner_string_t *target =
            signal ? (event.val.signal.task.is_some ? &event.val.signal.task.val : NULL)
                   : &event.val.restart_task;
        char message[TEXT];
        if (signal) {
          snprintf(message, sizeof message, "Task being sent signal %.*s",
                   (int)event.val.signal.signal.len, (char *)event.val.signal.signal.ptr);
        }
        for (size_t i = 0; i < count; i++) {
          bool named = target && target->len == tasks[i].name.len &&
                       !memcmp(target->ptr, tasks[i].name.ptr, target->len);
          if (signal && (target == NULL || named)) {
            add_event(&tasks[i], "Signaling", message);
          } else if (!signal && named) {
            tasks[i].restarts++;
            tasks[i].running = true;
            tasks[i].failed = false;
            add_event(&tasks[i], "Restarting", "User requested task to restart");
          }
        }
        caravan_runner_host_event_free(&event);
        if (!report(tasks, count, 0, NULL, err)) return false;
        continue;
      }
      caravan_runner_host_event_free(&event);
      if (tag == CARAVAN_RUNNER_TYPES_EVENT_KILL) {
        for (size_t i = 0; i < count; i++) {
          if (!tasks[i].running) continue;
          log_line(WASI_LOGGING_LOGGING_LEVEL_INFO, "task %.*s killed", NAME(&tasks[i]));
          add_event(&tasks[i], "Killing", "Sent interrupt");
          finish(&tasks[i], false, "Killed", "Task successfully killed");
        }
        return report(tasks, count, CARAVAN_RUNNER_TYPES_CLIENT_STATUS_COMPLETE,
                      "alloc was stopped", err);
      }
      if (tag == CARAVAN_RUNNER_TYPES_EVENT_SHUTDOWN) return true;
    }
    // With tasks, the run ends when the last one does; without, only on kill.
    bool any_running = false;
    for (size_t i = 0; i < count; i++) any_running |= tasks[i].running;
    if (count > 0 && !any_running) return true;
  }
}

bool exports_caravan_runner_runner_run(exports_caravan_runner_runner_alloc_t *alloc,
                                       alloc_runner_list_u8_t *maybe_restored,
                                       exports_caravan_runner_runner_runner_error_t *err) {
  if (maybe_restored) alloc_runner_list_u8_free(maybe_restored);
  task_t *tasks = calloc(alloc->tasks.len ? alloc->tasks.len : 1, sizeof(task_t));
  bool ok = tasks ? run(alloc, tasks, err) : out_of_memory(err);
  free(tasks);
  exports_caravan_runner_runner_alloc_free(alloc);
  return ok;
}

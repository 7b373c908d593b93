// Sleeper, in C, on the caravan_runner SDK (guest-sdk/c): each task "runs" for a configured
// time, then exits with a configured code. It behaves as guests/sleeper (Rust) does: the same
// config, log lines and task events (the conformance suite checks it).
//
// Task config (all optional), named after Nomad's mock driver:
// - `run_for`: how long the task runs, such as `500ms`, `5s`, `2m` (default: until killed).
// - `exit_code`: the code it exits with; anything but 0 fails the task (default 0).
// - `log_every`: log a progress line this often while running (default: never).
// - `crash_after`: crash this long after the task starts, as a bug would: a message on stderr,
//   then abort() (default: never). The host fails the alloc naming the trap and the message.

#include "caravan_runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_TIME UINT64_MAX

typedef struct {
  const char *name; // the state's copy
  int64_t exit_code;
  uint64_t run_for, log_every, crash_after;  // ms; NO_TIME when unset
  uint64_t ends_at, next_log, crashes_at;    // ms; NO_TIME when unset
  bool done;
} sleeping_task_t;

typedef struct {
  sleeping_task_t *tasks;
  size_t count;
} sleeper_t;

static uint64_t after(uint64_t now, uint64_t delay) { return delay == NO_TIME ? NO_TIME : now + delay; }

static void start_task(sleeping_task_t *task, uint64_t now) {
  task->ends_at = after(now, task->run_for);
  task->next_log = after(now, task->log_every);
  task->crashes_at = after(now, task->crash_after);
  task->done = false;
}

static bool duration(const caravan_task_t *spec, const char *key, uint64_t *ms, caravan_error_t *err) {
  bool set;
  if (!caravan_config_duration_ms(spec, key, ms, &set, err)) return false;
  if (!set) *ms = NO_TIME;
  return true;
}

static bool on_start(void *self, const caravan_alloc_t *alloc, const caravan_bytes_t *restored,
                     caravan_state_t *state, caravan_error_t *err) {
  (void)restored;
  sleeper_t *sleeper = self;
  sleeper->tasks = calloc(alloc->tasks.len ? alloc->tasks.len : 1, sizeof *sleeper->tasks);
  if (!sleeper->tasks) return caravan_failed(err, "out of memory");
  uint64_t now = caravan_now_ms();
  for (size_t i = 0; i < alloc->tasks.len; i++) {
    const caravan_task_t *spec = &alloc->tasks.ptr[i];
    sleeping_task_t *task = &sleeper->tasks[i];
    bool set;
    task->name = caravan_task_name(state, i);
    if (!duration(spec, "run_for", &task->run_for, err)) return false;
    if (!caravan_config_whole_number(spec, "exit_code", &task->exit_code, &set, err)) return false;
    if (!duration(spec, "log_every", &task->log_every, err)) return false;
    if (!duration(spec, "crash_after", &task->crash_after, err)) return false;
    start_task(task, now);
    sleeper->count++;
    if (task->run_for == NO_TIME) {
      caravan_info("sleeper", "task %s started; runs until killed", task->name);
    } else {
      caravan_info("sleeper", "task %s started; runs for %llums", task->name,
                   (unsigned long long)task->run_for);
    }
    caravan_state_task_started(state, task->name);
  }
  return true;
}

static uint64_t next_wakeup_ms(void *self) {
  sleeper_t *sleeper = self;
  uint64_t next = NO_TIME, now = caravan_now_ms();
  for (size_t i = 0; i < sleeper->count; i++) {
    const sleeping_task_t *task = &sleeper->tasks[i];
    if (task->done) continue;
    if (task->ends_at < next) next = task->ends_at;
    if (task->next_log < next) next = task->next_log;
    if (task->crashes_at < next) next = task->crashes_at;
  }
  return next == NO_TIME ? CARAVAN_NO_WAKEUP : (next > now ? next - now : 0);
}

static bool on_wakeup(void *self, caravan_state_t *state, caravan_error_t *err) {
  (void)err;
  sleeper_t *sleeper = self;
  uint64_t now = caravan_now_ms();
  for (size_t i = 0; i < sleeper->count; i++) {
    sleeping_task_t *task = &sleeper->tasks[i];
    if (task->done) continue;
    if (task->crashes_at != NO_TIME && task->crashes_at <= now) {
      fprintf(stderr, "task %s crashed on purpose (crash_after %llums)\n", task->name,
              (unsigned long long)task->crash_after);
      abort();
    }
    if (task->ends_at != NO_TIME && task->ends_at <= now) {
      char message[64];
      snprintf(message, sizeof message, "Exit Code: %lld", (long long)task->exit_code);
      task->done = true;
      if (task->exit_code == 0) {
        caravan_info("sleeper", "task %s finished: %s", task->name, message);
      } else {
        caravan_warn("sleeper", "task %s failed: %s", task->name, message);
      }
      caravan_state_task_finished(state, task->name, task->exit_code != 0, message);
    } else if (task->next_log != NO_TIME && task->next_log <= now) {
      caravan_info("sleeper", "task %s still running", task->name);
      task->next_log += task->log_every;
    }
  }
  return true;
}

static bool on_signal(void *self, const char *task, const char *signal, caravan_state_t *state,
                      caravan_error_t *err) {
  (void)err;
  sleeper_t *sleeper = self;
  for (size_t i = 0; i < sleeper->count; i++) {
    const char *name = sleeper->tasks[i].name;
    if (task != NULL && strcmp(task, name)) continue;
    caravan_info("sleeper", "received signal %s for task %s", signal, name);
    caravan_state_task_signaled(state, name, signal);
  }
  return true;
}

static bool on_restart_task(void *self, const char *task, caravan_state_t *state, caravan_error_t *err) {
  (void)err;
  sleeper_t *sleeper = self;
  for (size_t i = 0; i < sleeper->count; i++) {
    sleeping_task_t *target = &sleeper->tasks[i];
    if (strcmp(task, target->name)) continue;
    start_task(target, caravan_now_ms());
    caravan_state_task_event(state, task, "Restart Signaled", "User requested task to restart");
    caravan_state_task_restarted(state, task, "Task restarting in 0s");
    caravan_state_task_started(state, task);
    caravan_info("sleeper", "task %s restarted (restart %u)", task,
                 (unsigned)caravan_state_task(state, task)->restarts);
    return true;
  }
  caravan_warn("sleeper", "restart asked for task %s, which this alloc does not have", task);
  return true;
}

static void on_kill(void *self, caravan_state_t *state) {
  sleeper_t *sleeper = self;
  for (size_t i = 0; i < sleeper->count; i++) {
    if (!sleeper->tasks[i].done) caravan_info("sleeper", "task %s killed", sleeper->tasks[i].name);
  }
  caravan_state_kill_all(state, "alloc was stopped");
}

static void drop(void *self) { free(((sleeper_t *)self)->tasks); }

static const caravan_runner_t SLEEPER = {
    .on_start = on_start,
    .next_wakeup_ms = next_wakeup_ms,
    .on_wakeup = on_wakeup,
    .on_signal = on_signal,
    .on_restart_task = on_restart_task,
    .on_kill = on_kill,
    .drop = drop,
};

CARAVAN_EXPORT_RUNNER(SLEEPER, sleeper_t)

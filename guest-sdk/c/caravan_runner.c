// The Caravan runner SDK for C: see caravan_runner.h for what each part is for and the loop's
// rules. Everything here runs on the component's one thread.

#include "caravan_runner.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- small helpers -----------------------------------------------------------------------

static uint64_t clock_ms(clockid_t clock) {
  struct timespec now;
  clock_gettime(clock, &now);
  return (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
}

uint64_t caravan_now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

uint64_t caravan_now_unix_ms(void) { return clock_ms(CLOCK_REALTIME); }

// `text` (`len` bytes) as a new NUL-terminated string, or NULL when out of memory.
static char *dup_text(const uint8_t *text, size_t len) {
  char *copy = malloc(len + 1);
  if (copy) {
    memcpy(copy, text, len);
    copy[len] = '\0';
  }
  return copy;
}

static bool same_text(const alloc_runner_string_t *text, const char *other) {
  size_t len = strlen(other);
  return text->len == len && !memcmp(text->ptr, other, len);
}

// Cuts `text` back to a character boundary where it may have been cut inside one (the host
// refuses a string that is not UTF-8).
static void end_on_character(char *text) {
  size_t len = strlen(text), lead = len;
  while (lead > 0 && len - lead < 4 && ((unsigned char)text[lead - 1] & 0xC0) == 0x80) lead--;
  if (lead == 0) return;
  unsigned char first = (unsigned char)text[lead - 1];
  size_t wanted = first >= 0xF0 ? 4 : first >= 0xE0 ? 3 : first >= 0xC0 ? 2 : 1;
  if (len - (lead - 1) < wanted) text[lead - 1] = '\0';
}

// Copies `text` into `out`, cut to fit on a character boundary.
static void set_text(char *out, size_t size, const char *text) {
  snprintf(out, size, "%s", text);
  end_on_character(out);
}

void caravan_log(wasi_logging_logging_level_t level, const char *context, const char *format, ...) {
  char message[CARAVAN_TEXT_BYTES * 2];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof message, format, args);
  va_end(args);
  end_on_character(message);
  alloc_runner_string_t context_text, message_text;
  alloc_runner_string_set(&context_text, context);
  alloc_runner_string_set(&message_text, message);
  wasi_logging_logging_log(level, &context_text, &message_text);
}

static bool fill_error(caravan_error_t *err, uint8_t kind, const char *format, va_list args) {
  err->kind = kind;
  vsnprintf(err->message, sizeof err->message, format, args);
  end_on_character(err->message);
  return false;
}

bool caravan_invalid_config(caravan_error_t *err, const char *format, ...) {
  va_list args;
  va_start(args, format);
  fill_error(err, CARAVAN_RUNNER_TYPES_RUNNER_ERROR_INVALID_CONFIG, format, args);
  va_end(args);
  return false;
}

bool caravan_failed(caravan_error_t *err, const char *format, ...) {
  va_list args;
  va_start(args, format);
  fill_error(err, CARAVAN_RUNNER_TYPES_RUNNER_ERROR_FAILED, format, args);
  va_end(args);
  return false;
}

// ---- state -------------------------------------------------------------------------------

static void push_event(caravan_task_state_t *task, const char *kind, const char *message) {
  if (task->event_count == CARAVAN_MAX_EVENTS_PER_TASK) {
    memmove(&task->events[0], &task->events[1],
            (CARAVAN_MAX_EVENTS_PER_TASK - 1) * sizeof(caravan_event_t));
    task->event_count--;
  }
  caravan_event_t *event = &task->events[task->event_count++];
  set_text(event->kind, sizeof event->kind, kind);
  set_text(event->message, sizeof event->message, message);
  event->time_unix_ms = caravan_now_unix_ms();
}

bool caravan_state_is_terminal(const caravan_state_t *state) {
  return state->client_status == CARAVAN_COMPLETE || state->client_status == CARAVAN_FAILED;
}

void caravan_state_set_status(caravan_state_t *state, caravan_runner_types_client_status_t status,
                              const char *description) {
  if (caravan_state_is_terminal(state)) return;
  state->client_status = status;
  set_text(state->description, sizeof state->description, description);
  state->changed = true;
}

static caravan_task_state_t *find_task(caravan_state_t *state, const char *name) {
  for (size_t i = 0; i < state->task_count; i++) {
    if (!strcmp(state->tasks[i].name, name)) return &state->tasks[i];
  }
  return NULL;
}

const caravan_task_state_t *caravan_state_task(caravan_state_t *state, const char *name) {
  return find_task(state, name);
}

const char *caravan_task_name(const caravan_state_t *state, size_t index) {
  return index < state->task_count ? state->tasks[index].name : NULL;
}

// Nomad's rule: `running` once any task runs; when every task is dead, `failed` if one
// failed, else `complete`. A status the runner set terminal stays.
static void derive_client_status(caravan_state_t *state) {
  if (caravan_state_is_terminal(state)) return;
  bool all_dead = state->task_count > 0, any_running = false, any_failed = false;
  for (size_t i = 0; i < state->task_count; i++) {
    all_dead &= state->tasks[i].lifecycle == CARAVAN_TASK_DEAD;
    any_running |= state->tasks[i].lifecycle == CARAVAN_TASK_RUNNING;
    any_failed |= state->tasks[i].failed;
  }
  if (all_dead && any_failed) {
    char description[CARAVAN_TEXT_BYTES] = "Failed tasks: ";
    bool first = true;
    for (size_t i = 0; i < state->task_count; i++) {
      if (!state->tasks[i].failed) continue;
      size_t used = strlen(description);
      snprintf(description + used, sizeof description - used, "%s%s", first ? "" : ", ",
               state->tasks[i].name);
      first = false;
    }
    end_on_character(description);
    caravan_state_set_status(state, CARAVAN_FAILED, description);
  } else if (all_dead) {
    caravan_state_set_status(state, CARAVAN_COMPLETE, "All tasks have completed");
  } else if (any_running) {
    caravan_state_set_status(state, CARAVAN_RUNNING, "Tasks are running");
  }
}

// The task named `name`, marked changed, or NULL (logged) when the alloc has none.
static caravan_task_state_t *changing(caravan_state_t *state, const char *name) {
  caravan_task_state_t *task = find_task(state, name);
  if (task == NULL) {
    caravan_warn("caravan-runner", "no task named \"%s\" in this alloc", name);
    return NULL;
  }
  state->changed = true;
  return task;
}

void caravan_state_task_started(caravan_state_t *state, const char *name) {
  caravan_task_state_t *task = changing(state, name);
  if (!task) return;
  task->lifecycle = CARAVAN_TASK_RUNNING;
  task->failed = false;
  push_event(task, "Started", "Task started by client");
  derive_client_status(state);
}

void caravan_state_task_finished(caravan_state_t *state, const char *name, bool failed,
                                 const char *message) {
  caravan_task_state_t *task = changing(state, name);
  if (!task) return;
  task->lifecycle = CARAVAN_TASK_DEAD;
  task->failed = failed;
  push_event(task, "Terminated", message);
  derive_client_status(state);
}

void caravan_state_task_restarted(caravan_state_t *state, const char *name, const char *reason) {
  caravan_task_state_t *task = changing(state, name);
  if (!task) return;
  task->restarts++;
  push_event(task, "Restarting", reason);
  task->lifecycle = CARAVAN_TASK_RUNNING;
  task->failed = false;
  derive_client_status(state);
}

void caravan_state_task_signaled(caravan_state_t *state, const char *name, const char *signal) {
  char message[CARAVAN_TEXT_BYTES];
  snprintf(message, sizeof message, "Task being sent signal %s", signal);
  caravan_state_task_event(state, name, "Signaling", message);
}

void caravan_state_task_event(caravan_state_t *state, const char *name, const char *kind,
                              const char *message) {
  caravan_task_state_t *task = changing(state, name);
  if (!task) return;
  push_event(task, kind, message);
  derive_client_status(state);
}

void caravan_state_kill_all(caravan_state_t *state, const char *description) {
  for (size_t i = 0; i < state->task_count; i++) {
    caravan_task_state_t *task = &state->tasks[i];
    if (task->lifecycle == CARAVAN_TASK_DEAD) continue;
    push_event(task, "Killing", "Sent interrupt");
    push_event(task, "Killed", "Task successfully killed");
    task->lifecycle = CARAVAN_TASK_DEAD;
    state->changed = true;
  }
  caravan_state_set_status(state, CARAVAN_COMPLETE, description);
}

bool caravan_state_report(caravan_state_t *state, char *refusal, size_t refusal_size) {
  if (!state->changed) return true;
  size_t count = state->task_count;
  caravan_runner_types_task_state_t *tasks = calloc(count ? count : 1, sizeof *tasks);
  caravan_runner_types_task_event_t *events =
      calloc(count ? count * CARAVAN_MAX_EVENTS_PER_TASK : 1, sizeof *events);
  if (!tasks || !events) {
    free(tasks), free(events);
    set_text(refusal, refusal_size, "out of memory");
    return false;
  }
  for (size_t i = 0; i < count; i++) {
    caravan_task_state_t *task = &state->tasks[i];
    caravan_runner_types_task_event_t *task_events = &events[i * CARAVAN_MAX_EVENTS_PER_TASK];
    for (size_t e = 0; e < task->event_count; e++) {
      alloc_runner_string_set(&task_events[e].kind, task->events[e].kind);
      alloc_runner_string_set(&task_events[e].message, task->events[e].message);
      task_events[e].time_unix_ms = task->events[e].time_unix_ms;
    }
    alloc_runner_string_set(&tasks[i].name, task->name);
    tasks[i].state = task->lifecycle;
    tasks[i].failed = task->failed;
    tasks[i].restarts = task->restarts;
    tasks[i].events.ptr = task_events;
    tasks[i].events.len = task->event_count;
  }
  caravan_runner_host_alloc_state_t report = {.client_status = state->client_status};
  alloc_runner_string_set(&report.description, state->description);
  report.task_states.ptr = tasks;
  report.task_states.len = count;
  alloc_runner_string_t reason;
  bool accepted = caravan_runner_host_update_state(&report, &reason);
  free(tasks), free(events);
  if (accepted) {
    state->changed = false;
    return true;
  }
  snprintf(refusal, refusal_size, "%.*s", (int)reason.len, (char *)reason.ptr);
  end_on_character(refusal);
  alloc_runner_string_free(&reason);
  return false;
}

// A pending state with every task of `alloc` pending and `Received`; false when out of memory.
static bool state_init(caravan_state_t *state, const caravan_alloc_t *alloc) {
  memset(state, 0, sizeof *state);
  state->client_status = CARAVAN_PENDING;
  state->changed = true;
  state->tasks = calloc(alloc->tasks.len ? alloc->tasks.len : 1, sizeof *state->tasks);
  if (!state->tasks) return false;
  for (size_t i = 0; i < alloc->tasks.len; i++) {
    const alloc_runner_string_t *name = &alloc->tasks.ptr[i].name;
    caravan_task_state_t *task = &state->tasks[i];
    if (!(task->name = dup_text(name->ptr, name->len))) return false;
    state->task_count++;
    task->lifecycle = CARAVAN_TASK_PENDING;
    push_event(task, "Received", "Task received by client");
  }
  return true;
}

static void state_free(caravan_state_t *state) {
  for (size_t i = 0; i < state->task_count; i++) free(state->tasks[i].name);
  free(state->tasks);
}

// ---- task config -------------------------------------------------------------------------

const alloc_runner_string_t *caravan_config_get(const caravan_task_t *task, const char *key) {
  for (size_t i = 0; i < task->config.len; i++) {
    if (same_text(&task->config.ptr[i].f0, key)) return &task->config.ptr[i].f1;
  }
  return NULL;
}

// How a duration's text parsed: as Rust's `parse_duration` words each case.
typedef enum { DURATION_OK, NOT_A_DURATION, TOO_LONG } duration_parse_t;

// A whole number of digits after an optional sign, fitting `max` (magnitude); false otherwise.
static bool parse_digits(const char *text, size_t len, uint64_t max, uint64_t *number) {
  size_t at = 0;
  *number = 0;
  if (at == len) return false;
  for (; at < len; at++) {
    if (text[at] < '0' || text[at] > '9') return false;
    uint64_t digit = (uint64_t)(text[at] - '0');
    if (*number > (max - digit) / 10) return false;
    *number = *number * 10 + digit;
  }
  return true;
}

static duration_parse_t parse_duration(const char *text, size_t len, uint64_t *ms) {
  size_t start = len > 0 && text[0] == '+', digits = start;
  while (digits < len && text[digits] >= '0' && text[digits] <= '9') digits++;
  size_t unit_len = len - digits;
  const char *unit = text + digits;
  uint64_t per_unit, number;
  if (unit_len == 2 && !memcmp(unit, "ms", 2)) per_unit = 1;
  else if (unit_len == 1 && *unit == 's') per_unit = 1000;
  else if (unit_len == 1 && *unit == 'm') per_unit = 60000;
  else if (unit_len == 1 && *unit == 'h') per_unit = 3600000;
  else return NOT_A_DURATION;
  if (!parse_digits(text + start, digits - start, UINT64_MAX, &number)) return NOT_A_DURATION;
  if (number > UINT64_MAX / per_unit) return TOO_LONG;
  *ms = number * per_unit;
  return DURATION_OK;
}

bool caravan_parse_duration_ms(const char *text, size_t len, uint64_t *ms) {
  return parse_duration(text, len, ms) == DURATION_OK;
}

void caravan_quote(const uint8_t *text, size_t len, char *out, size_t size) {
  size_t used = 0;
#define PUT(...)                                                                           \
  do {                                                                                     \
    if (used < size) used += (size_t)snprintf(out + used, size - used, __VA_ARGS__);       \
  } while (0)
  PUT("\"");
  for (size_t i = 0; i < len && used < size; i++) {
    uint8_t c = text[i];
    if (c == '"') PUT("\\\"");
    else if (c == '\\') PUT("\\\\");
    else if (c == '\n') PUT("\\n");
    else if (c == '\r') PUT("\\r");
    else if (c == '\t') PUT("\\t");
    else if (c == 0) PUT("\\0");
    else if (c < 0x20 || c == 0x7F) PUT("\\u{%x}", c);
    else if (c == 0xC2 && i + 1 < len && text[i + 1] >= 0x80 && text[i + 1] < 0xA0) {
      PUT("\\u{%x}", text[++i]); // a C1 control character, U+0080 to U+009F
    } else PUT("%c", c);
  }
  PUT("\"");
#undef PUT
  if (used >= size && size > 0) out[size - 1] = '\0';
  end_on_character(out);
}

bool caravan_config_invalid(caravan_error_t *err, const caravan_task_t *task, const char *key,
                            const char *format, ...) {
  char name[CARAVAN_TEXT_BYTES / 4], why[CARAVAN_TEXT_BYTES];
  caravan_quote(task->name.ptr, task->name.len, name, sizeof name);
  va_list args;
  va_start(args, format);
  vsnprintf(why, sizeof why, format, args);
  va_end(args);
  return caravan_invalid_config(err, "task %s: %s: %s", name, key, why);
}

static bool invalid_value(caravan_error_t *err, const caravan_task_t *task, const char *key,
                          const alloc_runner_string_t *value, const char *why) {
  char text[CARAVAN_TEXT_BYTES / 2];
  caravan_quote(value->ptr, value->len, text, sizeof text);
  return caravan_config_invalid(err, task, key, "%s %s", text, why);
}

bool caravan_config_duration_ms(const caravan_task_t *task, const char *key, uint64_t *ms,
                                bool *set, caravan_error_t *err) {
  const alloc_runner_string_t *value = caravan_config_get(task, key);
  *set = value != NULL;
  if (!value) return true;
  switch (parse_duration((const char *)value->ptr, value->len, ms)) {
  case DURATION_OK: return true;
  case TOO_LONG: return invalid_value(err, task, key, value, "is too long");
  default: return invalid_value(err, task, key, value, "is not a duration such as 500ms, 5s or 2m");
  }
}

bool caravan_config_whole_number(const caravan_task_t *task, const char *key, int64_t *number,
                                 bool *set, caravan_error_t *err) {
  const alloc_runner_string_t *value = caravan_config_get(task, key);
  *set = value != NULL;
  if (!value) return true;
  const char *text = (const char *)value->ptr;
  size_t len = value->len, sign = len > 0 && (text[0] == '+' || text[0] == '-');
  bool negative = sign && text[0] == '-';
  uint64_t magnitude;
  // An i64 reaches 9223372036854775807 up, and one more down.
  uint64_t max = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  if (!parse_digits(text + sign, len - sign, max, &magnitude)) {
    return invalid_value(err, task, key, value, "is not a whole number");
  }
  *number = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
  return true;
}

// ---- checkpoints -------------------------------------------------------------------------

static const char HEADER[] = "caravan-checkpoint v";

bool caravan_encode_checkpoint(uint32_t version, const void *data, size_t len, caravan_bytes_t *out) {
  char header[40];
  int header_len = snprintf(header, sizeof header, "%s%u\n", HEADER, (unsigned)version);
  out->ptr = malloc((size_t)header_len + len);
  if (!out->ptr) return false;
  memcpy(out->ptr, header, (size_t)header_len);
  if (len) memcpy(out->ptr + header_len, data, len);
  out->len = (size_t)header_len + len;
  return true;
}

bool caravan_decode_checkpoint(const caravan_bytes_t *raw, uint32_t *version, const uint8_t **data,
                               size_t *len) {
  size_t prefix = sizeof HEADER - 1, at = prefix;
  if (raw->len < prefix || memcmp(raw->ptr, HEADER, prefix)) return false;
  uint64_t number = 0;
  while (at < raw->len && at - prefix < 10 && raw->ptr[at] >= '0' && raw->ptr[at] <= '9') {
    number = number * 10 + (uint64_t)(raw->ptr[at++] - '0');
  }
  if (at == prefix || at >= raw->len || raw->ptr[at] != '\n' || number > UINT32_MAX) return false;
  *version = (uint32_t)number;
  *data = raw->ptr + at + 1;
  *len = raw->len - at - 1;
  return true;
}

// ---- the loop ----------------------------------------------------------------------------

static bool default_signal(caravan_state_t *state, const char *task, const char *signal) {
  for (size_t i = 0; i < state->task_count; i++) {
    if (task == NULL || !strcmp(task, state->tasks[i].name)) {
      caravan_state_task_signaled(state, state->tasks[i].name, signal);
    }
  }
  return true;
}

static bool report(caravan_state_t *state, caravan_error_t *err) {
  char refusal[CARAVAN_TEXT_BYTES];
  if (caravan_state_report(state, refusal, sizeof refusal)) return true;
  return caravan_failed(err, "host refused state: %s", refusal);
}

static bool out_of_memory(caravan_error_t *err) { return caravan_failed(err, "out of memory"); }

// Hands one event to its handler; false with `err` filled when the run is to fail. Sets
// `*shut_down` when the run is to return at once.
static bool dispatch(const caravan_runner_t *runner, void *self, caravan_runner_host_event_t *event,
                     caravan_state_t *state, bool *shut_down, caravan_error_t *err) {
  switch (event->tag) {
  case CARAVAN_RUNNER_TYPES_EVENT_UPDATE:
    return runner->on_update ? runner->on_update(self, &event->val.update, state, err) : true;
  case CARAVAN_RUNNER_TYPES_EVENT_SIGNAL: {
    const caravan_runner_types_signal_request_t *request = &event->val.signal;
    char *task = request->task.is_some ? dup_text(request->task.val.ptr, request->task.val.len) : NULL;
    char *signal = dup_text(request->signal.ptr, request->signal.len);
    bool ok = (request->task.is_some && !task) || !signal
                  ? out_of_memory(err)
                  : runner->on_signal ? runner->on_signal(self, task, signal, state, err)
                                      : default_signal(state, task, signal);
    free(task), free(signal);
    return ok;
  }
  case CARAVAN_RUNNER_TYPES_EVENT_RESTART_TASK: {
    char *task = dup_text(event->val.restart_task.ptr, event->val.restart_task.len);
    bool ok = true;
    if (!task) ok = out_of_memory(err);
    else if (runner->on_restart_task) ok = runner->on_restart_task(self, task, state, err);
    else caravan_state_task_restarted(state, task, "User requested task to restart");
    free(task);
    return ok;
  }
  case CARAVAN_RUNNER_TYPES_EVENT_KILL:
    if (runner->on_kill) runner->on_kill(self, state);
    else caravan_state_kill_all(state, "alloc was stopped");
    return true;
  default: { // shutdown
    *shut_down = true;
    caravan_bytes_t checkpoint = {0};
    if (runner->on_shutdown) runner->on_shutdown(self, &checkpoint);
    if (!checkpoint.ptr) return true;
    alloc_runner_list_u8_t data = {.ptr = checkpoint.ptr, .len = checkpoint.len};
    alloc_runner_string_t refusal;
    bool saved = caravan_runner_host_checkpoint(&data, &refusal);
    free(checkpoint.ptr);
    if (saved) return true;
    caravan_failed(err, "%.*s", (int)refusal.len, (char *)refusal.ptr);
    alloc_runner_string_free(&refusal);
    return false;
  }
  }
}

// What a handler that returns false without saying why leaves.
static void reset_error(caravan_error_t *err) {
  err->kind = CARAVAN_RUNNER_TYPES_RUNNER_ERROR_FAILED;
  set_text(err->message, sizeof err->message, "a handler failed without saying why");
}

static bool drive(const caravan_runner_t *runner, void *self, const caravan_alloc_t *alloc,
                  const caravan_bytes_t *restored, caravan_state_t *state, caravan_error_t *err) {
  reset_error(err);
  if (runner->on_start && !runner->on_start(self, alloc, restored, state, err)) return false;
  if (state->client_status == CARAVAN_PENDING) {
    caravan_state_set_status(state, CARAVAN_RUNNING, "Runner started");
  }
  if (!report(state, err)) return false;
  while (!caravan_state_is_terminal(state)) {
    uint64_t wait = runner->next_wakeup_ms ? runner->next_wakeup_ms(self) : CARAVAN_NO_WAKEUP;
    caravan_runner_host_event_t event;
    bool ok = true, shut_down = false;
    reset_error(err);
    if (!caravan_runner_host_next_event(wait, &event)) {
      ok = runner->on_wakeup ? runner->on_wakeup(self, state, err) : true;
    } else {
      ok = dispatch(runner, self, &event, state, &shut_down, err);
      caravan_runner_host_event_free(&event);
    }
    if (!ok) return false;
    if (shut_down) return true;
    if (!report(state, err)) return false;
  }
  return true;
}

bool caravan_run(const caravan_runner_t *runner, void *self, caravan_alloc_t *alloc,
                 alloc_runner_list_u8_t *restored, caravan_runner_types_runner_error_t *err) {
  caravan_error_t error = {0};
  caravan_state_t state;
  caravan_bytes_t restored_bytes = {0};
  if (restored) restored_bytes = (caravan_bytes_t){.ptr = restored->ptr, .len = restored->len};
  bool ok = state_init(&state, alloc) ? drive(runner, self, alloc, restored ? &restored_bytes : NULL,
                                              &state, &error)
                                      : out_of_memory(&error);
  if (!ok) {
    // Worded as the host words it, so the description does not change when the host
    // applies its own rule for `err`; this report only adds the task states.
    char description[CARAVAN_TEXT_BYTES + 32];
    snprintf(description, sizeof description, "%s%s",
             error.kind == CARAVAN_RUNNER_TYPES_RUNNER_ERROR_INVALID_CONFIG ? "invalid config: " : "",
             error.message);
    end_on_character(description);
    caravan_state_set_status(&state, CARAVAN_FAILED, description);
    char ignored[8];
    caravan_state_report(&state, ignored, sizeof ignored);
    err->tag = error.kind;
    alloc_runner_string_dup(error.kind == CARAVAN_RUNNER_TYPES_RUNNER_ERROR_INVALID_CONFIG
                                ? &err->val.invalid_config
                                : &err->val.failed,
                            error.message);
  }
  if (runner->drop) runner->drop(self);
  state_free(&state);
  if (restored) alloc_runner_list_u8_free(restored);
  caravan_runner_types_alloc_free(alloc);
  return ok;
}

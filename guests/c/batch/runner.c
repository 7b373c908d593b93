// Batch, in C, on the caravan_runner SDK (guest-sdk/c): each task computes the sum of the
// squares of 1..`numbers`, `chunk` numbers at a time (so `kill` and `shutdown` are answered
// between chunks), logs it and ends with it in the task's `Terminated` event; the alloc
// completes when every task has. It behaves as guests/batch (Rust) does, byte for byte (the
// conformance suite checks it).
//
// Task config (all optional): `numbers` (default 1000, at most 1000000), `chunk` (default
// 100), `result_file` (a file under `/alloc/`, at most 128 bytes, its parts neither empty nor
// `.` or `..`: the task writes `{"numbers":N,"sum":S}` and a newline there when it is done,
// making its directories, and reads it back; a write that fails fails the task with the
// reason as a WASI error code, `Cannot write PATH: is-directory`; wasi-libc's stdio reaches
// the alloc dir, so the `alloc-runner` world is enough). On `shutdown` it checkpoints each task's progress (version 1: a line
// `name<TAB>next<TAB>sum` per task) and resumes from it.

#include "caravan_runner.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHECKPOINT_VERSION 1
#define MAX_NUMBERS 1000000
#define MAX_RESULT_FILE 128

typedef struct {
  const char *name; // the state's copy
  int64_t numbers, chunk, next;
  uint64_t sum;
  bool done;
  char *result_file; // NULL when not asked for
} summing_t;

typedef struct {
  summing_t *tasks;
  size_t count;
} batch_t;

static bool setting(const caravan_task_t *spec, const char *key, int64_t fallback, int64_t low,
                    int64_t high, int64_t *value, caravan_error_t *err) {
  bool set;
  if (!caravan_config_whole_number(spec, key, value, &set, err)) return false;
  if (!set) *value = fallback;
  if (*value >= low && *value <= high) return true;
  if (high == INT64_MAX) {
    return caravan_config_invalid(err, spec, key, "%" PRId64 " is not at least %" PRId64, *value, low);
  }
  return caravan_config_invalid(err, spec, key, "%" PRId64 " is not between %" PRId64 " and %" PRId64,
                                *value, low, high);
}

// Whether `text` (`len` bytes) is `/alloc/` and parts separated by single slashes, none of
// them empty, `.` or `..`, and no NUL.
static bool plain_file_under_alloc(const uint8_t *text, size_t len) {
  if (len < 7 || memcmp(text, "/alloc/", 7) || memchr(text, '\0', len)) return false;
  for (size_t start = 7, end; start <= len; start = end + 1) {
    const uint8_t *slash = memchr(text + start, '/', len - start);
    end = slash ? (size_t)(slash - text) : len;
    size_t part = end - start;
    if (part == 0 || (part == 1 && text[start] == '.') ||
        (part == 2 && text[start] == '.' && text[start + 1] == '.')) {
      return false;
    }
  }
  return true;
}

// `result_file` into `*path` (NULL when unset): a file under `/alloc/`, the only directory a
// runner sees, named plainly so that every language resolves it alike.
static bool result_file(const caravan_task_t *spec, char **path, caravan_error_t *err) {
  const alloc_runner_string_t *value = caravan_config_get(spec, "result_file");
  *path = NULL;
  if (!value) return true;
  if (value->len > MAX_RESULT_FILE) {
    return caravan_config_invalid(err, spec, "result_file", "is longer than %d bytes", MAX_RESULT_FILE);
  }
  if (!plain_file_under_alloc(value->ptr, value->len)) {
    // Room for every byte quoted at its longest (`\u{1f}`): never cut, and with the rest of
    // the message within the SDK's CARAVAN_TEXT_BYTES.
    char quoted[MAX_RESULT_FILE * 6 + 3];
    caravan_quote(value->ptr, value->len, quoted, sizeof quoted);
    return caravan_config_invalid(err, spec, "result_file", "%s is not a file under /alloc/", quoted);
  }
  *path = strndup((const char *)value->ptr, value->len);
  return *path ? true : caravan_failed(err, "out of memory");
}

// Why a write failed (errno), as the WASI error code every language's batch names it by.
static const char *reason(int error) {
  switch (error) {
  case EISDIR: return "is-directory";
  case ENOTDIR: return "not-directory";
  case ENOENT: return "no-entry";
  case ENOSPC:
  case EDQUOT: return "insufficient-space";
  case EACCES:
  case EPERM: return "access";
  case EEXIST: return "exist";
  default: return "io";
  }
}

// Makes the directory `dir` unless it is one already; false with errno set otherwise (EEXIST
// for a file in its place, as Rust's `create_dir_all` says).
static bool make_dir(const char *dir) {
  if (mkdir(dir, 0755) == 0) return true;
  if (errno != EEXIST) return false;
  struct stat found;
  if (stat(dir, &found) == 0 && S_ISDIR(found.st_mode)) return true;
  errno = EEXIST;
  return false;
}

// Makes every directory above the file `path` (as `mkdir -p` of its parent).
static bool make_parent_dirs(const char *path) {
  char *copy = strdup(path);
  if (!copy) return false;
  bool ok = true;
  for (char *slash = strchr(copy + 1, '/'); ok && slash; slash = strchr(slash + 1, '/')) {
    *slash = '\0';
    ok = make_dir(copy);
    *slash = '/';
  }
  int error = errno;
  free(copy);
  errno = error;
  return ok;
}

// Writes `text` to `path` (its directories made first) and reads it back into `read`
// (at most `size` - 1 bytes); false with errno set when a step fails.
static bool write_and_read_back(const char *path, const char *text, char *read, size_t size) {
  if (!make_parent_dirs(path)) return false;
  FILE *file = fopen(path, "w");
  if (!file) return false;
  bool written = fputs(text, file) >= 0;
  if (fclose(file) != 0 || !written) return false;
  if (!(file = fopen(path, "r"))) return false;
  size_t count = fread(read, 1, size - 1, file);
  read[count] = '\0';
  return fclose(file) == 0;
}

// Decimal digits only (no sign), fitting a u64, in `*value`; false otherwise.
static bool digits(const char *text, uint64_t *value) {
  *value = 0;
  if (!*text) return false;
  for (; *text; text++) {
    if (*text < '0' || *text > '9') return false;
    uint64_t digit = (uint64_t)(*text - '0');
    if (*value > (UINT64_MAX - digit) / 10) return false;
    *value = *value * 10 + digit;
  }
  return true;
}

// Each line `name<TAB>next<TAB>sum` of a version 1 checkpoint sets that task's progress;
// anything else in it is refused, in the same words by every language's batch runner.
static bool restore(batch_t *batch, const caravan_bytes_t *restored, caravan_error_t *err) {
  uint32_t version;
  const uint8_t *data;
  size_t len;
  if (!caravan_decode_checkpoint(restored, &version, &data, &len)) {
    return caravan_failed(err, "the restored checkpoint has no caravan-checkpoint header");
  }
  if (version != CHECKPOINT_VERSION) {
    return caravan_failed(err, "checkpoint version %u is not one this runner reads", (unsigned)version);
  }
  if (memchr(data, '\0', len)) return caravan_failed(err, "the restored checkpoint's progress cannot be read");
  char *text = malloc(len + 1);
  if (!text) return caravan_failed(err, "out of memory");
  memcpy(text, data, len);
  text[len] = '\0';
  bool ok = true;
  for (char *line = text, *end; ok && *line; line = end) {
    end = strchr(line, '\n');
    end = end ? (*end = '\0', end + 1) : line + strlen(line);
    if (!*line) continue;
    char *first_tab = strchr(line, '\t'), *second_tab = first_tab ? strchr(first_tab + 1, '\t') : NULL;
    uint64_t next, sum;
    ok = second_tab && !strchr(second_tab + 1, '\t');
    if (ok) {
      *first_tab = *second_tab = '\0';
      ok = digits(first_tab + 1, &next) && next >= 1 && next <= MAX_NUMBERS + 1 &&
           digits(second_tab + 1, &sum);
    }
    for (size_t i = 0; ok && i < batch->count; i++) {
      summing_t *task = &batch->tasks[i];
      if (strcmp(task->name, line)) continue;
      task->next = (int64_t)next;
      task->sum = sum;
      caravan_info("batch", "task %s resumed at %" PRId64, task->name, task->next);
    }
  }
  free(text);
  return ok ? true : caravan_failed(err, "the restored checkpoint's progress cannot be read");
}

static bool on_start(void *self, const caravan_alloc_t *alloc, const caravan_bytes_t *restored,
                     caravan_state_t *state, caravan_error_t *err) {
  batch_t *batch = self;
  batch->tasks = calloc(alloc->tasks.len ? alloc->tasks.len : 1, sizeof *batch->tasks);
  if (!batch->tasks) return caravan_failed(err, "out of memory");
  for (size_t i = 0; i < alloc->tasks.len; i++) {
    summing_t *task = &batch->tasks[i];
    const caravan_task_t *spec = &alloc->tasks.ptr[i];
    task->name = caravan_task_name(state, i);
    task->next = 1;
    if (!setting(spec, "numbers", 1000, 0, MAX_NUMBERS, &task->numbers, err)) return false;
    if (!setting(spec, "chunk", 100, 1, INT64_MAX, &task->chunk, err)) return false;
    batch->count++; // from here on `drop` frees its result_file
    if (!result_file(spec, &task->result_file, err)) return false;
  }
  if (restored && !restore(batch, restored, err)) return false;
  for (size_t i = 0; i < batch->count; i++) caravan_state_task_started(state, batch->tasks[i].name);
  if (batch->count == 0) caravan_state_set_status(state, CARAVAN_COMPLETE, "All tasks have completed");
  return true;
}

static uint64_t next_wakeup_ms(void *self) {
  batch_t *batch = self;
  for (size_t i = 0; i < batch->count; i++) {
    if (!batch->tasks[i].done) return 0;
  }
  return CARAVAN_NO_WAKEUP;
}

static bool on_wakeup(void *self, caravan_state_t *state, caravan_error_t *err) {
  (void)err;
  batch_t *batch = self;
  for (size_t i = 0; i < batch->count; i++) {
    summing_t *task = &batch->tasks[i];
    if (task->done) continue;
    // `chunk` may be near INT64_MAX: compared as what is left, not added up.
    int64_t last = task->chunk - 1 >= task->numbers - task->next ? task->numbers
                                                                : task->next + task->chunk - 1;
    for (int64_t n = task->next; n <= last; n++) task->sum += (uint64_t)n * (uint64_t)n;
    task->next = last + 1;
    if (task->next <= task->numbers) continue;
    task->done = true;
    // The path is at most MAX_RESULT_FILE bytes: the message is never cut.
    char message[MAX_RESULT_FILE + 64];
    snprintf(message, sizeof message, "Computed the sum of squares of 1..%" PRId64 ": %" PRIu64,
             task->numbers, task->sum);
    caravan_info("batch", "task %s computed the sum of squares of 1..%" PRId64 ": %" PRIu64,
                 task->name, task->numbers, task->sum);
    bool failed = false;
    if (task->result_file) {
      const char *path = task->result_file;
      char result[64], read[64];
      snprintf(result, sizeof result, "{\"numbers\":%" PRId64 ",\"sum\":%" PRIu64 "}\n",
               task->numbers, task->sum);
      if (!write_and_read_back(path, result, read, sizeof read)) {
        failed = true;
        snprintf(message, sizeof message, "Cannot write %s: %s", path, reason(errno));
      } else if (strcmp(read, result)) {
        failed = true;
        snprintf(message, sizeof message, "%s reads back otherwise", path);
      } else {
        caravan_info("batch", "task %s wrote %zu bytes to %s", task->name, strlen(read), path);
      }
    }
    caravan_state_task_finished(state, task->name, failed, message);
  }
  return true;
}

static void on_shutdown(void *self, caravan_bytes_t *checkpoint) {
  batch_t *batch = self;
  size_t room = 1;
  for (size_t i = 0; i < batch->count; i++) room += strlen(batch->tasks[i].name) + 48;
  char *lines = malloc(room);
  if (!lines) return; // nothing saved: the next start begins again
  size_t used = 0;
  lines[0] = '\0';
  for (size_t i = 0; i < batch->count; i++) {
    const summing_t *task = &batch->tasks[i];
    used += (size_t)snprintf(lines + used, room - used, "%s\t%" PRId64 "\t%" PRIu64 "\n",
                             task->name, task->next, task->sum);
  }
  caravan_encode_checkpoint(CHECKPOINT_VERSION, lines, used, checkpoint);
  free(lines);
}

static void drop(void *self) {
  batch_t *batch = self;
  for (size_t i = 0; i < batch->count; i++) free(batch->tasks[i].result_file);
  free(batch->tasks);
}

static const caravan_runner_t BATCH = {
    .on_start = on_start,
    .next_wakeup_ms = next_wakeup_ms,
    .on_wakeup = on_wakeup,
    .on_shutdown = on_shutdown,
    .drop = drop,
};

CARAVAN_EXPORT_RUNNER(BATCH, batch_t)

// {name}: a Caravan batch runner, made by `caravan runner new --files`. It writes
// /alloc/out/result.json (the alloc's id and its number of tasks), reads it back, logs it and
// ends each task with it; `caravan alloc fs ALLOC out/result.json` shows the file. wasi-libc's
// stdio reaches the alloc dir: the runner is built against the `alloc-runner` world.
// The SDK's header (caravan_runner.h, guest-sdk/c in the Caravan checkout) gives the event
// loop's rules and every hook.

#include "caravan_runner.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define RESULT "/alloc/out/result.json"

typedef struct {
  int unused;
} files_t;

// Writes `text` to RESULT (making /alloc/out first) and reads it back into `read`; false
// with errno set when a step fails.
static bool write_and_read_back(const char *text, char *read, size_t size) {
  if (mkdir("/alloc/out", 0755) != 0 && errno != EEXIST) return false;
  FILE *file = fopen(RESULT, "w");
  if (!file) return false;
  bool written = fputs(text, file) >= 0;
  if (fclose(file) != 0 || !written) return false;
  if (!(file = fopen(RESULT, "r"))) return false;
  size_t count = fread(read, 1, size - 1, file);
  read[count] = '\0';
  return fclose(file) == 0;
}

static bool on_start(void *self, const caravan_alloc_t *alloc, const caravan_bytes_t *restored,
                     caravan_state_t *state, caravan_error_t *err) {
  (void)self, (void)restored;
  char result[160], read[160];
  // The alloc id is a UUID: nothing in it needs escaping in JSON.
  snprintf(result, sizeof result, "{\"alloc\":\"%.*s\",\"tasks\":%zu}\n", (int)alloc->id.len,
           (const char *)alloc->id.ptr, alloc->tasks.len);
  if (!write_and_read_back(result, read, sizeof read)) {
    return caravan_failed(err, "cannot write " RESULT ": %s", strerror(errno));
  }
  read[strcspn(read, "\n")] = '\0';
  caravan_info("{name}", "wrote " RESULT ": %s", read);
  for (size_t i = 0; i < state->task_count; i++) {
    const char *task = caravan_task_name(state, i);
    caravan_state_task_started(state, task);
    caravan_state_task_finished(state, task, false, "Wrote " RESULT);
  }
  if (state->task_count == 0) {
    caravan_state_set_status(state, CARAVAN_COMPLETE, "All tasks have completed");
  }
  return true;
}

static const caravan_runner_t FILES = {.on_start = on_start};

CARAVAN_EXPORT_RUNNER(FILES, files_t)

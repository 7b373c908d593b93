// {name}: a Caravan runner, made by `caravan runner new`. It starts its tasks, says hello,
// logs a line every `log_every` (task config, default 10s) and runs until it is killed.
// The SDK's header (caravan_runner.h, guest-sdk/c in the Caravan checkout) gives the event
// loop's rules and every hook.

#include "caravan_runner.h"

typedef struct {
  uint64_t every, next; // ms
} hello_t;

static bool on_start(void *self, const caravan_alloc_t *alloc, const caravan_bytes_t *restored,
                     caravan_state_t *state, caravan_error_t *err) {
  (void)restored;
  hello_t *hello = self;
  hello->every = 10000;
  for (size_t i = 0; i < alloc->tasks.len; i++) {
    uint64_t configured;
    bool set;
    if (!caravan_config_duration_ms(&alloc->tasks.ptr[i], "log_every", &configured, &set, err)) {
      return false;
    }
    if (set) hello->every = configured;
    caravan_state_task_started(state, caravan_task_name(state, i));
  }
  caravan_info("{name}", "hello from alloc %.*s", (int)alloc->id.len, (char *)alloc->id.ptr);
  hello->next = caravan_now_ms() + hello->every;
  return true;
}

static uint64_t next_wakeup_ms(void *self) {
  hello_t *hello = self;
  uint64_t now = caravan_now_ms();
  return hello->next > now ? hello->next - now : 0;
}

static bool on_wakeup(void *self, caravan_state_t *state, caravan_error_t *err) {
  (void)state, (void)err;
  hello_t *hello = self;
  caravan_info("{name}", "still running");
  hello->next = caravan_now_ms() + hello->every;
  return true;
}

static const caravan_runner_t HELLO = {
    .on_start = on_start,
    .next_wakeup_ms = next_wakeup_ms,
    .on_wakeup = on_wakeup,
};

CARAVAN_EXPORT_RUNNER(HELLO, hello_t)

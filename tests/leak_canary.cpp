// Proves the sanitizer run's leak check is live: this program creates a context (so the driver
// stack and its suppressions are in play) and then leaks a block of its own. CTest expects LSan to
// report it; if LeakSanitizer stopped reporting our leaks, this test would fail and CI go red.
#include <flashvk.hpp>

#include <cstdio>

int main() {
  flashvk::Context ctx = flashvk::Context::create({});
  auto* leaked = new int[64];
  leaked[0] = 1;
  std::printf("leaked a block at %p on %s\n", static_cast<void*>(leaked),
              ctx.device().name.c_str());
  leaked = nullptr;
  return 0;
}

// Drives export/deepstream/nvmsgconv_dfine the way gst-nvmsgconv does: dlopen() the library given as
// argv[1], resolve all seven nvds_msg2p_* functions (nvmsgconv refuses a library lacking one), create
// a context for NVDS_PAYLOAD_CUSTOM without a config file, convert event messages one at a time
// (generate, as nvmsgconv does for a custom payload type) and several at once (generate_multiple),
// print every payload on its own line as "payload <bytes> <text>", and release each. Its event
// messages are filled like deepstream-test5-app fills them. tests/export/test_deepstream_msgconv.py
// reads the output (against our header transcription), and scripts/record_deepstream_headers.py
// records it against NVIDIA's headers.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "nvmsgconv.h"

namespace {

struct Library {
  decltype(&nvds_msg2p_ctx_create) create;
  decltype(&nvds_msg2p_ctx_destroy) destroy;
  decltype(&nvds_msg2p_generate) generate;
  decltype(&nvds_msg2p_generate_multiple) generateMultiple;
  decltype(&nvds_msg2p_generate_new) generateNew;
  decltype(&nvds_msg2p_generate_multiple_new) generateMultipleNew;
  decltype(&nvds_msg2p_release) release;
};

template <typename F>
void resolve(void *handle, const char *name, F *slot) {
  *slot = reinterpret_cast<F>(dlsym(handle, name));
}

void printAndRelease(Library const &lib, NvDsMsg2pCtx *ctx, NvDsPayload *payload) {
  if (payload == nullptr) {
    std::printf("payload none\n");
    return;
  }
  std::printf("payload %u %.*s\n", payload->payloadSize, static_cast<int>(payload->payloadSize),
              static_cast<const char *>(payload->payload));
  lib.release(ctx, payload);
}

NvDsEventMsgMeta event(gint sensor, gint frame, const char *ts, const char *label, guint64 track,
                       double confidence, NvDsRect box) {
  NvDsEventMsgMeta meta;
  std::memset(&meta, 0, sizeof meta);
  meta.type = NVDS_EVENT_ENTRY;
  meta.sensorId = sensor;
  meta.frameId = frame;
  meta.ts = const_cast<gchar *>(ts);
  meta.objectId = const_cast<gchar *>(label);
  meta.trackingId = track;
  meta.confidence = confidence;
  meta.bbox = box;
  return meta;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LIBRARY.so\n", argv[0]);
    return 2;
  }
  void *handle = dlopen(argv[1], RTLD_LAZY);
  if (handle == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  dlerror();
  Library lib{};
  resolve(handle, "nvds_msg2p_ctx_create", &lib.create);
  resolve(handle, "nvds_msg2p_ctx_destroy", &lib.destroy);
  resolve(handle, "nvds_msg2p_generate", &lib.generate);
  resolve(handle, "nvds_msg2p_generate_multiple", &lib.generateMultiple);
  resolve(handle, "nvds_msg2p_generate_new", &lib.generateNew);
  resolve(handle, "nvds_msg2p_generate_multiple_new", &lib.generateMultipleNew);
  resolve(handle, "nvds_msg2p_release", &lib.release);
  if (const char *error = dlerror()) {
    std::fprintf(stderr, "dlsym: %s\n", error);
    return 1;
  }
  NvDsMsg2pCtx *ctx = lib.create(nullptr, NVDS_PAYLOAD_CUSTOM);
  if (ctx == nullptr) {
    std::fprintf(stderr, "nvds_msg2p_ctx_create gave no context\n");
    return 1;
  }
  std::printf("context payloadType %d\n", static_cast<int>(ctx->payloadType));

  // box members in NVIDIA's order: top, left, width, height
  NvDsEventMsgMeta tracked =
      event(2, 4211, "2026-12-01T14:26:41.513Z", "person", 17, 0.87312, NvDsRect{188.0f, 412.5f, 57.75f, 167.75f});
  NvDsEventMsgMeta untracked = event(0, 7, "2026-12-01T15:26:41.5+01:00", nullptr, ~static_cast<guint64>(0), 0.5,
                                     NvDsRect{10.0f, 20.0f, 30.0f, 40.0f});
  untracked.objClassId = 3;
  NvDsEventMsgMeta named = event(1, 0, "2026-12-01T14:26:41Z", "fork \"lift\"\t2", 0, 1.0, NvDsRect{0, 0, 1, 1});
  named.sensorStr = const_cast<gchar *>("dock-west");

  NvDsEvent one[] = {{tracked.type, &tracked}};
  printAndRelease(lib, ctx, lib.generate(ctx, one, 1));
  NvDsEvent several[] = {{untracked.type, &untracked}, {named.type, &named}};
  guint count = 0;
  NvDsPayload **payloads = lib.generateMultiple(ctx, several, 2, &count);
  std::printf("generate_multiple count %u\n", count);
  for (guint i = 0; i < count; ++i) printAndRelease(lib, ctx, payloads[i]);
  std::free(payloads);  // nvmsgconv's g_free

  // without a readable time the payload carries the clock's: printed as its distance from now
  NvDsEventMsgMeta timeless = event(0, 1, nullptr, "person", 5, 0.25, NvDsRect{1, 2, 3, 4});
  NvDsEvent last[] = {{timeless.type, &timeless}};
  NvDsPayload *clocked = lib.generate(ctx, last, 1);
  double time = clocked ? std::atof(std::strstr(static_cast<const char *>(clocked->payload), "\"time\": ") + 8) : 0;
  std::printf("timeless within 60 s of now %s\n", std::abs(time - static_cast<double>(std::time(nullptr))) < 60 ? "yes" : "no");
  if (clocked) lib.release(ctx, clocked);

  guint newCount = 99;
  NvDsMsg2pMetaInfo info{};
  bool none = lib.generateNew(ctx, &info) == nullptr && lib.generateMultipleNew(ctx, &info, &newCount) == nullptr;
  std::printf("new api payloads %s count %u\n", none ? "none" : "some", newCount);
  lib.destroy(ctx);
  dlclose(handle);
  return 0;
}

// Prints, one fact a line, what export/deepstream/nvmsgconv_dfine relies on in the nvmsgconv
// headers it is compiled against (nvdsmeta_schema.h, nvmsgconv.h): the enum values our generated
// config names, the size and member offsets of what the library reads and writes, and that the seven
// entry points have the signatures the library defines (a mismatch does not compile). Compiled
// against NVIDIA's DeepStream headers by scripts/record_deepstream_headers.py (facts recorded in
// tests/data/deepstream_headers.json) and against our transcription, tests/fakes/nvmsgconv, by
// tests/export/test_deepstream_msgconv.py.
#include <cstddef>
#include <cstdio>
#include <type_traits>

#include "nvmsgconv.h"

#define SIGNATURE(function, type) \
  static_assert(std::is_same_v<decltype(&function), type>, #function " has another signature")
SIGNATURE(nvds_msg2p_ctx_create, NvDsMsg2pCtx *(*)(const gchar *, NvDsPayloadType));
SIGNATURE(nvds_msg2p_ctx_destroy, void (*)(NvDsMsg2pCtx *));
SIGNATURE(nvds_msg2p_generate, NvDsPayload *(*)(NvDsMsg2pCtx *, NvDsEvent *, guint));
SIGNATURE(nvds_msg2p_generate_multiple, NvDsPayload **(*)(NvDsMsg2pCtx *, NvDsEvent *, guint, guint *));
SIGNATURE(nvds_msg2p_generate_new, NvDsPayload *(*)(NvDsMsg2pCtx *, void *));
SIGNATURE(nvds_msg2p_generate_multiple_new, NvDsPayload **(*)(NvDsMsg2pCtx *, void *, guint *));
SIGNATURE(nvds_msg2p_release, void (*)(NvDsMsg2pCtx *, NvDsPayload *));

#define ENUM(name) std::printf("enum %s %d\n", #name, static_cast<int>(name))
#define SIZE(type) std::printf("sizeof %s %zu\n", #type, sizeof(type))
#define MEMBER(type, member) \
  std::printf("offsetof %s.%s %zu size %zu\n", #type, #member, offsetof(type, member), sizeof(type::member))

int main() {
  ENUM(NVDS_PAYLOAD_DEEPSTREAM);
  ENUM(NVDS_PAYLOAD_CUSTOM);
  ENUM(NVDS_EVENT_ENTRY);
  ENUM(NVDS_EVENT_CUSTOM);
  SIZE(NvDsEventType);
  SIZE(NvDsPayloadType);
  SIZE(NvDsRect);
  MEMBER(NvDsRect, top);
  MEMBER(NvDsRect, left);
  MEMBER(NvDsRect, width);
  MEMBER(NvDsRect, height);
  MEMBER(NvDsEventMsgMeta, type);
  MEMBER(NvDsEventMsgMeta, bbox);
  MEMBER(NvDsEventMsgMeta, objClassId);
  MEMBER(NvDsEventMsgMeta, sensorId);
  MEMBER(NvDsEventMsgMeta, frameId);
  MEMBER(NvDsEventMsgMeta, confidence);
  MEMBER(NvDsEventMsgMeta, trackingId);
  MEMBER(NvDsEventMsgMeta, ts);
  MEMBER(NvDsEventMsgMeta, objectId);
  MEMBER(NvDsEventMsgMeta, sensorStr);
  SIZE(NvDsEvent);
  MEMBER(NvDsEvent, eventType);
  MEMBER(NvDsEvent, metadata);
  SIZE(NvDsPayload);
  MEMBER(NvDsPayload, payload);
  MEMBER(NvDsPayload, payloadSize);
  MEMBER(NvDsPayload, componentId);
  SIZE(NvDsMsg2pCtx);
  MEMBER(NvDsMsg2pCtx, payloadType);
  MEMBER(NvDsMsg2pCtx, privData);
  return 0;
}

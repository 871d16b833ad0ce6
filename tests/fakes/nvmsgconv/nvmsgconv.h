// OUR TRANSCRIPTION, NOT NVIDIA'S FILE: the payload-library interface of DeepStream's message
// converter (src/utils/nvmsgconv/nvmsgconv.h, github.com/NVIDIA/DeepStream, tags v9.0.0 and
// v9.1.0; a DeepStream install has it under sources/libs/nvmsgconv), declared in our own words.
// gst-nvmsgconv dlopen()s the library named by its msg2p-lib property and resolves all seven
// functions below; a missing one fails the element's start.
#pragma once
#include "nvdsmeta_schema.h"

#ifdef __cplusplus
extern "C" {
#endif

// The library's state between calls; nvmsgconv only passes the pointer back.
typedef struct NvDsMsg2pCtx {
  NvDsPayloadType payloadType;
  gpointer privData;
} NvDsMsg2pCtx;

// What the "new API" (msg2p-newapi=1) hands over instead of event messages: DeepStream's own frame
// and object meta.
typedef struct {
  void *objMeta;
  void *frameMeta;
  gchar *mediaType;
  void *datamap;
} NvDsMsg2pMetaInfo;

// file: the msg-conv-config path (may be NULL); type: the payload-type asked for.
NvDsMsg2pCtx *nvds_msg2p_ctx_create(const gchar *file, NvDsPayloadType type);
void nvds_msg2p_ctx_destroy(NvDsMsg2pCtx *ctx);
// One payload for `size` events.
NvDsPayload *nvds_msg2p_generate(NvDsMsg2pCtx *ctx, NvDsEvent *events, guint size);
// Any number of payloads for `size` events; the count goes to *payloadCount and nvmsgconv frees the
// returned array with g_free.
NvDsPayload **nvds_msg2p_generate_multiple(NvDsMsg2pCtx *ctx, NvDsEvent *events, guint size,
                                           guint *payloadCount);
NvDsPayload *nvds_msg2p_generate_new(NvDsMsg2pCtx *ctx, void *metadataInfo);
NvDsPayload **nvds_msg2p_generate_multiple_new(NvDsMsg2pCtx *ctx, void *metadataInfo,
                                               guint *payloadCount);
// Frees one payload returned by a generate function, after the broker took it.
void nvds_msg2p_release(NvDsMsg2pCtx *ctx, NvDsPayload *payload);

#ifdef __cplusplus
}
#endif

// OUR TRANSCRIPTION, NOT NVIDIA'S FILE: the part of DeepStream's event-message schema header
// (includes/nvdsmeta_schema.h, github.com/NVIDIA/DeepStream, tags v9.0.0 and v9.1.0) that
// export/deepstream/nvmsgconv_dfine reads, declared in our own words so the test suite compiles the
// payload library without DeepStream. Names, member order and types follow NVIDIA's declarations;
// tests/export/test_deepstream_msgconv.py requires the layout probe to print here what it printed
// against NVIDIA's header (tests/data/deepstream_headers.json).
//
// Left out: the object-extension structs and every NvDsEventMsgMeta member after sensorStr (the
// library reads none of them, and only DeepStream allocates the real struct). So sizeof differs
// from NVIDIA's; the offsets of the members declared here do not.
#pragma once
#include <glib.h>

#ifdef __cplusplus
extern "C" {
#endif

// What happened to the object; the apps that attach event messages choose it.
typedef enum NvDsEventType {
  NVDS_EVENT_ENTRY,
  NVDS_EVENT_EXIT,
  NVDS_EVENT_MOVING,
  NVDS_EVENT_STOPPED,
  NVDS_EVENT_EMPTY,
  NVDS_EVENT_PARKED,
  NVDS_EVENT_RESET,
  NVDS_EVENT_RESERVED = 0x100,
  NVDS_EVENT_CUSTOM = 0x101,
  NVDS_EVENT_FORCE32 = 0x7FFFFFFF
} NvDsEventType;

// Which extension object (extMsg) an event carries; only its size matters here.
typedef enum NvDsObjectType {
  NVDS_OBJECT_TYPE_VEHICLE,
  NVDS_OBJECT_TYPE_PERSON,
  NVDS_OBJECT_TYPE_RESERVED = 0x100,
  NVDS_OBJECT_TYPE_CUSTOM = 0x101,
  NVDS_OBJECT_TYPE_UNKNOWN = 0x102,
  NVDS_OBJECT_TYPE_FORCE32 = 0x7FFFFFFF
} NvDsObjectType;

// The payload format nvmsgconv is asked for (its payload-type property); a library loaded through
// msg2p-lib is asked for NVDS_PAYLOAD_CUSTOM.
typedef enum NvDsPayloadType {
  NVDS_PAYLOAD_DEEPSTREAM,
  NVDS_PAYLOAD_DEEPSTREAM_MINIMAL,
  NVDS_PAYLOAD_DEEPSTREAM_PROTOBUF,
  NVDS_PAYLOAD_RESERVED = 0x100,
  NVDS_PAYLOAD_CUSTOM = 0x101,
  NVDS_PAYLOAD_FORCE32 = 0x7FFFFFFF
} NvDsPayloadType;

// A box in pixels: note top comes before left.
typedef struct NvDsRect {
  float top;
  float left;
  float width;
  float height;
} NvDsRect;

typedef struct NvDsGeoLocation {
  gdouble lat;
  gdouble lon;
  gdouble alt;
} NvDsGeoLocation;

typedef struct NvDsCoordinate {
  gdouble x;
  gdouble y;
  gdouble z;
} NvDsCoordinate;

typedef struct NvDsObjectSignature {
  gdouble *signature;
  guint size;
} NvDsObjectSignature;

// One object's event message, as an app attaches it to a frame (NVDS_EVENT_MSG_META user meta).
typedef struct NvDsEventMsgMeta {
  NvDsEventType type;
  NvDsObjectType objType;
  NvDsRect bbox;                   // in the pixels the app chose (deepstream-test5: the source's)
  NvDsGeoLocation location;
  NvDsCoordinate coordinate;
  NvDsObjectSignature objSignature;
  gint objClassId;
  gint sensorId;                   // the source's number
  gint moduleId;
  gint placeId;
  gint componentId;
  gint frameId;                    // the frame's number in its source
  gdouble confidence;
  guint64 trackingId;              // all ones: not tracked
  gchar *ts;                       // RFC 3339 UTC time text, e.g. 2026-12-01T14:26:41.513Z
  gchar *objectId;                 // deepstream-test5: the object's label
  gchar *sensorStr;                // a sensor name, when the app has one
  // (further members left out: see the top of this file)
} NvDsEventMsgMeta;

// One entry of the event list nvmsgconv hands to the generate functions.
typedef struct _NvDsEvent {
  NvDsEventType eventType;
  NvDsEventMsgMeta *metadata;
} NvDsEvent;

// One message for the broker: the bytes, their count, and the id nvmsgconv stamps on it.
typedef struct NvDsPayload {
  gpointer payload;
  guint payloadSize;
  guint componentId;
} NvDsPayload;

#ifdef __cplusplus
}
#endif

// nvmsgconv payload library (msg-conv-msg2p-lib): turns each DeepStream event message
// (NvDsEventMsgMeta) into one JSON object shaped like dfine-serve's events (docs/serving-fleet.md),
// so one MQTT or Redis consumer reads both. export/deepstream/README.md lists what DeepStream's
// message cannot fill and how those fields are marked:
//   id          "<time with 6 decimals>-<6 random [a-z0-9]>", dfine-serve's form
//   stream      sensorStr when the app set one, else "source<sensorId>" (deepstream-app's group name)
//   time        Unix seconds parsed from ts (RFC 3339); without a readable ts, the clock at conversion
//   frame_index frameId
//   kind        "detection": one object seen in one frame (not one of dfine-serve's kinds)
//   line, zone, direction, frame_size, snapshot, clip: null (the message carries none of them)
//   class       objectId (deepstream-test5-app puts the object's label there), else "class<objClassId>"
//   track_id    trackingId, null when it is all ones (DeepStream's "not tracked")
//   score       confidence, 4 decimals
//   box         [left, top, left + width, top + height] from bbox, in the pixels the app used
//
// nvmsgconv resolves all seven nvds_msg2p_* functions. The "new API" pair (msg2p-newapi=1) would
// hand over DeepStream's frame meta, which this library does not read: they make no payload.

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <random>
#include <string>

#include "nvmsgconv.h"

namespace {

constexpr const char *kKind = "detection";
constexpr guint64 kUntracked = ~static_cast<guint64>(0);

struct State {
  std::mt19937_64 random{std::random_device{}()};
};

void appendQuoted(std::string &out, const char *text) {
  out += '"';
  for (const unsigned char *c = reinterpret_cast<const unsigned char *>(text); *c; ++c) {
    if (*c == '"' || *c == '\\') {
      out += '\\';
      out += static_cast<char>(*c);
    } else if (*c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", *c);
      out += escaped;
    } else {
      out += static_cast<char>(*c);
    }
  }
  out += '"';
}

void appendNumber(std::string &out, const char *format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, std::isfinite(value) ? value : 0.0);
  out += text;
}

// Unix seconds of an RFC 3339 time ("2026-12-01T14:26:41.513Z", or with a +hh:mm / -hh:mm offset);
// false when the text is not one.
bool parseRfc3339(const char *text, double *seconds) {
  if (text == nullptr) return false;
  struct tm parts = {};
  int consumed = 0;
  if (std::sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d%n", &parts.tm_year, &parts.tm_mon, &parts.tm_mday,
                  &parts.tm_hour, &parts.tm_min, &parts.tm_sec, &consumed) != 6)
    return false;
  const char *rest = text + consumed;
  double fraction = 0.0;
  if (*rest == '.') {
    double scale = 0.1;
    for (++rest; *rest >= '0' && *rest <= '9'; ++rest, scale /= 10) fraction += (*rest - '0') * scale;
  }
  int offset = 0;
  if (*rest == '+' || *rest == '-') {
    int hours = 0, minutes = 0;
    if (std::sscanf(rest + 1, "%2d:%2d", &hours, &minutes) != 2) return false;
    offset = (*rest == '+' ? 1 : -1) * (hours * 3600 + minutes * 60);
  } else if (*rest != 'Z' && *rest != 'z') {
    return false;
  }
  parts.tm_year -= 1900;
  parts.tm_mon -= 1;
  *seconds = static_cast<double>(timegm(&parts)) + fraction - offset;
  return true;
}

std::string eventJson(State &state, NvDsEventMsgMeta const &meta) {
  double time = 0.0;
  if (!parseRfc3339(meta.ts, &time)) {
    struct timespec now = {};
    clock_gettime(CLOCK_REALTIME, &now);
    time = static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9;
  }
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  char suffix[7] = {};
  for (char &c : suffix) c = kAlphabet[state.random() % (sizeof kAlphabet - 1)];
  suffix[6] = '\0';
  char id[48];
  std::snprintf(id, sizeof id, "%.6f-%s", time, suffix);

  std::string stream = meta.sensorStr && *meta.sensorStr ? meta.sensorStr : "source" + std::to_string(meta.sensorId);
  std::string label = meta.objectId && *meta.objectId ? meta.objectId : "class" + std::to_string(meta.objClassId);

  std::string out = "{\"id\": ";
  appendQuoted(out, id);
  out += ", \"stream\": ";
  appendQuoted(out, stream.c_str());
  out += ", \"time\": ";
  appendNumber(out, "%.6f", time);
  out += ", \"frame_index\": " + std::to_string(meta.frameId);
  out += ", \"kind\": ";
  appendQuoted(out, kKind);
  out += ", \"line\": null, \"zone\": null, \"direction\": null, \"class\": ";
  appendQuoted(out, label.c_str());
  out += ", \"track_id\": ";
  out += meta.trackingId == kUntracked ? std::string("null") : std::to_string(meta.trackingId);
  out += ", \"score\": ";
  appendNumber(out, "%.4f", meta.confidence);
  NvDsRect const &box = meta.bbox;
  out += ", \"box\": [";
  appendNumber(out, "%.9g", box.left);
  out += ", ";
  appendNumber(out, "%.9g", box.top);
  out += ", ";
  appendNumber(out, "%.9g", static_cast<double>(box.left) + box.width);
  out += ", ";
  appendNumber(out, "%.9g", static_cast<double>(box.top) + box.height);
  out += "], \"frame_size\": null, \"snapshot\": null, \"clip\": null}";
  return out;
}

// A payload owning a malloc'd copy of `text`; nullptr when memory runs out.
NvDsPayload *newPayload(std::string const &text) {
  auto *payload = static_cast<NvDsPayload *>(std::calloc(1, sizeof(NvDsPayload)));
  char *bytes = static_cast<char *>(std::malloc(text.size() + 1));
  if (payload == nullptr || bytes == nullptr) {
    std::free(payload);
    std::free(bytes);
    return nullptr;
  }
  std::memcpy(bytes, text.c_str(), text.size() + 1);
  payload->payload = bytes;
  payload->payloadSize = static_cast<guint>(text.size());
  return payload;
}

State &stateOf(NvDsMsg2pCtx *ctx) { return *static_cast<State *>(ctx->privData); }

}  // namespace

extern "C" {

NvDsMsg2pCtx *nvds_msg2p_ctx_create(const gchar *, NvDsPayloadType type) {
  auto *ctx = static_cast<NvDsMsg2pCtx *>(std::calloc(1, sizeof(NvDsMsg2pCtx)));
  State *state = new (std::nothrow) State();
  if (ctx == nullptr || state == nullptr) {
    std::free(ctx);
    delete state;
    return nullptr;
  }
  ctx->payloadType = type;
  ctx->privData = state;
  return ctx;
}

void nvds_msg2p_ctx_destroy(NvDsMsg2pCtx *ctx) {
  if (ctx == nullptr) return;
  delete static_cast<State *>(ctx->privData);
  std::free(ctx);
}

// One payload: the events' JSON objects, one a line (nvmsgconv gives one event at a time for a
// custom payload type, so one object).
NvDsPayload *nvds_msg2p_generate(NvDsMsg2pCtx *ctx, NvDsEvent *events, guint size) {
  if (ctx == nullptr || events == nullptr) return nullptr;
  std::string text;
  for (guint i = 0; i < size; ++i) {
    if (events[i].metadata == nullptr) continue;
    if (!text.empty()) text += '\n';
    text += eventJson(stateOf(ctx), *events[i].metadata);
  }
  return text.empty() ? nullptr : newPayload(text);
}

// One payload per event. The array is malloc'd: nvmsgconv frees it with g_free, which is free()
// since GLib 2.46.
NvDsPayload **nvds_msg2p_generate_multiple(NvDsMsg2pCtx *ctx, NvDsEvent *events, guint size,
                                           guint *payloadCount) {
  if (payloadCount == nullptr) return nullptr;
  *payloadCount = 0;
  if (ctx == nullptr || events == nullptr || size == 0) return nullptr;
  auto **payloads = static_cast<NvDsPayload **>(std::calloc(size, sizeof(NvDsPayload *)));
  if (payloads == nullptr) return nullptr;
  for (guint i = 0; i < size; ++i) {
    if (events[i].metadata == nullptr) continue;
    NvDsPayload *payload = newPayload(eventJson(stateOf(ctx), *events[i].metadata));
    if (payload != nullptr) payloads[(*payloadCount)++] = payload;
  }
  return payloads;
}

NvDsPayload *nvds_msg2p_generate_new(NvDsMsg2pCtx *, void *) { return nullptr; }

NvDsPayload **nvds_msg2p_generate_multiple_new(NvDsMsg2pCtx *, void *, guint *payloadCount) {
  if (payloadCount != nullptr) *payloadCount = 0;
  return nullptr;
}

void nvds_msg2p_release(NvDsMsg2pCtx *, NvDsPayload *payload) {
  if (payload == nullptr) return;
  std::free(payload->payload);
  std::free(payload);
}

}  // extern "C"

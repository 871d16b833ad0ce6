// OUR STAND-IN, NOT GLIB'S FILE: the GLib scalar type names (and two container types, opaque) that DeepStream's
// nvdsmeta_schema.h and nvmsgconv.h use, with the types GLib gives them on the 64-bit Linux
// targets DeepStream runs on (gint64 and guint64 are long there). It lets
// scripts/record_deepstream_headers.py and the test suite compile the nvmsgconv payload library on
// a machine without GLib's development files; on a DeepStream machine the Makefile uses GLib's own.
#pragma once
typedef char gchar;
typedef int gint;
typedef unsigned int guint;
typedef int gboolean;
typedef long gint64;
typedef unsigned long guint64;
typedef int gint32;
typedef float gfloat;
typedef double gdouble;
typedef void *gpointer;
typedef struct _GHashTable GHashTable;
typedef struct _GList GList;

/* json.h: a minimal JSON reader (a tree of values) and string writer for checkpoint headers
 * (internal). It accepts RFC 8259 JSON: objects, arrays, strings with every escape (\uXXXX with
 * surrogate pairs becomes UTF-8), numbers, true, false, null; nesting at most 64 deep. */
#ifndef LOOM_CKPT_JSON_H
#define LOOM_CKPT_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type_t;

typedef struct json {
	json_type_t type;
	char *key;          /* member name when this value is inside an object (NUL-terminated) */
	char *s;            /* STRING: decoded bytes (NUL-terminated, may hold NULs: see slen);
	                       NUMBER: its text exactly as written */
	size_t slen;
	double num;         /* NUMBER */
	int boolean;        /* BOOL */
	struct json *kids;  /* ARRAY elements / OBJECT members, in document order */
	int n, cap;
} json_t;

/* Parse text[0..len) (one value, surrounded only by whitespace) into *out. Returns 0; -1 when the text
 * is malformed, with a description of the problem and its byte offset in err; or LOOM_ENOMEM (err
 * says "out of memory"). *out must be freed with json_free either way. */
int loom__json_parse(const char *text, size_t len, json_t *out, char *err, size_t errcap);
/* The same with at most max_values values (every number, string, array, object, ... counts one; each
 * costs about 100 bytes of memory): a document with more is malformed (-1), which bounds the memory a
 * hostile file can claim. loom__json_parse allows LOOM_JSON_MAX_VALUES. */
#define LOOM_JSON_MAX_VALUES (1L << 22)
int loom__json_parse_max(const char *text, size_t len, long max_values, json_t *out, char *err, size_t errcap);
void loom__json_free(json_t *v);

/* Member `key` of an object (the first one), or NULL. */
const json_t *loom__json_get(const json_t *obj, const char *key);
/* A NUMBER that is an integer in range: 0, or -1 when it is not (fraction, exponent, sign, overflow). */
int loom__json_to_u64(const json_t *v, uint64_t *out);
int loom__json_to_i64(const json_t *v, int64_t *out);
const char *loom__json_type_name(json_type_t t);

/* Write s[0..len) as a JSON string literal with escapes. */
void loom__json_write_string(FILE *f, const char *s, size_t len);

#endif

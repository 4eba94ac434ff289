/* json.c: a minimal recursive-descent JSON parser and a string-literal writer.
 *
 * Checkpoint headers are small (a few hundred KB at most for thousands of tensors) and come from
 * files that may be corrupt or hostile, so the parser favours strictness over speed: it validates
 * the full grammar, bounds nesting depth and the number of values (so the memory a file can claim),
 * never reads past len, and reports the byte offset of the
 * first problem. Invariant: every json_t it produces, even on failure, can be freed by json_free. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/json.h"
#include "core/util.h"

#define JSON_MAX_DEPTH 64

typedef struct {
	const char *p, *end, *start;
	char *err;
	size_t errcap;
	int nomem; /* the failure was an allocation, not the text */
	long values_left; /* values the document may still have */
} parser_t;

static int fail(parser_t *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parser_t *ps, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(ps->err, ps->errcap, "at byte %zu: ", (size_t)(ps->p - ps->start));
	if (n >= 0 && (size_t)n < ps->errcap) {
		va_start(ap, fmt);
		vsnprintf(ps->err + n, ps->errcap - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

static int fail_nomem(parser_t *ps)
{
	ps->nomem = 1;
	return fail(ps, "out of memory");
}

static void skip_ws(parser_t *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static int hex4(parser_t *ps, unsigned *out)
{
	unsigned v = 0;
	if (ps->end - ps->p < 4)
		return fail(ps, "truncated \\u escape");
	for (int i = 0; i < 4; i++) {
		char c = ps->p[i];
		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (unsigned)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (unsigned)(c - 'A' + 10);
		else
			return fail(ps, "bad hex digit in \\u escape");
	}
	ps->p += 4;
	*out = v;
	return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xE0 | (cp >> 12)), o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		o[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	o[0] = (char)(0xF0 | (cp >> 18)), o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

/* Parse a string literal at ps->p (which is '"'); the decoded bytes go to a new buffer. */
static int parse_string(parser_t *ps, char **out, size_t *outlen)
{
	const char *q = ++ps->p;
	size_t cap = 0;
	char *buf, *o;
	/* The decoded text is never longer than the literal. */
	while (q < ps->end && *q != '"') {
		if (*q == '\\')
			q++;
		q++;
	}
	if (q >= ps->end)
		return fail(ps, "unterminated string");
	cap = (size_t)(q - ps->p) + 1;
	buf = loom__malloc(cap);
	if (!buf)
		return fail_nomem(ps);
	o = buf;
	while (*ps->p != '"') {
		unsigned char c = (unsigned char)*ps->p;
		if (c < 0x20) {
			free(buf);
			return fail(ps, "control character 0x%02x in string", c);
		}
		if (c != '\\') {
			*o++ = (char)c;
			ps->p++;
			continue;
		}
		ps->p++;
		switch (*ps->p++) {
		case '"': *o++ = '"'; break;
		case '\\': *o++ = '\\'; break;
		case '/': *o++ = '/'; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case 'n': *o++ = '\n'; break;
		case 'r': *o++ = '\r'; break;
		case 't': *o++ = '\t'; break;
		case 'u': {
			unsigned cp, lo;
			if (hex4(ps, &cp)) {
				free(buf);
				return -1;
			}
			if (cp >= 0xD800 && cp <= 0xDBFF) {
				if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u') {
					free(buf);
					return fail(ps, "unpaired surrogate in \\u escape");
				}
				ps->p += 2;
				if (hex4(ps, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
					free(buf);
					return fail(ps, "bad low surrogate in \\u escape");
				}
				cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
			} else if (cp >= 0xDC00 && cp <= 0xDFFF) {
				free(buf);
				return fail(ps, "unpaired low surrogate in \\u escape");
			}
			o += put_utf8(o, cp);
			break;
		}
		default:
			free(buf);
			ps->p--;
			return fail(ps, "bad escape '\\%c'", *ps->p);
		}
	}
	ps->p++; /* closing quote */
	*o = '\0';
	*out = buf;
	*outlen = (size_t)(o - buf);
	return 0;
}

static int parse_number(parser_t *ps, json_t *v)
{
	const char *s = ps->p;
	if (ps->p < ps->end && *ps->p == '-')
		ps->p++;
	if (ps->p >= ps->end || !(*ps->p >= '0' && *ps->p <= '9'))
		return fail(ps, "bad number");
	if (*ps->p == '0')
		ps->p++;
	else
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	if (ps->p < ps->end && *ps->p == '.') {
		ps->p++;
		if (ps->p >= ps->end || !(*ps->p >= '0' && *ps->p <= '9'))
			return fail(ps, "bad number: no digit after '.'");
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	}
	if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
		ps->p++;
		if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
			ps->p++;
		if (ps->p >= ps->end || !(*ps->p >= '0' && *ps->p <= '9'))
			return fail(ps, "bad number: no digit in exponent");
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	}
	v->type = JSON_NUMBER;
	v->slen = (size_t)(ps->p - s);
	v->s = loom__malloc(v->slen + 1);
	if (!v->s)
		return fail_nomem(ps);
	memcpy(v->s, s, v->slen);
	v->s[v->slen] = '\0';
	v->num = strtod(v->s, NULL);
	return 0;
}

static json_t *add_kid(parser_t *ps, json_t *v)
{
	if (v->n == v->cap) {
		int cap = v->cap ? 2 * v->cap : 8;
		json_t *k = loom__realloc(v->kids, (size_t)cap * sizeof *k);
		if (!k) {
			fail_nomem(ps);
			return NULL;
		}
		v->kids = k, v->cap = cap;
	}
	memset(&v->kids[v->n], 0, sizeof v->kids[0]);
	return &v->kids[v->n++];
}

static int parse_value(parser_t *ps, json_t *v, int depth);

static int parse_container(parser_t *ps, json_t *v, int depth)
{
	int is_obj = *ps->p == '{';
	char close = is_obj ? '}' : ']';
	v->type = is_obj ? JSON_OBJECT : JSON_ARRAY;
	if (depth >= JSON_MAX_DEPTH)
		return fail(ps, "nesting deeper than %d", JSON_MAX_DEPTH);
	ps->p++;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == close) {
		ps->p++;
		return 0;
	}
	for (;;) {
		json_t *kid;
		char *key = NULL;
		size_t keylen;
		skip_ws(ps);
		if (is_obj) {
			if (ps->p >= ps->end || *ps->p != '"')
				return fail(ps, "expected a member name (string)");
			if (parse_string(ps, &key, &keylen))
				return -1;
			skip_ws(ps);
			if (ps->p >= ps->end || *ps->p != ':') {
				free(key);
				return fail(ps, "expected ':' after member name");
			}
			ps->p++;
		}
		kid = add_kid(ps, v);
		if (!kid) {
			free(key);
			return -1;
		}
		kid->key = key;
		if (parse_value(ps, kid, depth + 1))
			return -1;
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == ',') {
			ps->p++;
			continue;
		}
		if (ps->p < ps->end && *ps->p == close) {
			ps->p++;
			return 0;
		}
		return fail(ps, "expected ',' or '%c'", close);
	}
}

static int parse_value(parser_t *ps, json_t *v, int depth)
{
	skip_ws(ps);
	if (ps->p >= ps->end)
		return fail(ps, "unexpected end of input");
	if (ps->values_left-- <= 0)
		return fail(ps, "more values than the limit for this kind of file");
	switch (*ps->p) {
	case '{':
	case '[':
		return parse_container(ps, v, depth);
	case '"':
		v->type = JSON_STRING;
		return parse_string(ps, &v->s, &v->slen);
	case 't':
	case 'f':
	case 'n': {
		static const char *const words[] = {"true", "false", "null"};
		for (int i = 0; i < 3; i++) {
			size_t n = strlen(words[i]);
			if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, words[i], n) == 0) {
				ps->p += n;
				v->type = i == 2 ? JSON_NULL : JSON_BOOL;
				v->boolean = i == 0;
				return 0;
			}
		}
		return fail(ps, "unexpected character '%c'", *ps->p);
	}
	default:
		if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9'))
			return parse_number(ps, v);
		if ((unsigned char)*ps->p >= 0x20 && (unsigned char)*ps->p < 0x7f)
			return fail(ps, "unexpected character '%c'", *ps->p);
		return fail(ps, "unexpected byte 0x%02x", (unsigned char)*ps->p);
	}
}

int loom__json_parse(const char *text, size_t len, json_t *out, char *err, size_t errcap)
{
	return loom__json_parse_max(text, len, LOOM_JSON_MAX_VALUES, out, err, errcap);
}

int loom__json_parse_max(const char *text, size_t len, long max_values, json_t *out, char *err, size_t errcap)
{
	parser_t ps = {text, text + len, text, err, errcap, 0, max_values};
	memset(out, 0, sizeof *out);
	if (errcap)
		err[0] = '\0';
	if (parse_value(&ps, out, 0))
		return ps.nomem ? LOOM_ENOMEM : -1;
	skip_ws(&ps);
	if (ps.p != ps.end)
		return fail(&ps, "trailing characters after the JSON value");
	return 0;
}

void loom__json_free(json_t *v)
{
	if (!v)
		return;
	for (int i = 0; i < v->n; i++)
		loom__json_free(&v->kids[i]);
	free(v->kids);
	free(v->key);
	free(v->s);
	memset(v, 0, sizeof *v);
}

const json_t *loom__json_get(const json_t *obj, const char *key)
{
	if (!obj || obj->type != JSON_OBJECT)
		return NULL;
	for (int i = 0; i < obj->n; i++)
		if (strcmp(obj->kids[i].key, key) == 0)
			return &obj->kids[i];
	return NULL;
}

int loom__json_to_u64(const json_t *v, uint64_t *out)
{
	char *end;
	if (!v || v->type != JSON_NUMBER || v->s[0] == '-' || strpbrk(v->s, ".eE"))
		return -1;
	errno = 0;
	*out = strtoull(v->s, &end, 10);
	return errno || *end ? -1 : 0;
}

int loom__json_to_i64(const json_t *v, int64_t *out)
{
	char *end;
	if (!v || v->type != JSON_NUMBER || strpbrk(v->s, ".eE"))
		return -1;
	errno = 0;
	*out = strtoll(v->s, &end, 10);
	return errno || *end ? -1 : 0;
}

const char *loom__json_type_name(json_type_t t)
{
	static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
	return (unsigned)t < 6 ? names[t] : "?";
}

void loom__json_write_string(FILE *f, const char *s, size_t len)
{
	fputc('"', f);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c == '\t')
			fputs("\\t", f);
		else if (c == '\r')
			fputs("\\r", f);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

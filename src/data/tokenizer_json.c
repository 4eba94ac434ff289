/* tokenizer_json.c: Hugging Face's tokenizer.json, read into and written from loom's byte-level BPE
 * (bpe.c does the encoding; this file only translates the file's pieces into its steps).
 *
 * What is read is the subset that byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2 without its NFC
 * normalizer, SmolLM2, loom's own) use, and every other piece is refused with LOOM_ENOTSUP naming it
 * and where it is in the file, never skipped: a tokenizer read here gives Hugging Face's ids or is not
 * read at all. The subset (docs/data.md lists it):
 *   model         type "BPE" (or no type with vocab + merges): vocab, merges as "a b" strings or
 *                 [a, b] pairs, ignore_merges; dropout null or 0, byte_fallback false,
 *                 continuing_subword_prefix and end_of_word_suffix null or "", unk_token anything
 *                 (it never applies: every byte has a token, which loading checks), fuse_unk anything;
 *   normalizer    null;
 *   pre_tokenizer ByteLevel, or a Sequence of Split (pattern Regex or String, behavior Isolated,
 *                 invert either: with Isolated both give the same pieces) and Digits, ending in
 *                 ByteLevel (use_regex: GPT-2's regex or none; add_prefix_space per piece);
 *   added_tokens  id, content, special, normalized (the matching pass); single_word, lstrip and
 *                 rstrip false;
 *   post_processor null, ByteLevel (offsets only), TemplateProcessing whose single template is
 *                 special tokens, the sequence A, special tokens; or a Sequence of those;
 *   decoder       ByteLevel (a Sequence of ByteLevel too);
 *   truncation and padding null.
 * A member this file does not know is refused too (it may change the encoding). */
#include <stdlib.h>
#include <string.h>

#include "ckpt/json.h"
#include "core/fileio.h"
#include "core/util.h"
#include "data/bpe_internal.h"
#include "loom/tokenizer.h"

#define JSON_FILE_MAX (256u << 20) /* Llama 3's tokenizer.json is 9 MB, Qwen2's 7 MB */
#define DESC_MAX 4096

typedef struct {
	const char *path;
	loom_bpe_t *t;
	char desc[DESC_MAX];
	size_t desc_len;
} reader_t;

static int unsupported(const reader_t *r, const char *where, const char *fmt, const char *what)
{
	char msg[512];
	snprintf(msg, sizeof msg, fmt, what);
	return loom_seterr(LOOM_ENOTSUP, "%s: %s: %s", r->path, where, msg);
}

static int bad(const reader_t *r, const char *where, const char *expected)
{
	return loom_seterr(LOOM_EFORMAT, "%s: %s: expected %s", r->path, where, expected);
}

static void describe(reader_t *r, const char *fmt, const char *arg)
{
	if (r->desc_len + 8 >= DESC_MAX)
		return;
	int n = snprintf(r->desc + r->desc_len, DESC_MAX - r->desc_len, fmt, arg);
	if (n > 0)
		r->desc_len = LOOM_MIN(r->desc_len + (size_t)n, DESC_MAX - 1);
}

static const char *str_of(const json_t *v)
{
	return v && v->type == JSON_STRING ? v->s : NULL;
}

/* A member that must be a boolean when present; *out keeps its default when absent. */
static int get_bool(const reader_t *r, const json_t *obj, const char *key, const char *where, int *out)
{
	const json_t *v = loom__json_get(obj, key);
	char w[256];
	if (!v)
		return LOOM_OK;
	if (v->type != JSON_BOOL) {
		snprintf(w, sizeof w, "%s.%s", where, key);
		return bad(r, w, "true or false");
	}
	*out = v->boolean;
	return LOOM_OK;
}

/* Every member of obj is one of the names in known (NULL-terminated); else the first other is refused. */
static int only_known(const reader_t *r, const json_t *obj, const char *where, const char *const *known)
{
	for (int i = 0; i < obj->n; i++) {
		int ok = 0;
		for (const char *const *k = known; *k && !ok; k++)
			ok = strcmp(obj->kids[i].key, *k) == 0;
		if (!ok) {
			char w[256];
			snprintf(w, sizeof w, "%s.%s", where, obj->kids[i].key);
			return unsupported(r, w, "member \"%s\" is not one loom implements", obj->kids[i].key);
		}
	}
	return LOOM_OK;
}

static int type_is(const json_t *v, const char *type)
{
	const char *s = str_of(loom__json_get(v, "type"));
	return s && strcmp(s, type) == 0;
}

static const char *type_of(const json_t *v)
{
	const char *s = str_of(loom__json_get(v, "type"));
	return s ? s : "(no type)";
}

/* ---- model -------------------------------------------------------------------------------------- */

static int read_model(reader_t *r, const json_t *m)
{
	static const char *const known[] = {"type", "dropout", "unk_token", "continuing_subword_prefix",
	                                    "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
	                                    "vocab", "merges", NULL};
	const json_t *v, *merges;
	char where[600];
	int rc, on = 0;
	if (!m || m->type != JSON_OBJECT)
		return bad(r, "model", "an object");
	if ((v = loom__json_get(m, "type")) && !type_is(m, "BPE"))
		return unsupported(r, "model.type", "model \"%s\" is not supported (loom implements byte-level BPE)",
		                   str_of(v) ? str_of(v) : "?");
	if (!v && (!loom__json_get(m, "vocab") || !loom__json_get(m, "merges")))
		return unsupported(r, "model", "%s", "a model without a type that is not BPE (no vocab and merges)");
	if ((rc = only_known(r, m, "model", known)) != LOOM_OK)
		return rc;
	if ((v = loom__json_get(m, "dropout")) && v->type != JSON_NULL && !(v->type == JSON_NUMBER && v->num == 0))
		return unsupported(r, "model.dropout", "BPE dropout %s is not supported (it makes encoding random)",
		                   v->type == JSON_NUMBER ? v->s : loom__json_type_name(v->type));
	if ((rc = get_bool(r, m, "byte_fallback", "model", &on)) != LOOM_OK)
		return rc;
	if (on)
		return unsupported(r, "model.byte_fallback", "%s", "byte_fallback true is not supported (a byte-level BPE "
		                   "has a token for every byte)");
	if ((rc = get_bool(r, m, "fuse_unk", "model", &on)) != LOOM_OK)
		return rc;
	if ((v = loom__json_get(m, "unk_token")) && v->type != JSON_NULL && v->type != JSON_STRING)
		return bad(r, "model.unk_token", "null or a string");
	for (int i = 0; i < 2; i++) {
		const char *key = i ? "end_of_word_suffix" : "continuing_subword_prefix";
		if ((v = loom__json_get(m, key)) && v->type != JSON_NULL && !(v->type == JSON_STRING && v->slen == 0)) {
			snprintf(where, sizeof where, "model.%s", key);
			return unsupported(r, where, "\"%.60s\" is not supported (loom implements byte-level BPE without "
			                   "word markers)", str_of(v) ? str_of(v) : loom__json_type_name(v->type));
		}
	}
	on = 0;
	if ((rc = get_bool(r, m, "ignore_merges", "model", &on)) != LOOM_OK)
		return rc;
	loom__bpe_set_ignore_merges(r->t, on);
	snprintf(where, sizeof where, "%s: model.vocab", r->path);
	if (!(v = loom__json_get(m, "vocab")))
		return bad(r, "model.vocab", "an object of token -> id");
	if ((rc = loom__bpe_load_vocab(r->t, v, where)) != LOOM_OK)
		return rc;
	if (!(merges = loom__json_get(m, "merges")) || merges->type != JSON_ARRAY)
		return bad(r, "model.merges", "an array");
	if ((rc = loom__bpe_merges_begin(r->t, (size_t)merges->n)) != LOOM_OK)
		return loom_seterr(rc, "%s: %s", r->path, loom_errmsg());
	for (int i = 0; i < merges->n; i++) {
		const json_t *e = &merges->kids[i];
		const char *a, *b;
		size_t la, lb;
		int mrc;
		snprintf(where, sizeof where, "model.merges[%d]", i);
		if (e->type == JSON_STRING) { /* "a b": the two tokens, one space between */
			const char *sp = memchr(e->s, ' ', e->slen);
			if (!sp || sp == e->s || sp + 1 == e->s + e->slen || memchr(sp + 1, ' ', e->slen - (size_t)(sp + 1 - e->s)))
				return bad(r, where, "two tokens separated by one space");
			a = e->s, la = (size_t)(sp - e->s), b = sp + 1, lb = e->slen - la - 1;
		} else if (e->type == JSON_ARRAY && e->n == 2 && e->kids[0].type == JSON_STRING &&
		           e->kids[1].type == JSON_STRING) {
			a = e->kids[0].s, la = e->kids[0].slen, b = e->kids[1].s, lb = e->kids[1].slen;
		} else
			return bad(r, where, "a string \"a b\" or a pair [\"a\", \"b\"]");
		if ((mrc = loom__bpe_merge_add(r->t, a, la, b, lb)) == LOOM__MERGE_NOMEM)
			return loom_seterr(LOOM_ENOMEM, "%s: out of memory for the merges", r->path);
		if (mrc != LOOM__MERGE_OK)
			return loom_seterr(LOOM_EFORMAT, "%s: %s: merge \"%.*s\" + \"%.*s\": %s", r->path, where,
			                   (int)LOOM_MIN(la, 40), a, (int)LOOM_MIN(lb, 40), b, loom__bpe_merge_error(mrc));
	}
	loom__bpe_merges_end(r->t);
	return LOOM_OK;
}

/* ---- pre-tokenizer ------------------------------------------------------------------------------ */

static int read_step(reader_t *r, const json_t *p, const char *where, int last)
{
	char w[300];
	int rc;
	if (p->type != JSON_OBJECT)
		return bad(r, where, "a pre-tokenizer object");
	if (type_is(p, "ByteLevel")) {
		static const char *const known[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
		int prefix = 0, use_regex = 1, trim = 0;
		if ((rc = only_known(r, p, where, known)) != LOOM_OK || (rc = get_bool(r, p, "add_prefix_space", where, &prefix)) ||
		    (rc = get_bool(r, p, "use_regex", where, &use_regex)) || (rc = get_bool(r, p, "trim_offsets", where, &trim)))
			return rc;
		if (!last)
			return unsupported(r, where, "%s", "a pre-tokenizer after ByteLevel is not supported (ByteLevel must "
			                   "come last: loom splits bytes, not ByteLevel's characters)");
		describe(r, "%sByteLevel", r->desc_len ? " > " : "");
		describe(r, " (%s", use_regex ? "GPT-2's regex" : "no regex");
		describe(r, "%s)", prefix ? ", add_prefix_space" : "");
		return loom__bpe_add_step(r->t, LOOM__BPE_STEP_BYTELEVEL, use_regex ? loom_bpe_pattern_gpt2 : NULL, 0, prefix);
	}
	if (last)
		return unsupported(r, where, "a pre-tokenizer ending in %s is not supported (a byte-level BPE ends in "
		                   "ByteLevel)", type_of(p));
	if (type_is(p, "Split")) {
		static const char *const known[] = {"type", "pattern", "behavior", "invert", NULL};
		const json_t *pat = loom__json_get(p, "pattern");
		const char *beh = str_of(loom__json_get(p, "behavior")), *re = NULL;
		int invert = 0, literal = 0;
		if ((rc = only_known(r, p, where, known)) != LOOM_OK || (rc = get_bool(r, p, "invert", where, &invert)))
			return rc;
		if (pat && pat->type == JSON_OBJECT && pat->n == 1 && str_of(loom__json_get(pat, "Regex")))
			re = str_of(loom__json_get(pat, "Regex"));
		else if (pat && pat->type == JSON_OBJECT && pat->n == 1 && str_of(loom__json_get(pat, "String")))
			re = str_of(loom__json_get(pat, "String")), literal = 1;
		snprintf(w, sizeof w, "%s.pattern", where);
		if (!re)
			return bad(r, w, "{\"Regex\": \"...\"} or {\"String\": \"...\"}");
		if (strlen(re) != (literal ? loom__json_get(pat, "String") : loom__json_get(pat, "Regex"))->slen || !*re)
			return bad(r, w, "a non-empty pattern without NUL characters");
		snprintf(w, sizeof w, "%s.behavior", where);
		if (!beh)
			return bad(r, w, "a string");
		/* Isolated keeps every match and every gap as pieces, so invert (which swaps the two) changes nothing */
		if (strcmp(beh, "Isolated") != 0)
			return unsupported(r, w, "Split behavior \"%.40s\" is not supported (loom implements Isolated)", beh);
		snprintf(w, sizeof w, "%s.pattern", where);
		if ((rc = loom__bpe_add_step(r->t, LOOM__BPE_STEP_SPLIT, re, literal, 0)) != LOOM_OK)
			return loom_seterr(rc, "%s: %s: %s", r->path, w, loom_errmsg());
		describe(r, "%sSplit ", r->desc_len ? " > " : "");
		describe(r, literal ? "\"%s\"" : "/%s/", re);
		return LOOM_OK;
	}
	if (type_is(p, "Digits")) {
		static const char *const known[] = {"type", "individual_digits", NULL};
		int individual = 0;
		if ((rc = only_known(r, p, where, known)) != LOOM_OK || (rc = get_bool(r, p, "individual_digits", where, &individual)))
			return rc;
		/* Rust's char::is_numeric is Unicode's N categories: \p{N} */
		describe(r, "%sDigits", r->desc_len ? " > " : "");
		describe(r, "%s", individual ? " (individual)" : "");
		return loom__bpe_add_step(r->t, LOOM__BPE_STEP_DIGITS, individual ? "\\p{N}" : "\\p{N}+", 0, 0);
	}
	return unsupported(r, where, "pre-tokenizer \"%.60s\" is not supported (loom implements Sequence, Split, "
	                   "Digits, ByteLevel)", type_of(p));
}

static int read_pre_tokenizer(reader_t *r, const json_t *p)
{
	const json_t *list;
	char where[64];
	int rc;
	if (!p || p->type == JSON_NULL)
		return unsupported(r, "pre_tokenizer", "%s", "null is not supported (a byte-level BPE needs ByteLevel)");
	if (p->type != JSON_OBJECT)
		return bad(r, "pre_tokenizer", "an object");
	if (!type_is(p, "Sequence"))
		return read_step(r, p, "pre_tokenizer", 1);
	static const char *const known[] = {"type", "pretokenizers", NULL};
	if ((rc = only_known(r, p, "pre_tokenizer", known)) != LOOM_OK)
		return rc;
	if (!(list = loom__json_get(p, "pretokenizers")) || list->type != JSON_ARRAY || list->n == 0)
		return bad(r, "pre_tokenizer.pretokenizers", "a non-empty array");
	if (list->n > LOOM__BPE_MAX_STEPS)
		return unsupported(r, "pre_tokenizer.pretokenizers", "%s", "more than 8 pre-tokenizers");
	for (int i = 0; i < list->n; i++) {
		snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%d]", i);
		if (type_is(&list->kids[i], "Sequence"))
			return unsupported(r, where, "%s", "a Sequence inside a Sequence is not supported");
		if ((rc = read_step(r, &list->kids[i], where, i == list->n - 1)) != LOOM_OK)
			return rc;
	}
	return LOOM_OK;
}

/* ---- added tokens ------------------------------------------------------------------------------- */

static int read_added(reader_t *r, const json_t *a)
{
	static const char *const known[] = {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special",
	                                    NULL};
	char where[64];
	int rc;
	if (!a || a->type == JSON_NULL)
		return LOOM_OK;
	if (a->type != JSON_ARRAY)
		return bad(r, "added_tokens", "an array");
	for (int i = 0; i < a->n; i++) {
		const json_t *e = &a->kids[i], *c;
		int64_t id;
		int special = 0, normalized = 1, flag;
		snprintf(where, sizeof where, "added_tokens[%d]", i);
		if (e->type != JSON_OBJECT)
			return bad(r, where, "an object");
		if ((rc = only_known(r, e, where, known)) != LOOM_OK || (rc = get_bool(r, e, "special", where, &special)) ||
		    (rc = get_bool(r, e, "normalized", where, &normalized)))
			return rc;
		if (loom__json_to_i64(loom__json_get(e, "id"), &id) != 0 || id < 0 || id > INT32_MAX)
			return bad(r, where, "an integer id >= 0");
		if (!(c = loom__json_get(e, "content")) || c->type != JSON_STRING || c->slen == 0)
			return bad(r, where, "a non-empty string content");
		for (int k = 0; k < 3; k++) {
			static const char *const names[] = {"single_word", "lstrip", "rstrip"};
			flag = 0;
			if ((rc = get_bool(r, e, names[k], where, &flag)) != LOOM_OK)
				return rc;
			if (flag) {
				char w[128];
				snprintf(w, sizeof w, "%s.%s", where, names[k]);
				return unsupported(r, w, "%s true is not supported", names[k]);
			}
		}
		if ((rc = loom__bpe_add_token(r->t, (int)id, c->s, c->slen, special, normalized)) != LOOM_OK)
			return loom_seterr(rc, "%s: %s: %s", r->path, where, loom_errmsg());
	}
	return LOOM_OK;
}

/* ---- post-processor ----------------------------------------------------------------------------- */

/* The ids of special token `name` in TemplateProcessing's special_tokens map. */
static int template_ids(reader_t *r, const json_t *map, const char *name, int *ids, int *n, int cap, const char *where)
{
	const json_t *e = loom__json_get(map, name), *list = e ? loom__json_get(e, "ids") : NULL;
	if (!list || list->type != JSON_ARRAY || list->n == 0)
		return bad(r, where, "its special token in special_tokens with a non-empty ids array");
	for (int i = 0; i < list->n; i++) {
		int64_t id;
		if (loom__json_to_i64(&list->kids[i], &id) != 0 || id < 0 || id > INT32_MAX)
			return bad(r, where, "integer ids in special_tokens");
		if (*n == cap)
			return unsupported(r, where, "%s", "more than 4 special tokens on one side of the text");
		ids[(*n)++] = (int)id;
	}
	return LOOM_OK;
}

static int read_template(reader_t *r, const json_t *p, const char *where)
{
	static const char *const known[] = {"type", "single", "pair", "special_tokens", NULL};
	const json_t *single = loom__json_get(p, "single"), *map = loom__json_get(p, "special_tokens");
	int ids[2][LOOM__BPE_MAX_TEMPLATE], n[2] = {0, 0}, side = 0, rc;
	char w[300];
	if ((rc = only_known(r, p, where, known)) != LOOM_OK)
		return rc;
	snprintf(w, sizeof w, "%s.single", where);
	if (!single || single->type != JSON_ARRAY)
		return bad(r, w, "an array");
	if (!map || map->type != JSON_OBJECT)
		return bad(r, where, "a special_tokens object");
	for (int i = 0; i < single->n; i++) {
		const json_t *e = &single->kids[i], *st = loom__json_get(e, "SpecialToken"), *sq = loom__json_get(e, "Sequence");
		snprintf(w, sizeof w, "%s.single[%d]", where, i);
		if (e->type != JSON_OBJECT || e->n != 1 || (!st && !sq))
			return bad(r, w, "{\"SpecialToken\": ...} or {\"Sequence\": ...}");
		if (sq) {
			const char *id = str_of(loom__json_get(sq, "id"));
			if (!id || strcmp(id, "A") != 0 || side == 1)
				return unsupported(r, w, "%s", "a single template other than special tokens, the sequence A once, "
				                   "special tokens");
			side = 1;
			continue;
		}
		const char *name = str_of(loom__json_get(st, "id"));
		if (!name)
			return bad(r, w, "a SpecialToken with a string id");
		if ((rc = template_ids(r, map, name, ids[side], &n[side], LOOM__BPE_MAX_TEMPLATE, w)) != LOOM_OK)
			return rc;
	}
	if (side == 0)
		return unsupported(r, where, "%s", "a single template without the sequence A");
	if ((rc = loom__bpe_set_template(r->t, ids[0], n[0], ids[1], n[1])) != LOOM_OK)
		return loom_seterr(rc, "%s: %s: %s", r->path, where, loom_errmsg());
	describe(r, "%s", "; post-processor TemplateProcessing");
	return LOOM_OK;
}

static int read_post(reader_t *r, const json_t *p, const char *where, int depth)
{
	if (!p || p->type == JSON_NULL)
		return LOOM_OK;
	if (p->type != JSON_OBJECT)
		return bad(r, where, "an object or null");
	if (type_is(p, "ByteLevel")) /* it adjusts offsets, which loom does not report */
		return LOOM_OK;
	if (type_is(p, "TemplateProcessing"))
		return read_template(r, p, where);
	if (type_is(p, "Sequence") && depth == 0) {
		const json_t *list = loom__json_get(p, "processors");
		char w[128];
		int rc, templates = 0;
		if (!list || list->type != JSON_ARRAY)
			return bad(r, "post_processor.processors", "an array");
		for (int i = 0; i < list->n; i++) {
			snprintf(w, sizeof w, "post_processor.processors[%d]", i);
			if (type_is(&list->kids[i], "TemplateProcessing") && templates++)
				return unsupported(r, w, "%s", "a second TemplateProcessing is not supported");
			if ((rc = read_post(r, &list->kids[i], w, 1)) != LOOM_OK)
				return rc;
		}
		return LOOM_OK;
	}
	return unsupported(r, where, "post-processor \"%.60s\" is not supported (loom implements TemplateProcessing, "
	                   "ByteLevel, a Sequence of them, or null)", type_of(p));
}

static int read_decoder(reader_t *r, const json_t *d)
{
	if (d && type_is(d, "ByteLevel"))
		return LOOM_OK;
	if (d && type_is(d, "Sequence")) {
		const json_t *list = loom__json_get(d, "decoders");
		if (list && list->type == JSON_ARRAY && list->n == 1 && type_is(&list->kids[0], "ByteLevel"))
			return LOOM_OK;
		return unsupported(r, "decoder", "%s", "a Sequence of decoders other than [ByteLevel] is not supported");
	}
	if (!d || d->type == JSON_NULL)
		return unsupported(r, "decoder", "%s", "null is not supported (loom decodes byte-level tokens to their bytes, "
		                   "which is the ByteLevel decoder)");
	return unsupported(r, "decoder", "decoder \"%.60s\" is not supported (loom implements ByteLevel)", type_of(d));
}

int loom__bpe_load_json(loom_bpe_t **out, const char *path)
{
	static const char *const known[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
	                                    "pre_tokenizer", "post_processor", "decoder", "model", NULL};
	reader_t r = {.path = path};
	char *text = NULL, err[256];
	size_t len;
	json_t root;
	const json_t *v;
	int rc;
	memset(&root, 0, sizeof root);
	*out = NULL;
	if ((rc = loom__read_file_max(path, JSON_FILE_MAX, &text, &len)) != LOOM_OK)
		return rc;
	if ((rc = loom__json_parse(text, len, &root, err, sizeof err)) != 0) {
		rc = loom_seterr(rc == LOOM_ENOMEM ? LOOM_ENOMEM : LOOM_EFORMAT, "%s: bad JSON %s", path, err);
		goto done;
	}
	free(text), text = NULL;
	if (root.type != JSON_OBJECT) {
		rc = bad(&r, "the file", "a JSON object (a Hugging Face tokenizer.json)");
		goto done;
	}
	if ((rc = only_known(&r, &root, "tokenizer.json", known)) != LOOM_OK)
		goto done;
	for (int i = 0; i < 2; i++) {
		const char *key = i ? "padding" : "truncation";
		if ((v = loom__json_get(&root, key)) && v->type != JSON_NULL) {
			rc = unsupported(&r, key, "%s is set: loom encodes whole texts (only null is supported)", key);
			goto done;
		}
	}
	if ((v = loom__json_get(&root, "normalizer")) && v->type != JSON_NULL) {
		rc = unsupported(&r, "normalizer", "normalizer \"%.60s\" is not supported (loom implements none: only null)",
		                 type_of(v));
		goto done;
	}
	if ((v = loom__json_get(&root, "model")) && v->type == JSON_OBJECT && loom__json_get(v, "type") &&
	    !type_is(v, "BPE")) { /* the model's type first: "Unigram is not supported" says the most */
		rc = unsupported(&r, "model.type", "model \"%.60s\" is not supported (loom implements byte-level BPE)",
		                 type_of(v));
		goto done;
	}
	if ((rc = loom__bpe_new(&r.t)) != LOOM_OK)
		goto done;
	if ((rc = read_pre_tokenizer(&r, loom__json_get(&root, "pre_tokenizer"))) != LOOM_OK ||
	    (rc = read_decoder(&r, loom__json_get(&root, "decoder"))) != LOOM_OK ||
	    (rc = read_model(&r, loom__json_get(&root, "model"))) != LOOM_OK ||
	    (rc = read_added(&r, loom__json_get(&root, "added_tokens"))) != LOOM_OK ||
	    (rc = read_post(&r, loom__json_get(&root, "post_processor"), "post_processor", 0)) != LOOM_OK)
		goto done;
	if (loom__bpe_ignore_merges(r.t))
		describe(&r, "%s", "; ignore_merges");
	rc = loom__bpe_set_pattern_text(r.t, r.desc);
done:
	loom__json_free(&root);
	free(text);
	if (rc != LOOM_OK)
		loom_bpe_destroy(r.t);
	else
		*out = r.t;
	return rc;
}

/* ---- writing ------------------------------------------------------------------------------------ */

/* p[0..n) as byte-level characters, escaped for a JSON string. */
static void put_mapped(FILE *f, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int cp = loom__bpe_byte_cp(p[i]);
		if (cp == '"' || cp == '\\')
			fprintf(f, "\\%c", cp);
		else if (cp < 0x80)
			fputc(cp, f);
		else
			fputc(0xC0 | (cp >> 6), f), fputc(0x80 | (cp & 0x3F), f);
	}
}

static void write_mapped(FILE *f, const unsigned char *p, size_t n)
{
	fputc('"', f);
	put_mapped(f, p, n);
	fputc('"', f);
}

static void write_raw(FILE *f, const unsigned char *p, size_t n)
{
	loom__json_write_string(f, (const char *)p, n);
}

static void write_template_side(FILE *f, const loom_bpe_t *t, int after, int *first)
{
	const int *ids;
	int n = loom__bpe_template(t, after, &ids);
	for (int i = 0; i < n; i++) {
		size_t len;
		const unsigned char *b = loom_bpe_token(t, ids[i], &len);
		fputs(*first ? "" : ", ", f);
		*first = 0;
		fputs("{\"SpecialToken\": {\"id\": ", f);
		write_raw(f, b, len);
		fputs(", \"type_id\": 0}}", f);
	}
}

/* One sequence of a template with the special tokens around it: "[BOS, ]{Sequence id}[, EOS]". */
static void write_template_segment(FILE *f, const loom_bpe_t *t, const char *seq, int type_id, int *first)
{
	write_template_side(f, t, 0, first);
	fprintf(f, "%s{\"Sequence\": {\"id\": \"%s\", \"type_id\": %d}}", *first ? "" : ", ", seq, type_id);
	*first = 0;
	write_template_side(f, t, 1, first);
}

int loom_bpe_save_json(const loom_bpe_t *t, const char *path)
{
	atomic_file_t af;
	FILE *f;
	int rc, id, special, normalized, literal, prefix, kind, last_kind = -1;
	const char *pattern;
	const int32_t(*merges)[2] = loom__bpe_merge_list(t);
	if ((rc = loom__atomic_open(&af, path)) != LOOM_OK)
		return rc;
	f = af.f;
	fputs("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [", f);
	for (int i = 0; loom__bpe_added(t, i, &id, &special, &normalized) == 0; i++) {
		size_t len;
		const unsigned char *b = loom_bpe_token(t, id, &len);
		fprintf(f, "%s\n    {\"id\": %d, \"content\": ", i ? "," : "", id);
		write_raw(f, b, len);
		fprintf(f, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": %s, "
		        "\"special\": %s}", normalized ? "true" : "false", special ? "true" : "false");
	}
	fputs("\n  ],\n  \"normalizer\": null,\n  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [", f);
	for (int i = 0; (kind = loom__bpe_step(t, i, &pattern, &literal, &prefix)) >= 0; i++) {
		fputs(i ? ",\n    " : "\n    ", f);
		if (kind == LOOM__BPE_STEP_BYTELEVEL)
			fprintf(f, "{\"type\": \"ByteLevel\", \"add_prefix_space\": %s, \"trim_offsets\": true, \"use_regex\": %s}",
			        prefix ? "true" : "false", pattern ? "true" : "false");
		else if (kind == LOOM__BPE_STEP_DIGITS)
			fprintf(f, "{\"type\": \"Digits\", \"individual_digits\": %s}",
			        strcmp(pattern, "\\p{N}") == 0 ? "true" : "false");
		else {
			fprintf(f, "{\"type\": \"Split\", \"pattern\": {\"%s\": ", literal ? "String" : "Regex");
			loom__json_write_string(f, pattern, strlen(pattern));
			fputs("}, \"behavior\": \"Isolated\", \"invert\": false}", f);
		}
		last_kind = kind;
	}
	if (last_kind != LOOM__BPE_STEP_BYTELEVEL)
		fprintf(f, "%s{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
		        "\"use_regex\": false}", last_kind < 0 ? "\n    " : ",\n    ");
	fputs("\n  ]},\n  \"post_processor\": ", f);
	{
		const int *ids;
		int nb = loom__bpe_template(t, 0, &ids), na = loom__bpe_template(t, 1, &ids), first = 1;
		if (nb + na == 0)
			fputs("null", f);
		else {
			fputs("{\"type\": \"TemplateProcessing\", \"single\": [", f);
			write_template_segment(f, t, "A", 0, &first);
			fputs("], \"pair\": [", f);
			first = 1;
			write_template_segment(f, t, "A", 0, &first);
			write_template_segment(f, t, "B", 1, &first);
			fputs("], \"special_tokens\": {", f);
			first = 1;
			for (int side = 0; side < 2; side++) {
				int n = loom__bpe_template(t, side, &ids);
				for (int i = 0; i < n; i++) {
					size_t len;
					const unsigned char *b = loom_bpe_token(t, ids[i], &len);
					int dup = 0; /* a token on both sides (or twice) is one entry of the map */
					for (int s2 = 0; s2 <= side && !dup; s2++) {
						const int *o;
						int no = loom__bpe_template(t, s2, &o);
						for (int j = 0; j < (s2 == side ? i : no) && !dup; j++)
							dup = o[j] == ids[i];
					}
					if (dup)
						continue;
					fputs(first ? "" : ", ", f);
					first = 0;
					write_raw(f, b, len);
					fputs(": {\"id\": ", f);
					write_raw(f, b, len);
					fprintf(f, ", \"ids\": [%d], \"tokens\": [", ids[i]);
					write_raw(f, b, len);
					fputs("]}", f);
				}
			}
			fputs("}}", f);
		}
	}
	fputs(",\n  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
	      "\"use_regex\": true},\n", f);
	fprintf(f, "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
	        "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n"
	        "    \"byte_fallback\": false,\n    \"ignore_merges\": %s,\n    \"vocab\": {",
	        loom__bpe_ignore_merges(t) ? "true" : "false");
	for (int i = 0, first = 1; i < loom_bpe_vocab_size(t); i++) {
		size_t len;
		const unsigned char *b = loom_bpe_token(t, i, &len);
		if (!b || !loom__bpe_model_token(t, i))
			continue;
		fputs(first ? "\n      " : ",\n      ", f);
		first = 0;
		write_mapped(f, b, len);
		fprintf(f, ": %d", i);
	}
	fputs("\n    },\n    \"merges\": [", f);
	for (int m = 0; m < loom_bpe_num_merges(t); m++) {
		size_t la, lb;
		const unsigned char *a = loom_bpe_token(t, merges[m][0], &la), *b = loom_bpe_token(t, merges[m][1], &lb);
		fputs(m ? ",\n      " : "\n      ", f);
		/* "a b" as one string: the two byte-level spellings never hold a space (U+0020 maps to U+0120) */
		fputc('"', f);
		put_mapped(f, a, la);
		fputc(' ', f);
		put_mapped(f, b, lb);
		fputc('"', f);
	}
	fputs("\n    ]\n  }\n}\n", f);
	if (ferror(f)) {
		loom__atomic_abort(&af);
		return loom_seterr(LOOM_EIO, "%s: write failed", path);
	}
	return loom__atomic_commit(&af);
}

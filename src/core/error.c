/* error.c: loom_strerror from the LOOM_ERRORS list, and the thread-local detail of the last failure. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/util.h"

static _Thread_local char last_msg[1024];

const char *loom_strerror(int code)
{
	switch (code) {
	case LOOM_OK: return "success";
#define LOOM_ERR_CASE_(name, c, desc) case c: return desc;
	LOOM_ERRORS(LOOM_ERR_CASE_)
#undef LOOM_ERR_CASE_
	}
	return "unknown error";
}

const char *loom_errmsg(void)
{
	return last_msg;
}

int loom_seterr(int code, const char *fmt, ...)
{
	/* Formatted into a local buffer first: callers often wrap the previous message, passing
	 * loom_errmsg() itself as an argument, and vsnprintf's source and destination must not overlap. */
	char tmp[sizeof last_msg];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	memcpy(last_msg, tmp, sizeof last_msg);
	return code;
}

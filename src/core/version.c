/* version.c: the library's version and the git description of the tree it was built from (the
 * Makefile passes LOOM_GIT_DESCRIBE when it compiles this file). */
#include "loom/util.h"

#ifndef LOOM_GIT_DESCRIBE
#define LOOM_GIT_DESCRIBE "unknown"
#endif

const char *loom_version(void)
{
	return LOOM_VERSION;
}

const char *loom_git_describe(void)
{
	return LOOM_GIT_DESCRIBE;
}

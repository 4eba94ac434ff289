/* loom/error.h: one error convention for the whole library.
 *
 * Every fallible call returns LOOM_OK (0) or a negative LOOM_E* code. The human detail (which file,
 * rank, operation, what was expected) of the last failure on the calling thread is kept by
 * loom_errmsg(); communicators also keep their own (loom_comm_errmsg). */
#ifndef LOOM_ERROR_H
#define LOOM_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, code, description): the single list that defines the enum and loom_strerror(). */
#define LOOM_ERRORS(X)                                              \
	X(EINVAL, -1, "invalid argument")                               \
	X(ENOMEM, -2, "out of memory")                                  \
	X(EIO, -3, "input/output error")                                \
	X(EFORMAT, -4, "malformed file or data")                        \
	X(ETIMEDOUT, -5, "operation timed out")                         \
	X(EPEERLOST, -6, "peer rank lost")                              \
	X(EMISMATCH, -7, "mismatched calls across ranks")               \
	X(ENOTSUP, -8, "not supported")                                 \
	X(ESYS, -9, "system call failed")                               \
	X(ENOENT, -10, "no such file, object or name")                  \
	X(ESTATE, -11, "object is not in a state that allows the call")

enum {
	LOOM_OK = 0,
#define LOOM_ERR_ENUM_(name, code, desc) LOOM_##name = code,
	LOOM_ERRORS(LOOM_ERR_ENUM_)
#undef LOOM_ERR_ENUM_
};

/* Short description of an error code; never NULL ("unknown error" for codes not in the list). */
const char *loom_strerror(int code);

/* Detail of the last failure recorded on the calling thread ("" if none). Thread-safe: the text is
 * thread-local and stays valid until the thread's next failing loom call. */
const char *loom_errmsg(void);

#ifdef __cplusplus
}
#endif
#endif

/* fiber.h: the smallest coroutine the progress engine needs: a stack of its own and a switch.
 *
 * Why: a collective algorithm is a sequence of blocking transport calls. For collectives on
 * different communicators to be in flight at once on one progress thread, each must be able to
 * stop where it waits and resume later, with its algorithm's state (loop counters, the transfer
 * being progressed) intact. Running each on its own stack gives that without rewriting every
 * algorithm as a state machine: where a transport call would block, the fiber switches back to the
 * engine, which resumes another. Switches are explicit and cooperative; a fiber never migrates
 * between threads. Not for use outside src/comm/. */
#ifndef LOOM_COMM_FIBER_H
#define LOOM_COMM_FIBER_H

#include <stddef.h>

typedef struct loom_fiber loom_fiber_t;

/* Make a fiber that will run fn(arg) on a fresh stack of `stack_bytes` when first switched to.
 * fn must never return (it switches away for good instead). NULL when out of memory. */
loom_fiber_t *loom__fiber_create(size_t stack_bytes, void (*fn)(void *), void *arg);
/* Free a fiber that is not running (switched away from, or never started). */
void loom__fiber_destroy(loom_fiber_t *f);
/* The calling thread's own context, to switch back to; one per thread, created on first use. */
loom_fiber_t *loom__fiber_self(void);
/* Save the current context into `from` (which must be the one running) and run `to`. Returns
 * when some other context switches back to `from`. */
void loom__fiber_switch(loom_fiber_t *from, loom_fiber_t *to);

#endif

/* fiber.c: stackful coroutines for the progress engine (fiber.h): an x86-64 register switch, and
 * ucontext elsewhere.
 *
 * On x86-64 a switch pushes the callee-saved registers (and the SSE/x87 control words) on the old
 * stack, stores the stack pointer in the old fiber, loads the new one's and pops; a fresh fiber's
 * stack is laid out as if it had switched away just before entering `entry`. This costs a few
 * nanoseconds, where swapcontext makes a sigprocmask system call per switch. Stacks are mmap'd with
 * a guard page below (an overflow faults instead of corrupting memory) and only touched pages cost
 * memory. Sanitizers are told about every switch (AddressSanitizer and ThreadSanitizer fiber
 * annotations), since they track stacks per thread.
 *
 * Invariant: exactly one fiber of a thread is running; a fiber is resumed only by the thread that
 * created it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "comm/fiber.h"
#include "core/util.h"

#if defined(__SANITIZE_ADDRESS__)
#define FIBER_ASAN 1
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
#else
#define FIBER_ASAN 0
#endif
#if defined(__SANITIZE_THREAD__)
#define FIBER_TSAN 1
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
#else
#define FIBER_TSAN 0
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

struct loom_fiber {
	void *sp; /* saved stack pointer while switched away (x86-64) */
#if !defined(__x86_64__)
	ucontext_t uc;
#endif
	char *map; /* guard page + stack; NULL for a thread's own context */
	size_t map_bytes;
	const void *stack_lo; /* usable stack, for the sanitizers */
	size_t stack_bytes;
	void (*fn)(void *);
	void *arg;
	void *tsan; /* ThreadSanitizer's fiber handle */
};

static _Thread_local loom_fiber_t self_ctx;
static _Thread_local loom_fiber_t *self_init;
static _Thread_local loom_fiber_t *switching_from; /* for the sanitizer bookkeeping on entry */

#if defined(__x86_64__)
/* loom__fiber_swap(&from->sp, to->sp): System V callee-saved registers, MXCSR and the x87 control
 * word; everything else is caller-saved, so the compiler already spilled it around the call. */
void loom__fiber_swap(void **save_sp, void *new_sp);
__asm__(".text\n"
        ".globl loom__fiber_swap\n"
        ".type loom__fiber_swap,@function\n"
        "loom__fiber_swap:\n"
        "\tpushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n"
        "\tsubq $8, %rsp\n\tstmxcsr (%rsp)\n\tfnstcw 4(%rsp)\n"
        "\tmovq %rsp, (%rdi)\n"
        "\tmovq %rsi, %rsp\n"
        "\tldmxcsr (%rsp)\n\tfldcw 4(%rsp)\n\taddq $8, %rsp\n"
        "\tpopq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n"
        "\tret\n"
        ".size loom__fiber_swap, .-loom__fiber_swap\n");
#endif

static void after_switch(void *fake)
{
#if FIBER_ASAN
	__sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
	(void)fake;
#endif
}

static _Thread_local loom_fiber_t *starting;

static void entry(void)
{
	loom_fiber_t *f = starting;
#if FIBER_ASAN
	/* First entry: learn the stack we came from (a thread's own, which only the sanitizer knows). */
	loom_fiber_t *from = switching_from;
	const void *lo = NULL;
	size_t bytes = 0;
	__sanitizer_finish_switch_fiber(NULL, &lo, &bytes);
	if (!from->map)
		from->stack_lo = lo, from->stack_bytes = bytes;
#endif
	f->fn(f->arg);
	abort(); /* fn must not return */
}

#if !defined(__x86_64__)
static void uc_entry(void)
{
	entry();
}
#endif

loom_fiber_t *loom__fiber_self(void)
{
	if (!self_init) {
		memset(&self_ctx, 0, sizeof self_ctx);
#if FIBER_TSAN
		self_ctx.tsan = __tsan_get_current_fiber();
#endif
		self_init = &self_ctx;
	}
	return self_init;
}

loom_fiber_t *loom__fiber_create(size_t stack_bytes, void (*fn)(void *), void *arg)
{
	long page = sysconf(_SC_PAGESIZE);
	size_t pg = page > 0 ? (size_t)page : 4096;
	loom_fiber_t *f = loom__calloc(1, sizeof *f);
	if (!f)
		return NULL;
	stack_bytes = (stack_bytes + pg - 1) / pg * pg;
	f->map_bytes = stack_bytes + pg;
	f->map = mmap(NULL, f->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (f->map == MAP_FAILED) {
		free(f);
		return NULL;
	}
	mprotect(f->map, pg, PROT_NONE); /* guard page: an overflow faults */
	f->stack_lo = f->map + pg;
	f->stack_bytes = stack_bytes;
	f->fn = fn, f->arg = arg;
#if FIBER_TSAN
	f->tsan = __tsan_create_fiber(0);
#endif
#if defined(__x86_64__)
	{
		/* From the top: a zero return address for entry (never used), entry's address at a 16-byte
		 * boundary (so entry starts with rsp = 8 mod 16, as after a call), six registers and the
		 * control words that loom__fiber_swap pops. */
		uintptr_t top = ((uintptr_t)f->map + f->map_bytes) & ~(uintptr_t)15;
		uint64_t *sp = (uint64_t *)top;
		*--sp = 0;
		*--sp = (uint64_t)(uintptr_t)entry;
		for (int i = 0; i < 6; i++)
			*--sp = 0;
		*--sp = 0x037F00001F80ull; /* MXCSR 0x1F80 (low half), x87 control word 0x037F */
		f->sp = sp;
	}
#else
	getcontext(&f->uc);
	f->uc.uc_stack.ss_sp = (void *)f->stack_lo;
	f->uc.uc_stack.ss_size = stack_bytes;
	f->uc.uc_link = NULL;
	makecontext(&f->uc, uc_entry, 0);
#endif
	return f;
}

void loom__fiber_destroy(loom_fiber_t *f)
{
	if (!f || !f->map)
		return;
#if FIBER_TSAN
	__tsan_destroy_fiber(f->tsan);
#endif
	munmap(f->map, f->map_bytes);
	free(f);
}

void loom__fiber_switch(loom_fiber_t *from, loom_fiber_t *to)
{
#if FIBER_ASAN
	void *fake = NULL;
	__sanitizer_start_switch_fiber(&fake, to->stack_lo, to->stack_bytes);
#endif
#if FIBER_TSAN
	__tsan_switch_to_fiber(to->tsan, 0);
#endif
	starting = to;
	switching_from = from;
#if defined(__x86_64__)
	loom__fiber_swap(&from->sp, to->sp);
#else
	swapcontext(&from->uc, &to->uc);
#endif
#if FIBER_ASAN
	after_switch(fake);
#else
	after_switch(NULL);
#endif
}

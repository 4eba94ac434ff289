/* shm_heap.c: the shared heap behind loom_comm_alloc: a first-fit allocator over this rank's region
 * of the world segment.
 *
 * Why this shape: only the owning rank allocates in its region, and peers only read from it at
 * offsets that travel in messages, so the allocator's bookkeeping is process-local (a list of blocks
 * in offset order, guarded by a mutex) and needs no cross-process locking. The workload is a few
 * large, long-lived buffers (gradient buckets, benchmark buffers, algorithm scratch), so first fit
 * with coalescing is plenty. The region is sparse address space in tmpfs: pages are reserved with
 * fallocate when a block is handed out (so a full /dev/shm is a NULL return, not a SIGBUS later) and
 * large freed blocks are punched out again so their memory goes back to the system.
 *
 * Invariants: blocks tile the region exactly, in offset order; no two adjacent blocks are both free;
 * every block's offset and length are multiples of the page size. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "comm/transport/shm_internal.h"
#include "core/util.h"

#define HEAP_ALIGN 4096u
#define PUNCH_MIN (1u << 20) /* freed blocks at least this large give their pages back */

struct heap_block {
	size_t off, len; /* offset in the world segment */
	int used;
	heap_block_t *next;
};

int loom__shm_heap_init(loom_job_t *j)
{
	shm_hdr_t *h = j->hdr;
	heap_block_t *b = loom__calloc(1, sizeof *b);
	if (!b)
		return loom_seterr(LOOM_ENOMEM, "rank %d: out of memory for the shared-heap bookkeeping", j->world_rank);
	b->off = h->heap_off + (size_t)j->world_rank * h->heap_bytes;
	b->len = h->heap_bytes;
	j->blocks = b;
	j->heap_lo = j->base + h->heap_off;
	j->heap_hi = j->heap_lo + (size_t)h->nranks * h->heap_bytes;
	pthread_mutex_init(&j->heap_lock, NULL);
	return LOOM_OK;
}

void loom__shm_heap_free_all(loom_job_t *j)
{
	heap_block_t *b = j->blocks, *n;
	for (; b; b = n) {
		n = b->next;
		free(b);
	}
	j->blocks = NULL;
	pthread_mutex_destroy(&j->heap_lock);
}

void *loom__shm_heap_alloc(loom_job_t *j, size_t bytes)
{
	size_t len;
	heap_block_t *b;
	void *p = NULL;
	if (!j || !j->blocks || bytes > SIZE_MAX - HEAP_ALIGN)
		return NULL;
	len = (LOOM_MAX(bytes, (size_t)1) + HEAP_ALIGN - 1) / HEAP_ALIGN * HEAP_ALIGN;
	pthread_mutex_lock(&j->heap_lock);
	for (b = j->blocks; b; b = b->next) {
		if (b->used || b->len < len)
			continue;
		if (fallocate(j->fd, 0, (off_t)b->off, (off_t)len) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
			loom_seterr(LOOM_ENOMEM, "rank %d: shared memory exhausted (fallocate of %zu bytes in /dev/shm: %s)",
			            j->world_rank, len, strerror(errno));
			break;
		}
		if (b->len > len) {
			heap_block_t *rest = loom__calloc(1, sizeof *rest);
			if (!rest) {
				loom_seterr(LOOM_ENOMEM, "rank %d: out of memory for the shared-heap bookkeeping", j->world_rank);
				break;
			}
			rest->off = b->off + len;
			rest->len = b->len - len;
			rest->next = b->next;
			b->next = rest;
			b->len = len;
		}
		b->used = 1;
		p = j->base + b->off;
		break;
	}
	if (!p && !b)
		loom_seterr(LOOM_ENOMEM, "rank %d: shared heap exhausted: no free block of %zu bytes (LOOM_SHM_MB=%zu)",
		            j->world_rank, len, (size_t)(j->hdr->heap_bytes >> 20));
	pthread_mutex_unlock(&j->heap_lock);
	return p;
}

int loom__shm_heap_free(loom_job_t *j, void *p)
{
	heap_block_t *b, *prev = NULL;
	size_t off;
	int found = 0;
	if (!j || !p || (char *)p < j->base || (char *)p >= j->base + j->bytes)
		return 0;
	off = (size_t)((char *)p - j->base);
	pthread_mutex_lock(&j->heap_lock);
	for (b = j->blocks; b; prev = b, b = b->next) {
		if (b->off != off || !b->used)
			continue;
		found = 1;
		b->used = 0;
		if (b->len >= PUNCH_MIN)
			fallocate(j->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)b->off, (off_t)b->len);
		if (b->next && !b->next->used) { /* merge the following free block */
			heap_block_t *n = b->next;
			b->len += n->len;
			b->next = n->next;
			free(n);
		}
		if (prev && !prev->used) { /* merge into the preceding free block */
			prev->len += b->len;
			prev->next = b->next;
			free(b);
		}
		break;
	}
	pthread_mutex_unlock(&j->heap_lock);
	return found;
}

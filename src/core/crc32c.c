/* crc32c.c: CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), for the checksums of checkpoint files.
 *
 * Two implementations with the same result: the SSE4.2 crc32 instruction, 8 bytes at a time (chosen
 * at run time when the CPU has it; several GB/s, so checksumming a file just written costs little
 * next to writing and fsyncing it), and a table-driven one (slicing by 8) everywhere else. The
 * tables are built once (pthread_once), so both are safe to call from any thread.
 * Invariant: loom__crc32c(loom__crc32c(0, a, n), b, m) == loom__crc32c(0, a||b, n + m). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "core/util.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
#define HAVE_SSE42_PATH 1
#endif

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

/* crc here is the running (inverted) register, not the final value. */
static uint32_t crc_table(uint32_t crc, const unsigned char *p, size_t n)
{
	pthread_once(&table_once, build_table);
	while (n && ((uintptr_t)p & 7)) {
		crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
		n--;
	}
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		w ^= crc; /* little-endian: the low 4 bytes carry the register */
		crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
		      table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
		      table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
		p += 8, n -= 8;
	}
	while (n--)
		crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
	return crc;
}

#ifdef HAVE_SSE42_PATH
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const unsigned char *p, size_t n)
{
	uint64_t c = crc;
	while (n && ((uintptr_t)p & 7)) {
		c = _mm_crc32_u8((uint32_t)c, *p++);
		n--;
	}
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		c = _mm_crc32_u64(c, w);
		p += 8, n -= 8;
	}
	while (n--)
		c = _mm_crc32_u8((uint32_t)c, *p++);
	return (uint32_t)c;
}
#endif

uint32_t loom__crc32c(uint32_t crc, const void *p, size_t n)
{
	uint32_t c = ~crc;
#ifdef HAVE_SSE42_PATH
	if (__builtin_cpu_supports("sse4.2"))
		return ~crc_sse42(c, p, n);
#endif
	return ~crc_table(c, p, n);
}

/* The table path alone (tests compare both on the same bytes). */
uint32_t loom__crc32c_portable(uint32_t crc, const void *p, size_t n)
{
	return ~crc_table(~crc, p, n);
}

int loom__crc32c_file(const char *path, uint32_t *crc, uint64_t *size)
{
	enum { CHUNK = 1 << 20 };
	struct stat sb;
	unsigned char *buf;
	uint32_t c = 0;
	uint64_t total = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), rc = LOOM_OK;
	*crc = 0, *size = 0;
	if (fd < 0)
		return loom_seterr(errno == ENOENT ? LOOM_ENOENT : LOOM_EIO, "%s: cannot open: %s", path, strerror(errno));
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return loom_seterr(LOOM_EINVAL, "%s: not a regular file", path);
	}
	if (!(buf = loom__malloc(CHUNK))) {
		close(fd);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory for checksumming it", path);
	}
	for (;;) {
		ssize_t r = read(fd, buf, CHUNK);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = loom_seterr(LOOM_EIO, "%s: read: %s", path, strerror(errno));
			break;
		}
		if (r == 0)
			break;
		c = loom__crc32c(c, buf, (size_t)r);
		total += (uint64_t)r;
	}
	free(buf);
	close(fd);
	if (rc == LOOM_OK)
		*crc = c, *size = total;
	return rc;
}

/* crc32c.h: CRC-32C (Castagnoli), the checksum of checkpoint files in their MANIFEST (internal).
 *
 * loom__crc32c(0, p, n) is the standard CRC-32C of n bytes (the one of iSCSI, ext4 and
 * `crc32c` in Python's crc32c package: "123456789" -> 0xe3069283); pass the previous result as crc
 * to continue over the next bytes. */
#ifndef LOOM_CORE_CRC32C_H
#define LOOM_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t loom__crc32c(uint32_t crc, const void *p, size_t n);
uint32_t loom__crc32c_portable(uint32_t crc, const void *p, size_t n); /* the table path alone, for tests */
/* The CRC-32C and size of a whole regular file (read in 1 MiB pieces). LOOM_ENOENT / LOOM_EIO /
 * LOOM_EINVAL (not a regular file) naming the path. */
int loom__crc32c_file(const char *path, uint32_t *crc, uint64_t *size);

#endif

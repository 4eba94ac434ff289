/* fileio.c: atomic file replacement (temp + fsync + rename + fsync dir) and directory helpers.
 *
 * Invariant: a file written through atomic_open/atomic_commit is visible under its final name only
 * once its content is complete and on disk; a crash leaves at most a ".NAME.tmp.PID" file beside it.
 * Reading files that may be hostile (loom__read_file_max, loom__open_regular): only regular files,
 * opened without blocking (a FIFO cannot hang the reader), sizes checked before any allocation. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "core/fileio.h"

int loom__fsync_path(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return loom_seterr(LOOM_ESYS, "%s: open for fsync: %s", path, strerror(errno));
	if (fsync(fd) != 0 && errno != EINVAL) {
		int e = errno;
		close(fd);
		return loom_seterr(LOOM_ESYS, "%s: fsync: %s", path, strerror(e));
	}
	close(fd);
	return LOOM_OK;
}

int loom__fsync_parent(const char *path)
{
	char buf[1100];
	if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
		return loom_seterr(LOOM_EINVAL, "%s: path too long", path);
	return loom__fsync_path(dirname(buf));
}

int loom__atomic_open(atomic_file_t *af, const char *path)
{
	char dir[1100], base[1100];
	memset(af, 0, sizeof *af);
	if (snprintf(af->path, sizeof af->path, "%s", path) >= (int)sizeof af->path)
		return loom_seterr(LOOM_EINVAL, "%s: path too long", path);
	snprintf(dir, sizeof dir, "%s", path);
	snprintf(base, sizeof base, "%s", path);
	if (snprintf(af->tmp, sizeof af->tmp, "%s/.%s.tmp.%ld", dirname(dir), basename(base), (long)getpid()) >=
	    (int)sizeof af->tmp)
		return loom_seterr(LOOM_EINVAL, "%s: path too long", path);
	af->f = fopen(af->tmp, "wb");
	if (!af->f)
		return loom_seterr(errno == ENOENT ? LOOM_ENOENT : LOOM_ESYS, "%s: cannot create %s: %s", path, af->tmp,
		                   strerror(errno));
	return LOOM_OK;
}

int loom__atomic_write(atomic_file_t *af, const void *p, size_t n)
{
	if (n && fwrite(p, 1, n, af->f) != n)
		return loom_seterr(LOOM_EIO, "%s: write of %zu bytes failed: %s", af->path, n, strerror(errno));
	return LOOM_OK;
}

void loom__atomic_abort(atomic_file_t *af)
{
	if (af->f) {
		fclose(af->f);
		af->f = NULL;
		unlink(af->tmp);
	}
}

int loom__atomic_commit(atomic_file_t *af)
{
	int rc;
	if (!af->f)
		return loom_seterr(LOOM_ESTATE, "%s: atomic file is not open", af->path);
	if (fflush(af->f) != 0 || ferror(af->f)) {
		rc = loom_seterr(LOOM_EIO, "%s: write failed: %s", af->path, strerror(errno));
		loom__atomic_abort(af);
		return rc;
	}
	if (fsync(fileno(af->f)) != 0) {
		rc = loom_seterr(LOOM_EIO, "%s: fsync failed: %s", af->path, strerror(errno));
		loom__atomic_abort(af);
		return rc;
	}
	if (fclose(af->f) != 0) {
		af->f = NULL;
		unlink(af->tmp);
		return loom_seterr(LOOM_EIO, "%s: close failed: %s", af->path, strerror(errno));
	}
	af->f = NULL;
	if (rename(af->tmp, af->path) != 0) {
		rc = loom_seterr(LOOM_ESYS, "%s: rename from %s failed: %s", af->path, af->tmp, strerror(errno));
		unlink(af->tmp);
		return rc;
	}
	return loom__fsync_parent(af->path);
}

int loom__mkdir_p(const char *path)
{
	char buf[1100];
	size_t n = strlen(path);
	if (n == 0 || n >= sizeof buf)
		return loom_seterr(LOOM_EINVAL, "'%s': bad directory path", path);
	memcpy(buf, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] == '/' || buf[i] == '\0') {
			char c = buf[i];
			buf[i] = '\0';
			if (mkdir(buf, 0777) != 0 && errno != EEXIST)
				return loom_seterr(LOOM_ESYS, "%s: mkdir %s: %s", path, buf, strerror(errno));
			buf[i] = c;
		}
	}
	struct stat st;
	if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
		return loom_seterr(LOOM_ESYS, "%s: exists and is not a directory", path);
	return LOOM_OK;
}

int loom__rm_rf(const char *path)
{
	struct stat st;
	if (lstat(path, &st) != 0)
		return errno == ENOENT ? LOOM_OK : loom_seterr(LOOM_ESYS, "%s: stat: %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		DIR *d = opendir(path);
		struct dirent *e;
		if (!d)
			return loom_seterr(LOOM_ESYS, "%s: opendir: %s", path, strerror(errno));
		while ((e = readdir(d))) {
			char sub[1100];
			int rc;
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) {
				closedir(d);
				return loom_seterr(LOOM_EINVAL, "%s/%s: path too long", path, e->d_name);
			}
			if ((rc = loom__rm_rf(sub)) != LOOM_OK) {
				closedir(d);
				return rc;
			}
		}
		closedir(d);
		if (rmdir(path) != 0)
			return loom_seterr(LOOM_ESYS, "%s: rmdir: %s", path, strerror(errno));
		return LOOM_OK;
	}
	if (unlink(path) != 0)
		return loom_seterr(LOOM_ESYS, "%s: unlink: %s", path, strerror(errno));
	return LOOM_OK;
}

static const char *file_kind(mode_t m)
{
	return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" :
	       S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int loom__open_regular(const char *what, const char *path, int *fd, size_t *size)
{
	const char *w = what ? what : "", *sp = what ? " " : "";
	struct stat sb;
	int f;
	*fd = -1, *size = 0;
	f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (f < 0)
		return loom_seterr(errno == ENOENT ? LOOM_ENOENT : LOOM_EIO, "%s%s%s: cannot open: %s", w, sp, path,
		                   strerror(errno));
	if (fstat(f, &sb) != 0) {
		int e = errno;
		close(f);
		return loom_seterr(LOOM_EIO, "%s%s%s: stat: %s", w, sp, path, strerror(e));
	}
	if (!S_ISREG(sb.st_mode)) {
		close(f);
		return loom_seterr(LOOM_EINVAL, "%s%s%s: is %s, expected a regular file", w, sp, path,
		                   file_kind(sb.st_mode));
	}
	/* back to blocking reads (a regular file never blocks, but keep the usual semantics) */
	fcntl(f, F_SETFL, fcntl(f, F_GETFL) & ~O_NONBLOCK);
	*fd = f, *size = (size_t)sb.st_size;
	return LOOM_OK;
}

int loom__read_file_max(const char *path, size_t max, char **buf, size_t *len)
{
	size_t size, n = 0;
	char *b;
	int fd, rc;
	*buf = NULL, *len = 0;
	if ((rc = loom__open_regular(NULL, path, &fd, &size)) != LOOM_OK)
		return rc;
	if (size > max) {
		close(fd);
		return loom_seterr(LOOM_EFORMAT, "%s: %zu bytes, more than the %zu this kind of file may have", path, size,
		                   max);
	}
	if (!(b = loom__malloc(size + 1))) {
		close(fd);
		return loom_seterr(LOOM_ENOMEM, "%s: out of memory for %zu bytes", path, size + 1);
	}
	while (n < size) { /* the file may shrink under us: stop at its end; never read past size */
		ssize_t got = read(fd, b + n, size - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			int e = errno;
			free(b);
			close(fd);
			return loom_seterr(LOOM_EIO, "%s: read error: %s", path, strerror(e));
		}
		if (got == 0)
			break;
		n += (size_t)got;
	}
	close(fd);
	b[n] = '\0';
	*buf = b, *len = n;
	return LOOM_OK;
}

int loom__read_file(const char *path, char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *b = NULL;
	size_t cap = 0, n = 0;
	struct stat sb;
	*buf = NULL, *len = 0;
	if (!f)
		return loom_seterr(errno == ENOENT ? LOOM_ENOENT : LOOM_EIO, "%s: cannot open: %s", path, strerror(errno));
	if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
		fclose(f);
		return loom_seterr(LOOM_EINVAL, "%s: is a directory, expected a file", path);
	}
	for (;;) {
		if (n + 1 >= cap) {
			size_t nc = cap ? 2 * cap : 65536;
			char *nb = loom__realloc(b, nc);
			if (!nb) {
				free(b);
				fclose(f);
				return loom_seterr(LOOM_ENOMEM, "%s: out of memory reading the file", path);
			}
			b = nb, cap = nc;
		}
		size_t got = fread(b + n, 1, cap - n - 1, f);
		n += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		free(b);
		fclose(f);
		return loom_seterr(LOOM_EIO, "%s: read error", path);
	}
	fclose(f);
	b[n] = '\0';
	*buf = b, *len = n;
	return LOOM_OK;
}

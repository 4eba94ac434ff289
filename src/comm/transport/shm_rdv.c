/* shm_rdv.c: how ranks find a communicator's shared memory without a name in /dev/shm, so that no
 * segment outlives its job, whatever ends it.
 *
 * Why. A name in /dev/shm lives until someone unlinks it. The processes that could (the ranks) are
 * exactly the ones a failing job loses: mpirun and Slurm stop ranks still waiting at the rendezvous,
 * and a SIGKILL leaves no chance to clean up. So nothing of a job has a name in the file system:
 *   - the memory is an unnamed file on /dev/shm's tmpfs (O_TMPFILE): it counts against /dev/shm's
 *     size like a named segment, and the kernel frees it when the last process holding it (a
 *     descriptor or a mapping) ends;
 *   - the creator (rank 0, a sub-group's leader) offers the descriptor on an abstract Unix socket
 *     named like the segment and the /dev/shm it lives on ("@loom-<id>@w:<dev>"; long names end in
 *     a hash), which the kernel also removes with the last process holding it; the others connect
 *     and receive the descriptor (SCM_RIGHTS). Both sides check that the other runs as the same
 *     user.
 * The world's offer stays open for the job's lifetime (the creator's keeper thread answers): a rank
 * that arrives late, or a second process claiming a rank, maps the segment and is refused with the
 * rank's owner named (shm_segment.c), and a second job with the same id on this host is refused at
 * once. A sub-group's offer closes when all its members have joined.
 * Where /dev/shm has no O_TMPFILE, the memory is a named file unlinked right after its creation (a
 * window of one system call). */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "comm/transport/shm_internal.h"
#include "core/util.h"

#define RDV_MAGIC 0x317664726d6f6f6cull /* "loomrdv1": the payload of an offer's one message */

/* The abstract address of segment `name` ("/loom-..."): the name without its slash, ':' and the
 * device number of /dev/shm in hex, so that only processes sharing a /dev/shm ever meet (two
 * containers on the host's network, each with its own /dev/shm, keep their jobs apart as they did
 * when segments had names there). When that does not fit sun_path: the name's first 80 characters,
 * '~' and a 64-bit FNV-1a hash of all of it. */
static socklen_t rdv_addr(const char *name, struct sockaddr_un *a, char *shown, size_t cap)
{
	struct stat st;
	char full[320];
	size_t len, room = sizeof a->sun_path - 2; /* a leading NUL, and snprintf's own */
	if (stat("/dev/shm", &st) != 0)
		st.st_dev = 0;
	snprintf(full, sizeof full, "%s:%llx", name[0] == '/' ? name + 1 : name, (unsigned long long)st.st_dev);
	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	if ((len = strlen(full)) <= room) {
		memcpy(a->sun_path + 1, full, len);
	} else {
		uint64_t h = 1469598103934665603ull;
		for (const char *p = full; *p; p++)
			h = (h ^ (unsigned char)*p) * 1099511628211ull;
		snprintf(a->sun_path + 1, room + 1, "%.80s~%016llx", full, (unsigned long long)h);
		len = strlen(a->sun_path + 1);
	}
	snprintf(shown, cap, "@%.*s", (int)len, a->sun_path + 1);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

int loom__shm_rdv_memory(const char *name)
{
	static atomic_uint serial;
	char tmp[256];
	int fd = -1;
	if (loom_env_long("LOOM_TEST_SHM_NO_TMPFILE", 0, NULL) == 1)
		errno = EOPNOTSUPP;
	else if ((fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)) >= 0)
		return fd;
	if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
		return -1;
	snprintf(tmp, sizeof tmp, "%.200s.%d.%u", name, (int)getpid(), atomic_fetch_add(&serial, 1));
	if ((fd = shm_open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) >= 0)
		shm_unlink(tmp);
	return fd;
}

/* The process listening at a, for messages: 1 with its pid and uid when it could be asked. */
static int holder(const struct sockaddr_un *a, socklen_t len, struct ucred *cr)
{
	socklen_t cl = sizeof *cr;
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), ok;
	if (s < 0)
		return 0;
	ok = connect(s, (const struct sockaddr *)a, len) == 0 && getsockopt(s, SOL_SOCKET, SO_PEERCRED, cr, &cl) == 0;
	close(s);
	return ok;
}

int loom__shm_rdv_offer(loom_comm_t *c, const char *name, int *lfd)
{
	struct sockaddr_un a;
	struct ucred cr;
	char shown[128];
	socklen_t len = rdv_addr(name, &a, shown, sizeof shown);
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), e;
	*lfd = -1;
	if (s < 0)
		return loom_comm_fail(c, LOOM_ESYS, "socket(AF_UNIX) for the rendezvous of %s: %s", name, strerror(errno));
	if (bind(s, (const struct sockaddr *)&a, len) == 0 && listen(s, SOMAXCONN) == 0) {
		*lfd = s;
		return LOOM_OK;
	}
	e = errno;
	close(s);
	if (e != EADDRINUSE)
		return loom_comm_fail(c, LOOM_ESYS, "cannot offer %s on the abstract socket %s: %s", name, shown, strerror(e));
	if (holder(&a, len, &cr))
		return loom_comm_fail(c, LOOM_ESTATE,
		                      "%s is in use on this host: process %d (uid %u) offers it on %s (a job with the same "
		                      "LOOM_JOB_ID is running; wait for it to end or use another LOOM_JOB_ID)",
		                      name, (int)cr.pid, (unsigned)cr.uid, shown);
	return loom_comm_fail(c, LOOM_ESTATE,
	                      "%s is in use on this host: another process holds the abstract socket %s (a job with "
	                      "the same LOOM_JOB_ID? use another LOOM_JOB_ID)",
	                      name, shown);
}

/* One message: the magic, and fd as SCM_RIGHTS. */
static void send_fd(int s, int fd)
{
	uint64_t magic = RDV_MAGIC;
	struct iovec io = {&magic, sizeof magic};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr m;
	memset(&m, 0, sizeof m);
	memset(&u, 0, sizeof u);
	m.msg_iov = &io, m.msg_iovlen = 1;
	m.msg_control = u.buf, m.msg_controllen = sizeof u.buf;
	CMSG_FIRSTHDR(&m)->cmsg_level = SOL_SOCKET;
	CMSG_FIRSTHDR(&m)->cmsg_type = SCM_RIGHTS;
	CMSG_FIRSTHDR(&m)->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(CMSG_FIRSTHDR(&m)), &fd, sizeof fd);
	(void)!sendmsg(s, &m, MSG_NOSIGNAL | MSG_DONTWAIT); /* a peer that went away: nothing to do */
}

void loom__shm_rdv_serve(int lfd, int fd)
{
	for (;;) {
		struct ucred cr;
		socklen_t cl = sizeof cr;
		int s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (s < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return; /* EAGAIN: nobody waiting */
		}
		if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0 && cr.uid == geteuid())
			send_fd(s, fd);
		close(s); /* the message stays readable after the close */
	}
}

int loom__shm_rdv_fetch(loom_comm_t *c, const char *name, loom_shm_rdv_t *r, int *fd)
{
	uint64_t magic = 0;
	struct iovec io = {&magic, sizeof magic};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr m;
	struct cmsghdr *h;
	ssize_t n;
	int got = -1;
	if (r->sock < 0) {
		struct sockaddr_un a;
		struct ucred cr;
		socklen_t cl = sizeof cr, len = rdv_addr(name, &a, r->shown, sizeof r->shown);
		int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (s < 0)
			return loom_comm_fail(c, LOOM_ESYS, "socket(AF_UNIX) for the rendezvous of %s: %s", name, strerror(errno));
		if (connect(s, (const struct sockaddr *)&a, len) != 0) {
			int e = errno;
			close(s);
			if (e == ECONNREFUSED || e == ENOENT || e == EAGAIN || e == EINTR)
				return 0; /* not offered (yet or any more), or its queue is full */
			return loom_comm_fail(c, LOOM_ESYS, "connect(%s) for %s: %s", r->shown, name, strerror(e));
		}
		if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != geteuid()) {
			close(s);
			return loom_comm_fail(c, LOOM_ESTATE,
			                      "%s is offered on %s by process %d of another user (uid %u, this process runs as "
			                      "uid %u): a job with the same LOOM_JOB_ID? use another LOOM_JOB_ID",
			                      name, r->shown, (int)cr.pid, (unsigned)cr.uid, (unsigned)geteuid());
		}
		r->sock = s, r->pid = (int)cr.pid;
	}
	memset(&m, 0, sizeof m);
	m.msg_iov = &io, m.msg_iovlen = 1;
	m.msg_control = u.buf, m.msg_controllen = sizeof u.buf;
	n = recvmsg(r->sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 0; /* connected, not answered yet */
	h = n > 0 ? CMSG_FIRSTHDR(&m) : NULL;
	if (h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS && h->cmsg_len == CMSG_LEN(sizeof(int)))
		memcpy(&got, CMSG_DATA(h), sizeof got);
	loom__shm_rdv_close(r);
	if (got >= 0 && n == (ssize_t)sizeof magic && magic == RDV_MAGIC && !(m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		*fd = got;
		return 1;
	}
	if (got >= 0)
		close(got);
	return 0; /* the offer was withdrawn while this rank queued (its creator gave up): look again */
}

void loom__shm_rdv_close(loom_shm_rdv_t *r)
{
	if (r->sock >= 0)
		close(r->sock);
	r->sock = -1;
}

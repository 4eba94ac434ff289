/* allreduce.c: the smallest loom program. Every rank contributes its rank number; all ranks end
 * with the sum. Build and run:
 *   cc examples/allreduce.c $(pkg-config --cflags --libs build/loom.pc) -o allreduce
 *   build/loom run --nproc-per-node 4 ./allreduce */
#include <stdio.h>

#include <loom/loom.h>

int main(void)
{
	loom_comm_t *comm;
	int rc = loom_comm_init(&comm);
	if (rc != LOOM_OK) {
		fprintf(stderr, "loom_comm_init: %s: %s\n", loom_strerror(rc), loom_errmsg());
		return 1;
	}
	int rank = loom_comm_rank(comm), size = loom_comm_size(comm);
	float x[4] = {(float)rank, 1.0f, 2.0f * (float)rank, -1.0f};
	rc = loom_allreduce(comm, x, x, 4, LOOM_FLOAT32, LOOM_SUM);
	if (rc != LOOM_OK) {
		fprintf(stderr, "allreduce: %s: %s\n", loom_strerror(rc), loom_comm_errmsg(comm));
		loom_comm_destroy(comm);
		return 1;
	}
	printf("rank %d of %d: %g %g %g %g\n", rank, size, x[0], x[1], x[2], x[3]);
	loom_comm_destroy(comm);
	return 0;
}

/* test_mesh.c: the dp x cp x tp x pp mesh (loom/mesh.h): every rank's coordinates in Megatron's order
 * (tp fastest, then cp, then dp, then pp) and the exact members of each axis communicator and of the
 * dp x cp group (an allgather of world ranks on it), for 8 ranks as 2x2x2 and 4 ranks as dp 4 and as
 * tp 4, with cp: 8 ranks as dp 2 x cp 2 x tp 2 and cp 2 x pp 2 x dp 2, 4 as cp 4; a size-1 axis has no
 * communicator and a world-sized one is the world itself; the error cases name the rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/mesh.h"
#include "test.h"

typedef struct {
	int dp, tp, pp, cp; /* cp 0: 1 (no context parallel) */
} sizes_t;

/* The members of this rank's communicator on `axis`, as world ranks, must be exactly want[0..n). */
static int check_members(loom_mesh_t *m, loom_mesh_axis_t axis, const int *want, int n)
{
	loom_comm_t *c = loom_mesh_comm(m, axis);
	int me = loom_mesh_world_rank(m), got[16];
	if (n == 1) {
		CHECK(c == NULL); /* a size-1 axis has no communicator */
		return 0;
	}
	CHECK(c != NULL);
	CHECK_EQ(loom_comm_size(c), n);
	CHECK_EQ(loom_comm_rank(c), loom_mesh_coord(m, axis)); /* ordered by the coordinate */
	CHECK_OK(loom_allgather(c, &me, got, 1, LOOM_INT32));
	for (int i = 0; i < n; i++)
		CHECK_MSG(got[i] == want[i], "rank %d, axis %s, member %d: %d, expected %d", me,
		          loom_mesh_axis_name(axis), i, got[i], want[i]);
	return 0;
}

/* Any dp x cp x tp x pp: coordinates r = tp + TP*(cp + CP*(dp + DP*pp)) and the groups computed from
 * that formula; the dp x cp group ordered cp + CP*dp. */
static int mesh_rank(int rank, int nranks, void *arg)
{
	const sizes_t *z = arg;
	loom_comm_t *world;
	loom_mesh_t *m;
	int want[16];
	CHECK_OK(loom_comm_init(&world));
	CHECK_OK(loom_mesh_create4(&m, world, z->dp, z->cp ? z->cp : 1, z->tp, z->pp));
	int DP = loom_mesh_size(m, LOOM_MESH_DP), TP = loom_mesh_size(m, LOOM_MESH_TP);
	int PP = loom_mesh_size(m, LOOM_MESH_PP), CP = loom_mesh_size(m, LOOM_MESH_CP);
	CHECK_EQ(DP * CP * TP * PP, nranks);
	CHECK_EQ(CP, z->cp ? z->cp : 1);
	if (z->dp > 0)
		CHECK_EQ(DP, z->dp);
	int tp = rank % TP, cp = rank / TP % CP, dp = rank / (TP * CP) % DP, pp = rank / (TP * CP * DP);
	CHECK_EQ(loom_mesh_coord(m, LOOM_MESH_TP), tp);
	CHECK_EQ(loom_mesh_coord(m, LOOM_MESH_CP), cp);
	CHECK_EQ(loom_mesh_coord(m, LOOM_MESH_DP), dp);
	CHECK_EQ(loom_mesh_coord(m, LOOM_MESH_PP), pp);
	CHECK_EQ(loom_mesh_world_rank(m), rank);
	for (int i = 0; i < TP; i++)
		want[i] = i + TP * (cp + CP * (dp + DP * pp));
	if (check_members(m, LOOM_MESH_TP, want, TP))
		return 1;
	for (int i = 0; i < CP; i++)
		want[i] = tp + TP * (i + CP * (dp + DP * pp));
	if (check_members(m, LOOM_MESH_CP, want, CP))
		return 1;
	for (int i = 0; i < DP; i++)
		want[i] = tp + TP * (cp + CP * (i + DP * pp));
	if (check_members(m, LOOM_MESH_DP, want, DP))
		return 1;
	for (int i = 0; i < PP; i++)
		want[i] = tp + TP * (cp + CP * (dp + DP * i));
	if (check_members(m, LOOM_MESH_PP, want, PP))
		return 1;
	/* the data-parallel group: dp x cp, none for one rank, the world when it is every rank */
	loom_comm_t *g = loom_mesh_dpcp_comm(m);
	int me = rank, got[16];
	if (DP * CP == 1) {
		CHECK(g == NULL);
	} else {
		CHECK(g != NULL);
		CHECK_EQ(loom_comm_size(g), DP * CP);
		CHECK_EQ(loom_comm_rank(g), cp + CP * dp);
		CHECK_OK(loom_allgather(g, &me, got, 1, LOOM_INT32));
		for (int i = 0; i < DP; i++)
			for (int j = 0; j < CP; j++)
				CHECK_EQ(got[j + CP * i], tp + TP * (j + CP * (i + DP * pp)));
		if (DP * CP == nranks)
			CHECK(g == world);
		if (CP == 1)
			CHECK(g == loom_mesh_comm(m, LOOM_MESH_DP));
	}
	for (int a = 0; a < LOOM_MESH_AXES; a++) /* a world-sized axis is the world communicator itself */
		if (loom_mesh_size(m, (loom_mesh_axis_t)a) == nranks)
			CHECK(loom_mesh_comm(m, (loom_mesh_axis_t)a) == world);
	loom_mesh_destroy(m);
	CHECK_OK(loom_barrier(world)); /* the world still works after the mesh is gone */
	loom_comm_destroy(world);
	return 0;
}

/* 8 ranks as 2x2x2, written out: rank 5 is (dp 0, tp 1, pp 1), its tp group {4, 5}, dp group {5, 7},
 * pp group {1, 5}; the description says so. */
static int mesh_222_rank(int rank, int nranks, void *arg)
{
	static const int coords[8][3] = {{0, 0, 0}, {0, 1, 0}, {1, 0, 0}, {1, 1, 0},
	                                 {0, 0, 1}, {0, 1, 1}, {1, 0, 1}, {1, 1, 1}}; /* dp, tp, pp */
	static const int tpg[8][2] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}, {4, 5}, {4, 5}, {6, 7}, {6, 7}};
	static const int dpg[8][2] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}, {4, 6}, {5, 7}, {4, 6}, {5, 7}};
	static const int ppg[8][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7}};
	loom_comm_t *world;
	loom_mesh_t *m;
	char text[512];
	(void)nranks, (void)arg;
	CHECK_OK(loom_comm_init(&world));
	CHECK_OK(loom_mesh_create(&m, world, 2, 2, 2));
	CHECK_EQ(loom_mesh_coord(m, LOOM_MESH_DP), coords[rank][0]);
	CHECK_EQ(loom_mesh_coord(m, LOOM_MESH_TP), coords[rank][1]);
	CHECK_EQ(loom_mesh_coord(m, LOOM_MESH_PP), coords[rank][2]);
	if (check_members(m, LOOM_MESH_TP, tpg[rank], 2) || check_members(m, LOOM_MESH_DP, dpg[rank], 2) ||
	    check_members(m, LOOM_MESH_PP, ppg[rank], 2))
		return 1;
	size_t len = loom_mesh_describe(m, text, sizeof text);
	CHECK_EQ(len, strlen(text));
	if (rank == 5)
		CHECK_STREQ(text, "mesh dp 2 x tp 2 x pp 2 = 8 ranks; world rank = tp + 2*dp + 4*pp\n"
		                  "  tp: stride 1, this rank (5) at 1 of {4, 5}\n"
		                  "  dp: stride 2, this rank (5) at 0 of {5, 7}\n"
		                  "  pp: stride 4, this rank (5) at 1 of {1, 5}\n");
	CHECK_EQ(loom_mesh_describe(m, text, 10), len); /* truncated, but says what it needed */
	CHECK_EQ(strlen(text), 9);
	loom_mesh_destroy(m);
	loom_comm_destroy(world);
	return 0;
}

TEST(mesh_8ranks_2x2x2)
{
	return test_spawn(8, mesh_222_rank, NULL, 120, NULL);
}

TEST(mesh_8ranks_2x2x2_formula)
{
	sizes_t z = {2, 2, 2, 0};
	return test_spawn(8, mesh_rank, &z, 120, NULL);
}

/* Context parallel: dp 2 x cp 2 x tp 2 (the dp x cp group split apart from the axes), cp 2 x pp 2 with dp
 * derived (2), and cp 4 alone (its group the world). */
TEST(mesh_8ranks_dp2_cp2_tp2)
{
	sizes_t z = {2, 2, 1, 2};
	return test_spawn(8, mesh_rank, &z, 120, NULL);
}

TEST(mesh_8ranks_cp2_pp2_derived_dp)
{
	sizes_t z = {0, 1, 2, 2};
	return test_spawn(8, mesh_rank, &z, 120, NULL);
}

TEST(mesh_4ranks_cp4)
{
	sizes_t z = {1, 1, 1, 4};
	return test_spawn(4, mesh_rank, &z, 60, NULL);
}

/* rank 5 of dp 2 x cp 2 x tp 2 is (tp 1, cp 0, dp 1): the description lists its cp group {5, 7} and its
 * dp x cp group {1, 3, 5, 7}. */
static int mesh_cp_describe_rank(int rank, int nranks, void *arg)
{
	loom_comm_t *world;
	loom_mesh_t *m;
	char text[512];
	(void)nranks, (void)arg;
	CHECK_OK(loom_comm_init(&world));
	CHECK_OK(loom_mesh_create4(&m, world, 2, 2, 2, 1));
	loom_mesh_describe(m, text, sizeof text);
	if (rank == 5)
		CHECK_STREQ(text, "mesh dp 2 x cp 2 x tp 2 x pp 1 = 8 ranks; world rank = tp + 2*cp + 4*dp + 8*pp\n"
		                  "  tp: stride 1, this rank (5) at 1 of {4, 5}\n"
		                  "  cp: stride 2, this rank (5) at 0 of {5, 7}\n"
		                  "  dp: stride 4, this rank (5) at 1 of {1, 5}\n"
		                  "  pp: stride 8, this rank (5) at 0 of {5}\n"
		                  "  dp x cp: this rank (5) at 2 of {1, 3, 5, 7}\n");
	loom_mesh_destroy(m);
	CHECK_ERR(loom_mesh_create4(&m, world, 0, 3, 1, 1), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "not divisible by the other sizes (3) to derive dp (dp 0, cp 3, tp 1, pp 1)");
	loom_comm_destroy(world);
	return 0;
}

TEST(mesh_cp_describe)
{
	return test_spawn(8, mesh_cp_describe_rank, NULL, 120, NULL);
}

TEST(mesh_4ranks_dp4)
{
	sizes_t z = {4, 1, 1};
	return test_spawn(4, mesh_rank, &z, 60, NULL);
}

TEST(mesh_4ranks_tp4)
{
	sizes_t z = {1, 4, 1};
	return test_spawn(4, mesh_rank, &z, 60, NULL);
}

/* dp derived (0): 4 ranks with tp 2 are dp 2; and 6 ranks as dp 3 x tp 1 x pp 2. */
TEST(mesh_4ranks_derived_dp)
{
	sizes_t z = {0, 2, 1};
	return test_spawn(4, mesh_rank, &z, 60, NULL);
}

TEST(mesh_6ranks_3x1x2)
{
	sizes_t z = {3, 1, 2};
	return test_spawn(6, mesh_rank, &z, 60, NULL);
}

/* Errors on 4 ranks: every rank gets the same clear error, naming itself; a rank asking for other
 * sizes is named on every rank. */
static int mesh_errors_rank(int rank, int nranks, void *arg)
{
	loom_comm_t *world;
	loom_mesh_t *m = (loom_mesh_t *)&m;
	char want[128];
	(void)nranks, (void)arg;
	CHECK_OK(loom_comm_init(&world));
	CHECK_ERR(loom_mesh_create(&m, world, 3, 1, 1), LOOM_EINVAL);
	CHECK(m == NULL);
	snprintf(want, sizeof want, "mesh: rank %d of 4: dp 3 x tp 1 x pp 1 = 3 ranks, but the world has 4", rank);
	CHECK_CONTAINS(loom_errmsg(), want);
	CHECK_ERR(loom_mesh_create(&m, world, 0, 3, 1), LOOM_EINVAL);
	snprintf(want, sizeof want, "mesh: rank %d of 4: the world of 4 ranks is not divisible by the other sizes (3)",
	         rank);
	CHECK_CONTAINS(loom_errmsg(), want);
	CHECK_ERR(loom_mesh_create(&m, world, 4, -1, 1), LOOM_EINVAL);
	snprintf(want, sizeof want, "mesh: rank %d: tp size -1 must be >= 1 (or 0: derived)", rank);
	CHECK_CONTAINS(loom_errmsg(), want);
	CHECK_ERR(loom_mesh_create(&m, world, 0, 0, 4), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "only one of dp 0, tp 0, pp 4 may be 0");
	CHECK_ERR(loom_mesh_create(&m, world, rank == 2 ? 2 : 4, rank == 2 ? 2 : 1, 1), LOOM_EMISMATCH);
	CHECK_CONTAINS(loom_errmsg(), "rank(s) 2 asked for other sizes than rank 0's dp 4 x tp 1 x pp 1");
	CHECK_OK(loom_mesh_create(&m, world, 0, 1, 1)); /* and the world is still usable */
	CHECK_EQ(loom_mesh_size(m, LOOM_MESH_DP), 4);
	loom_mesh_destroy(m);
	loom_comm_destroy(world);
	return 0;
}

TEST(mesh_errors_4ranks)
{
	return test_spawn(4, mesh_errors_rank, NULL, 60, NULL);
}

/* One process (no communicator): 1 x 1 x 1, no axis communicators. */
TEST(mesh_single_process)
{
	loom_mesh_t *m;
	char text[256];
	CHECK_OK(loom_mesh_create(&m, NULL, 0, 1, 1));
	for (int a = 0; a < LOOM_MESH_AXES; a++) {
		CHECK_EQ(loom_mesh_size(m, (loom_mesh_axis_t)a), 1);
		CHECK_EQ(loom_mesh_coord(m, (loom_mesh_axis_t)a), 0);
		CHECK(loom_mesh_comm(m, (loom_mesh_axis_t)a) == NULL);
	}
	CHECK(loom_mesh_world(m) == NULL);
	CHECK_EQ(loom_mesh_world_size(m), 1);
	loom_mesh_describe(m, text, sizeof text);
	CHECK_STREQ(text, "mesh dp 1 x tp 1 x pp 1 = 1 ranks; world rank = tp + dp + pp\n"
	                  "  tp: stride 1, this rank (0) at 0 of {0}\n"
	                  "  dp: stride 1, this rank (0) at 0 of {0}\n"
	                  "  pp: stride 1, this rank (0) at 0 of {0}\n");
	loom_mesh_destroy(m);
	CHECK_ERR(loom_mesh_create(&m, NULL, 2, 1, 1), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "mesh: rank 0 of 1: dp 2 x tp 1 x pp 1 = 2 ranks, but the world has 1");
	CHECK_STREQ(loom_mesh_axis_name(LOOM_MESH_PP), "pp");
	CHECK_STREQ(loom_mesh_axis_name((loom_mesh_axis_t)7), "?");
	return 0;
}

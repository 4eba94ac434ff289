/* rng.h: the model's random numbers: splitmix64 (Steele, Lea, Flood 2014), uniform floats from its
 * top bits, normals by Box-Muller. Small, seedable and identical on every platform, so an init or
 * a sampling run is reproducible from its seed alone. */
#ifndef LOOM_MODEL_RNG_H
#define LOOM_MODEL_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct {
	uint64_t s;
	int has_spare; /* Box-Muller makes normals in pairs */
	double spare;
} rng_t;

static inline void rng_seed(rng_t *r, uint64_t seed)
{
	r->s = seed;
	r->has_spare = 0;
	r->spare = 0.0;
}

static inline uint64_t rng_next(rng_t *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double rng_uniform(rng_t *r)
{
	return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal. */
static inline double rng_normal(rng_t *r)
{
	if (r->has_spare) {
		r->has_spare = 0;
		return r->spare;
	}
	double u1 = 1.0 - rng_uniform(r), u2 = rng_uniform(r); /* u1 in (0, 1]: log is finite */
	double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586477 * u2;
	r->spare = rad * sin(th);
	r->has_spare = 1;
	return rad * cos(th);
}

/* One token from logits z (V): the argmax at temperature 0, else a draw from softmax(z / temperature)
 * over the top_k largest (0: all); scratch holds V floats (reordered). Every family's sampler
 * (generate.c). */
int loom__sample_token(const float *z, int V, float temperature, int top_k, float *scratch, rng_t *r);

#endif

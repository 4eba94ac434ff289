/* test_core.c: the error convention, environment parsing and the GPT-2 tensor table. */
#include <stdlib.h>

#include "core/util.h"
#include "loom/gpt2.h"
#include "test.h"

TEST(error_strings)
{
	CHECK_STREQ(loom_strerror(LOOM_OK), "success");
	CHECK_STREQ(loom_strerror(LOOM_EPEERLOST), "peer rank lost");
	CHECK_STREQ(loom_strerror(12345), "unknown error");
	CHECK_ERR(loom_seterr(LOOM_EFORMAT, "file %s: bad magic %d", "x.bin", 7), LOOM_EFORMAT);
	CHECK_STREQ(loom_errmsg(), "file x.bin: bad magic 7");
	/* wrapping the previous detail in a new one reads and writes the same buffer */
	CHECK_ERR(loom_seterr(LOOM_EIO, "loading model: %s", loom_errmsg()), LOOM_EIO);
	CHECK_STREQ(loom_errmsg(), "loading model: file x.bin: bad magic 7");
	return 0;
}

TEST(env_long)
{
	int ok;
	setenv("LOOM_TEST_ENV", "42", 1);
	CHECK_EQ(loom_env_long("LOOM_TEST_ENV", 7, &ok), 42);
	CHECK_EQ(ok, 1);
	setenv("LOOM_TEST_ENV", "4x", 1);
	CHECK_EQ(loom_env_long("LOOM_TEST_ENV", 7, &ok), 7);
	CHECK_EQ(ok, 0);
	unsetenv("LOOM_TEST_ENV");
	CHECK_EQ(loom_env_long("LOOM_TEST_ENV", 7, &ok), 7);
	CHECK_EQ(ok, 1);
	return 0;
}

TEST(gpt2_tensor_table)
{
	loom_gpt2_config_t cfg;
	loom_tensor_info_t info;
	size_t total = 0;
	CHECK_OK(loom_gpt2_preset("gpt2", &cfg));
	CHECK_EQ(loom_gpt2_num_tensors(&cfg), 148);
	/* HF GPT-2 124M: 124,439,808 parameters (tied lm head counted once). */
	CHECK_EQ(loom_gpt2_num_params(&cfg), 124439808);
	for (int i = 0; i < loom_gpt2_num_tensors(&cfg); i++) {
		CHECK_OK(loom_gpt2_tensor_info(&cfg, i, &info));
		CHECK_EQ(info.offset, total);
		total += info.numel;
	}
	CHECK_EQ(total, loom_gpt2_num_params(&cfg));
	CHECK_OK(loom_gpt2_tensor_info(&cfg, 2 + 12 * 3 + 2, &info));
	CHECK_STREQ(info.name, "h.3.attn.c_attn.weight");
	CHECK_EQ(info.shape[0], 768);
	CHECK_EQ(info.shape[1], 2304);
	CHECK_EQ(info.decay, 1);
	CHECK_EQ(loom_gpt2_tensor_index(&cfg, "transformer.h.11.mlp.c_proj.bias"), 2 + 12 * 11 + 11);
	CHECK_EQ(loom_gpt2_tensor_index(&cfg, "h.12.ln_1.weight"), -1);
	CHECK_ERR(loom_gpt2_preset("huge", &cfg), LOOM_EINVAL);
	cfg.n_head = 5;
	CHECK_ERR(loom_gpt2_config_check(&cfg), LOOM_EINVAL);
	CHECK_CONTAINS(loom_errmsg(), "not divisible");
	return 0;
}

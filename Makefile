# loom: plain GNU Makefile. Objects go to $(BUILD); `make SANITIZER=address,undefined` builds a separate tree,
# and so does `make ARCH=x86-64-v3` (another -march, e.g. to see what an AVX2 machine runs: build/arch-x86-64-v3).
# Every flag and detected option is tracked (stamps in $(BUILD), below): changing any of them (MPI=0,
# installing OpenMPI, OPT, CFLAGS=...) rebuilds what it affects, never more, without `make clean`.
#   make            library, CLI, pkg-config file
#   make test       build and run the test suite
#   make install PREFIX=/usr/local
#   make demo       install deps, build, prepare the default corpus, train with 2 processes, sample

CC       ?= gcc
ARCH     ?= native
OPT      ?= -O2
PREFIX   ?= /usr/local
SANITIZER ?=

# CPPFLAGS, CFLAGS and LDFLAGS given on make's command line (`make CFLAGS=-DX`) come after loom's own
# flags, so they win (`make CFLAGS=-O1`); from the environment they are ignored.
cmdline = $(if $(filter command line,$(origin $1)),$($1))
USER_CPPFLAGS := $(call cmdline,CPPFLAGS)
USER_CFLAGS   := $(call cmdline,CFLAGS)
USER_LDFLAGS  := $(call cmdline,LDFLAGS)

ALL_CPPFLAGS := -Iinclude -Isrc -D_GNU_SOURCE
# Floating point: loom never reads FP exception flags or errno after a math call, so telling GCC so
# changes no result, only what it may vectorize. -fno-trapping-math lets it if-convert the clamps of
# src/model/fastmath.h (without it every GELU, softmax and exp loop stays scalar unless AVX-512 masks
# them) and -fno-math-errno lets sqrtf be the vector instruction (AdamW). Neither reassociates,
# contracts or assumes no NaN/Inf/signed zero (unlike -ffast-math): IEEE results are unchanged.
FPFLAGS  := -fno-trapping-math -fno-math-errno
ALL_CFLAGS := -std=c11 $(OPT) -g -march=$(ARCH) $(FPFLAGS) -fopenmp -pthread -Wall -Wextra -Wno-missing-field-initializers -Werror -MMD -MP
# PCRE2 (Debian: libpcre2-dev) gives the tokenizer's Unicode regex.
PCRE2_CFLAGS := $(shell pkg-config --cflags libpcre2-8 2>/dev/null)
PCRE2_LIBS   := $(or $(shell pkg-config --libs libpcre2-8 2>/dev/null),-lpcre2-8)
ALL_CPPFLAGS += $(PCRE2_CFLAGS)
# oneDNN (Debian: libdnnl-dev; it ships no .pc file, so plain -ldnnl then) gives the bf16 GEMM of
# `--dtype bf16` (src/model/matmul_bf16.c).
DNNL_CFLAGS := $(shell pkg-config --cflags dnnl 2>/dev/null)
DNNL_LIBS   := $(or $(shell pkg-config --libs dnnl 2>/dev/null),-ldnnl)
ifeq ($(DNNL_CFLAGS)$(wildcard /usr/include/dnnl.h /usr/local/include/dnnl.h),)
$(warning oneDNN's dnnl.h not found: run `make deps` (Debian: libdnnl-dev))
endif
ALL_CPPFLAGS += $(DNNL_CFLAGS)
LDLIBS   := -lopenblas $(DNNL_LIBS) $(PCRE2_LIBS) -fopenmp -pthread -lm -lrt

# Optional MPI, for jobs spanning hosts (docs/multinode.md): on when `pkg-config ompi-c` works
# (Debian: libopenmpi-dev), off with `make MPI=0`; without it loom builds and runs single-host (and
# `loom run --hostfile` refuses). Switching, or installing OpenMPI, rebuilds everything by itself.
MPI ?= $(shell pkg-config --exists ompi-c 2>/dev/null && echo 1 || echo 0)
MPI := $(MPI)
ifeq ($(MPI),1)
MPI_LIBS := $(shell pkg-config --libs ompi-c)
MPI_VERSION := $(shell pkg-config --modversion ompi-c 2>/dev/null)
ALL_CPPFLAGS += -DLOOM_HAVE_MPI $(patsubst -I%,-isystem %,$(shell pkg-config --cflags ompi-c))
LDLIBS   += $(MPI_LIBS)
endif

comma := ,
BUILD := build
ifneq ($(ARCH),native)
BUILD := build/arch-$(ARCH)
endif
ifeq ($(SANITIZER),)
SANLIBS :=
else
BUILD := $(BUILD)/san-$(subst $(comma),-,$(SANITIZER))
ALL_CFLAGS += -fsanitize=$(SANITIZER) -fno-omit-frame-pointer -fno-sanitize-recover=all
SANLIBS := -fsanitize=$(SANITIZER)
LDLIBS  += $(SANLIBS)
endif
ALL_CPPFLAGS += $(USER_CPPFLAGS)
ALL_CFLAGS   += $(USER_CFLAGS)
ALL_LDFLAGS  := $(USER_LDFLAGS)
# From $(BUILD) back to the source tree ("..", "../.."), for the relocatable loom.pc.
TOPREL := $(subst $(eval) ,/,$(foreach d,$(subst /, ,$(BUILD)),..))

LIB_SRC  := $(sort $(shell find src -name '*.c'))
CLI_SRC  := $(sort $(wildcard cli/*.c))
TEST_SRC := $(sort $(wildcard tests/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
# Helper programs that tests launch as ranks (each tests/progs/NAME.c becomes $(BUILD)/tests/NAME).
PROG_SRC := $(sort $(wildcard tests/progs/*.c))
PROG_BIN := $(PROG_SRC:tests/progs/%.c=$(BUILD)/tests/%)

all: $(BUILD)/libloom.a $(BUILD)/loom $(BUILD)/loom.pc

# ---- the configuration, tracked ----------------------------------------------------------------------
# What a compile depends on besides its sources (the compiler, every flag, the options detected:
# MPI, oneDNN, PCRE2 and their versions) is the text of $(BUILD)/compile.stamp, and what a link
# depends on that of $(BUILD)/link.stamp; every object depends on the first, every program (and
# loom.pc) on the second. A stamp's recipe runs on every make but rewrites the file only when its text
# changes, so a change rebuilds exactly what it affects (a new LDFLAGS relinks, a new CFLAGS
# recompiles), a build that failed half-way leaves no object that a build of another configuration
# would link (a stamp is written before any object of its configuration), and a make with nothing to
# do does nothing. `cat build/compile.stamp` shows what the tree was built with.
PCRE2_VERSION := $(shell pkg-config --modversion libpcre2-8 2>/dev/null)
# dnnl_version.h through the compiler, with the flags the sources see ("2 6 3"; empty without oneDNN)
DNNL_VERSION := $(strip $(shell echo DNNL_VERSION_MAJOR DNNL_VERSION_MINOR DNNL_VERSION_PATCH | \
                  $(CC) $(ALL_CPPFLAGS) -include dnnl_version.h -E -P -x c - 2>/dev/null))
CC_VERSION := $(shell $(CC) --version 2>/dev/null | head -n 1)
# (immediate: a target-specific flag of the object that first asks for a stamp is not its text)
define COMPILE_CONFIG :=
CC = $(CC): $(CC_VERSION)
CPPFLAGS = $(ALL_CPPFLAGS)
CFLAGS = $(ALL_CFLAGS)
MPI = $(MPI) $(MPI_VERSION)
oneDNN = $(or $(DNNL_VERSION),none)
PCRE2 = $(or $(PCRE2_VERSION),none)
ARCH = $(ARCH)
SANITIZER = $(SANITIZER)
OPT = $(OPT)
endef
define LINK_CONFIG :=
CC = $(CC): $(CC_VERSION)
CFLAGS = $(ALL_CFLAGS)
LDFLAGS = $(ALL_LDFLAGS)
LDLIBS = $(LDLIBS)
endef
# A stamp's recipe: $@ gets the text of variable $1 (its directory made first) unless it holds it already.
define write_stamp
	@$(shell mkdir -p $(@D))$(file >$@.new,$($1))if cmp -s $@.new $@; then rm -f $@.new; else \
	  if [ -e $@ ]; then echo "$@: changed, rebuilding what depends on it"; fi; mv -f $@.new $@; fi
endef
$(BUILD)/compile.stamp: FORCE
	$(call write_stamp,COMPILE_CONFIG)
$(BUILD)/link.stamp: FORCE
	$(call write_stamp,LINK_CONFIG)

# `loom --version` and the training log's config record name the tree the library was built from,
# and say what it was built with (src/core/build.c).
GIT_DESCRIBE := $(or $(shell git describe --always --dirty 2>/dev/null),unknown)
$(BUILD)/git.stamp: FORCE
	$(call write_stamp,GIT_DESCRIBE)
$(BUILD)/src/core/version.o: $(BUILD)/git.stamp
$(BUILD)/src/core/version.o: private ALL_CPPFLAGS += -DLOOM_GIT_DESCRIBE='"$(GIT_DESCRIBE)"'
# $(call c_string,TEXT): TEXT as a C string literal, quoted for the shell
c_string = '"$(subst ','\'',$(subst ",\",$(subst \,\\,$1)))"'
$(BUILD)/src/core/build.o: private ALL_CPPFLAGS += -DLOOM_BUILD_ARCH=$(call c_string,$(ARCH)) \
    -DLOOM_BUILD_OPT=$(call c_string,$(OPT)) -DLOOM_BUILD_SANITIZER=$(call c_string,$(SANITIZER)) \
    -DLOOM_BUILD_CFLAGS=$(call c_string,$(strip $(USER_CPPFLAGS) $(USER_CFLAGS)))

$(BUILD)/%.o: %.c $(BUILD)/compile.stamp
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CPPFLAGS) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/libloom.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/loom: $(CLI_OBJ) $(BUILD)/libloom.a $(BUILD)/link.stamp
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libloom.a $(LDLIBS)

# Relocatable: paths are relative to the .pc file itself.
$(BUILD)/loom.pc: Makefile $(BUILD)/link.stamp
	@mkdir -p $(BUILD)
	@printf '%s\n' 'prefix=$${pcfiledir}/$(TOPREL)' 'includedir=$${prefix}/include' 'libdir=$${pcfiledir}' '' \
	  'Name: loom' 'Description: distributed training for GPT-style language models' 'Version: 0.1.0' \
	  'Cflags: -I$${includedir} -pthread' \
	  'Libs: $${libdir}/libloom.a -lopenblas $(DNNL_LIBS) $(PCRE2_LIBS) -fopenmp -pthread -lm -lrt $(MPI_LIBS) $(SANLIBS)' > $@

# The test list is generated from every TEST(name) in tests/*.c, so adding a test is one edit.
$(BUILD)/tests/list.h: $(TEST_SRC)
	@mkdir -p $(dir $@)
	@grep -ho '^TEST([A-Za-z0-9_]*)' $(TEST_SRC) | sed 's/^TEST(\(.*\))/X(\1)/' > $@.tmp && mv $@.tmp $@

$(BUILD)/tests/run.o: $(BUILD)/tests/list.h
$(BUILD)/tests/run.o: private ALL_CPPFLAGS += -I$(BUILD)/tests

$(BUILD)/tests/run: $(TEST_OBJ) $(BUILD)/libloom.a $(BUILD)/link.stamp
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libloom.a $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/progs/%.o $(BUILD)/libloom.a $(BUILD)/link.stamp
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $< $(BUILD)/libloom.a $(LDLIBS)

tests: $(BUILD)/tests/run $(BUILD)/loom $(PROG_BIN)

# Under SANITIZER=thread, OpenMP's uninstrumented runtime needs tests/tsan.supp (see the file).
test: deps
	@$(MAKE) --no-print-directory all tests
	TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp history_size=7 $${TSAN_OPTIONS:-}" \
	LOOM_BIN=$(BUILD)/loom LOOM_TEST_BIN=$(BUILD)/tests $(BUILD)/tests/run

install: all
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include/loom $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(BUILD)/libloom.a $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/loom/*.h $(DESTDIR)$(PREFIX)/include/loom/
	install -m 755 $(BUILD)/loom $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(PREFIX)/share/loom
	install -m 755 scripts/nanochat_pt.py $(DESTDIR)$(PREFIX)/share/loom/
	@printf '%s\n' 'prefix=$${pcfiledir}/../..' 'includedir=$${prefix}/include' 'libdir=$${prefix}/lib' '' \
	  'Name: loom' 'Description: distributed training for GPT-style language models' 'Version: 0.1.0' \
	  'Cflags: -I$${includedir} -pthread' \
	  'Libs: -L$${libdir} -lloom -lopenblas $(DNNL_LIBS) $(PCRE2_LIBS) -fopenmp -pthread -lm -lrt $(MPI_LIBS)' > $(DESTDIR)$(PREFIX)/lib/pkgconfig/loom.pc

# Installs the Debian packages that are missing (quiet when all are present).
deps:
	@scripts/deps.sh

DEMO_DIR ?= build/demo
demo: deps
	@$(MAKE) --no-print-directory all
	@scripts/demo.sh $(BUILD)/loom $(DEMO_DIR)

# libFuzzer harnesses (tests/fuzz/) for the file readers, built with clang into build/fuzz/;
# scripts/fuzz.sh SECONDS runs each. Only the readers' sources are compiled (no BLAS, OpenMP or MPI).
FUZZ_CC      ?= clang
FUZZ_FLAGS   := -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -g -O1 -fno-omit-frame-pointer
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_LIB_SRC := src/core/error.c src/core/util.c src/core/fileio.c src/core/crc32c.c src/ckpt/json.c src/ckpt/kv.c \
                src/ckpt/safetensors.c src/ckpt/llmc.c src/ckpt/model.c src/ckpt/hf_config.c src/ckpt/hf_dir.c \
                src/ckpt/train_ckpt.c \
                src/model/gpt2/layout.c src/model/iface.c src/model/nanochat/nanochat_layout.c src/model/llama/llama_layout.c \
                tests/fuzz/fuzz_families.c \
                src/data/shard.c src/data/shard_index.c src/data/loader.c src/data/tokenizer.c src/data/bpe.c \
                src/data/bpe_train.c src/data/tokenizer_json.c
FUZZ_NAMES   := safetensors llmc shard index tokenizer bpe tokjson state manifest cluster hfconfig
FUZZ_BIN     := $(FUZZ_NAMES:%=build/fuzz/fuzz_%)
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=build/fuzz/obj/%.o)

# The fuzz tree tracks its configuration as the others do (build/fuzz/*.stamp).
FUZZ_CC_VERSION = $(shell $(FUZZ_CC) --version 2>/dev/null | head -n 1)
define FUZZ_COMPILE_CONFIG
CC = $(FUZZ_CC): $(FUZZ_CC_VERSION)
CFLAGS = $(FUZZ_FLAGS) $(FUZZ_SAN) -fsanitize=fuzzer-no-link
PCRE2 = $(or $(PCRE2_VERSION),none) $(PCRE2_CFLAGS)
endef
define FUZZ_LINK_CONFIG
CC = $(FUZZ_CC): $(FUZZ_CC_VERSION)
CFLAGS = $(FUZZ_FLAGS) $(FUZZ_SAN) -fsanitize=fuzzer
LDLIBS = $(PCRE2_LIBS) -pthread -lm
endef
build/fuzz/compile.stamp: FORCE
	$(call write_stamp,FUZZ_COMPILE_CONFIG)
build/fuzz/link.stamp: FORCE
	$(call write_stamp,FUZZ_LINK_CONFIG)

build/fuzz/obj/%.o: %.c build/fuzz/compile.stamp
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(FUZZ_SAN) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(FUZZ_LIB_OBJ) build/fuzz/compile.stamp build/fuzz/link.stamp
	$(FUZZ_CC) $(FUZZ_FLAGS) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB_OBJ) $(PCRE2_LIBS) -pthread -lm
# the cluster file's reader lives beside the machine's measurement, which the harness stubs
build/fuzz/fuzz_cluster: tests/fuzz/fuzz_cluster.c tests/fuzz/fuzz.h $(FUZZ_LIB_OBJ) build/fuzz/obj/src/train/plan_cluster.o \
                         build/fuzz/compile.stamp build/fuzz/link.stamp
	$(FUZZ_CC) $(FUZZ_FLAGS) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB_OBJ) \
	    build/fuzz/obj/src/train/plan_cluster.o $(PCRE2_LIBS) -pthread -lm

fuzz: $(FUZZ_BIN)
.SECONDARY: $(FUZZ_LIB_OBJ)

clean:
	rm -rf build

.PHONY: all tests test install deps demo clean fuzz FORCE
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(PROG_SRC:%.c=$(BUILD)/%.d) $(FUZZ_LIB_OBJ:.o=.d)

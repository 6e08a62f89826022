# make            build every example (in $(BUILD)/examples/, with examples/data/ beside them)
# make test       build and run every test (one binary; the implementation is compiled once),
#                 then the CUDA tests on the CPU stand-in for the driver, NVRTC and NCCL
#                 (CUDA_ON_CPU=0: not; tests/cuda_on_cpu.cpp)
# make test-asan  the same under AddressSanitizer and UndefinedBehaviorSanitizer (the CUDA
#                 stand-in too: its device memory exact, its kernels built with ASan)
# make test-tsan  the same under ThreadSanitizer (the thread pool, queues, background builds)
# make test-cuda  with an NVIDIA GPU: the op, gradient, training, reliability and CUDA tests on
#                 TG_DEVICE=CUDA, then CUDA_GRAPHS random graphs (default 300) on CUDA against
#                 the interpreter
# make test-cuda-on-cpu  the same on the CPU stand-in for the driver, NVRTC and NCCL
# make test-cuda-memcheck compute-sanitizer's memcheck over those tests (with a GPU)
# make test-asan-subset   the part of it that CI runs (runtime, loaders, scheduler, errors)
# make test-asan-oracle   random graphs under it on the CPU and the CUDA stand-in (CI runs it)
# make bench      speed figures (COMPARE=1: beside PyTorch)   make loc   line count of the header
# make build-time seconds to compile the implementation alone (a tinygrad_impl.cpp) with each
#                 C++ compiler found, at BUILD_TIME_OPTS (default -O0 -O2); printed, not asserted
# make fuzz       libFuzzer on the safetensors loader and einsum, FUZZ_SECONDS each (default 60)
# make oracle     random graphs, optimized CPU against the unoptimized interpreter, for
#                 SEED (default 1) and COUNT (default 1000) graphs; THREADS=N: also 1 thread
#                 against N, with every nest that can run in chunks doing so (the same bits);
#                 JIT=1: also three training steps under tg::Jit against eager ones (the same bits)
#                 ASAN=1: under AddressSanitizer, each kernel built with -fsanitize=address and
#                 each temporary a buffer of its own (plan_memory left out): a kernel that
#                 touches a byte past a tensor is reported, and one that reads an element no
#                 kernel wrote reads the bytes 0xbe that fill every new buffer; STAND_IN=1: on
#                 the CUDA device, through the CPU stand-in (with ASAN=1 its device memory is
#                 exact too: what compute-sanitizer's memcheck checks on a GPU)
CXX      ?= c++
CXXFLAGS ?= -std=c++17 -O2 -Wall -Wextra

# Without a -j of your own, make runs a job per core, at most 4: every example compiles the
# implementation (about half a minute and 1.4 GB each), so one at a time keeps cores idle.
# (Only the first make: a recursive one shares its jobs.)
ifeq ($(MAKELEVEL)$(filter -j%,$(MAKEFLAGS)),0)
MAKEFLAGS += -j$(shell n=$$(nproc 2>/dev/null || echo 1); echo $$((n < 4 ? n : 4)))
endif
LDLIBS   := -ldl -lpthread
BUILD    ?= build

EXAMPLES  := $(patsubst examples/%.cpp,$(BUILD)/examples/%,$(wildcard examples/*.cpp))
EX_DATA   := $(patsubst examples/%,$(BUILD)/examples/%,$(wildcard examples/data/*))
TEST_SRCS := $(wildcard tests/test_*.cpp) tests/main.cpp
TEST_OBJS := $(patsubst tests/%.cpp,$(BUILD)/tests/%.o,$(TEST_SRCS))
SANITIZERS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

.PHONY: all test test-cuda test-cuda-on-cpu test-cuda-memcheck test-asan test-tsan test-subset test-asan-subset test-asan-oracle asan-programs fuzz oracle bench loc clean
all: $(EXAMPLES) $(EX_DATA)

# examples are single files that define TINYGRAD_IMPLEMENTATION themselves, as a user's would
$(BUILD)/examples/%: examples/%.cpp tinygrad.hpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -o $@ $< $(LDLIBS)

# An example looks for its data beside its executable (with the license), so that the built
# examples run from any directory and can be moved together.
$(BUILD)/examples/data/%: examples/data/%
	@mkdir -p $(dir $@)
	cp $< $@

# make test runs the examples built another way: the same sources with the tests' compiled
# implementation linked in (TINYGRAD_IMPLEMENTATION_DONE leaves out theirs), rather than the
# implementation compiled once more in each (CI on 2 cores: 12 min 51 s -> 10 min 55 s, one run
# each, 2026-11-28). That each compiles alone is header_compiles_alone_cxx17_cxx20's part (the
# implementation) and make's.
TEST_EXAMPLES := $(patsubst examples/%.cpp,$(BUILD)/test-examples/%,$(wildcard examples/*.cpp))
TEST_EX_DATA  := $(patsubst examples/%,$(BUILD)/test-examples/%,$(wildcard examples/data/*))
$(BUILD)/test-examples/%: examples/%.cpp tinygrad.hpp $(BUILD)/tinygrad.o
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -DTINYGRAD_IMPLEMENTATION_DONE -o $@ $< $(BUILD)/tinygrad.o $(LDLIBS)
$(BUILD)/test-examples/data/%: examples/data/%
	@mkdir -p $(dir $@)
	cp $< $@

$(BUILD)/tinygrad.o: tests/tinygrad_impl.cpp tinygrad.hpp cuda_backend.hpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c -o $@ $<

# The tests at -O1: what they run fast is the implementation (CXXFLAGS) and the kernels; their
# own code builds graphs and compares values. It compiles in a third less time than at -O2
# (test_ops.cpp: 23.8 s, then 15.7 s) and keeps the warnings that need an optimizer.
TEST_CXXFLAGS ?= $(patsubst -O2,-O1,$(patsubst -O3,-O1,$(CXXFLAGS)))
$(BUILD)/tests/%.o: tests/%.cpp tests/harness.hpp tinygrad.hpp
	@mkdir -p $(dir $@)
	$(CXX) $(TEST_CXXFLAGS) -c -o $@ $<
$(BUILD)/tests/test_fuzz.o: tests/fuzz_targets.hpp
$(BUILD)/tests/test_oracle.o: tests/random_graphs.hpp
$(BUILD)/tests/test_ops.o $(BUILD)/tests/test_math.o $(BUILD)/tests/test_training.o: tests/reference.hpp
$(BUILD)/tests/test_cuda.o: cuda_backend.hpp tests/random_graphs.hpp

$(BUILD)/run_tests: $(TEST_OBJS) $(BUILD)/tinygrad.o
	$(CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

# tests/seed_probe.cpp compiled by each C++ compiler found (they order a call's arguments
# differently) and linked with the implementation: the tests compare the models they print.
PROBE_CXXS := $(shell for c in g++ clang++; do command -v $$c >/dev/null && echo $$c; done)
PROBES     := $(patsubst %,$(BUILD)/probes/seed_probe_%,$(PROBE_CXXS))
$(BUILD)/probes/seed_probe_%: tests/seed_probe.cpp tinygrad.hpp $(BUILD)/tinygrad.o
	@mkdir -p $(dir $@)
	$* -std=c++17 -O1 -c -o $@.o $<
	$(CXX) $(CXXFLAGS) -o $@ $@.o $(BUILD)/tinygrad.o $(LDLIBS)

# Tests run from the repository root with a fresh, private compile cache, in as many processes
# as there are cores (tests/run.sh; TG_TEST_PROCESSES=1 for one).
CUDA_TESTS  := test_ops.cpp test_math.cpp test_autograd.cpp test_training.cpp test_reliability.cpp \
               test_cuda.cpp
# make test's rerun on the CPU stand-in leaves test_training (layers, losses, optimizers, jit)
# and test_math (compositions that add no device code) to make test-cuda on a GPU: with
# test_training, CI took 15 min 5 s on this 2-core machine (50617d9, 2026-12-07). test_cuda's
# own tests still train, jit and replay CUDA graphs on the stand-in.
STAND_IN_TESTS := test_ops.cpp test_autograd.cpp test_reliability.cpp test_cuda.cpp
CUDA_ON_CPU ?= 1
STAND_IN    := $(if $(filter 1,$(CUDA_ON_CPU)),$(BUILD)/cuda_on_cpu.so)
test: $(BUILD)/run_tests $(TEST_EXAMPLES) $(TEST_EX_DATA) $(PROBES) $(STAND_IN)
	@dir=$$(mktemp -d /tmp/tg-test-XXXXXX); \
	TG_CACHE_DIR=$$dir TG_EXAMPLES_DIR=$(BUILD)/test-examples TG_PROBES_DIR=$(BUILD)/probes \
	TG_TEST_CUDA_ON_CPU=$(if $(STAND_IN),$(abspath $(STAND_IN))) TG_TEST_CUDA_FILES="$(STAND_IN_TESTS)" \
	TG_CUDA_ON_CPU_CXX="$(CXX)" \
	tests/run.sh ./$(BUILD)/run_tests $(FILTER); rc=$$?; rm -rf $$dir; exit $$rc

# The CUDA driver API, NVRTC and NCCL on the CPU, for make test (one library serves as all three)
$(BUILD)/cuda_on_cpu.so: tests/cuda_on_cpu.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -fPIC -shared -o $@ $< -ldl

CUDA_GRAPHS ?= 300
test-cuda: $(BUILD)/run_tests $(BUILD)/oracle
	@dir=$$(mktemp -d /tmp/tg-test-XXXXXX); \
	TG_CACHE_DIR=$$dir TG_DEVICE=CUDA ./$(BUILD)/run_tests $(CUDA_TESTS); rc=$$?; \
	TG_CACHE_DIR=$$dir TG_ORACLE_DEVICE=CUDA ./$(BUILD)/oracle 1 $(CUDA_GRAPHS) || rc=1; \
	rm -rf $$dir; exit $$rc

# compute-sanitizer's memcheck over the CUDA tests (with a GPU; the graphs off, so that each
# kernel is reported by name). Its reports of failed API calls are off: the backend checks
# every call it makes, and NCCL's set-up asks for kernels it has no code for on this GPU
# (cudaFuncGetAttributes, "no kernel image"), which it expects and passes over. The debugger
# test skips (TG_TEST_MEMCHECK): it would start cuda-gdb in a child under the sanitizer, two
# tools on the GPU's debugging interface at once, and memcheck checks the kernels without it.
test-cuda-memcheck: $(BUILD)/run_tests
	@dir=$$(mktemp -d /tmp/tg-test-XXXXXX); \
	TG_CACHE_DIR=$$dir TG_DEVICE=CUDA TG_CUDA_GRAPHS=0 TG_TEST_MEMCHECK=1 \
	    compute-sanitizer --tool memcheck \
	    --report-api-errors no --error-exitcode 1 ./$(BUILD)/run_tests $(CUDA_TESTS); rc=$$?; \
	rm -rf $$dir; exit $$rc

# the same without a GPU, on the CPU stand-in (slow: every kernel a thread at a time)
test-cuda-on-cpu: $(BUILD)/cuda_on_cpu.so
	@TG_CUDA_LIBRARY=$(abspath $<) TG_NVRTC_LIBRARY=$(abspath $<) TG_CUDA_ON_CPU_CXX="$(CXX)" \
	    $(MAKE) --no-print-directory test-cuda

ASAN_CXXFLAGS := -std=c++17 -O1 -g -Wall -Wextra $(SANITIZERS)
# The tests' own code (and the oracle's) unoptimized under the sanitizers: test-asan-subset's
# and the oracle's programs took 103 s of g++'s user time at -O1, 44 s at -O0, and ran as fast
# (36.6 and 18.0 s, 35.6 and 17.8 at -O1; one build and run each, 2026-11-30): what they run
# is the implementation's code. The warnings that need the optimizer are make test's.
ASAN_TEST_CXXFLAGS := $(patsubst -O1,-O0,$(ASAN_CXXFLAGS))
ASAN_MAKE := BUILD=build-asan CXXFLAGS="$(ASAN_CXXFLAGS)" TEST_CXXFLAGS="$(ASAN_TEST_CXXFLAGS)"
test-asan:
	$(MAKE) --no-print-directory test $(ASAN_MAKE)
	$(MAKE) --no-print-directory test-asan-oracle
test-tsan:
	$(MAKE) --no-print-directory test BUILD=build-tsan CUDA_ON_CPU=0 \
	    CXXFLAGS="-std=c++17 -O1 -g -Wall -Wextra -fsanitize=thread"

# What CI runs under the sanitizers beside make test (all of make test-asan takes about 8
# minutes on 2 cores): the runtime and cache, the loaders and parsers (fuzz targets), the
# scheduler, the errors and the reliability tests.
SUBSET := test_runtime test_fuzz test_schedule test_errors test_reliability main
$(BUILD)/run_tests_subset: $(patsubst %,$(BUILD)/tests/%.o,$(SUBSET)) $(BUILD)/tinygrad.o
	$(CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)
test-subset: $(BUILD)/run_tests_subset
	@dir=$$(mktemp -d /tmp/tg-test-XXXXXX); \
	TG_CACHE_DIR=$$dir tests/run.sh ./$(BUILD)/run_tests_subset $(FILTER); rc=$$?; \
	rm -rf $$dir; exit $$rc
test-asan-subset:
	$(MAKE) --no-print-directory test-subset $(ASAN_MAKE)
# Random graphs under AddressSanitizer with their kernels built with it (make oracle ASAN=1),
# 100 on the CPU and 100 on the CUDA stand-in, every product tiled and the GPU's plans at a
# test's sizes (the seeds at which test_cuda's graphs reach every plan): a kernel of either
# device that touches a byte past a buffer fails here, without a GPU (CI runs it). The two
# runs go side by side, their output one after the other.
test-asan-oracle: asan-programs
	@out=$$(mktemp -d /tmp/tg-oracle-XXXXXX); \
	$(MAKE) --no-print-directory oracle ASAN=1 SEED=1 COUNT=100 >$$out/cpu 2>&1 & cpu=$$!; \
	TG_TILE_MIN_WORK=1 TG_CUDA_SMALL_PLANS=1 $(MAKE) --no-print-directory oracle ASAN=1 \
	    STAND_IN=1 SEED=80700 COUNT=100 >$$out/cuda 2>&1 & cuda=$$!; \
	rc=0; wait $$cpu || rc=1; wait $$cuda || rc=1; \
	cat $$out/cpu $$out/cuda; rm -rf $$out; exit $$rc
# the sanitized programs of test-asan-subset and test-asan-oracle (CI builds them beside make
# test, one compile at a time: make -j1 asan-programs, which fills make test's idle moments)
asan-programs:
	$(MAKE) --no-print-directory build-asan/tinygrad.o build-asan/run_tests_subset \
	    build-asan/oracle build-asan/cuda_on_cpu.so $(ASAN_MAKE)

# libFuzzer (clang) with ASan and UBSan, each target run with a scratch corpus directory first:
# new inputs go there, the committed corpus is only read. Findings land in build-fuzz/.
# Without libFuzzer: the test binary's bounded random-input loop, run much longer.
FUZZ_SECONDS ?= 60
FUZZ_CXX     ?= clang++
# TINYGRAD_OPTIMIZE_ALL: the safetensors loader, run once per file, is otherwise compiled
# unoptimized, and the fuzzer runs it millions of times.
FUZZ_FLAGS   := -std=c++17 -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
                -DTINYGRAD_OPTIMIZE_ALL
FUZZ_RUN     := -max_total_time=$(FUZZ_SECONDS) -timeout=10 -print_final_stats=1 \
                -artifact_prefix=build-fuzz/
FUZZ_PROBE   := extern "C" int LLVMFuzzerTestOneInput(const void*, unsigned long) { return 0; }
fuzz:
	@if echo '$(FUZZ_PROBE)' | $(FUZZ_CXX) -x c++ -fsanitize=fuzzer -o /dev/null - 2>/dev/null; \
	then \
	  $(MAKE) --no-print-directory build-fuzz/fuzz_safetensors build-fuzz/fuzz_einsum || exit 1; \
	  failed=; \
	  for t in safetensors einsum; do \
	    dir=$$(mktemp -d /tmp/tg-fuzz-XXXXXX); \
	    UBSAN_OPTIONS=print_stacktrace=1 ./build-fuzz/fuzz_$$t $(FUZZ_RUN) \
	      -dict=tests/fuzz/$$t.dict $$dir tests/fuzz/corpus/$$t || failed="$$failed $$t"; \
	    rm -rf $$dir; \
	  done; \
	  [ -z "$$failed" ] || { echo "fuzz: findings for$$failed in build-fuzz/"; exit 1; }; \
	else \
	  echo "no libFuzzer ($(FUZZ_CXX) -fsanitize=fuzzer): the bounded loop instead"; \
	  $(MAKE) --no-print-directory $(BUILD)/run_tests && \
	  TG_FUZZ_ITERATIONS=200000 TG_FUZZ_VERBOSE=1 ./$(BUILD)/run_tests fuzz; \
	fi

build-fuzz/tinygrad.o: tests/tinygrad_impl.cpp tinygrad.hpp
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link,address,undefined -c -o $@ $<

build-fuzz/fuzz_%: tests/fuzz/fuzz_%.cpp tests/fuzz_targets.hpp tinygrad.hpp build-fuzz/tinygrad.o
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer,address,undefined -o $@ $< build-fuzz/tinygrad.o \
	    $(LDLIBS)

# The oracle program (tests/oracle_main.cpp), with a private compile cache per run.
SEED  ?= 1
COUNT ?= 1000
$(BUILD)/oracle: tests/oracle_main.cpp tests/random_graphs.hpp tinygrad.hpp $(BUILD)/tinygrad.o
	$(CXX) $(TEST_CXXFLAGS) -o $@ $< $(BUILD)/tinygrad.o $(LDLIBS)
PASSES_BUT_PLAN := simplify,fuse_loops,fuse_maps,substitute_temps,dead_stores,first_write
PASSES_BUT_PLAN := $(PASSES_BUT_PLAN),order_nests,local_temps,tile_products,sum_lanes
PASSES_BUT_PLAN := $(PASSES_BUT_PLAN),split_at_edges,parallel_loops
ORACLE_ASAN_ENV := TG_CFLAGS="-O2 -fsanitize=address -fno-omit-frame-pointer" \
    TG_PASSES=$(PASSES_BUT_PLAN) ASAN_OPTIONS=max_malloc_fill_size=1073741824
ifeq ($(ASAN),1)
oracle:
	@$(MAKE) --no-print-directory oracle ASAN= $(ASAN_MAKE) \
	    ORACLE_ENV='$(ORACLE_ASAN_ENV)'
else
ORACLE_STAND_IN_ENV = TG_ORACLE_DEVICE=CUDA TG_CUDA_LIBRARY=$(abspath $(BUILD)/cuda_on_cpu.so) \
    TG_NVRTC_LIBRARY=$(abspath $(BUILD)/cuda_on_cpu.so) TG_CUDA_ON_CPU_CXX="$(CXX)"
oracle: $(BUILD)/oracle $(if $(STAND_IN),$(BUILD)/cuda_on_cpu.so)
	@dir=$$(mktemp -d /tmp/tg-oracle-XXXXXX); \
	TG_CACHE_DIR=$$dir $(ORACLE_ENV) $(if $(STAND_IN),$(ORACLE_STAND_IN_ENV)) \
	    ./$(BUILD)/oracle $(if $(THREADS),-t $(THREADS)) $(if $(JIT),-j) $(SEED) $(COUNT); \
	rc=$$?; rm -rf $$dir; exit $$rc
endif

$(BUILD)/bench: bench/bench.cpp tinygrad.hpp cuda_backend.hpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -o $@ $< $(LDLIBS)

# Speed figures: W1-W6 and M1 of shared/bench/WORKLOADS.md, C1 (a CNN) and R1 (an LSTM) of our
# own (a private compile cache per run).
# COMPARE=1: interleaved with reference_torch.py, with ratios (bench/compare.sh). TG_DEVICE=CUDA
# (a GPU): W3, W4, W5 and W7 on the GPU, then reference_torch_gpu.py (bench/compare_gpu.sh).
REFERENCE ?= ../shared/bench/reference_torch.py
REFERENCE_GPU ?= ../shared/bench/reference_torch_gpu.py
bench: $(BUILD)/bench
ifeq ($(TG_DEVICE),CUDA)
	@bench/compare_gpu.sh ./$(BUILD)/bench $(REFERENCE_GPU)
else ifeq ($(COMPARE),1)
	@bench/compare.sh ./$(BUILD)/bench $(REFERENCE)
else
	@dir=$$(mktemp -d /tmp/tg-bench-XXXXXX); TG_CACHE_DIR=$$dir ./$(BUILD)/bench; rc=$$?; rm -rf $$dir; exit $$rc
endif

loc:
	@wc -l tinygrad.hpp

# The file a program defines TINYGRAD_IMPLEMENTATION in, compiled as the README's command does
# (BUILD_TIME_FLAGS=-DTINYGRAD_OPTIMIZE_ALL: with every section optimized). User seconds are the
# figure to compare on a busy machine.
BUILD_TIME_CXXS  ?= $(PROBE_CXXS)
BUILD_TIME_OPTS  ?= -O0 -O2
BUILD_TIME_FLAGS ?=
.PHONY: build-time
build-time:
	@mkdir -p $(BUILD)
	@printf '#define TINYGRAD_IMPLEMENTATION\n#include "tinygrad.hpp"\n' > $(BUILD)/build_time.cpp
	@for c in $(BUILD_TIME_CXXS); do for o in $(BUILD_TIME_OPTS); do \
	  cmd="$$c -std=c++17 $$o $(BUILD_TIME_FLAGS) -I. -c -o $(BUILD)/build_time.o"; \
	  cmd="$$cmd $(BUILD)/build_time.cpp"; \
	  if /usr/bin/time -f '' true 2>/dev/null; then \
	    /usr/bin/time -f "$$c $$o: %e s wall, %U s user" $$cmd || exit 1; \
	  else \
	    t0=$$(date +%s.%N); $$cmd || exit 1; t1=$$(date +%s.%N); \
	    awk -v c="$$c $$o" -v a=$$t0 -v b=$$t1 'BEGIN { printf "%s: %.2f s wall\n", c, b - a }'; \
	  fi; \
	done; done; rm -f $(BUILD)/build_time.cpp $(BUILD)/build_time.o

clean:
	rm -rf build build-asan build-fuzz

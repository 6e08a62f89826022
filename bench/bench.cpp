// bench.cpp — speed of training steps on the workloads of shared/bench/WORKLOADS.md.
//
// Prints one line per workload: time per step as the median and the minimum over blocks of
// steps (after warm-up steps; W4: GFLOP/s of one 1024^3 product instead), and the number of
// threads the kernels ran on (TG_THREADS, default the machine's cores). Each training step is
// a tg::jit replay: one compiled program for forward, backward and update. Compare with
// reference_torch.py run on the same machine in the same session, as a ratio (make bench
// COMPARE=1). Beside each time: the step program's loop nests and temporary bytes
// (tg::last_program()). W6 is W2's first step as a whole new process (cold and warm compile
// cache); M1 sums up the temporaries of W3 and W5, unplanned and planned. C1, a small CNN, is
// a workload of our own, and R1, an LSTM, beside bench/reference_own.py.
//
// TG_DEVICE=CUDA runs them on the GPU (W4 then also at n = 4096; W7, the larger GPT, runs when
// TG_BENCH names it). Compare with reference_torch_gpu.py, run on that machine in the same call.
//
// Build and run: make bench      (or: c++ -std=c++17 -O2 bench/bench.cpp -o bench -ldl)
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include "../cuda_backend.hpp"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

using tg::Tensor;
namespace nn = tg::nn;

struct Timing { double median_us, min_us; };

// blocks of `steps` calls of step(), after `warmup` calls and the optimized builds they asked
// for; per-step times of each block
template <typename F> static Timing time_blocks(F&& step, int warmup, int steps, int blocks) {
    for (int i = 0; i < warmup; i++) step();
    tg::finish_compiles();
    tg::synchronize();
    std::vector<double> per_step;
    for (int b = 0; b < blocks; b++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < steps; i++) step();
        tg::synchronize();   // the steps' programs still in the background count too
        per_step.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / steps);
    }
    std::sort(per_step.begin(), per_step.end());
    return {per_step[per_step.size() / 2], per_step.front()};
}

// The step's program: loop nests after (and before) the passes, the temporaries that became
// arrays local to a nest, temporary bytes as lowered, left after the passes, and planned into
// one arena.
static std::string program_figures(const tg::ProgramInfo& p) {
    char line[240];
    std::snprintf(line, sizeof line,
                  "  nests %d (lowered %d, tiled %d)  local arrays %d  temporaries %lld B"
                  " lowered, %lld B unplanned -> %lld B planned",
                  p.nests, p.nests_lowered, p.tiled_nests, p.local_arrays,
                  (long long)p.temp_bytes_lowered,
                  (long long)p.temp_bytes, (long long)p.arena_bytes);
    return line;
}

// One workload's line: name, step time (in ms when ms, else us), threads, a result figure of
// the workload (accuracy or final loss) and the program's figures.
static void print_line(const char* name, const Timing& t, bool ms, const char* figure,
                       double value, const tg::ProgramInfo& program) {
    double scale = ms ? 1e-3 : 1;
    const char* unit = ms ? "ms" : "us";
    std::printf("%-10s %9.1f %s/step median %9.1f %s/step min  threads %d  %s %.4f%s\n", name,
                t.median_us * scale, unit, t.min_us * scale, unit, tg::threads(), figure, value,
                program_figures(program).c_str());
}

// A training step as one jitted program: the loss of the batch of indices in[0], its
// backward and the optimizer's update.
static tg::Jit training_step(tg::optim::Optimizer& opt,
                             std::function<Tensor(const Tensor&)> loss_of) {
    return tg::Jit([&opt, loss_of](const std::vector<Tensor>& in) {
        Tensor loss = loss_of(in[0]);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
}

// Calls step() once (it traces and compiles), keeps that program's figures, then times it.
struct Traced { Timing t; tg::ProgramInfo program; };
template <typename F> static Traced trace_and_time(F&& step, int warmup, int steps, int blocks) {
    step();
    tg::ProgramInfo program = tg::last_program();
    return {time_blocks(step, warmup - 1, steps, blocks), program};
}

static std::vector<int32_t> random_batch(std::mt19937& rng, int64_t n, int64_t size) {
    std::uniform_int_distribution<int32_t> pick(0, int32_t(n - 1));
    std::vector<int32_t> b(static_cast<size_t>(size));
    for (auto& x : b) x = pick(rng);
    return b;
}

// int32 [rows, cols] of tokens drawn uniformly from [0, vocab)
static Tensor random_tokens(std::mt19937& rng, int64_t rows, int64_t cols, int64_t vocab) {
    std::uniform_int_distribution<int32_t> token(0, int32_t(vocab - 1));
    std::vector<int32_t> tokens(size_t(rows * cols));
    for (auto& t : tokens) t = token(rng);
    return Tensor::from_vector(tokens, {rows, cols});
}

// W1: half moons, 1024 points, MLP 2→16→16→1 ReLU, hinge loss, SGD lr 0.1 wd 1e-4, batch 32;
// 10 epochs of warm-up, 9 timed blocks of 10 epochs; accuracy after all 100 epochs
static void w1() {
    const int64_t n = 1024, batch = 32, steps_per_epoch = n / batch;
    tg::manual_seed(1337);
    tg::data::Dataset d = tg::data::moons(n, 0.1, 1337);
    nn::Sequential mlp(nn::Linear(2, 16), nn::ReLU(), nn::Linear(16, 16), nn::ReLU(), nn::Linear(16, 1));
    tg::optim::SGD opt(mlp.parameters(), 0.1, 0, 1e-4);
    tg::Jit step = training_step(opt, [&](const Tensor& idx) {
        return nn::hinge_loss(mlp(d.X[idx]).reshape({-1}), d.Y[idx]);
    });
    std::mt19937 rng(1);
    auto one = [&] { step({Tensor::from_vector(random_batch(rng, n, batch))}); };
    auto [t, program] =
        trace_and_time(one, int(10 * steps_per_epoch), int(10 * steps_per_epoch), 9);
    double acc = ((mlp(d.X).reshape({-1}) > 0) == (d.Y > 0)).cast(tg::DType::FLOAT32).mean().item();
    print_line("W1 moons", t, false, "accuracy", acc, program);
}

// W2: Bengio char MLP, V=27 T=3 E=10 D=200 B=32, no biases, tanh, cross-entropy, SGD lr 0.01;
// 20 warm-up steps, 7 blocks of 200. first_only: one step, its loss printed (W6's child).
static void w2(bool first_only = false) {
    const int V = 27, T = 3, E = 10, D = 200, B = 32, pool = 32768;
    std::mt19937 rng(1337);
    std::uniform_int_distribution<int32_t> ch(0, V - 1);
    std::vector<int32_t> xs(size_t(pool) * T), ys(pool);
    for (auto& x : xs) x = ch(rng);
    for (auto& y : ys) y = ch(rng);
    Tensor X = Tensor::from_vector(xs, {pool, T}), Y = Tensor::from_vector(ys, {pool});
    tg::manual_seed(1337);
    Tensor C = Tensor::randn({V, E}).requires_grad();
    nn::Sequential mlp(nn::Linear(T * E, D, false), nn::Tanh(), nn::Linear(D, D, false), nn::Tanh(),
                       nn::Linear(D, V, false));
    std::vector<Tensor> params = mlp.parameters();
    params.push_back(C);
    tg::optim::SGD opt(params, 0.01);
    tg::Jit step = training_step(opt, [&](const Tensor& idx) {
        return nn::cross_entropy(mlp(C[X[idx]].reshape({B, T * E})), Y[idx]);
    });
    Tensor last;
    auto one = [&] { last = step({Tensor::from_vector(random_batch(rng, pool, B))}); };
    if (first_only) {
        one();
        std::printf("first loss %.4f\n", last.item());
        return;
    }
    auto [t, program] = trace_and_time(one, 20, 200, 7);
    print_line("W2 bengio", t, false, "final loss", last.item(), program);
    // the same step eager, as a user first writes it: each step builds its graph again and
    // finds its program by the graph's structure
    auto eager = [&] {
        Tensor idx = Tensor::from_vector(random_batch(rng, pool, B));
        last = nn::cross_entropy(mlp(C[X[idx]].reshape({B, T * E})), Y[idx]);
        opt.zero_grad();
        last.backward();
        opt.step();
    };
    Timing e = time_blocks(eager, 20, 200, 7);
    std::printf("W2e eager %9.1f us/step median %9.1f us/step min  threads %d  %.2fx the jitted "
                "step (medians)\n", e.median_us, e.min_us, tg::threads(),
                e.median_us / t.median_us);
}

// W6: W2's first step as a whole process (this program again, TG_BENCH_CHILD=w6): from its
// start to the first loss, with an empty compile cache (cold) and then with the cache that
// run left (warm); the median of 3 of each, each cold run with a new cache.
static double process_ms(const std::string& cache) {
    std::fflush(stdout);   // or the child writes this process's pending output again
    auto t0 = std::chrono::steady_clock::now();
    pid_t pid = fork();
    if (pid == 0) {
        setenv("TG_CACHE_DIR", cache.c_str(), 1);
        setenv("TG_BENCH_CHILD", "w6", 1);
        if (!std::freopen("/dev/null", "w", stdout)) _exit(2);
        execl("/proc/self/exe", "bench", (char*)nullptr);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::printf("W6 first   the child failed (status %d)\n", status);
        std::exit(1);
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
static void w6() {
    std::vector<double> cold, warm;
    for (int i = 0; i < 3; i++) {
        char dir[] = "/tmp/tg-bench-w6-XXXXXX";
        if (!mkdtemp(dir)) { std::perror("mkdtemp"); std::exit(1); }
        cold.push_back(process_ms(dir));
        warm.push_back(process_ms(dir));
        if (std::system((std::string("rm -rf ") + dir).c_str()) != 0) std::exit(1);
    }
    std::sort(cold.begin(), cold.end());
    std::sort(warm.begin(), warm.end());
    std::printf("W6 first   %9.1f ms cold cache median %7.1f ms warm cache median (whole process, "
                "start to the first W2 loss; min %.1f, %.1f)\n",
                cold[1], warm[1], cold[0], warm[0]);
}

static tg::ProgramInfo w3_program, w5_program;   // for M1
static double w3_median_ms = 0;                     // for W3dp

// W3: MLP 784→1024→1024→10 ReLU with biases, batch 256, cross-entropy, SGD lr 0.01, on a pool
// of 4096 random inputs; 2 warm-up steps, 3 blocks of 2 steps
static const int64_t W3_IN = 784, W3_HIDDEN = 1024, W3_OUT = 10, W3_BATCH = 256, W3_POOL = 4096;
static std::pair<Tensor, Tensor> w3_pool(std::mt19937& rng) {   // inputs and labels
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int32_t> label(0, int32_t(W3_OUT - 1));
    std::vector<float> xs(size_t(W3_POOL * W3_IN));
    std::vector<int32_t> ys(static_cast<size_t>(W3_POOL));
    for (auto& x : xs) x = normal(rng);
    for (auto& y : ys) y = label(rng);
    return {Tensor::from_vector(xs, {W3_POOL, W3_IN}), Tensor::from_vector(ys, {W3_POOL})};
}
static nn::Sequential w3_mlp() {
    tg::manual_seed(1337);
    return nn::Sequential(nn::Linear(W3_IN, W3_HIDDEN), nn::ReLU(),
                          nn::Linear(W3_HIDDEN, W3_HIDDEN), nn::ReLU(),
                          nn::Linear(W3_HIDDEN, W3_OUT));
}

static void w3() {
    std::mt19937 rng(1337);
    auto [X, Y] = w3_pool(rng);
    nn::Sequential mlp = w3_mlp();
    tg::optim::SGD opt(mlp.parameters(), 0.01);
    tg::Jit step = training_step(opt, [&, X = X, Y = Y](const Tensor& idx) {
        return nn::cross_entropy(mlp(X[idx]), Y[idx]);
    });
    Tensor last;
    auto one = [&] { last = step({Tensor::from_vector(random_batch(rng, W3_POOL, W3_BATCH))}); };
    auto [t, program] = trace_and_time(one, 2, 2, 3);
    print_line("W3 mlp", t, true, "final loss", last.item(), program);
    w3_program = program;
    w3_median_ms = t.median_us * 1e-3;
}

// W3dp: W3's steps with tg::DataParallel on two CPU devices (CPU and CPU:1; each batch split
// in halves, threads()/2 threads each), beside the same DataParallel on one device given as
// many threads as each of the two has, and beside W3 (one device, every thread).
static void w3dp() {
    std::mt19937 rng(1337);
    auto [X, Y] = w3_pool(rng);
    int threads = tg::threads(), each = std::max(1, threads / 2);
    struct Run { Timing t; tg::DataParallel::Times parts; double loss; };
    auto run = [&, X = X, Y = Y](const std::vector<std::string>& devices) {
        nn::Sequential mlp = w3_mlp();
        tg::optim::SGD opt(mlp.parameters(), 0.01);
        tg::DataParallel dp(devices, opt, [&](const std::vector<Tensor>& shard) {
            return nn::cross_entropy(mlp(X[shard[0]]), Y[shard[0]]);
        });
        std::mt19937 batches(7);
        Tensor last;
        auto one = [&] {
            last = dp({Tensor::from_vector(random_batch(batches, W3_POOL, W3_BATCH))});
        };
        Timing t = time_blocks(one, 3, 2, 5);
        return Run{t, dp.last_times(), last.item()};
    };
    Run two = run({"CPU", "CPU:1"});
    std::string saved = std::getenv("TG_THREADS") ? std::getenv("TG_THREADS") : "";
    setenv("TG_THREADS", std::to_string(each).c_str(), 1);
    Run one = run({"CPU"});
    if (saved.empty()) unsetenv("TG_THREADS");
    else setenv("TG_THREADS", saved.c_str(), 1);
    std::printf("W3dp       %9.1f ms/step median %9.1f ms/step min  devices 2, threads %d each  "
                "final loss %.4f  merge %.2f ms  update %.2f ms  1 device of %d threads: %.1f ms "
                "(2 devices %.2fx faster)", two.t.median_us * 1e-3, two.t.min_us * 1e-3, each,
                two.loss, two.parts.merge_ms, two.parts.update_ms, each, one.t.median_us * 1e-3,
                one.t.median_us / two.t.median_us);
    if (w3_median_ms > 0)
        std::printf("  W3 (1 device, %d threads): %.1f ms (%.2fx)", threads, w3_median_ms,
                    w3_median_ms / (two.t.median_us * 1e-3));
    std::printf("\n");
}

// W4: C = A·B for n×n float32 A and B from randn, realized (the eager path, as a user writes
// it); 3 warm-up products, 7 blocks of 10; GFLOP/s at the median and the largest error of C's
// first 16 rows against a float64 product. On CUDA, also with TG_CUDA_TF32=1 (tensor cores,
// as PyTorch's allow_tf32), labelled W4 tf32.
static void w4(int64_t n, const char* label = "W4 matmul") {
    tg::manual_seed(1337);
    Tensor A = Tensor::randn({n, n}).realize(), B = Tensor::randn({n, n}).realize();
    Tensor C;
    auto one = [&] { C = A.matmul(B).realize(); };
    auto [t, program] = trace_and_time(one, 3, 10, 7);
    std::vector<float> a = A.to_vector(), b = B.to_vector(), c = C.to_vector();
    double worst = 0;
    for (int64_t i = 0; i < 16; i++)
        for (int64_t j = 0; j < n; j++) {
            double want = 0;
            for (int64_t k = 0; k < n; k++)
                want += double(a[size_t(i * n + k)]) * b[size_t(k * n + j)];
            worst = std::max(worst, std::fabs(double(c[size_t(i * n + j)]) - want));
        }
    double gflop = 2.0 * n * n * n / 1e9;
    std::printf("%s  %9.1f GFLOP/s median %7.1f GFLOP/s best  threads %d  max error %.2e"
                "  n %lld\n", label, gflop / (t.median_us * 1e-6), gflop / (t.min_us * 1e-6),
                tg::threads(), worst, (long long)n);
    (void)program;
}

// W5: decoder-only transformer (GPT) of nn::TransformerBlock layers: vocab 64, context 64,
// d_model 128, 4 heads, 2 layers, pre-LayerNorm, MLP 4x with tanh GELU, causal attention,
// learned positions, batch 16, AdamW lr 1e-3 wd 0.01, next-token cross-entropy on a pool of
// 4096 random sequences of 65 tokens; 5 warm-up steps, 7 blocks of 10. W7: the same at vocab 256, context 256, d_model 512,
// 8 heads, 6 layers, batch 32; 5 warm-up steps, 5 blocks of 10.
static void gpt(const char* name, int64_t vocab, int64_t ctx, int64_t d, int64_t heads,
                int64_t layers, int64_t B, int blocks_timed) {
    const int64_t pool = 4096;
    std::mt19937 rng(1337);
    Tensor data = random_tokens(rng, pool, ctx + 1, vocab);
    tg::manual_seed(1337);
    nn::Embedding tok(vocab, d), pos(ctx, d);
    nn::ModuleList blocks;
    for (int64_t l = 0; l < layers; l++) blocks.append(nn::TransformerBlock(d, heads));
    nn::LayerNorm lnf(d);
    nn::Linear head(d, vocab, false);
    std::vector<Tensor> params = {tok.weight, pos.weight};
    for (const Tensor& p : blocks.parameters()) params.push_back(p);
    for (const Tensor& p : lnf.parameters()) params.push_back(p);
    params.push_back(head.weight);
    Tensor positions = Tensor::arange(ctx).realize();
    tg::optim::AdamW opt(params, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    tg::Jit step = training_step(opt, [&](const Tensor& idx) {
        Tensor seq = data[idx];
        Tensor x = tok(seq.slice(1, 0, ctx)) + pos(positions);
        for (size_t l = 0; l < blocks.size(); l++) x = blocks.at(l)(x);
        Tensor logits = head(lnf(x));
        Tensor next = seq.slice(1, 1, ctx + 1).reshape({-1});
        return nn::cross_entropy(logits.reshape({-1, vocab}), next);
    });
    Tensor last;
    auto one = [&] { last = step({Tensor::from_vector(random_batch(rng, pool, B))}); };
    auto [t, program] = trace_and_time(one, 5, 10, blocks_timed);
    print_line(name, t, true, "final loss", last.item(), program);
    if (std::string(name) == "W5 gpt") w5_program = program;
}

// C1: a small CNN of our own (not in WORKLOADS.md; bench/reference_own.py is PyTorch's
// side): Conv2d(3, 32, 3, padding 1), ReLU, MaxPool2d(2), Conv2d(32, 64, 3, padding 1), ReLU,
// MaxPool2d(2), Linear(64·8·8, 10), batch 64 of 3 x 32 x 32 from a pool of 1024 random images
// with random labels, cross-entropy, SGD lr 0.01; 3 warm-up steps, 5 blocks of 3 steps
static const int64_t C1_POOL = 1024, C1_BATCH = 64, C1_CLASSES = 10;
static void c1() {
    std::mt19937 rng(1337);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int32_t> label(0, int32_t(C1_CLASSES - 1));
    std::vector<float> xs(size_t(C1_POOL * 3 * 32 * 32));
    std::vector<int32_t> ys(static_cast<size_t>(C1_POOL));
    for (auto& x : xs) x = normal(rng);
    for (auto& y : ys) y = label(rng);
    Tensor X = Tensor::from_vector(xs, {C1_POOL, 3, 32, 32});
    Tensor Y = Tensor::from_vector(ys, {C1_POOL});
    tg::manual_seed(1337);
    nn::Sequential cnn(nn::Conv2d(3, 32, 3, 1, 1), nn::ReLU(), nn::MaxPool2d(2),
                       nn::Conv2d(32, 64, 3, 1, 1), nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                       nn::Linear(64 * 8 * 8, C1_CLASSES));
    tg::optim::SGD opt(cnn.parameters(), 0.01);
    tg::Jit step = training_step(opt, [&](const Tensor& idx) {
        return nn::cross_entropy(cnn(X[idx]), Y[idx]);
    });
    Tensor last;
    auto one = [&] { last = step({Tensor::from_vector(random_batch(rng, C1_POOL, C1_BATCH))}); };
    auto [t, program] = trace_and_time(one, 3, 3, 5);
    print_line("C1 cnn", t, true, "final loss", last.item(), program);
}

// R1: a recurrent language model of our own (not in WORKLOADS.md; bench/reference_own.py is
// PyTorch's side): Embedding(64, 64), a 2-layer LSTM(64, 128) over 32 steps (batch first),
// Linear(128, 64) at each step, cross-entropy against the next token, batch 32 of a pool of
// 512 random sequences of 33 tokens, Adam lr 1e-3; 3 warm-up steps, 5 blocks of 3 steps. Its
// program unrolls the 32 steps of each layer, forward and backward (279 kernels): the line
// after it gives the first step's time (trace, schedule, compile and run).
static const int64_t R1_POOL = 512, R1_BATCH = 32, R1_STEPS = 32, R1_VOCAB = 64;
static void r1() {
    std::mt19937 rng(1337);
    Tensor pool = random_tokens(rng, R1_POOL, R1_STEPS + 1, R1_VOCAB);
    tg::manual_seed(1337);
    nn::Embedding embed(R1_VOCAB, 64);
    nn::LSTM lstm(64, 128, 2, true, true);
    nn::Linear head(128, R1_VOCAB);
    std::vector<Tensor> params = embed.parameters();
    for (nn::Module* m : std::vector<nn::Module*>{&lstm, &head})
        for (const Tensor& p : m->parameters()) params.push_back(p);
    tg::optim::Adam opt(params, 1e-3);
    tg::Jit step = training_step(opt, [&](const Tensor& idx) {
        Tensor seq = pool[idx];
        Tensor logits = head(lstm(embed(seq.slice(1, 0, R1_STEPS))));
        return nn::cross_entropy(logits.reshape({-1, R1_VOCAB}),
                                 seq.slice(1, 1, R1_STEPS + 1).reshape({-1}));
    });
    Tensor last;
    auto one = [&] { last = step({Tensor::from_vector(random_batch(rng, R1_POOL, R1_BATCH))}); };
    auto t0 = std::chrono::steady_clock::now();
    one();
    double first_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    tg::ProgramInfo program = tg::last_program();
    Timing t = time_blocks(one, 2, 3, 5);
    print_line("R1 lstm", t, true, "final loss", last.item(), program);
    std::printf("R1f first  %9.1f ms (the first step's trace, schedule, compile and run)\n",
                first_ms);
}

// TG_BENCH=w2,w5 runs those workloads only (all by default)
static bool enabled(const char* workload) {
    const char* only = std::getenv("TG_BENCH");
    if (!only || !*only) return true;
    std::string list = std::string(",") + only + ",";
    return list.find(std::string(",") + workload + ",") != std::string::npos;
}

// M1: the temporaries of the W3 and W5 step programs, unplanned (each its own allocation) and
// planned into one arena by lifetime.
static void m1() {
    auto mib = [](int64_t b) { return double(b) / (1 << 20); };
    std::printf("M1 memory  W3 %.2f MiB unplanned -> %.2f MiB planned (%.0f%%), W5 %.2f MiB -> "
                "%.2f MiB (%.0f%%)\n",
                mib(w3_program.temp_bytes), mib(w3_program.arena_bytes),
                100.0 * double(w3_program.arena_bytes) / double(w3_program.temp_bytes),
                mib(w5_program.temp_bytes), mib(w5_program.arena_bytes),
                100.0 * double(w5_program.arena_bytes) / double(w5_program.temp_bytes));
}

int main() {
    if (const char* child = std::getenv("TG_BENCH_CHILD"))
        if (std::string(child) == "w6") {
            w2(true);
            return 0;
        }
    bool cuda = tg::detail::default_device().name() == std::string("CUDA");
    std::printf("device %s\n", tg::detail::default_device().name());
    if (enabled("w1")) w1();
    if (enabled("w2")) w2();
    if (enabled("w3")) w3();
    if (enabled("w3dp") && !cuda) w3dp();
    if (enabled("w4")) {   // float32, whatever TG_CUDA_TF32 says, then (on CUDA) TF32
        const char* set = std::getenv("TG_CUDA_TF32");
        std::string tf32 = set ? set : "";
        setenv("TG_CUDA_TF32", "0", 1);
        w4(1024);
        if (cuda) w4(4096);
        setenv("TG_CUDA_TF32", "1", 1);
        if (cuda) w4(4096, "W4 tf32");
        if (set) setenv("TG_CUDA_TF32", tf32.c_str(), 1);
        else unsetenv("TG_CUDA_TF32");
    }
    if (enabled("w5")) gpt("W5 gpt", 64, 64, 128, 4, 2, 16, 7);
    if (enabled("w6")) w6();
    if (std::getenv("TG_BENCH") && enabled("w7")) gpt("W7 gpt", 256, 256, 512, 8, 6, 32, 5);
    if (enabled("c1") && !cuda) c1();
    if (enabled("r1") && !cuda) r1();
    if (enabled("w3") && enabled("w5")) m1();
    return 0;
}

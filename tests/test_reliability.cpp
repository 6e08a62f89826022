// Reliability: deep graphs, parameters made every way, NaN and integer semantics shared by CPU
// and INTERP, accurate sums, stale reads after in-place updates, and the errors that guard them.
#include "harness.hpp"
#include <algorithm>
#include <cmath>
#include <limits>
#include <pthread.h>
#include <thread>
#include <unistd.h>
using tg::DType;
using tg::Shape;
using tg::Tensor;
using th::EnvGuard;

namespace {
std::vector<float> floats(std::initializer_list<float> v) { return v; }
}  // namespace

// ---- deep graphs: iterative walks, bounded kernels, iterative release ------------------------

// The walks of a graph (building, autograd, scheduling, release) are loops, not recursion: on a
// thread with a 1 MiB stack, chains of 25,000 and 200,000 ops are deeper than a recursive walk
// could go (at 48 bytes a frame, 25,000 frames need 1.2 MB), as deep for it as 200,000 and
// 1,600,000 on a default 8 MiB stack, with a quarter of the ops to realize. Lowering recurses
// over kernels of bounded depth (SCHED_MAX_DEPTH): under AddressSanitizer or ThreadSanitizer,
// whose frames are larger (a recursive walk's too), that needs more than 1 MiB, and the thread
// gets 2.
#if defined(TG_TEST_ASAN) || defined(TG_TEST_TSAN)
const size_t deep_chain_stack = size_t(2) << 20;
#else
const size_t deep_chain_stack = size_t(1) << 20;
#endif
TEST(deep_chain_realizes_differentiates_and_is_released) {
    EnvGuard dev("TG_DEVICE", "INTERP");
    auto body = [](void*) -> void* {
        try {
            const int n = 25000;
            Tensor y = Tensor::ones({3});
            for (int i = 0; i < n; i++)
                y = y + 1.0f;
            CHECK_ALL_NEAR(y.to_vector(), (std::vector<double>{n + 1.0, n + 1.0, n + 1.0}), 0);

            Tensor x = Tensor::from_vector(floats({1, 2, 3}));
            x.requires_grad();
            Tensor z = x;
            for (int i = 0; i < n; i++)
                z = z * 1.00001f + 0.5f;
            z.sum().backward();
            double slope = std::pow(double(1.00001f), n);   // d z / d x, in exact arithmetic
            tg::realize({x.grad()});
            CHECK_ALL_NEAR(x.grad().to_vector(), (std::vector<double>{slope, slope, slope}),
                           1e-3);

            Tensor never = Tensor::ones({3});   // built and dropped without being realized
            for (int i = 0; i < 200000; i++)
                never = never + 1.0f;
        } catch (const std::exception& e) {
            th::report(__FILE__, __LINE__, std::string("threw: ") + e.what());
        }
        return nullptr;
    };
    pthread_attr_t attr;
    pthread_t thread;
    CHECK_EQ(pthread_attr_init(&attr), 0);
    CHECK_EQ(pthread_attr_setstacksize(&attr, deep_chain_stack), 0);
    CHECK_EQ(pthread_create(&thread, &attr, body, nullptr), 0);
    CHECK_EQ(pthread_join(thread, nullptr), 0);
    pthread_attr_destroy(&attr);
}

// A pending gradient's graph reads its leaf, and the leaf holds the gradient: when the thread
// that ran backward() ends before anything realized it, the cycles nothing else holds are
// freed (LeakSanitizer saw them at a program's exit), and a leaf still held keeps its gradient.
TEST(gradients_never_realized_are_freed_when_their_thread_ends) {
    std::weak_ptr<tg::detail::Node> dropped_leaf, dropped_grad, kept_grad;
    Tensor kept = Tensor::from_vector(floats({1, 2, 3})).requires_grad();
    std::thread([&] {
        Tensor w = Tensor::from_vector(floats({1, 2, 3, 4}), {2, 2}).requires_grad();
        Tensor b = Tensor::from_vector(floats({0.5f, -1})).requires_grad();
        (w.matmul(w) + b).relu().sum().backward();   // w's gradient reads w; b's reads w too
        (kept * kept).sum().backward();
        dropped_leaf = w.node();
        dropped_grad = w.grad().node();
        kept_grad = kept.grad().node();
    }).join();
    CHECK(dropped_leaf.expired());
    CHECK(dropped_grad.expired());
    CHECK(!kept_grad.expired());
    CHECK_ALL_NEAR(kept.grad().to_vector(), (std::vector<double>{2, 4, 6}), 0);
}

TEST(deep_chain_compiles_as_kernels_of_bounded_depth) {
    Tensor y = Tensor::from_vector(floats({0, 1}));
    for (int i = 0; i < 1000; i++)
        y = y + 0.5f;
    tg::Stages st = tg::inspect({y});
    long kernels = std::count(st.schedule.begin(), st.schedule.end(), '\n'); // one line each
    CHECK(kernels >= 1000 / 256);
    CHECK_ALL_NEAR(y.to_vector(), (std::vector<double>{500, 501}), 0);
}

// ---- parameters: every way of making one receives gradients and trains -----------------------

namespace {
// d/dp sum(p·p·3) = 6p: the gradient each parameter must receive, and one SGD step with lr 0.1
void check_trains(const char* how, Tensor p) {
    std::vector<double> before = p.to_vector<double>();
    tg::optim::SGD opt({p}, 0.1);
    (p * p * 3.0f).sum().backward();
    opt.step();
    std::vector<double> g = p.grad().to_vector<double>(), after = p.to_vector<double>();
    bool ok = g.size() == before.size() && after.size() == before.size();
    for (size_t i = 0; ok && i < g.size(); i++)
        ok = th::near(g[i], 6 * before[i], 1e-6) &&
             th::near(after[i], before[i] - 0.6 * before[i], 1e-6);
    if (!ok)
        th::report(__FILE__, __LINE__, std::string("parameter made by ") + how + " did not train");
}
}  // namespace

TEST(parameters_made_every_way_receive_gradients_and_train) {
    check_trains("zeros", Tensor::zeros({3}).requires_grad());
    check_trains("ones", Tensor::ones({3}).requires_grad());
    check_trains("full", Tensor::full({2, 2}, 1.5f).requires_grad());
    check_trains("rand", Tensor::rand({4}, 3).requires_grad());
    check_trains("randn", Tensor::randn({4}, 4).requires_grad());
    check_trains("arange", Tensor::arange(0.5f, 3.0f).requires_grad());
    check_trains("eye", Tensor::eye(3).requires_grad());
    check_trains("from_vector", Tensor::from_vector(floats({1, -2})).requires_grad());
    check_trains("a float64 vector",
                 Tensor::from_vector(std::vector<double>{1, -2}).requires_grad());
    check_trains("a computed value",
                 (Tensor::arange(3).cast(DType::FLOAT32) * 2.0f).requires_grad());
    check_trains("a cast", Tensor::arange(4).cast(DType::FLOAT32).requires_grad());
    check_trains("a view", Tensor::ones({2, 3}).reshape({6}).requires_grad());
    check_trains("detach", (Tensor::ones({2}).requires_grad() * 4.0f).detach().requires_grad());
    Tensor assigned = Tensor::zeros({3}).requires_grad();
    assigned.assign(Tensor::from_vector(floats({1, 2, 3}))).realize();
    check_trains("assign", assigned);
    std::string path = "/tmp/tg-param-" + std::to_string(getpid()) + ".safetensors";
    tg::safetensors::save(path, {{"w", Tensor::from_vector(floats({0.5f, -1}))}});
    check_trains("safetensors::load", tg::safetensors::load(path).at("w").requires_grad());
    std::remove(path.c_str());
}

TEST(parameters_of_every_nn_layer_receive_gradients) {
    namespace nn = tg::nn;
    Tensor x = Tensor::from_vector(floats({0.5f, -1, 2, 0.25f, 1, -3}), {2, 3});
    nn::Linear lin(3, 2);
    nn::Linear lazy(2); // learns in_features = 3 at its first call
    nn::Embedding emb(5, 3);
    nn::LayerNorm ln(3);
    Tensor ids = Tensor::from_vector(std::vector<int32_t>{4, 0});
    Tensor loss = lin(x).sum() + lazy(x).sum() + (emb(ids) * x).sum() + (ln(x) * x).sum();
    std::vector<Tensor> ps;
    for (nn::Module* m : std::vector<nn::Module*>{&lin, &lazy, &emb, &ln})
        for (const Tensor& p : m->parameters())
            ps.push_back(p);
    CHECK_EQ(ps.size(), size_t(7));
    tg::optim::Adam opt(ps, 0.01);
    loss.backward();
    opt.step();
    for (const Tensor& p : ps) {
        CHECK(p.grad().defined());
        if (!p.grad().defined()) continue;
        double norm = 0;
        for (double g : p.grad().to_vector<double>())
            norm += g * g;
        CHECK(norm > 0);
    }
    // LayerNorm: d/dw Σ (x̂·w + b)·x = Σ_rows x̂·x, d/db = Σ_rows x
    std::vector<double> xs = x.to_vector<double>(), want_w(3, 0), want_b(3, 0);
    for (int r = 0; r < 2; r++) {
        double mean = 0, var = 0;
        for (int c = 0; c < 3; c++)
            mean += xs[size_t(3 * r + c)] / 3;
        for (int c = 0; c < 3; c++)
            var += std::pow(xs[size_t(3 * r + c)] - mean, 2) / 3;
        for (int c = 0; c < 3; c++) {
            double v = xs[size_t(3 * r + c)];
            want_w[size_t(c)] += (v - mean) / std::sqrt(var + 1e-5) * v;
            want_b[size_t(c)] += v;
        }
    }
    CHECK_ALL_NEAR(ln.weight.grad().to_vector(), want_w, 1e-5);
    CHECK_ALL_NEAR(ln.bias.grad().to_vector(), want_b, 1e-6);
}

TEST(parameters_that_cannot_train_are_refused) {
    Tensor w = Tensor::ones({3}).requires_grad();
    std::string here = "test_reliability.cpp:" + std::to_string(__LINE__ + 1);
    Tensor scaled = w * 2.0f;
    CHECK_THROWS(tg::optim::SGD({w, scaled}, 0.1), "optimizer", "parameter 1", "float32 [3]",
                 here.c_str(), "never", "leaf");
    CHECK_THROWS(tg::optim::Adam({Tensor::ones({2})}, 0.1), "parameter 0", "requires_grad()");
    CHECK_THROWS(tg::optim::SGD(std::vector<Tensor>{}, 0.1), "optimizer", "no parameters");
    tg::nn::Sequential lazy(tg::nn::Linear(4));
    CHECK_THROWS(tg::optim::SGD(lazy.parameters(), 0.1), "no parameters", "first call");
    CHECK_THROWS(scaled.requires_grad(), "requires_grad", "not a leaf", "detach()");
    CHECK_THROWS(Tensor::arange(3).requires_grad(), "requires_grad", "float", "int32");
}

// ---- seeds: a seeded model is the same with every compiler -----------------------------------

namespace {
std::vector<double> params_of(tg::nn::Module& m) {
    std::vector<double> out;
    for (const Tensor& p : m.parameters())
        for (double v : p.to_vector<double>())
            out.push_back(v);
    return out;
}
}  // namespace

TEST(sequential_hands_out_seeds_in_layer_order) {
    namespace nn = tg::nn;
    tg::manual_seed(7);
    nn::Linear a(2, 3);
    nn::Embedding e(4, 2);
    nn::Linear b(3, 1);
    std::vector<double> want = params_of(a);
    for (double v : params_of(e))
        want.push_back(v);
    for (double v : params_of(b))
        want.push_back(v);
    tg::manual_seed(7); // the arguments are built in an order the compiler picks
    nn::Sequential s(nn::Linear(2, 3), nn::Embedding(4, 2), nn::ReLU(), nn::Linear(3, 1));
    CHECK_EQ(params_of(s), want);
    tg::manual_seed(7); // nested: the inner Sequential's layers take their turn in order
    nn::Sequential n(nn::Linear(2, 3), nn::Sequential(nn::Embedding(4, 2), nn::Linear(3, 1)));
    CHECK_EQ(params_of(n), want);
}

// tests/seed_probe.cpp, compiled by each C++ compiler on the machine, prints a seeded model.
TEST(seeded_models_agree_across_compilers) {
    const char* dir = std::getenv("TG_PROBES_DIR");
    if (!dir) SKIP("TG_PROBES_DIR is not set (make test sets it)");
    std::vector<std::string> outputs;
    for (const char* cxx : {"g++", "clang++"}) {
        std::string exe = std::string(dir) + "/seed_probe_" + cxx;
        if (access(exe.c_str(), X_OK) != 0) continue;
        std::string out;
        FILE* p = popen(("'" + exe + "'").c_str(), "r");
        char buf[4096];
        size_t n;
        while (p && (n = fread(buf, 1, sizeof buf, p)) > 0)
            out.append(buf, n);
        CHECK(p && pclose(p) == 0);
        CHECK(out.size() > 100);
        outputs.push_back(out);
    }
    if (outputs.size() < 2) SKIP("needs both g++ and clang++");
    CHECK(outputs[0] == outputs[1]);
}

// ---- NaN, integer and special values: one meaning on every device ------------------------------

namespace {
const double NaN = std::numeric_limits<double>::quiet_NaN(), Inf = INFINITY;
// Runs check once per device.
template <typename F>
void on_each_device(F check) {
    for (const char* dev : {"CPU", "INTERP"}) {
        EnvGuard g("TG_DEVICE", dev);
        check(std::string(dev));
    }
}
// equal, with NaN equal to NaN and the sign of zero significant
bool same(const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++) {
        if (std::isnan(a[i]) != std::isnan(b[i])) return false;
        if (!std::isnan(a[i]) && (a[i] != b[i] || std::signbit(a[i]) != std::signbit(b[i])))
            return false;
    }
    return true;
}
#define CHECK_SAME(dev, got, ...)                                                             \
    do {                                                                                      \
        std::vector<double> g_ = (got), w_ = __VA_ARGS__;                                     \
        if (!same(g_, w_))                                                                    \
            th::report(__FILE__, __LINE__,                                                    \
                       dev + ": " #got " is " + th::show(g_) + ", expected " + th::show(w_)); \
    } while (0)
Tensor f32(std::initializer_list<double> v) {
    return Tensor::from_vector(std::vector<double>(v)).cast(DType::FLOAT32);
}
}  // namespace

TEST(nan_propagates_through_max_min_relu_and_argmax) {
    on_each_device([](const std::string& dev) {
        Tensor x = f32({NaN, 2, -3});
        CHECK_SAME(dev, x.max().to_vector<double>(), {NaN});
        CHECK_SAME(dev, x.min().to_vector<double>(), {NaN});
        CHECK_SAME(dev, x.relu().to_vector<double>(), {NaN, 2, 0});
        CHECK_SAME(dev, x.argmax().to_vector<double>(), {0});
        CHECK_SAME(dev, f32({1, 5, NaN, 7, NaN}).argmax().to_vector<double>(), {2});
        CHECK_SAME(dev, x.maximum(f32({1, NaN, -4})).to_vector<double>(), {NaN, NaN, -3});
        CHECK_SAME(dev, x.minimum(f32({1, NaN, -4})).to_vector<double>(), {NaN, NaN, -4});
        CHECK_SAME(dev, x.maximum(0.0f).to_vector<double>(), {NaN, 2, 0});
        Tensor rows = f32({1, NaN, 3, 4, 5, 6}).reshape({2, 3});
        CHECK_SAME(dev, rows.max(1).to_vector<double>(), {NaN, 6});
        CHECK_SAME(dev, rows.argmax(1).to_vector<double>(), {1, 2});
        std::vector<double> soft = rows.softmax(1).to_vector<double>();
        CHECK(std::isnan(soft[0]) && std::isnan(soft[2]) && !std::isnan(soft[3]));
    });
}

TEST(nan_gradients_follow_pytorch) {
    on_each_device([](const std::string& dev) {
        // relu: 0 at x <= 0 (relu'(0) = 0), g elsewhere, NaN included
        Tensor x = f32({NaN, 0, -1, 2}).requires_grad();
        x.relu().sum().backward();
        CHECK_SAME(dev, x.grad().to_vector<double>(), {1, 0, 0, 1});
        // maximum: a tie splits, and where either side is NaN both receive the gradient
        Tensor a = f32({NaN, 1, 2, 5}).requires_grad(), b = f32({1, NaN, 2, 3}).requires_grad();
        a.maximum(b).sum().backward();
        CHECK_SAME(dev, a.grad().to_vector<double>(), {1, 1, 0.5, 1});
        CHECK_SAME(dev, b.grad().to_vector<double>(), {1, 1, 0.5, 0});
        // max over an axis with its indices: the gradient goes to the index, the first NaN or
        // tie, as PyTorch's torch.max(x, dim)
        Tensor m = f32({1, NaN, NaN, 4, 7, 7}).reshape({2, 3}).requires_grad();
        m.max(1).sum().backward();
        CHECK_SAME(dev, m.grad().to_vector<double>(), {0, 1, 0, 0, 1, 0});
        // over a list of axes (amax): to the NaNs, shared evenly, as for ties (PyTorch's amax
        // gives NaN to the row)
        Tensor n = f32({1, NaN, NaN, 4, 7, 7}).reshape({2, 3}).requires_grad();
        n.max(std::vector<int>{1}).sum().backward();
        CHECK_SAME(dev, n.grad().to_vector<double>(), {0, 0.5, 0.5, 0, 0.5, 0.5});
    });
}

TEST(integer_arithmetic_wraps_and_casts_saturate) {
    on_each_device([](const std::string& dev) {
        Tensor big = Tensor::from_vector(std::vector<int32_t>{INT32_MAX, INT32_MIN, 46341, -7});
        CHECK_SAME(dev, big.pow(2).to_vector<double>(), {1, 0, -2147479015, 49});
        CHECK_SAME(dev, (big + 1).to_vector<double>(), {INT32_MIN, INT32_MIN + 1.0, 46342, -6});
        CHECK_SAME(dev, (big * 3).to_vector<double>(), {2147483645, INT32_MIN, 139023, -21});
        CHECK_SAME(dev, (-big).to_vector<double>(), {-INT32_MAX, INT32_MIN, -46341, 7});
        CHECK_SAME(dev, (big - 2).to_vector<double>(),
                   {INT32_MAX - 2.0, INT32_MAX - 1.0, 46339, -9});
        Tensor f =
            Tensor::from_vector(std::vector<double>{3e9, -3e9, NaN, Inf, -2.7, 2147483647.9});
        CHECK_SAME(dev, f.cast(DType::INT32).to_vector<double>(),
                   {INT32_MAX, INT32_MIN, 0, INT32_MAX, -2, INT32_MAX});
        CHECK_SAME(dev, f.cast(DType::FLOAT32).cast(DType::INT32).to_vector<double>(),
                   {INT32_MAX, INT32_MIN, 0, INT32_MAX, -2, INT32_MAX});
        CHECK_SAME(dev, Tensor::full({2}, 5e9, DType::INT32).to_vector<double>(),
                   {INT32_MAX, INT32_MAX});
    });
}

TEST(special_values_cos_pow_and_scalars) {
    on_each_device([](const std::string& dev) {
        // cos is its own op: no rounding of x + π/2 for large x
        std::vector<double> xs = {-25000, 0, 1e6, 3.5, -1e-3};
        std::vector<double> got =
            Tensor::from_vector(xs).cast(DType::FLOAT32).cos().to_vector<double>();
        for (size_t i = 0; i < xs.size(); i++)
            CHECK_NEAR(got[i], std::cos(double(float(xs[i]))), 1e-6);
        got = Tensor::from_vector(xs).cos().to_vector<double>();
        for (size_t i = 0; i < xs.size(); i++)
            CHECK_NEAR(got[i], std::cos(xs[i]), 1e-15);
        // pow follows C's special cases (the values PyTorch gives)
        Tensor base = Tensor::from_vector(
            std::vector<double>{-0.0, -0.0, -0.0, 0.0, -2, -8, -Inf, -Inf, 1, -1, NaN, 2, -2});
        Tensor expo = Tensor::from_vector(
            std::vector<double>{-1, 3, 0.5, -2, 1e10, 1.0 / 3, 0.5, -3, NaN, Inf, 0, NaN, 3});
        std::vector<double> want;
        for (size_t i = 0; i < 13; i++)
            want.push_back(std::pow(base.to_vector<double>()[i], expo.to_vector<double>()[i]));
        CHECK_SAME(dev, base.pow(expo).to_vector<double>(), want);
        CHECK_SAME(dev, Tensor::from_vector(std::vector<double>{-0.0}).pow(-1).to_vector<double>(),
                   {-Inf});
        CHECK_SAME(dev, Tensor::from_vector(std::vector<float>{-0.0f}).pow(-1).to_vector<double>(),
                   {-Inf});
        // 0-d tensors reduce over their one implicit axis, like PyTorch
        Tensor s = Tensor::full({}, 2.0f);
        CHECK_SAME(dev, s.softmax(0).to_vector<double>(), {1});
        CHECK_SAME(dev, s.log_softmax(-1).to_vector<double>(), {0});
        CHECK_SAME(dev, s.sum(0).to_vector<double>(), {2});
        CHECK_SAME(dev, s.max(-1, true).to_vector<double>(), {2});
        CHECK_SAME(dev, s.transpose(0, -1).to_vector<double>(), {2});
        CHECK_SAME(dev, s.flip(0).to_vector<double>(), {2});
        CHECK_THROWS(s.size(0), "size", "axis 0", "[]");
        CHECK_THROWS(s.slice(0, 0, 1), "slice", "[]");
        // every NaN reads (and prints) as the same NaN, whatever sign the arithmetic left
        Tensor inf = Tensor::full({3}, Inf, DType::FLOAT32);
        Tensor nans = inf - inf * Tensor::from_vector(floats({1, -1, 0}));
        std::vector<double> got_nans = (-nans).to_vector<double>();
        got_nans.insert(got_nans.end(),
                        {nans.to_vector<double>()[0], (inf - inf).to_vector<double>()[2]});
        for (double v : got_nans)
            CHECK(!std::isnan(v) || !std::signbit(v));
        CHECK_EQ(nans.to_string(), std::string("tensor([nan, inf, nan])"));
    });
}

// ---- sums: error that does not grow with the length; integers in int64 ----------------------

TEST(float_sums_stay_accurate_at_any_length) {
    // one accumulator would give 0.5 and 1087937 here (float32 stops counting at 2^24)
    CHECK_EQ(Tensor::ones({1 << 25}).mean().item(), 1.0);
    CHECK_NEAR(Tensor::full({10000000}, 0.1f).sum().item(), 1e7 * double(0.1f), 1e-6);
    CHECK_NEAR(Tensor::full({3000, 3000}, 0.1f).sum().item(), 9e6 * double(0.1f), 1e-6);
    CHECK_NEAR(Tensor::full({4, 250000}, 0.1f).sum(1).to_vector()[3], 250000 * double(0.1f), 1e-6);
    // random values against a float64 sum, and the same bits on both devices (one fixed order)
    std::vector<float> v = th::randf(300007, 5, 0, 1);
    double exact = 0;
    for (float x : v)
        exact += x;
    std::vector<double> got[2];
    int k = 0;
    on_each_device([&](const std::string& dev) {
        got[k] = Tensor::from_vector(v).sum().to_vector<double>();
        if (std::fabs(got[k][0] - exact) > 1e-6 * exact)
            th::report(__FILE__, __LINE__,
                       dev + ": sum is " + th::show(got[k][0]) + ", exact " + th::show(exact));
        k++;
    });
    CHECK(same(got[0], got[1]));
}

TEST(integer_sums_accumulate_in_int64) {
    on_each_device([](const std::string& dev) {
        Tensor s = Tensor::arange(100000).sum();
        CHECK(s.dtype() == DType::INT64);
        CHECK_SAME(dev, s.to_vector<double>(), {4999950000.0});
        Tensor big = Tensor::full({3, 4}, INT32_MAX, DType::INT32);
        CHECK_SAME(dev, big.sum(0).to_vector<double>(), std::vector<double>(4, 3.0 * INT32_MAX));
        CHECK_SAME(dev, (Tensor::arange(10) < 4).sum().to_vector<double>(), {4});
        CHECK((Tensor::arange(10) < 4).sum().dtype() == DType::INT64);
        CHECK(
            Tensor::arange(6).reshape({2, 3}).matmul(Tensor::ones({3, 1}, DType::INT32)).dtype() ==
            DType::INT32);
    });
}

TEST(int64_tensors_are_exact) {
    const int64_t big = (int64_t(1) << 60) + 1; // not a double
    on_each_device([&](const std::string& dev) {
        Tensor x = Tensor::from_vector(std::vector<int64_t>{big, -3, INT64_MAX});
        CHECK(x.dtype() == DType::INT64);
        CHECK_EQ(x.to_vector<int64_t>(), (std::vector<int64_t>{big, -3, INT64_MAX}));
        CHECK_EQ((x + 1).to_vector<int64_t>(), (std::vector<int64_t>{big + 1, -2, INT64_MIN}));
        CHECK_EQ((x * 2).to_vector<int64_t>(), (std::vector<int64_t>{2 * big, -6, -2}));
        CHECK_EQ(x.max().to_vector<int64_t>(), (std::vector<int64_t>{INT64_MAX}));
        CHECK_EQ(x.sum().to_vector<int64_t>(),
                 (std::vector<int64_t>{int64_t(uint64_t(big) - 3 + uint64_t(INT64_MAX))})); // wraps
        CHECK_EQ(x.to_string(),
                 "tensor([1152921504606846977,                  -3, 9223372036854775807])");
        CHECK((x + Tensor::from_vector(std::vector<int32_t>{1, 2, 3})).dtype() == DType::INT64);
        CHECK((x + 1.5f).dtype() == DType::FLOAT32);
        CHECK(((x > 0) + 2).dtype() == DType::INT64);
        Tensor f = Tensor::from_vector(std::vector<double>{1e19, -1e19, NaN, -7.9});
        CHECK_EQ(f.cast(DType::INT64).to_vector<int64_t>(),
                 (std::vector<int64_t>{INT64_MAX, INT64_MIN, 0, -7}));
        // int64 indices work wherever int32 ones do
        Tensor table = Tensor::from_vector(floats({10, 20, 30}));
        CHECK_SAME(dev, table[Tensor::from_vector(std::vector<int64_t>{2, 0})].to_vector<double>(),
                   {30, 10});
        Tensor logits = Tensor::from_vector(floats({0, 0, 5, 5, 0, 0}), {2, 3});
        CHECK_NEAR(
            tg::nn::cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{2, 0})).item(),
            std::log(2 + std::exp(5.0)) - 5, 1e-6);
    });
    std::string path = "/tmp/tg-i64-" + std::to_string(getpid()) + ".safetensors";
    tg::safetensors::save(path, {{"x", Tensor::from_vector(std::vector<int64_t>{big, -1})}});
    Tensor back = tg::safetensors::load(path).at("x");
    std::remove(path.c_str());
    CHECK(back.dtype() == DType::INT64);
    CHECK_EQ(back.to_vector<int64_t>(), (std::vector<int64_t>{big, -1}));
}

// ---- reads after in-place updates: the value it had when built, or an error ------------------

TEST(stale_reads_after_in_place_updates_are_errors) {
    on_each_device([](const std::string&) {
        Tensor p = Tensor::from_vector(floats({1, 2, 3}));
        Tensor old = p * 1.0f;
        std::string update = "test_reliability.cpp:" + std::to_string(__LINE__ + 1);
        p.assign(p + 10.0f).realize();
        CHECK_THROWS(old.to_vector(), "stale read", "MUL float32 [3]", update.c_str(),
                     "realize it before");
        // realized with the update (one program), or before it, it keeps the old value
        Tensor q = Tensor::from_vector(floats({1, 2, 3}));
        Tensor before = q * 1.0f;
        tg::realize({q.assign(q + 10.0f), before});
        CHECK_EQ(before.to_vector(), floats({1, 2, 3}));
        CHECK_EQ(q.to_vector(), floats({11, 12, 13}));
        // a view aliases the storage and sees the update, as in PyTorch
        Tensor view = q.reshape({3, 1});
        q.assign(q * 2.0f).realize();
        CHECK_EQ(view.to_vector(), floats({22, 24, 26}));
        // two assignments to one buffer in one realize
        std::string first = "test_reliability.cpp:" + std::to_string(__LINE__ + 1);
        Tensor a1 = q.assign(q + 1.0f);
        Tensor a2 = q.assign(q + 2.0f);
        CHECK_THROWS(tg::realize({a1, a2}), "two assignments", first.c_str());
        a1.realize();
        CHECK_THROWS(a2.realize(), "stale read", "ADD"); // q + 2 was built before a1 wrote q
    });
}

TEST(stale_reads_after_optimizer_steps_are_errors) {
    Tensor w = Tensor::from_vector(floats({1, -2})).requires_grad();
    tg::optim::SGD opt({w}, 0.5);
    Tensor x = Tensor::from_vector(floats({3, 4}));
    Tensor pred = (w * x).sum(), kept = (w * x).sum();
    Tensor loss = pred * pred;
    loss.backward();
    kept.realize(); // the whole step would realize it too: tg::realize({kept}) before the step
    opt.step();
    CHECK_EQ(kept.item(), -5.0);                 // computed before the update
    CHECK_THROWS(pred.item(), "stale read");     // built before the update, never realized
    CHECK_THROWS(loss.backward(), "stale read"); // its graph read w before the update
    Tensor fresh = (w * x).sum();                // built after: the new weights
    CHECK_NEAR(fresh.item(), (1 - 0.5 * 2 * -5 * 3) * 3 + (-2 - 0.5 * 2 * -5 * 4) * 4, 1e-6);
    // a jitted step updates in place too
    tg::Jit step([&](const std::vector<Tensor>& in) {
        Tensor l = ((w * in[0]).sum() - 1.0f).pow(2);
        opt.zero_grad();
        l.backward();
        opt.step();
        return l;
    });
    step({x});
    Tensor built = (w * x).sum();
    step({x});
    CHECK_THROWS(built.item(), "stale read");
}

// ---- shapes, empty tensors, and errors that point to the right place ---------------------------

TEST(shapes_too_large_and_empty_reductions) {
    const int64_t big = int64_t(1) << 40;
    CHECK_THROWS(Tensor::ones({big, big}), "ones", "2^63");
    CHECK_THROWS(Tensor::zeros({big, big, 1}), "zeros", "2^63");
    CHECK_THROWS(Tensor::rand({big, big}), "rand", "2^63");
    CHECK_THROWS(Tensor::ones({big, 1}).expand({big, big}), "expand", "2^63");
    CHECK_THROWS(Tensor::ones({big, 2}).pad({{0, 0}, {0, big}}), "pad", "2^63");
    CHECK_THROWS(Tensor::ones({2}).pad({{INT64_MAX, 0}}), "pad", "too large");
    // with a zero size, the product of the others still bounds the strides of a view
    CHECK_THROWS(Tensor::zeros({0, big / 256, big / 256}), "zeros", "too large");
    CHECK_THROWS(Tensor::zeros({0}).reshape({0, big, big}), "reshape", "too large");
    on_each_device([](const std::string& dev) {
        Tensor e = Tensor::zeros({0, 3});
        CHECK_THROWS(e.argmax(0), "argmax", "axis 0", "[0,3]", "empty");
        CHECK_THROWS(e.max(), "max", "empty");
        CHECK_THROWS(e.min(0), "min", "empty");
        CHECK_THROWS(Tensor::zeros({0}).max(), "max", "empty");
        CHECK_EQ(e.max(1).shape(), (Shape{0})); // nothing is reduced over an empty axis here
        CHECK_SAME(dev, e.sum(0).to_vector<double>(), {0, 0, 0});
        CHECK_SAME(dev, Tensor::zeros({0}).sum().to_vector<double>(), {0});
        CHECK(std::isnan(Tensor::zeros({0}).mean().item()));
    });
}

TEST(index_errors_name_the_indexing_line_once) {
    for (const char* dev : {"CPU", "INTERP"}) {
        EnvGuard g("TG_DEVICE", dev);
        Tensor C = Tensor::randn({27, 10}, 1).requires_grad();
        tg::optim::SGD opt({C}, 0.1);
        Tensor X = Tensor::from_vector(std::vector<int32_t>{3, 27});
        std::string here = "(at test_reliability.cpp:" + std::to_string(__LINE__ + 1) + ")";
        Tensor emb = C[X];
        emb.sum().backward();
        try {
            opt.step();
            tg::synchronize();   // on the CPU the step ran in the background
            th::report(__FILE__, __LINE__, std::string(dev) + ": nothing thrown");
        } catch (const tg::Error& e) {
            std::string m = e.what();
            CHECK(m.find("index: index out of range [0, 27)") != std::string::npos);
            CHECK(m.find("got 27") != std::string::npos && m.find(here) != std::string::npos);
            CHECK_EQ(m.find("(at "), m.rfind("(at ")); // once
        }
    }
}

TEST(environment_values_are_checked) {
    {
        EnvGuard dev("TG_DEVICE", "cpu"); // any case
        CHECK_EQ(tg::detail::default_device().name(), std::string("CPU"));
        dev.set("Interp");
        CHECK_EQ((Tensor::ones({2}) * 3.0f).to_vector(), floats({3, 3}));
        dev.set("gpu");
        CHECK_THROWS(Tensor::ones({2}).to_vector(), "unknown device 'gpu'", "CPU", "INTERP");
    }
    EnvGuard debug("TG_DEBUG", "abc");
    // (computed tensors: a constant is filled without a program, and reads no TG_DEBUG)
    CHECK_THROWS((Tensor::arange(2) + 1).to_vector<int32_t>(), "TG_DEBUG", "'abc'");
    debug.set("9");
    CHECK_THROWS((Tensor::arange(2) + 2).to_vector<int32_t>(), "TG_DEBUG", "0 to 4");
}

// ---- TG_CHECK: the first kernel that produces a NaN or an infinity ---------------------------

TEST(check_mode_names_the_first_kernel_with_nan_or_inf) {
    on_each_device([](const std::string& dev) {
        EnvGuard check("TG_CHECK", "1");
        Tensor x = Tensor::from_vector(floats({1, -1, 4}));
        std::string here = "(at test_reliability.cpp:" + std::to_string(__LINE__ + 1) + ")";
        Tensor logs = x.log();
        Tensor later = (logs * 2.0f).sum();
        CHECK_THROWS(tg::realize({logs, later}), "TG_CHECK", "a NaN at element 1", "LOG2",
                     here.c_str());
        Tensor num = Tensor::from_vector(std::vector<double>{1, 2, 3});
        Tensor den = Tensor::from_vector(std::vector<double>{1, 0, 1});
        here = "(at test_reliability.cpp:" + std::to_string(__LINE__ + 1) + ")";
        Tensor ratio = num / den;
        CHECK_THROWS(ratio.realize(), "TG_CHECK", "an infinity at element 1", "float64",
                     here.c_str());
        CHECK_EQ((x * 2.0f).to_vector(), floats({2, -2, 8})); // finite: runs as usual
        check.set("0");
        CHECK(std::isnan(x.log().to_vector()[1])); // off: NaN is a value like any other
        (void)dev;
    });
}

// A letter repeated n times takes n - 1 diagonals: the loop IR grows linearly with n (a
// diagonal that nested a condition into the index per level made it grow as 2^n).
TEST(einsum_repeated_letters_stay_linear) {
    auto ir_size = [](int n) {
        return tg::inspect(
                   {tg::einsum(std::string(size_t(n), 'i'), {Tensor::ones(Shape(size_t(n), 2))})})
            .optimized_ir.size();
    };
    size_t ten = ir_size(10), twenty = ir_size(20);
    CHECK(twenty < 3 * ten);
    EnvGuard dev("TG_DEVICE", "INTERP");
    CHECK_EQ(tg::einsum(std::string(24, 'i'), {Tensor::ones(Shape(24, 2))}).item(), 2.0);
}

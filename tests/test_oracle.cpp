// The compiler oracle (tests/random_graphs.hpp): random graphs of the Tensor API, with their
// gradients, realized optimized on the CPU device and as unoptimized loop IR on INTERP
// (TG_PASSES=none) must agree. A fixed range of seeds runs here; make oracle SEED=S COUNT=N
// runs any. Random graphs also give the same bits in a quick build and an optimized one, and
// on one thread and on three. The other cases check the oracle itself: that its two runs
// really differ in device, that the generator is deterministic, that the comparison catches
// what it should and that the shrinker keeps a failure while it removes nodes.
#include "harness.hpp"
#include "random_graphs.hpp"
#include <cmath>
#include <set>
#include <string>
#include <vector>

namespace {

const oracle::Tolerance tolerance;

// The first few failures are minimized (each try compiles a program); the others are listed.
std::string failure_text(const oracle::Graph& g, const std::string& what, bool shrink) {
    std::string s = "graph " + std::to_string(g.seed) + ": " + what + "\n" + oracle::listing(g);
    std::string rerun = "rerun: make oracle SEED=" + std::to_string(g.seed) + " COUNT=1";
    if (!shrink) return s + rerun;
    oracle::Graph small = oracle::minimize(
        g, [](const oracle::Graph& c) { return !oracle::check_one(c, tolerance).empty(); }, 60);
    if (small.nodes.size() < g.nodes.size())
        s += "minimized (" + oracle::check_one(small, tolerance) + "):\n" + oracle::listing(small);
    return s + rerun;
}

}  // namespace

// Seeds 1-240 in batches of 12 graphs per program: the C compiler's time is most of it. Every
// other batch tiles every product and sum of columns, however small (TG_TILE_MIN_WORK=1).
TEST(oracle_random_graphs) {
    const uint64_t first = 1;
    const int count = 240, batch = 12;
    std::set<int> kinds, modes;
    int64_t values = 0;
    double worst = 0;
    int failures = 0;
    for (int start = 0; start < count; start += batch) {
        std::vector<oracle::Graph> graphs;
        for (int i = start; i < start + batch && i < count; i++) {
            graphs.push_back(oracle::generate(first + uint64_t(i)));
            for (const oracle::Node& n : graphs.back().nodes) kinds.insert(int(n.kind));
            modes.insert(int(graphs.back().grad_mode));
        }
        th::EnvGuard tiles("TG_TILE_MIN_WORK", start / batch % 2 ? "1" : "32768");
        oracle::Report r = oracle::check(graphs, tolerance);
        for (const oracle::Failure& f : r.failures)
            th::report(__FILE__, __LINE__,
                       failure_text(graphs[f.index], f.what, failures++ < 3));
        values += r.values;
        worst = std::max(worst, r.worst);
    }
    // the seeds reach every kind of node and every way of taking gradients
    CHECK_EQ(int(kinds.size()), int(oracle::Kind::KIND_COUNT));
    CHECK_EQ(int(modes.size()), 4);
    CHECK(values > 20000);
    // agreeing graphs stay well inside the tolerance (it is not what makes them pass)
    CHECK(worst < 0.5);
}

// The reference run compiles nothing (it interprets), the optimized one compiles its program,
// and both put the environment back as they found it.
TEST(oracle_runs_two_devices) {
    th::EnvGuard device("TG_DEVICE", "cpu");
    th::EnvGuard passes("TG_PASSES", "all");
    oracle::Graph g = oracle::generate(7);
    auto compiled = [] {
        tg::Stats s = tg::stats();
        return s.compiles + s.disk_cache_hits + s.memory_cache_hits;
    };
    int64_t before = compiled();
    oracle::Outcome ref = oracle::run({&g}, oracle::Mode::REFERENCE_INTERP)[0];
    CHECK_EQ(compiled(), before);
    oracle::Outcome cpu = oracle::run({&g}, oracle::Mode::OPTIMIZED_CPU)[0];
    CHECK(compiled() > before);
    CHECK_EQ(std::string(std::getenv("TG_DEVICE")), std::string("cpu"));
    CHECK_EQ(std::string(std::getenv("TG_PASSES")), std::string("all"));
    CHECK(ref.error.empty());
    CHECK(!ref.entries.empty());
    CHECK_EQ(oracle::compare(cpu, ref, tolerance), std::string());
    tg::ProgramInfo all = tg::last_program();
    CHECK(all.nests < all.nests_lowered);
}

// The optimized run takes the caller's TG_PASSES (to bisect a mismatch to a pass).
TEST(oracle_optimizes_with_the_callers_passes) {
    th::EnvGuard passes("TG_PASSES", "none");
    oracle::Graph g = oracle::generate(7);
    oracle::Outcome cpu = oracle::run({&g}, oracle::Mode::OPTIMIZED_CPU)[0];
    CHECK(cpu.error.empty());
    tg::ProgramInfo none = tg::last_program();
    CHECK(none.nests_lowered > 1);
    CHECK_EQ(none.nests, none.nests_lowered);
}

// splitmix64 is pinned (its first output from 0 is a published value), so a seed names the same
// graph with every compiler and standard library.
TEST(oracle_generator_is_deterministic) {
    oracle::Rng rng(0);
    CHECK_EQ(rng.next(), 0xE220A8397B1DCDAFull);
    CHECK_EQ(oracle::listing(oracle::generate(12345)), oracle::listing(oracle::generate(12345)));
    CHECK(oracle::listing(oracle::generate(12345)) != oracle::listing(oracle::generate(12346)));
    std::vector<float> grid = oracle::leaf_values<float>(99, 1000, -2, 2, 2);
    for (float v : grid) {
        CHECK(v >= -2 && v <= 2);
        CHECK_EQ(v * 4, float(int(v * 4)));
    }
    std::vector<int32_t> ints = oracle::leaf_values<int32_t>(99, 1000, 0, 6, 0);
    CHECK_EQ(*std::min_element(ints.begin(), ints.end()), 0);
    CHECK_EQ(*std::max_element(ints.begin(), ints.end()), 6);
}

// A swapped pair of elements (a wrong index), an integer off by one, a NaN, a missing gradient
// and a shape are all mismatches; a float32 rounding difference is not.
TEST(oracle_compare_catches_wrong_values) {
    oracle::Entry floats{"t1", true, tg::DType::FLOAT32, {2, 2}, {0.5, -1.25, 3.0, 2.0}};
    oracle::Entry ints{"t2", true, tg::DType::INT32, {3}, {1, 2, 3}};
    oracle::Outcome want{{floats, ints}, ""};
    CHECK_EQ(oracle::compare(want, want, tolerance), std::string());

    oracle::Outcome rounded = want;
    for (double& v : rounded.entries[0].values) v = double(std::nextafter(float(v), 10.0f));
    CHECK_EQ(oracle::compare(rounded, want, tolerance), std::string());

    oracle::Outcome swapped = want;
    std::swap(swapped.entries[0].values[1], swapped.entries[0].values[2]);
    std::string what = oracle::compare(swapped, want, tolerance);
    CHECK(what.find("t1 float32[2,2] at element 1 {0, 1}") != std::string::npos);
    CHECK(what.find("2 of 4 elements differ") != std::string::npos);

    oracle::Outcome off = want;
    off.entries[1].values[2] = 4;
    CHECK(oracle::compare(off, want, tolerance).find("t2 int32[3] at element 2") !=
          std::string::npos);

    oracle::Outcome nan = want;
    nan.entries[0].values[0] = std::nan("");
    CHECK(!oracle::compare(nan, want, tolerance).empty());

    oracle::Outcome missing = want;
    missing.entries[1].defined = false;
    CHECK(oracle::compare(missing, want, tolerance).find("defined on one device only") !=
          std::string::npos);

    oracle::Outcome reshaped = want;
    reshaped.entries[0].shape = {4};
    CHECK(!oracle::compare(reshaped, want, tolerance).empty());

    oracle::Outcome failed = want;
    failed.error = "running: boom";
    CHECK(oracle::compare(failed, want, tolerance).find("boom") != std::string::npos);
}

// With a stand-in for "fails" (the graph still has a matmul), the shrinker removes nodes, keeps
// the matmul, and what it leaves still builds and runs.
TEST(oracle_minimize_keeps_the_failure) {
    auto has_matmul = [](const oracle::Graph& g) {
        for (const oracle::Node& n : g.nodes)
            if (n.kind == oracle::Kind::MATMUL) return true;
        return false;
    };
    uint64_t seed = 1;
    while (!has_matmul(oracle::prune(oracle::generate(seed))) ||
           oracle::prune(oracle::generate(seed)).nodes.size() < 8)
        seed++;
    oracle::Graph g = oracle::generate(seed);
    oracle::Graph small = oracle::minimize(g, has_matmul);
    CHECK(has_matmul(small));
    CHECK(small.nodes.size() < g.nodes.size());
    CHECK(small.nodes.size() <= 3);   // the matmul and two leaves
    oracle::Outcome out = oracle::run({&small}, oracle::Mode::REFERENCE_INTERP)[0];
    CHECK_EQ(out.error, std::string());
}

// Random graphs as training steps (the leaves that require grad are parameters that SGD
// moves; the other data leaves take new values at each call): three calls under tg::Jit, a
// trace and two replays, give the losses and parameters of three eager steps, bit for bit.
// Graphs 135 and 188 slice rows of an input, which replays once read from the traced input.
TEST(jitted_random_graphs_train_as_eager_steps_do) {
    int trained = 0;
    for (uint64_t seed = 135; seed < 195; seed++) {
        oracle::Graph g = oracle::generate(seed);
        trained += oracle::loss_tracks(g);
        std::string what = oracle::check_jit(g);
        if (!what.empty())
            th::report(__FILE__, __LINE__, "graph " + std::to_string(seed) + ": " + what + "\n" +
                                               oracle::listing(g));
    }
    CHECK(trained >= 40);
}

// Graph 401379 of an earlier generator (the seed names another graph since cumsum, topk and
// the other calls joined it), found by a long run: the gradient of min over a column counts
// the elements equal to the minimum, recomputing them in a second loop. With multiply-adds
// fused in one loop and not in the other, no element equalled the minimum (a NaN gradient on
// the CPU); C kernels now compile with -ffp-contract=off.
TEST(oracle_graph_401379_ties_of_a_value_computed_in_two_loops) {
    using tg::Tensor;
    Tensor x = Tensor::from_vector(
        oracle::leaf_values<int32_t>(0x1e75ab787d50389bull, 168, -4.0, 4.0, 0), {24, 7});
    Tensor s = Tensor::from_vector(
        oracle::leaf_values<float>(0xc3fff5dbb516febull, 1, -2.0, 2.0, 2), {}).requires_grad();
    Tensor w = Tensor::from_vector(
        oracle::leaf_values<float>(0x6712c3ea315975c1ull, 7, -1, 1, -1), {7});
    (oracle::layer_norm(x, 1).minimum(s).min(0) * w).sum().backward();
    CHECK(std::isfinite(s.grad().item()));
}

// The quick build (-O0) and the optimized build (-O3) of a program give the same bits, so a
// program may switch builds between runs (tinygrad.hpp, CompiledProgram): random graphs with
// their gradients, one batch with every product and sum of columns tiled.
TEST(quick_and_optimized_builds_give_the_same_bits) {
    if (std::string(oracle::optimized_device()) != "CPU") SKIP("TG_ORACLE_DEVICE is not CPU");
    for (int batch = 0; batch < 2; batch++) {
        std::vector<oracle::Graph> graphs;
        std::vector<const oracle::Graph*> ptrs;
        for (int i = 0; i < 12; i++)
            graphs.push_back(oracle::generate(uint64_t(5000 + 12 * batch + i)));
        for (const oracle::Graph& g : graphs) ptrs.push_back(&g);
        th::EnvGuard tiles("TG_TILE_MIN_WORK", batch ? "1" : "32768");
        th::EnvGuard flags("TG_CFLAGS", "-O0 -march=native");
        std::vector<oracle::Outcome> quick = oracle::run(ptrs, oracle::Mode::OPTIMIZED_CPU);
        flags.set("-O3 -march=native");
        std::vector<oracle::Outcome> optimized = oracle::run(ptrs, oracle::Mode::OPTIMIZED_CPU);
        CHECK_EQ(quick.size(), optimized.size());
        for (size_t k = 0; k < quick.size() && k < optimized.size(); k++) {
            CHECK(quick[k].error.empty());
            std::string what = oracle::same_bits(quick[k], optimized[k]);
            if (!what.empty())
                th::report(__FILE__, __LINE__, "graph " + std::to_string(graphs[k].seed) +
                                                   ": the builds differ: " + what);
        }
    }
}

// Results are the same bits on any number of threads: random graphs with every nest that can
// run in chunks on threads, however small (TG_PARALLEL_MIN_WORK=1), on 1 thread and on 3; one
// batch with every product and sum of columns tiled too. (A pool that dropped the last row of
// one chunk when on several threads failed it: checked.) Bits one ulp apart are a difference.
TEST(threads_give_the_same_bits_on_random_graphs) {
    if (std::string(oracle::optimized_device()) != "CPU") SKIP("TG_ORACLE_DEVICE is not CPU");
    int chunked = 0;
    for (int batch = 0; batch < 2; batch++) {
        std::vector<oracle::Graph> graphs;
        for (int i = 0; i < 12; i++)
            graphs.push_back(oracle::generate(uint64_t(7000 + 12 * batch + i)));
        th::EnvGuard tiles("TG_TILE_MIN_WORK", batch ? "1" : "32768");
        for (const oracle::Failure& f : oracle::check_threads(graphs, 3))
            th::report(__FILE__, __LINE__, "graph " + std::to_string(graphs[f.index].seed) +
                                               ": " + f.what + "\n" +
                                               oracle::listing(graphs[f.index]));
        th::EnvGuard min_work("TG_PARALLEL_MIN_WORK", "1");
        for (const oracle::Graph& g : graphs) {
            oracle::Built b = oracle::build(g);
            std::vector<tg::Tensor> targets;
            for (const tg::Tensor& t : b.tensors)
                if (t.defined()) targets.push_back(t);
            chunked += th::count_of(tg::inspect(targets).optimized_ir, "[parallel:");
        }
    }
    CHECK(chunked >= 24);   // the graphs did run in chunks (39 nests when written)
    oracle::Outcome a, b;
    a.entries.resize(1);
    a.entries[0].defined = true;
    a.entries[0].values = {1.0, 2.0};
    b = a;
    CHECK(oracle::same_bits(a, b).empty());
    b.entries[0].values[1] = std::nextafter(2.0, 3.0);
    CHECK(!oracle::same_bits(a, b).empty());
}

// The CUDA device (cuda_backend.hpp) and the device seam: tensors know their device, to()
// moves them, ops mixing devices fail. Without a GPU: every program the test run builds is
// rendered to CUDA C and compiled by NVRTC (skipped when NVRTC is absent), and the
// CUDA device fails with a clear error. With a GPU: ops, gradients, bounds checks and the
// allocator on CUDA against the CPU (make test-cuda also runs the op, gradient and training
// tests with TG_DEVICE=CUDA).
#include "harness.hpp"
#include "random_graphs.hpp"
#include "../cuda_backend.hpp"
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <dirent.h>
#include <dlfcn.h>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#ifdef TG_TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

using tg::Tensor;
using th::EnvGuard;

namespace {
// A device whose programs are planned as the CUDA device plans them (its passes), and not run:
// the plans of products too large to compute on the CPU or the stand-in in a test.
struct PlanOnly : tg::detail::Device {
    struct Nothing : tg::detail::Executable {
        void run(void* const*, int64_t*) override {}
    };
    const char* name() const override { return "CUDA_PLAN"; }
    void* alloc(size_t bytes) override { return std::calloc(bytes ? bytes : 1, 1); }
    void free(void* ptr) override { std::free(ptr); }
    void copy_in(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
    void copy_out(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
    bool host_memory() const override { return true; }
    std::shared_ptr<tg::detail::Executable> prepare(const tg::detail::Program&) override {
        return std::make_shared<Nothing>();
    }
    bool runs_pass(const std::string& pass) const override {
        return tg::detail::device("CUDA").runs_pass(pass);
    }
    bool recomputes_calls() const override { return tg::detail::device("CUDA").recomputes_calls(); }
};

// Every program of this run built with all the passes, rendered for CUDA as it is prepared
// for its own device. One built under TG_PASSES (test_passes.cpp runs the IR with passes left
// out) is not: it is a debugging form of what the default passes build, and its unsimplified
// indices (one line of 770 KB) took NVRTC's fast compile 50 s, a quarter of make test's NVRTC
// time. Each kernel is kept once, by its code (as render_cuda_kernels compares kernels: its
// name, comments and buffer numbers aside), with the first program that made it: the run's
// programs share many kernels, and NVRTC's time is the kernels'.
struct Kernel {
    std::string program, code;   // code: the function, named KERNEL
};
struct Rendered {
    size_t programs = 0;
    std::vector<Kernel> kernels;
    std::set<uint64_t> seen;
    std::vector<std::string> render_errors;
    size_t under_chosen_passes = 0;
};
Rendered& rendered() {
    static Rendered r;
    return r;
}
uint64_t hash_of(const std::string& s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}
bool identifier_char(char c) { return std::isalnum((unsigned char)c) || c == '_'; }
// A __global__ function's text as compared: named KERNEL, without its line comments (launch
// names), its buffers renumbered buf0, buf1, ... in the order the text names them.
std::string canonical_kernel(const std::string& fn) {
    std::string code;
    for (size_t at = 0; at < fn.size();) {
        size_t comment = fn.find("//", at), eol = fn.find('\n', comment);
        if (comment == std::string::npos) { code += fn.substr(at); break; }
        code += fn.substr(at, comment - at);
        at = eol == std::string::npos ? fn.size() : eol;
    }
    size_t name = code.find(" void ") + 6;
    if (code.compare(name, 18, "__launch_bounds__(") == 0) name = code.find(") ", name) + 2;
    code.replace(name, code.find('(', name) - name, "KERNEL");
    std::map<std::string, std::string> renamed;
    std::string out;
    for (size_t i = 0; i < code.size(); i++) {
        if (code.compare(i, 3, "buf") == 0 && (i == 0 || !identifier_char(code[i - 1])) &&
            i + 3 < code.size() && std::isdigit((unsigned char)code[i + 3])) {
            size_t e = i + 3;
            while (e < code.size() && std::isdigit((unsigned char)code[e])) e++;
            if (e == code.size() || !identifier_char(code[e])) {
                std::string& to = renamed[code.substr(i, e - i)];
                if (to.empty()) to = "buf" + std::to_string(renamed.size() - 1);
                out += to;
                i = e - 1;
                continue;
            }
        }
        out += code[i];
    }
    return out;
}
const bool collecting = [] {
    if (!tg::cuda::nvrtc_available()) return false;
    tg::detail::program_observer() = [](const tg::detail::Program& p) {
        Rendered& r = rendered();
        const char* passes = std::getenv("TG_PASSES");   // read by this prepare, on this thread
        if (passes && std::strcmp(passes, "all") != 0) {
            r.under_chosen_passes++;
            return;
        }
        try {
            std::string src = tg::detail::render_cuda(p);
            r.programs++;
            const std::string marker = "extern \"C\" __global__ ";
            for (size_t at = 0; (at = src.find(marker, at)) != std::string::npos;) {
                size_t end = src.find("\n}\n", at);
                if (end == std::string::npos) {
                    r.render_errors.push_back(p.name + ": a kernel without its closing brace");
                    break;
                }
                end += 3;
                std::string code = canonical_kernel(src.substr(at, end - at));
                if (r.seen.insert(hash_of(code)).second) r.kernels.push_back({p.name, code});
                at = end;
            }
        } catch (const std::exception& e) {
            r.render_errors.push_back(p.name + ": " + e.what());
        }
    };
    return true;
}();

// Kernels in NVRTC calls of up to 128, with the helpers they use, each named by its place:
// those that declare shared memory (tiles, block reductions) compiled to a CUBIN for sm_90
// (TG_NVRTC_FLAGS), so that ptxas checks what they declare against the GPU's limits; the
// others to PTX alone (nvrtc_check, ptxas took six sevenths of the time) with quick_flags, and
// one of more than 128 KB alone with large_flags. A batch that fails is compiled kernel by
// kernel to name the program at fault.
std::vector<std::string> compile_all(const std::vector<Kernel>& all, const std::string& quick_flags,
                                     const std::string& large_flags, size_t* assembled) {
    enum Kind { ASSEMBLED, LARGE, QUICK };
    auto kind = [](const Kernel* k) {
        if (k->code.find("__shared__") != std::string::npos ||
            k->code.find("tg_block_reduce") != std::string::npos)
            return ASSEMBLED;
        return k->code.size() > 128 * 1024 ? LARGE : QUICK;
    };
    std::vector<std::pair<Kind, const Kernel*>> sorted;
    for (const Kernel& k : all) sorted.push_back({kind(&k), &k});
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<const Kernel*> ks;
    for (const auto& [k, kernel] : sorted) ks.push_back(kernel);
    struct Batch {
        size_t first, last;
        Kind kind;
    };
    std::vector<Batch> batches;
    *assembled = 0;
    for (size_t i = 0; i < ks.size(); i++) {
        Kind k = sorted[i].first;
        *assembled += k == ASSEMBLED;
        if (batches.empty() || batches.back().kind != k || k == LARGE ||
            batches.back().last - batches.back().first == 128)
            batches.push_back({i, i, k});
        batches.back().last = i + 1;
    }
    auto compile = [&](size_t first, size_t last, Kind k, const std::string& name) {
        std::string code;
        for (size_t i = first; i < last; i++) {
            std::string fn = ks[i]->code;
            code += "\n" + fn.replace(fn.find("KERNEL("), 6, "k" + std::to_string(i));
        }
        code = tg::detail::cuda_prelude(code) + code;
        if (k == ASSEMBLED) tg::detail::nvrtc_compile(code, 90, name);
        else tg::detail::nvrtc_check(code, 90, name, k == LARGE ? large_flags : quick_flags);
    };
    std::vector<std::string> failures;
    std::mutex m;
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t b; (b = next++) < batches.size();) {
            const Batch& batch = batches[b];
            try {
                compile(batch.first, batch.last, batch.kind, "batch.cu");
            } catch (const tg::Error&) {
                for (size_t i = batch.first; i < batch.last; i++) try {
                        compile(i, i + 1, batch.kind, ks[i]->program + ".cu");
                    } catch (const tg::Error& e) {
                        std::lock_guard<std::mutex> lock(m);
                        failures.push_back(e.what());
                    }
            }
        }
    };
    std::vector<std::thread> threads;   // a thread per core: the batches are independent
    for (unsigned t = 1; t < std::max(1u, std::thread::hardware_concurrency()); t++)
        threads.emplace_back(work);
    work();
    for (std::thread& t : threads) t.join();
    return failures;
}

bool gpu(std::string* why = nullptr) { return tg::cuda::available(why); }
// make test runs the CUDA tests a second time on tests/cuda_on_cpu.cpp, the driver API and
// NVRTC on the CPU
bool stand_in() { return gpu() && tg::cuda::gpu_name().find("cuda_on_cpu") != std::string::npos; }

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

// The .cu files that TG_DEBUG >= 2 kept in a cache dir (NAME-HASH.cu), with their paths
std::vector<std::string> kept_cu_files(const std::string& dir) {
    std::vector<std::string> kept;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) {
            std::string n = e->d_name;
            if (n.size() > 3 && n.compare(n.size() - 3, 3, ".cu") == 0 && n.find('-') != n.npos)
                kept.push_back(dir + "/" + n);
        }
        closedir(d);
    }
    return kept;
}

}  // namespace

// ---- the device seam, with INTERP as the second device --------------------------------------

TEST(device_each_tensor_knows_its_device) {
    EnvGuard cpu("TG_DEVICE", "CPU");   // also under make test-cuda
    Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3});
    CHECK_EQ(a.device(), std::string("CPU"));
    Tensor b = a.to("INTERP");
    CHECK_EQ(b.device(), std::string("INTERP"));
    CHECK_EQ((b * 2 + 1).device(), std::string("INTERP"));   // constants follow
    CHECK_ALL_NEAR(values((b * 2 + 1).exp()), values((a * 2 + 1).exp()), 1e-6);
    CHECK_EQ(b.to("interp").node(), b.node());                 // already there: itself
    CHECK_ALL_NEAR(values(b.to("CPU")), (std::vector<float>{1, 2, 3}), 0);
    cpu.set("INTERP");
    CHECK_EQ(Tensor::ones({2}).device(), std::string("INTERP"));
    CHECK_EQ(a.device(), std::string("CPU"));                  // made before: stays
}

TEST(device_mixing_is_an_error_naming_both) {
    EnvGuard cpu("TG_DEVICE", "CPU");   // also under make test-cuda
    Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3});
    Tensor b = Tensor::from_vector(std::vector<float>{4, 5, 6}).to("INTERP");
    CHECK_THROWS(a + b, "ADD", "different devices", "float32 [3] on CPU",
                 "float32 [3] on INTERP", "test_cuda.cpp");
    CHECK_THROWS(a.matmul(b.reshape({3, 1})), "different devices", "CPU", "INTERP");
    CHECK_THROWS(a.to("TPU"), "unknown device 'TPU'", "CPU", "INTERP");
}

TEST(device_moved_leaf_trains_there) {
    EnvGuard cpu("TG_DEVICE", "CPU");   // also under make test-cuda
    Tensor w = Tensor::from_vector(std::vector<float>{0.5f, -1.0f}).requires_grad();
    Tensor wi = w.to("INTERP");
    CHECK(wi.tracks_grad());
    Tensor x = Tensor::from_vector(std::vector<float>{2, 3}).to("INTERP");
    (wi * x).sum().backward();
    CHECK_EQ(wi.grad().device(), std::string("INTERP"));
    CHECK_ALL_NEAR(values(wi.grad()), (std::vector<float>{2, 3}), 0);
    CHECK(!w.grad().defined());   // the copy's gradient stays with the copy
    CHECK_THROWS((w * 2).to("INTERP"), "to:", "require grad", "detach", "test_cuda.cpp");
}

TEST(device_jit_keeps_to_its_device) {
    EnvGuard cpu("TG_DEVICE", "CPU");   // also under make test-cuda
    tg::Jit step([](const std::vector<Tensor>& in) { return (in[0] * 3).sum(); });
    Tensor x = Tensor::from_vector(std::vector<float>{1, 2});
    CHECK_NEAR(step({x}).item(), 9, 0);
    CHECK_NEAR(step({x}).item(), 9, 0);
    CHECK_THROWS(step({x.to("INTERP")}), "jit: input 0 is on INTERP, traced on CPU");
    tg::Jit moving([](const std::vector<Tensor>& in) { return in[0].to("INTERP"); });
    CHECK_THROWS(moving({x}), "to:", "jitted step");
    Tensor elsewhere = Tensor::from_vector(std::vector<float>{3}).to("INTERP");
    tg::Jit two([&](const std::vector<Tensor>& in) {
        (elsewhere * 2).realize();
        return in[0] * 2;
    });
    CHECK_THROWS(two({x}), "one program cannot compute on two devices", "CPU", "INTERP");
}

// A backward on one device and a read on another run as two programs, one per device.
TEST(device_pending_work_runs_per_device) {
    EnvGuard cpu("TG_DEVICE", "CPU");   // also under make test-cuda
    Tensor w = Tensor::from_vector(std::vector<float>{1, 2}).to("INTERP").requires_grad();
    (w * w).sum().backward();
    Tensor c = Tensor::from_vector(std::vector<float>{5});
    CHECK_NEAR((c * 2).item(), 10, 0);
    CHECK_ALL_NEAR(values(w.grad()), (std::vector<float>{2, 4}), 0);
}

// ---- CUDA without a GPU ------------------------------------------------------------------------

TEST(cuda_without_a_driver_is_a_clear_error) {
    std::string why;
    if (gpu()) SKIP("a GPU is present (the GPU cases test the device)");
    CHECK(!tg::cuda::available(&why));
    CHECK(why.find("CUDA: ") == 0);
    // which library or call failed
    CHECK(why.find("libcuda.so.1") != std::string::npos ||
          why.find("cuInit") != std::string::npos || why.find("cuDevice") != std::string::npos);
    Tensor a = Tensor::from_vector(std::vector<float>{1, 2});
    CHECK_THROWS(a.to("CUDA"), "CUDA: ");
    EnvGuard dev("TG_DEVICE", "CUDA");
    CHECK_THROWS(Tensor::ones({2}).to_vector(), "CUDA: ");
}

TEST(cuda_rendering_names_kernels_and_maps_outer_loops_to_threads) {
    // rows short enough (8 x 8 multiply-adds) for a thread each
    Tensor a = Tensor::randn({64, 8}, 1).realize(), b = Tensor::randn({8, 8}, 2).realize();
    tg::detail::Program captured;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) { captured = p; };
    a.matmul(b).relu().sum(1).realize();
    tg::detail::program_observer() = saved;
    std::string cu = tg::detail::render_cuda(captured);
    CHECK(cu.find("extern \"C\" __global__") != std::string::npos);
    CHECK(cu.find("blockIdx.x") != std::string::npos);
    CHECK(cu.find("if (t >= 64LL) return;") != std::string::npos);   // one thread per row
    CHECK(cu.find("#include") == std::string::npos);                 // NVRTC: no headers
    std::string why;
    if (!tg::cuda::nvrtc_available(&why)) SKIP("NVRTC is absent: " + why);
    std::string cubin = tg::detail::nvrtc_compile(cu, 90, "matmul.cu");
    CHECK(cubin.size() > 4 && std::memcmp(cubin.data(), "\x7f" "ELF", 4) == 0);
    CHECK_THROWS(tg::detail::nvrtc_compile("__global__ void k() { undefined_name; }", 90, "bad.cu"),
                 "NVRTC", "bad.cu", "undefined_name", "sm_90");
    // TG_DEBUG >= 4's build: line tables that name the source file TG_DEBUG keeps, which is
    // where cuda-gdb reads a kernel's lines (the debugger itself: cuda_debugger_stops_...)
    const std::string kept = "/tmp/tg-kept/matmul-0123abcd.cu";
    std::string debug = tg::detail::nvrtc_compile(cu, 90, kept, true);
    std::string plain = tg::detail::nvrtc_compile(cu, 90, kept, false);
    CHECK(debug.find(".debug_line") != std::string::npos);
    CHECK(debug.find("matmul-0123abcd.cu") != std::string::npos);
    CHECK(plain.find(".debug_line") == std::string::npos);
}

// How nests map to the GPU (no GPU needed): a long sum with one output is a block of threads
// with one block reduction (its tree's segments each a loop split over the threads); each of
// many rows (5000 > COOPERATIVE_MAX_ITEMS) that an item walks along is a warp with a warp's
// reduction (a block where they are fewer than 8 per multiprocessor: 500 of 300; a warp again
// where each loop of a row is shorter than a block: 500 of 130, 500 of 40), but not each of
// many columns, whose threads read side by side; an
// optimizer's update is a grid over the elements (its values before the loop go into it where
// fuse_maps runs); a scatter (an index_select's gradient) is a grid over its columns, each
// summing its rows in order after a kernel that zeroes the output, and one of many rows sums
// ranges of them into copies first; a product of few outputs and a long sum keeps 64 x 64
// tiles and splits its terms, or 128 x 128 ones where 64 x 64 would not need splitting; a
// product takes 128 x 128 tiles where the busiest multiprocessor computes no more outputs than
// in 64 x 64 ones.
TEST(cuda_plans_nests_for_the_gpu) {
    // the passes CudaDevice runs (runs_pass), on whichever device this run uses
    EnvGuard passes("TG_PASSES", "simplify,fuse_maps,substitute_temps,dead_stores,"
                                 "first_write,parallel_loops,plan_memory");
    std::vector<tg::detail::Program> programs;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) { programs.push_back(p); };
    Tensor a = Tensor::randn({4, 3000}, 5).realize();
    size_t sum_at = programs.size();
    (a * a).sum().realize();
    Tensor r = Tensor::randn({5000, 130}, 7).realize(), c = Tensor::randn({300, 5000}, 8).realize();
    size_t rows_from = programs.size();
    (r - r.mean(-1, true)).realize();
    size_t fewer_rows_from = programs.size();
    Tensor r500 = Tensor::randn({500, 300}, 12).realize();
    (r500 - r500.mean(-1, true)).realize();
    size_t short_rows_from = programs.size();
    Tensor r130 = Tensor::randn({500, 130}, 14).realize();
    (r130 - r130.mean(-1, true)).realize();
    Tensor r40 = Tensor::randn({500, 40}, 13).realize();
    r40.sum(-1).realize();
    size_t columns_from = programs.size();
    c.sum(0).realize();
    size_t columns_to = programs.size();
    Tensor few = Tensor::randn({300, 3000}, 11).realize();
    few.sum(0).realize();
    size_t few_columns_to = programs.size();
    size_t long_sum_from = programs.size();
    std::vector<size_t> tiles_from;   // the products whose tiles say the tile rule
    {   // computed on the CPU, whatever this run's device: only its plan matters. A fresh
        // cache: a program found in the cache (make test's run on the CPU) is not observed
        char tmpl[] = "/tmp/tg-cuda-plans-XXXXXX";
        std::string dir = mkdtemp(tmpl);
        {
            EnvGuard cpu("TG_DEVICE", "CPU"), cache("TG_CACHE_DIR", dir.c_str());
            Tensor x = Tensor::from_vector(std::vector<float>(384 * 4096, 0.5f), {384, 4096});
            Tensor y = Tensor::from_vector(std::vector<float>(4096 * 256, 0.25f), {4096, 256});
            x.matmul(y).realize();
        }
        {   // planned only: larger products, whose loops the CPU would run untiled here
            static PlanOnly plan_only;
            tg::detail::register_device("CUDA_PLAN", &plan_only);
            EnvGuard plan("TG_DEVICE", "CUDA_PLAN"), cache("TG_CACHE_DIR", dir.c_str());
            // 768 x 768 outputs of 4096 terms: 36 tiles of 128 x 128 in 7 ranges of 592
            // terms, rather than 144 of 64 x 64 whole
            // 2048 x 2048 outputs: 256 tiles of 128 x 128, two on most multiprocessors, as
            // many outputs as eight of 64 x 64; 1792 x 2048: 224 of 128 (two, 32768 outputs)
            // against 896 of 64 (seven, 28672): 64
            for (auto [rows, terms, cols] : {std::array<int64_t, 3>{768, 4096, 768},
                                             {2048, 16, 2048}, {1792, 16, 2048}}) {
                tiles_from.push_back(programs.size());
                Tensor x = Tensor::randn({rows, terms}).realize();
                Tensor y = Tensor::randn({terms, cols}).realize();
                x.matmul(y).realize();
            }
        }
        CHECK_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
    }
    size_t long_sum_to = programs.size();
    Tensor table = Tensor::randn({16, 8}, 9).requires_grad();
    Tensor many = Tensor::from_vector(th::randi(3000, 10, 0, 15));
    table.index_select(0, many).sum().backward();
    table.grad().realize();
    size_t many_rows_to = programs.size();
    Tensor w = Tensor::randn({16, 8}, 6).requires_grad();
    Tensor idx = Tensor::from_vector(std::vector<int32_t>{1, 3, 1, 5, 0});
    tg::optim::AdamW opt({w}, 1e-3, 0.9, 0.999, 1e-8, 0.01);
    w.index_select(0, idx).sum().backward();
    opt.step();
    w.realize();
    tg::detail::program_observer() = saved;
    bool reduced = false, adam = false, scatter = false, rows = false, columns = false;
    bool scatter_split = false, short_columns = false, fewer_rows = false, long_sum = false;
    int short_rows = 0;   // 500 of 130 and 500 of 40
    int64_t tiles_2048 = 0, tiles_1792 = 0;
    bool long_sum_128 = false;
    for (size_t n = 0; n < programs.size(); n++) {
        const tg::detail::Program& p = programs[n];
        std::string cu = tg::detail::render_cuda(p);
        reduced = reduced || (cu.find("tg_block_reduce<0>(acc") != std::string::npos &&
                              cu.find("int64_t t = blockIdx.x;") != std::string::npos);
        // 4 x 3000 terms, no power of 16: a loop per segment of the tree, one reduction
        if (n == sum_at) CHECK_EQ(th::count_of(cu, "tg_block_reduce<0>(acc"), 1);
        auto launches = tg::detail::launches_of(p);
        for (const auto& l : launches) {
            tg::detail::KernelPlan plan = tg::detail::plan_kernel(p, l.block, l.part);
            const std::string& title = l.part.title;
            if (title.find("DIV SQRT ASSIGN") != std::string::npos)   // Adam's update
                adam = adam || (plan.items == 128 && !plan.cooperative);
            if (title.find("SCATTER_ADD") != std::string::npos && plan.serial && n >= many_rows_to)
                scatter = scatter || (plan.items == 8 && plan.splits == 1 &&
                                      l.name.find('_') != std::string::npos);
            // 3000 rows: 91 ranges of 33 (the last 30), a thread per range and column, into
            // copies of the 16 x 8 gradient
            if (title.find("SCATTER_ADD") != std::string::npos && n >= columns_to &&
                n < many_rows_to && l.stage == 1)
                scatter_split = plan.serial && plan.splits == 91 && plan.rows_each == 33 &&
                                plan.items == 91 * 8 && plan.outputs == 128 &&
                                l.name.find("_terms") != std::string::npos &&
                                cu.find("tg_range[") != std::string::npos;
            if (n >= rows_from && n < fewer_rows_from && plan.items == 5000)
                rows = rows || (plan.cooperative && plan.warp && plan.blocks() == 625 &&
                                cu.find("tg_warp_reduce<0>(acc") != std::string::npos);
            if (n >= fewer_rows_from && n < short_rows_from && plan.items == 500)
                fewer_rows = fewer_rows || (plan.cooperative && !plan.warp);
            if (n >= short_rows_from && n < columns_from && plan.items == 500)
                short_rows += plan.warp;
            // 5000 columns of 300 rows: 4 ranges of 75, a thread per range and column, one
            // launch (each column's last range adds them); 3000 x 300 is too little to split
            if (n >= columns_from && n < columns_to && plan.outputs == 5000)
                columns = columns || (plan.column_sum && plan.splits == 4 &&
                                      plan.rows_each == 75 && plan.items == 4 * 5000 &&
                                      l.stage == 1 && launches.size() == 1 &&
                                      cu.find("atomicAdd(arrived, 1u) != 3u") != std::string::npos);
            // 384 x 256 outputs of 4096 terms: 24 tiles of 64 x 64 (not 96 of 32 x 32), each
            // in 11 ranges of 384 terms (the last 256), 264 blocks: two a multiprocessor
            if (n >= long_sum_from && n < tiles_from[0] && plan.product && l.stage == 1)
                long_sum = plan.splits == 11 && plan.items == 24 * 11;
            if (n >= tiles_from[0] && n < tiles_from[1] && plan.product && l.stage == 1)
                long_sum_128 = plan.splits == 7 && plan.items == 36 * 7;
            if (n >= tiles_from[1] && n < tiles_from[2] && plan.product) tiles_2048 = plan.items;
            if (n >= tiles_from[2] && n < long_sum_to && plan.product) tiles_1792 = plan.items;
            if (n >= columns_to && n < few_columns_to && plan.items == 3000)
                short_columns = !plan.cooperative && !plan.column_sum && l.stage == 0;
        }
    }
    CHECK(rows);
    CHECK(fewer_rows);
    CHECK_EQ(short_rows, 2);
    CHECK(long_sum);
    CHECK(long_sum_128);
    CHECK_EQ(tiles_2048, 256);
    CHECK_EQ(tiles_1792, 896);
    CHECK(columns);
    CHECK(short_columns);
    CHECK(scatter_split);
    CHECK(reduced);
    CHECK(adam);
    CHECK(scatter);
}

TEST_LAST(cuda_nvrtc_compiles_every_program_of_the_run) {
    std::string why;
    if (!tg::cuda::nvrtc_available(&why)) SKIP("NVRTC is absent: " + why);
    if (stand_in()) SKIP("NVRTC is the CPU stand-in, whose compiler ran every program already");
    CHECK(collecting);
    // a few programs of its own, so that it compiles something when run alone, a product in
    // tiles through shared memory among them
    Tensor x = Tensor::randn({16, 8}, 3).requires_grad();
    (Tensor::randn({64, 64}, 4).matmul(Tensor::randn({64, 64}, 5))).realize();
    Tensor idx = Tensor::from_vector(std::vector<int32_t>{0, 2, 5});
    Tensor loss = (x.index_select(0, idx).softmax(-1) * x.sum(0)).tanh().mean();
    loss.backward();
    x.assign(x - x.grad() * 0.1f).realize();
    {
        EnvGuard check("TG_CHECK", "1");
        (x.exp2().log2() + x.abs().sqrt().sin().cos()).realize();
    }
    Rendered& r = rendered();
    for (const std::string& e : r.render_errors) th::report(__FILE__, __LINE__, e);
    CHECK(r.programs >= 3);
    // NVRTC's fastest compile (-Ofc=max, CUDA 12.8 on), and ptxas unoptimized for the kernels
    // it assembles: a third of the time of ptxas unoptimized alone (16 large programs, one by
    // one: 25.2 s, then 10.0 s; it took a quarter less than full optimization). Not for a
    // kernel of 270 KB, grid_sample's gradient planned for the CPU (a straight line of 2,292
    // doubles): 65 s to PTX with -Ofc=max, 0.8 s with -Ofc=mid, which takes twice -Ofc=max's
    // time on test_ops.cpp's kernels (NVRTC 13.0, 2026-12-07).
    std::string quick_flags = "-Ofc=max", large_flags = "-Ofc=mid";
    try {
        tg::detail::nvrtc_check("extern \"C\" __global__ void k() {}", 90, "probe.cu",
                                quick_flags);
    } catch (const tg::Error&) {
        quick_flags = large_flags = "";   // an NVRTC before -Ofc
    }
    EnvGuard quick("TG_NVRTC_FLAGS", (quick_flags + " -Xptxas -O0").c_str());
    auto t0 = std::chrono::steady_clock::now();
    size_t assembled = 0;
    std::vector<std::string> failures = compile_all(r.kernels, quick_flags, large_flags,
                                                    &assembled);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < failures.size() && i < 5; i++)
        th::report(__FILE__, __LINE__, failures[i]);
    CHECK_EQ(failures.size(), size_t(0));
    CHECK(assembled >= 1);
    std::printf("    %zu programs rendered for CUDA, their %zu kernels compiled by NVRTC (%zu of"
                " shared memory for sm_90, the others to PTX) in %.1f s (%s); %zu built under"
                " TG_PASSES left out\n", r.programs, r.kernels.size(), assembled, seconds,
                quick_flags.c_str(), r.under_chosen_passes);
}

// ---- CUDA on a GPU -----------------------------------------------------------------------------

#define NEED_GPU()                                                                             \
    do {                                                                                       \
        std::string why_;                                                                      \
        if (!gpu(&why_)) SKIP("no GPU: " + why_);                                             \
    } while (0)

// A model built on the CPU moves to the GPU (Module::to) and trains there: its forward agrees
// with the CPU's, an optimizer made after steps it there, and it comes back with those bits.
TEST(cuda_module_to_moves_a_model_to_the_gpu_and_back) {
    NEED_GPU();
    EnvGuard cpu("TG_DEVICE", "CPU");
    tg::manual_seed(41);
    tg::nn::Sequential net(tg::nn::Linear(5, 7), tg::nn::GELU(), tg::nn::Linear(7, 2));
    Tensor x = Tensor::randn({4, 5});
    std::vector<float> on_cpu = values(net(x));
    net.to("CUDA");
    for (const Tensor& p : net.parameters()) CHECK_EQ(p.device(), std::string("CUDA"));
    Tensor y = net(x.to("CUDA"));
    CHECK_EQ(y.device(), std::string("CUDA"));
    CHECK_ALL_NEAR(values(y), on_cpu, 1e-5);
    tg::optim::SGD opt(net.parameters(), 0.1);
    y.square().mean().backward();
    opt.step();
    std::vector<float> stepped;
    for (const Tensor& p : net.parameters())
        for (float v : values(p)) stepped.push_back(v);
    net.to("CPU");
    std::vector<float> back;
    for (const Tensor& p : net.parameters()) {
        CHECK_EQ(p.device(), std::string("CPU"));
        for (float v : values(p)) back.push_back(v);
    }
    CHECK_ALL_NEAR(back, stepped, 0);
}

// A GELU between two products, forward and backward, planned as each device plans it: the
// GPU computes the tanh again in the backward kernel (about 30 operations an element) rather
// than store it, its sign and e^-2|z| in the forward product's epilogue and load them there
// (W7's MLP: three tensors of 8192 x 2048 a layer, each stored and loaded once). The CPU
// keeps them stored: a call or a select in a product's epilogue keeps GCC from vectorizing it.
TEST(cuda_recomputes_a_gelu_in_the_kernels_that_read_it) {
    auto temporaries = [](const char* device) {   // of the GELU's shape, 64 x 128
        std::vector<tg::detail::Program> programs;
        auto saved = tg::detail::program_observer();
        tg::detail::program_observer() = [&](const tg::detail::Program& p) {
            programs.push_back(p);
        };
        char tmpl[] = "/tmp/tg-cuda-gelu-XXXXXX";
        std::string dir = mkdtemp(tmpl);
        {
            static PlanOnly plan_only;
            tg::detail::register_device("CUDA_PLAN", &plan_only);
            EnvGuard dev("TG_DEVICE", device), cache("TG_CACHE_DIR", dir.c_str());
            Tensor x = Tensor::randn({64, 32}, 3).requires_grad();
            Tensor w1 = Tensor::randn({32, 128}, 4).requires_grad();
            Tensor w2 = Tensor::randn({128, 32}, 5);
            Tensor y = (x.matmul(w1) * 0.01f).gelu(true).matmul(w2);
            std::vector<Tensor> g = tg::gradients((y * y).sum(), {x, w1});
            tg::realize({y, g[0], g[1]});
        }
        tg::detail::program_observer() = saved;
        CHECK_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
        int n = 0;
        for (const tg::detail::Program& p : programs)
            for (const auto& b : p.buffers)
                n += b.role == tg::detail::ProgramBuffer::TEMP && b.numel == 64 * 128;
        return n;
    };
    CHECK_EQ(temporaries("CUDA_PLAN"), 3);   // the product, the GELU, the input's gradient
    CHECK_EQ(temporaries("CPU"), 6);         // and the tanh, its sign and e^-2|z|
    // Softmax's e^(x - max) is stored where it is computed, once: recomputed by its sum, its
    // outputs and its gradient, it would load x where they load e and compute the exp2 again
    // in each. They stay one kernel of rows (the sum reads each row's max along the rows, yet
    // is no product).
    std::vector<tg::detail::Program> programs;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) { programs.push_back(p); };
    char tmpl[] = "/tmp/tg-cuda-softmax-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    {
        EnvGuard dev("TG_DEVICE", "CUDA_PLAN"), cache("TG_CACHE_DIR", dir.c_str());
        Tensor x = Tensor::randn({512, 256}, 6).requires_grad(), w = Tensor::randn({512, 256}, 7);
        Tensor y = x.softmax(-1);
        tg::realize({y, tg::gradients((y * w).sum(), {x})[0]});
    }
    tg::detail::program_observer() = saved;
    CHECK_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
    CHECK(!programs.empty());
    if (!programs.empty()) {
        const tg::detail::Program& p = programs.back();
        CHECK_EQ(tg::detail::kernels_of(p, tg::detail::launches_of(p)).size(), size_t(1));
        std::string cu = tg::detail::render_cuda(p);
        size_t exp2s = 0;   // calls, not the helper's definition
        for (size_t at = 0; (at = cu.find("tg_exp2f(", at)) != std::string::npos; at++)
            exp2s += cu.compare(at, 15, "tg_exp2f(float ") != 0;
        CHECK_EQ(exp2s, size_t(1));
    }
}

TEST(cuda_ops_and_gradients_match_the_cpu) {
    NEED_GPU();
    auto run = [](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        Tensor a = Tensor::randn({33, 65}, 11).requires_grad();
        Tensor b = Tensor::randn({65, 17}, 12).requires_grad();
        Tensor h = a.matmul(b).gelu(true);
        Tensor loss = (h.log_softmax(-1) * h.sigmoid()).sum() + h.max(0).sum() +
                      a.abs().sqrt().mean() + h.exp2().min();
        loss.backward();
        std::vector<float> out = {float(loss.item())};
        for (float v : values(a.grad())) out.push_back(v);
        for (float v : values(b.grad())) out.push_back(v);
        return out;
    };
    std::vector<float> cpu = run("CPU"), cuda = run("CUDA");
    CHECK_ALL_NEAR(cuda, cpu, 1e-4);
    CHECK(cuda == run("CUDA"));   // the same bits on every run
}

// Long reductions over few items run a block of threads per item (plan_kernel's cooperative
// nests): sums and maxima by rows, over everything, over two axes, in a product with a long
// inner axis, in softmax's forward and backward, over many rows (a layer norm's, a warp per
// row), over short rows (a softmax of 40: a warp per row), and in integers.
TEST(cuda_block_reductions_match_the_cpu) {
    NEED_GPU();
    auto run = [](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        Tensor x = Tensor::from_vector(th::randf(3 * 1000, 21), {3, 1000}).requires_grad();
        Tensor y = Tensor::from_vector(th::randf(2 * 3 * 700, 22), {2, 3, 700});
        Tensor a = Tensor::from_vector(th::randf(2 * 3000, 23), {2, 3000});
        Tensor b = Tensor::from_vector(th::randf(3000 * 3, 24), {3000, 3});
        Tensor i = Tensor::from_vector(th::randi(4097, 25, -50, 50), {4097});
        Tensor r = Tensor::from_vector(th::randf(5000 * 130, 26), {5000, 130}).requires_grad();
        Tensor centred = r - r.mean(-1, true);
        Tensor normed = centred / (centred.pow(2).mean(-1, true) + 1e-5f).sqrt();
        Tensor q = Tensor::from_vector(th::randf(300 * 40, 27), {300, 40}).requires_grad();
        Tensor loss = (x.softmax(-1) * x).sum() + (normed * normed.softmax(-1)).sum() +
                      (q.softmax(-1) * q).sum();
        loss.backward();
        std::vector<float> out;
        for (const Tensor& t : {x.sum(1), x.max(1).values, x.min(1).values, x.sum(),
                                y.sum(std::vector<int>{1, 2}), a.matmul(b), loss, x.grad(),
                                r.grad(), q.grad(),
                                i.sum().cast(tg::DType::FLOAT32),
                                i.max().cast(tg::DType::FLOAT32)})
            for (float v : values(t)) out.push_back(v);
        return out;
    };
    std::vector<float> cpu = run("CPU"), cuda = run("CUDA");
    CHECK_ALL_NEAR(cuda, cpu, 1e-5);
    CHECK(cuda == run("CUDA"));
}

// The programs that run() makes with the passes the CUDA device runs (runs_pass), on whichever
// device this run uses: what a GPU's kernels would be.
static std::vector<tg::detail::Program> planned_for_cuda(const std::function<void()>& run) {
    std::vector<tg::detail::Program> programs;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) { programs.push_back(p); };
    EnvGuard passes("TG_PASSES", "simplify,fuse_maps,substitute_temps,dead_stores,"
                                 "first_write,order_nests,parallel_loops,plan_memory");
    run();
    tg::detail::program_observer() = saved;
    return programs;
}

// Kernels of the same code over other buffers (two layers of one size) launch one function,
// which NVRTC compiles once; each passes its own buffers in that function's order, and the
// values are the CPU's.
TEST(cuda_kernels_of_the_same_code_share_a_function) {
    auto run = [](const std::string& device) {
        EnvGuard dev("TG_DEVICE", device.c_str());
        auto filled = [](tg::Shape s, uint64_t seed) {
            int64_t n = s[0] * (s.size() > 1 ? s[1] : 1);
            return Tensor::from_vector(th::randf(size_t(n), seed), s);
        };
        Tensor x = filled({64, 128}, 1), w1 = filled({128, 128}, 2), w2 = filled({128, 128}, 3);
        Tensor b1 = filled({128}, 4), b2 = filled({128}, 5), w3 = filled({4, 128}, 6);
        Tensor h1 = (x.matmul(w1.t()) + b1).tanh(), h2 = (h1.matmul(w2.t()) + b2).tanh();
        return values(h2.matmul(w3.t()));
    };
    std::vector<float> here;
    std::vector<tg::detail::Program> programs =
        planned_for_cuda([&] { here = run(tg::detail::default_device().name()); });
    int shared = 0;
    for (const tg::detail::Program& p : programs) {
        tg::detail::CudaSource source = tg::detail::render_cuda_kernels(p);
        std::vector<tg::detail::Launch> launches = tg::detail::launches_of(p);
        std::vector<std::vector<size_t>> kernels = tg::detail::kernels_of(p, launches);
        CHECK_EQ(source.function.size(), kernels.size());
        CHECK_EQ(source.buffers.size(), kernels.size());
        std::set<std::string> functions(source.function.begin(), source.function.end());
        CHECK_EQ(size_t(th::count_of(source.text, "__global__ void")), functions.size());
        for (const std::string& f : functions)
            CHECK(source.text.find(") " + f + "(") != std::string::npos);
        for (size_t k = 0; k < kernels.size(); k++) {
            const std::string& own = launches[kernels[k][0]].name;
            if (source.function[k] == own) continue;
            shared++;
            CHECK(source.text.find("runs " + source.function[k] + "'s code") != std::string::npos);
            CHECK(source.text.find(") " + own + "(") == std::string::npos);
            CHECK(source.buffers[k] != source.buffers[size_t(
                std::find(source.function.begin(), source.function.end(), source.function[k]) -
                source.function.begin())]);
        }
    }
    CHECK_EQ(shared, 1);   // the second layer runs the first's code
    CHECK_ALL_NEAR(here, run("CPU"), 1e-5);   // the GPU sums in another order
}

// A recurrence unrolled over its steps: each step's kernel reads its rows of the stacked input
// projection (x[t]) at another offset, from which it is passed the buffer (a multiple of 16
// bytes), so the steps after the first launch one function; the values are the CPU's.
TEST(cuda_kernels_at_other_offsets_of_a_buffer_share_a_function) {
    const int64_t T = 6, N = 16, H = 64;
    auto run = [&](const std::string& device) {
        EnvGuard dev("TG_DEVICE", device.c_str());
        // x computed in the program (a recurrent layer's input projection): its steps are
        // offsets of one buffer, not views of a realized one
        Tensor in = Tensor::from_vector(th::randf(size_t(T * N * H), 7), {T * N, H});
        Tensor w = Tensor::from_vector(th::randf(size_t(H * H), 8), {H, H}) * 0.1f;
        Tensor x = in.matmul(w).reshape({T, N, H});
        Tensor h = Tensor::zeros({N, H});
        for (int64_t t = 0; t < T; t++) h = (x[t] + h.matmul(w)).tanh();
        return values(h);
    };
    std::vector<float> here;
    std::vector<tg::detail::Program> programs =
        planned_for_cuda([&] { here = run(tg::detail::default_device().name()); });
    std::set<size_t> offsets;   // into x, in bytes: step t's rows
    int shared = 0;
    for (const tg::detail::Program& p : programs) {
        tg::detail::CudaSource source = tg::detail::render_cuda_kernels(p);
        CHECK_EQ(source.offsets.size(), source.buffers.size());
        for (size_t k = 0; k < source.buffers.size(); k++) {
            CHECK_EQ(source.offsets[k].size(), source.buffers[k].size());
            for (size_t bytes : source.offsets[k]) {
                CHECK_EQ(bytes % 16, size_t(0));
                if (bytes) offsets.insert(bytes);
            }
        }
        shared += th::count_of(source.text, "'s code */");
    }
    // step 0 reads no state: steps 2 to 5 run step 1's code (as the CUDA device plans them,
    // the last step's kernel numbers its sums otherwise, and has its own)
    CHECK(shared >= int(T) - 3);
    CHECK(offsets == (std::set<size_t>{1 * 4096, 2 * 4096, 3 * 4096, 4 * 4096, 5 * 4096}));
    CHECK_ALL_NEAR(here, run("CPU"), 1e-5);
}

// A row's sum that lowering splits into loops (512 terms as 2 x 16 x 16, 256 as 16 x 16, in a
// fixed order), run by a block (a layer norm of 300 rows) or a warp (a softmax of 2000 rows)
// a row: each thread reads its terms f = thread, thread + size, ... at the row's start + f,
// not through the loops' variables computed back from f (divisions and remainders by 16 for
// every term). The same sums in the same order: the values are the CPU's, the same each run.
TEST(cuda_cooperative_sums_read_their_terms_in_order) {
    auto run = [](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        Tensor r = Tensor::from_vector(th::randf(300 * 512, 51), {300, 512});
        Tensor centred = r - r.mean(-1, true);
        Tensor normed = centred / (centred.pow(2).mean(-1, true) + 1e-5f).sqrt();
        Tensor q = Tensor::from_vector(th::randf(2000 * 256, 52), {2000, 256});
        std::vector<float> out;
        for (const Tensor& t : {normed, q.softmax(-1)})
            for (float v : values(t)) out.push_back(v);
        return out;
    };
    std::vector<tg::detail::Program> programs =
        planned_for_cuda([&] { run(tg::detail::default_device().name()); });
    int blocks = 0, warps = 0;
    for (const tg::detail::Program& p : programs) {
        CHECK_EQ(th::count_of(tg::detail::render_cuda(p), "% 16LL"), 0);
        for (const tg::detail::Launch& l : tg::detail::launches_of(p)) {
            tg::detail::KernelPlan plan = tg::detail::plan_kernel(p, l.block, l.part);
            warps += plan.warp;
            blocks += plan.cooperative && !plan.warp;
        }
    }
    CHECK(blocks >= 1);
    CHECK(warps >= 1);
    std::string why;
    if (!gpu(&why)) SKIP("no GPU for the values: " + why);
    std::vector<float> cuda = run("CUDA");
    CHECK_ALL_NEAR(cuda, run("CPU"), 1e-5);
    CHECK(cuda == run("CUDA"));
}

// A sum of few items and many terms (a whole tensor's: one item) is split into ranges, a
// block each, 264 (two a multiprocessor) for 10^7 terms: one block would read them all while
// the others idle. A thread that adds many float terms, and the last range adding the
// ranges' totals, carry what each addition lost into the next, so the sum's error does not
// grow with the length, as on the CPU (test_reliability's float sums); rows of a layer norm's
// length are neither split nor compensated. The same bits on every run.
TEST(cuda_long_float_sums_split_over_blocks_and_stay_accurate) {
    auto run = [](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        std::vector<double> out = {Tensor::full({10000000}, 0.1f).sum().item(),
                                   Tensor::full({4, 250000}, 0.1f).sum(1).to_vector<double>()[3],
                                   Tensor::from_vector(th::randf(300007, 5, 0, 1)).sum().item()};
        Tensor rows = Tensor::from_vector(th::randf(300 * 512, 6), {300, 512});
        out.push_back(rows.sum(1).to_vector<double>()[7]);
        // read across its rows (a loop's variables from each term's number), with an epilogue;
        // and a sum of products (its two loads by term)
        Tensor m = Tensor::from_vector(th::randf(600 * 700, 7), {600, 700});
        Tensor x = Tensor::from_vector(th::randf(1000000, 8)), y = x * 0.5f + 0.25f;
        out.push_back(m.t().mean().item());
        out.push_back((x * y).sum().item());
        return out;
    };
    std::vector<tg::detail::Program> programs =
        planned_for_cuda([&] { run(tg::detail::default_device().name()); });
    int compensated = 0;
    std::vector<int64_t> split_blocks;   // of each split cooperative sum
    for (const tg::detail::Program& p : programs) {
        compensated += th::count_of(tg::detail::render_cuda(p), "float tg_lost") > 0;
        for (const tg::detail::Launch& l : tg::detail::launches_of(p)) {
            tg::detail::KernelPlan plan = tg::detail::plan_kernel(p, l.block, l.part);
            if (plan.cooperative && plan.splits > 1) split_blocks.push_back(plan.blocks());
        }
    }
    CHECK_EQ(compensated, 5);   // not the rows of 512
    CHECK_EQ(split_blocks, (std::vector<int64_t>{264, 4 * 30, 36, 50, 119}));
    std::string why;
    if (!gpu(&why)) SKIP("no GPU for the values: " + why);
    std::vector<double> cuda = run("CUDA"), cpu = run("CPU");
    CHECK_NEAR(cuda[0], 1e7 * double(0.1f), 1e-6);
    CHECK_NEAR(cuda[1], 250000 * double(0.1f), 1e-6);
    double exact = 0;
    for (float x : th::randf(300007, 5, 0, 1))
        exact += x;
    CHECK_NEAR(cuda[2], exact, 1e-6);
    for (size_t i : {3, 4, 5})
        CHECK_NEAR(cuda[i], cpu[i], 1e-6);
    CHECK(cuda == run("CUDA"));
}

// Matrix products run a block per tile of outputs through shared memory (plan_kernel's
// products; these small ones in tiles of 32 x 32, larger ones of 64 or 128): sizes that leave
// partial tiles or none (then no bounds are tested, and loads read by pointer), a batch,
// operands read across their rows (x.t(), a Linear's weight), an operand whose rows are heads
// apart (attention's output before its projection: a pointer each step), an epilogue (bias and
// GELU) and a Linear's gradients; the same bits on every run. The plan is checked on every
// machine, the values where a GPU (or the stand-in) is.
TEST(cuda_products_run_in_tiles_through_shared_memory) {
    auto run = [](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        Tensor a = Tensor::from_vector(th::randf(100 * 300, 31), {100, 300});
        Tensor b = Tensor::from_vector(th::randf(300 * 70, 32), {300, 70});
        Tensor c = Tensor::from_vector(th::randf(3 * 40 * 50, 33), {3, 40, 50});
        Tensor d = Tensor::from_vector(th::randf(3 * 50 * 20, 34), {3, 50, 20});
        Tensor e = Tensor::from_vector(th::randf(20 * 3000, 35), {20, 3000});
        Tensor f = Tensor::from_vector(th::randf(3000 * 30, 36), {3000, 30});
        Tensor g = Tensor::from_vector(th::randf(2 * 64 * 96, 37), {2, 64, 96});
        Tensor k = Tensor::from_vector(th::randf(2 * 96 * 64, 38), {2, 96, 64});
        Tensor heads = Tensor::from_vector(th::randf(2 * 4 * 32 * 16, 39), {2, 4, 32, 16});
        Tensor wh = Tensor::from_vector(th::randf(64 * 32, 40), {64, 32});
        Tensor gb = Tensor::from_vector(th::randf(96, 41), {96});
        Tensor wl = Tensor::from_vector(th::randf(20 * 64, 42), {20, 64});
        Tensor gl = Tensor::from_vector(th::randf(2 * 32 * 20, 43), {2, 32, 20});
        wl.requires_grad();   // its gradient: the heads' layout read along its 64 columns
        (heads.transpose(1, 2).reshape({2, 32, 64}).matmul(wl.t()) * gl).sum().backward();
        tg::manual_seed(4);
        tg::nn::Linear lin(300, 90);
        Tensor h = lin(a).gelu(true);
        Tensor loss = (h * h).mean();
        loss.backward();
        std::vector<float> out;
        for (const Tensor& t : {a.matmul(b), c.matmul(d), b.t().matmul(a.t()), h, loss,
                                lin.weight.grad(), lin.bias.grad(), (e.matmul(f) + 1).relu(),
                                g.matmul(k), (g + gb).matmul(k),
                                heads.transpose(1, 2).reshape({2, 32, 64}).matmul(wh),
                                wl.grad()})
            for (float v : values(t)) out.push_back(v);
        return out;
    };
    std::vector<tg::detail::Program> programs =
        planned_for_cuda([&] { run(tg::detail::default_device().name()); });
    std::vector<float> cpu = run("CPU");
    int products = 0, by_term = 0;   // products whose operands are loads at base + c·term
    int unbounded = 0;   // whole tiles and steps: no bounds tested, operands read by pointer
    int split = 0;                   // a product of long sums split in ranges of terms
    int by_step = 0;   // x a head's slice of each row: one index a step, the rest by offsets
    int two_pointers = 0;   // x a load plus a bias: a pointer for each
    int by_step_along = 0;   // y heads' slices read along their columns (head and offset)
    for (const tg::detail::Program& p : programs) {
        std::vector<tg::detail::Launch> launches = tg::detail::launches_of(p);
        std::vector<std::string> kernel_of(launches.size());   // the function that runs it
        {
            std::vector<std::vector<size_t>> kernels = tg::detail::kernels_of(p, launches);
            tg::detail::CudaSource source = tg::detail::render_cuda_kernels(p);
            for (size_t k = 0; k < kernels.size(); k++)
                for (size_t i : kernels[k]) kernel_of[i] = source.function[k];
        }
        std::string whole = tg::detail::render_cuda(p);   // kernel by kernel
        for (size_t at = whole.find("__global__"); at != std::string::npos;) {
            size_t next = whole.find("__global__", at + 1);
            std::string kernel = whole.substr(at, next == std::string::npos ? next : next - at);
            by_step += kernel.find("xn[l] = p[l * 256LL];") != std::string::npos;
            by_step_along += kernel.find("yn[l] = p[l * 128LL];") != std::string::npos;
            at = next;
        }
        for (size_t n = 0; n < launches.size(); n++) {
            const tg::detail::Launch& l = launches[n];
            tg::detail::KernelPlan plan = tg::detail::plan_kernel(p, l.block, l.part);
            if (!plan.product) continue;
            products++;
            split += plan.splits > 1 && l.stage == 1 && launches.size() == 1;
            std::string cu = tg::detail::render_cuda(p);
            // two buffers of x's and y's 16 terms, 32 + 4 floats a row, in the kernel's array
            CHECK(cu.find("float tg_tiles[2304];") != std::string::npos);
            CHECK(cu.find("(float (*)[16][36])(tg_tiles + 1152);") != std::string::npos);
            // the epilogue unrolled: sum indexed by constants stays in registers (the lines
            // without their indents: a kernel of launches side by side indents them further)
            std::string flat;
            for (size_t at = 0; at < cu.size();) {
                size_t eol = std::min(cu.find('\n', at), cu.size() - 1);
                size_t first = std::min(cu.find_first_not_of(' ', at), eol);
                flat += cu.substr(first, eol - first + 1);
                at = eol + 1;
            }
            // (a thread's columns one by one, or in groups of V, each column of a group too)
            bool unrolled = false;
            for (int r : {2, 4, 8}) {
                std::string rows = "#pragma unroll\nfor (int a = 0; a < " + std::to_string(r) +
                                   "; a++)\n#pragma unroll\n";
                unrolled = unrolled ||
                           flat.find(rows + "for (int c = 0; c < " + std::to_string(r) +
                                     "; c++) {\nconst int64_t i") != std::string::npos ||
                           (flat.find(rows + "for (int v = 0; v < " +
                                      std::to_string(r / std::min(r, 4)) +
                                      "; v++) {\nconst int64_t i") != std::string::npos &&
                            flat.find("#pragma unroll\nfor (int q = 0; q < ") !=
                                std::string::npos);
            }
            CHECK(unrolled);
            {   // two blocks a multiprocessor asked: for tiles of 128 (smaller ones fit more)
                EnvGuard two("TG_CUDA_PRODUCT_BLOCKS", "2");
                CHECK(tg::detail::render_cuda(p).find("__launch_bounds__(256) " + kernel_of[n] +
                                                      "(") != std::string::npos);
                EnvGuard big("TG_CUDA_TILE", "128");
                tg::detail::CudaSource large_source = tg::detail::render_cuda_kernels(p);
                std::string bounded = large_source.text, first;   // n's kernel's function
                std::vector<tg::detail::Launch> large = tg::detail::launches_of(p);
                std::vector<std::vector<size_t>> large_kernels = tg::detail::kernels_of(p, large);
                for (size_t k = 0; k < large_kernels.size(); k++)
                    for (size_t i : large_kernels[k])
                        if (i == n) first = large_source.function[k];
                CHECK(!first.empty());
                CHECK(bounded.find("__launch_bounds__(256, 2) " + first + "(") !=
                      std::string::npos);
                if (tg::cuda::nvrtc_available() && !stand_in())
                    CHECK(tg::detail::nvrtc_compile(bounded, 90, p.name + ".cu").size() > 0);
            }
            by_term += cu.find("int64_t l = f") == std::string::npos;
            unbounded += cu.find("const float *xp0;") != std::string::npos &&
                         cu.find("const float *yp0;") != std::string::npos &&
                         cu.find("if (i") == std::string::npos;
            two_pointers += cu.find("xn[l] = (xp0[l * 1536LL] + xp1[l * 0LL]);") !=
                            std::string::npos;
            if (tg::cuda::nvrtc_available() && !stand_in())   // NVRTC for sm_90 takes it
                CHECK(tg::detail::nvrtc_compile(cu, 90, p.name + ".cu").size() > 0);
        }
    }
    // the 7 products, the Linear's forward, its input's and weight's gradients, the heads'
    // product with wl and its gradient
    CHECK_EQ(products, 12);
    CHECK_EQ(by_step, 2);   // the heads' products with wh and wl (4 heads of 16 terms): rows 16
                            // floats apart
    CHECK_EQ(by_step_along, 1);   // wl's gradient, 20 x 64 of 2 x 32 terms 16 floats apart
    CHECK_EQ(unbounded, 2);   // 2 x 64 x 64 outputs of 96 terms
    CHECK_EQ(two_pointers, 1);   // the same with a bias added to x: its step 0 across the rows
    CHECK(by_term >= 3);
    CHECK_EQ(split, 1);   // 20 x 30 outputs of 3000 terms: 11 ranges of 288 (the last 120)
    std::string why;
    if (!gpu(&why)) SKIP("no GPU for the values: " + why);
    std::vector<float> cuda = run("CUDA");
    CHECK_ALL_NEAR(cuda, cpu, 1e-5);
    CHECK(cuda == run("CUDA"));
    for (const char* tile : {"64", "128"}) {   // the tiles of larger products
        EnvGuard t("TG_CUDA_TILE", tile);
        CHECK_ALL_NEAR(run("CUDA"), cpu, 1e-5);
    }
    // compiled for two blocks a multiprocessor
    EnvGuard two("TG_CUDA_PRODUCT_BLOCKS", "2"), big("TG_CUDA_TILE", "128");
    CHECK_ALL_NEAR(run("CUDA"), cpu, 1e-5);
}

// A product's epilogue stores a thread's V consecutive columns at once where it can (see
// vector_stores): a store that moves one float with the column and starts on a multiple of V
// is one vector store; not for a column count that V does not divide. Values: the CPU's, for
// outputs, temporaries and an assignment to a view one float into its tensor (which writes a
// copy of the view, so its stores start aligned too; on the CPU stand-in a misaligned vector
// traps, as the GPU stops).
TEST(cuda_product_epilogues_store_vectors) {
    auto run = [](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        Tensor x = Tensor::from_vector(th::randf(70 * 48, 41), {70, 48});
        Tensor w = Tensor::from_vector(th::randf(48 * 40, 42), {48, 40});
        Tensor c = Tensor::from_vector(th::randf(70 * 40, 43), {70, 40});
        Tensor odd = Tensor::from_vector(th::randf(48 * 33, 44), {48, 33});
        Tensor flat = Tensor::from_vector(th::randf(70 * 40 + 1, 45), {70 * 40 + 1});
        Tensor view = flat.slice(0, 1, 70 * 40 + 1).reshape({70, 40});
        Tensor assigned = view.assign(x.matmul(w) + c).realize();
        std::vector<float> out;
        for (const Tensor& t : {(x.matmul(w) + c).relu(), x.matmul(odd) + 1,
                                (x.matmul(w).relu() * c).sum(0), assigned, view, flat})
            for (float v : values(t)) out.push_back(v);
        return out;
    };
    std::vector<tg::detail::Program> programs =
        planned_for_cuda([&] { run(tg::detail::default_device().name()); });
    int products = 0, vectors = 0;
    for (const tg::detail::Program& p : programs)
        for (const tg::detail::Launch& l : tg::detail::launches_of(p)) {
            if (!tg::detail::plan_kernel(p, l.block, l.part).product) continue;
            products++;
            vectors += tg::detail::render_cuda(p).find(" = make_float2(s") != std::string::npos;
        }
    CHECK_EQ(products, 4);
    CHECK_EQ(vectors, 3);   // 70 x 40 outputs, 2 of a thread's columns at once; not 70 x 33
    std::string why;
    if (!gpu(&why)) SKIP("no GPU for the values: " + why);
    CHECK_ALL_NEAR(run("CUDA"), run("CPU"), 1e-5);
}

// TG_CUDA_TF32=1: products on tensor cores (mma.m16n8k8), their operands rounded to TF32 (to
// nearest, ties away from zero): each output is the float32 sum of the rounded operands'
// products (exact in float32), here against that sum in float64, in every tile size, with
// partial tiles and steps, a batch, operands read across, and terms split in ranges. Off (the
// default), the products keep float32's bits.
static float to_tf32(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u = (u + 0x1000u) & 0xffffe000u;   // finite values only here
    std::memcpy(&v, &u, 4);
    return v;
}
TEST(cuda_tf32_products_round_their_operands_on_tensor_cores) {
    struct Case {
        int64_t batch, m, k, n;
        bool across;   // (yᵀ·xᵀ)ᵀ: the product's operands read across their rows
    };
    const Case cases[] = {{1, 100, 60, 70, false}, {1, 100, 60, 70, true},
                          {3, 40, 37, 20, false}, {1, 20, 1100, 30, false},
                          {1, 128, 32, 64, false}};
    auto run = [&](const Case& c, uint64_t seed) {
        Tensor x = Tensor::from_vector(th::randf(size_t(c.batch * c.m * c.k), seed),
                                       {c.batch, c.m, c.k});
        Tensor y = Tensor::from_vector(th::randf(size_t(c.batch * c.k * c.n), seed + 1),
                                       {c.batch, c.k, c.n});
        Tensor z = c.across ? y.transpose(1, 2).matmul(x.transpose(1, 2)).transpose(1, 2)
                            : x.matmul(y);
        return values(z.contiguous());
    };
    auto want = [&](const Case& c, uint64_t seed) {
        std::vector<float> x = th::randf(size_t(c.batch * c.m * c.k), seed),
                           y = th::randf(size_t(c.batch * c.k * c.n), seed + 1), z;
        for (int64_t b = 0; b < c.batch; b++)
            for (int64_t i = 0; i < c.m; i++)
                for (int64_t j = 0; j < c.n; j++) {
                    double sum = 0;
                    for (int64_t k = 0; k < c.k; k++)
                        sum += double(to_tf32(x[size_t((b * c.m + i) * c.k + k)])) *
                               to_tf32(y[size_t((b * c.k + k) * c.n + j)]);
                    z.push_back(float(sum));
                }
        return z;
    };
    std::vector<tg::detail::Program> programs = planned_for_cuda([&] { run(cases[0], 1); });
    int products = 0;
    for (const tg::detail::Program& p : programs) {
        std::string plain = tg::detail::render_cuda(p);
        EnvGuard tf32("TG_CUDA_TF32", "1");
        std::string cu = tg::detail::render_cuda(p);
        if (cu == plain) continue;
        products++;
        CHECK(plain.find("tg_mma_tf32") == std::string::npos);
        CHECK(cu.find("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") != std::string::npos);
        CHECK(cu.find("(float (*)[16][40])tg_tiles;") != std::string::npos);
        CHECK(cu.find("= tg_tf32(xn[l]);") != std::string::npos);
        if (tg::cuda::nvrtc_available() && !stand_in()) {   // tensor cores, and shuffles before
            CHECK(tg::detail::nvrtc_compile(cu, 90, p.name + ".cu").size() > 0);
            CHECK(tg::detail::nvrtc_compile(cu, 75, p.name + ".cu").size() > 0);
        }
    }
    CHECK_EQ(products, 1);
    std::string why;
    if (!gpu(&why)) SKIP("no GPU for the values: " + why);
    EnvGuard dev("TG_DEVICE", "CUDA");
    {   // 1 + 3·2^-12 is 1 + 2^-10 in TF32: 256 terms of it make 256.25, not 256.1875
        Tensor x = Tensor::from_vector(std::vector<float>(64 * 256, 1.0f + 3.0f / 4096), {64, 256});
        Tensor y = Tensor::from_vector(std::vector<float>(256 * 32, 1.0f), {256, 32});
        CHECK_EQ(values(x.matmul(y))[0], 256.1875f);
        EnvGuard tf32("TG_CUDA_TF32", "1");
        CHECK_EQ(values(x.matmul(y))[0], 256.25f);
    }
    EnvGuard tf32("TG_CUDA_TF32", "1");
    uint64_t seed = 50;
    for (const Case& c : cases) {
        std::vector<float> z = run(c, seed);
        CHECK_ALL_NEAR(z, want(c, seed), 1e-4);
        CHECK(z == run(c, seed));
        for (const char* tile : {"64", "128"}) {   // partial tiles and whole ones
            if (&c != &cases[0] && &c != &cases[4]) break;
            EnvGuard t("TG_CUDA_TILE", tile);
            CHECK_ALL_NEAR(run(c, seed), want(c, seed), 1e-4);
        }
        seed += 2;
    }
    // compiled for two blocks a multiprocessor
    EnvGuard two("TG_CUDA_PRODUCT_BLOCKS", "2"), big("TG_CUDA_TILE", "128");
    CHECK_ALL_NEAR(run(cases[0], 7), want(cases[0], 7), 1e-4);
}

// A scatter of many rows (an embedding's gradient: 3000 tokens of a vocabulary of 50) adds its
// rows in ranges, each into a copy of the gradient, then the copies in order: the values of
// the CPU's, the same bits on every run, in graphs too, and a bad index is still an error.
TEST(cuda_scatters_of_many_rows_match_the_cpu) {
    NEED_GPU();
    auto run = [](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        Tensor table = Tensor::from_vector(th::randf(50 * 24, 41), {50, 24}).requires_grad();
        Tensor tokens = Tensor::from_vector(th::randi(3000, 42, 0, 49));
        Tensor g = Tensor::from_vector(th::randf(3000 * 24, 43), {3000, 24});
        std::vector<float> out;
        for (int s = 0; s < 3; s++) {   // the second and third run the program's graph
            table.zero_grad();
            (table.index_select(0, tokens) * g).sum().backward();
            for (float v : values(table.grad())) out.push_back(v);
        }
        Tensor bad = Tensor::from_vector(std::vector<int32_t>(3000, 50));
        table.zero_grad();
        CHECK_THROWS(((table.index_select(0, bad) * g).sum().backward(), table.grad().realize()),
                     "got 50");
        return out;
    };
    std::vector<float> cpu = run("CPU"), cuda = run("CUDA");
    CHECK_ALL_NEAR(cuda, cpu, 1e-4);
    CHECK(cuda == run("CUDA"));
}

// Sums of few columns over many rows (a bias's gradient, a layer norm's weight gradient: a
// product by a value per row) add ranges of rows, a thread per range and column; the last
// range of each column to finish adds its ranges in order: 5003 rows (no power of two:
// several segments of terms), a mean, rows read across two axes out of order (their loop
// variables from each row's number): the values of the CPU's, the same bits on every run, in
// graphs too.
TEST(cuda_column_sums_of_many_rows_match_the_cpu) {
    NEED_GPU();
    auto run = [](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        Tensor a = Tensor::from_vector(th::randf(5003 * 210, 61), {5003, 210});
        Tensor b = Tensor::from_vector(th::randf(5003 * 210, 62), {5003, 210});
        Tensor r = Tensor::from_vector(th::randf(5003, 63), {5003, 1});
        Tensor p = Tensor::from_vector(th::randf(50 * 100 * 210, 64), {50, 100, 210});
        std::vector<float> out;
        for (int s = 0; s < 3; s++)   // the second and third run the programs' graphs
            for (const Tensor& t : {a.sum(0), (a * b).sum(0), (a * r).mean(0),
                                    p.permute({1, 0, 2}).sum(std::vector<int>{0, 1})})
                for (float v : values(t)) out.push_back(v);
        return out;
    };
    std::vector<float> cpu = run("CPU"), cuda = run("CUDA");
    CHECK_ALL_NEAR(cuda, cpu, 1e-4);
    CHECK(cuda == run("CUDA"));
}

// A split product's or column sum's ranges run as one kernel: the last range of each tile or
// column to finish adds them, in their order, and runs the epilogue. The same program runs 3
// times on new values (its graph from the second run), each time with the CPU's values, so
// each run found its counters of arrivals back at 0; the bits are those of another 3 runs
// whose blocks ran in the other order (the stand-in runs a kernel's blocks backwards at every
// other launch), so they do not depend on which range finishes last. Partial tiles (20 x 30
// outputs of 3000 terms in 11 ranges), whole ones (64 x 64 of 4096 terms: 4 tiles of 32 x 32
// in 16 ranges); 5000 columns of 300 rows in 4 ranges.
TEST(cuda_split_sums_add_their_ranges_in_one_kernel) {
    NEED_GPU();
    std::vector<tg::detail::Program> programs;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) { programs.push_back(p); };
    auto run = [](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        std::vector<float> out;
        for (int s = 0; s < 3; s++) {
            Tensor e = Tensor::from_vector(th::randf(20 * 3000, 35 + s), {20, 3000});
            Tensor f = Tensor::from_vector(th::randf(3000 * 30, 40 + s), {3000, 30});
            Tensor c = Tensor::from_vector(th::randf(300 * 5000, 45 + s), {300, 5000});
            Tensor g = Tensor::from_vector(th::randf(64 * 4096, 50 + s), {64, 4096});
            Tensor h = Tensor::from_vector(th::randf(4096 * 64, 55 + s), {4096, 64});
            for (const Tensor& t : {(e.matmul(f) + 1).relu(), c.sum(0), g.matmul(h)})
                for (float v : values(t)) out.push_back(v);
        }
        return out;
    };
    std::vector<float> cpu = run("CPU");
    programs.clear();
    std::vector<float> cuda = run("CUDA");
    tg::detail::program_observer() = saved;
    // programs of one launch whose ranges add the totals
    int partial_tiles = 0, whole_tiles = 0, column_sum = 0;
    for (const tg::detail::Program& p : programs) {
        std::vector<tg::detail::Launch> launches = tg::detail::launches_of(p);
        tg::detail::KernelPlan plan =
            tg::detail::plan_kernel(p, launches[0].block, launches[0].part);
        if (launches.size() != 1 || launches[0].stage != 1) continue;
        std::string cu = tg::detail::render_cuda(p);
        bool tested = cu.find(" ? (outer") != std::string::npos;   // an output past the end
        partial_tiles += plan.product && plan.splits == 11 && tested &&
                         cu.find("last = atomicAdd(arrived, 1u) == 10u;") != std::string::npos;
        whole_tiles += plan.product && plan.splits == 16 && !tested &&
                       cu.find("last = atomicAdd(arrived, 1u) == 15u;") != std::string::npos;
        column_sum += plan.column_sum && plan.splits == 4 &&
                      cu.find("if (atomicAdd(arrived, 1u) != 3u) return;") != std::string::npos;
    }
    CHECK(partial_tiles >= 1);
    CHECK(whole_tiles >= 1);
    CHECK(column_sum >= 1);
    CHECK_ALL_NEAR(cuda, cpu, 1e-4);
    CHECK(cuda == run("CUDA"));
}

// CUDA's passes less fuse_maps: every nest its own kernel
static const char* const PASSES_APART =
    "simplify,substitute_temps,dead_stores,first_write,order_nests,parallel_loops,plan_memory";

// fuse_maps also joins a map over a product's outputs to the product, as its epilogue: two
// Linear layers with a GELU between, whose forward GELU and whose backward GELU (after the
// product that gives its output's gradient) each run in a product's kernel; the CPU's values,
// the same bits as the nests apart.
TEST(cuda_fuse_maps_joins_maps_into_a_products_epilogue) {
    NEED_GPU();
    std::vector<tg::detail::Program> programs;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) { programs.push_back(p); };
    // the gradients, and the products whose nest has a map joined
    auto run = [&](const char* device, const char* passes, int* joined) {
        EnvGuard dev("TG_DEVICE", device), chosen("TG_PASSES", passes);
        programs.clear();
        tg::manual_seed(8);
        tg::nn::Linear first(96, 80), second(80, 40);
        Tensor x = Tensor::from_vector(th::randf(64 * 96, 81), {64, 96});
        Tensor y = second(first(x).gelu(true));
        (y * y).mean().backward();
        std::vector<float> out;
        for (const Tensor& t : {first.weight.grad(), first.bias.grad(), second.weight.grad()})
            for (float v : values(t)) out.push_back(v);
        *joined = 0;
        for (const tg::detail::Program& p : programs)
            for (const auto& l : tg::detail::launches_of(p))
                *joined += tg::detail::plan_kernel(p, l.block, l.part).product &&
                           l.part.title.find(" + K") != std::string::npos;
        return out;
    };
    int joined = 0, apart_joined = 0, cpu_joined = 0;
    std::vector<float> cpu = run("CPU", "all", &cpu_joined);
    std::vector<float> cuda = run("CUDA", "all", &joined);
    std::vector<float> apart = run("CUDA", PASSES_APART, &apart_joined);
    tg::detail::program_observer() = saved;
    CHECK_ALL_NEAR(cuda, cpu, 1e-5);
    CHECK(cuda == apart);
    CHECK(joined >= 2);
    CHECK_EQ(apart_joined, 0);
}

// fuse_maps (a pass the CPU does not run: its fuse_loops fuses more): elementwise nests over
// the same loops become one, so a GELU's chain of nests and AdamW's updates of the moments and
// of each parameter run as fewer kernels, with the same bits as unfused, and the CPU's values.
TEST(cuda_fuse_maps_joins_elementwise_nests) {
    NEED_GPU();
    std::vector<tg::detail::Program> programs;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) { programs.push_back(p); };
    // the values after two steps, and the largest program's nests and fused nests
    auto run = [&](const char* device, const char* passes, size_t* nests, size_t* fused) {
        EnvGuard dev("TG_DEVICE", device), chosen("TG_PASSES", passes);
        programs.clear();
        Tensor x = Tensor::from_vector(th::randf(64 * 300, 71), {64, 300});
        Tensor a = Tensor::from_vector(th::randf(300, 72), {300}).requires_grad();
        Tensor b = Tensor::from_vector(th::randf(300, 73), {300}).requires_grad();
        Tensor c = Tensor::from_vector(th::randf(20 * 300, 74), {20, 300}).requires_grad();
        tg::optim::AdamW opt({a, b, c}, 1e-2, 0.9, 0.999, 1e-8, 0.01);
        for (int s = 0; s < 2; s++) {
            opt.zero_grad();
            ((x * a + b).gelu(true) * c.sum(0)).mean().backward();
            opt.step();
        }
        std::vector<float> out;
        for (const Tensor& t : {a, b, c})
            for (float v : values(t)) out.push_back(v);
        *nests = *fused = 0;
        for (const tg::detail::Program& p : programs) {
            if (p.blocks.size() <= *nests) continue;
            *nests = p.blocks.size();
            *fused = 0;
            for (const auto& block : p.blocks)
                *fused += block.title.find(" + K") != std::string::npos;
        }
        return out;
    };
    size_t nests = 0, fused = 0, apart_nests = 0, apart_fused = 0, cpu_nests = 0;
    std::vector<float> cpu = run("CPU", "all", &cpu_nests, &fused);
    std::vector<float> cuda = run("CUDA", "all", &nests, &fused);
    std::vector<float> apart = run("CUDA", PASSES_APART, &apart_nests, &apart_fused);
    tg::detail::program_observer() = saved;
    CHECK_ALL_NEAR(cuda, cpu, 1e-5);
    CHECK(cuda == apart);
    CHECK(fused >= 3);   // the GELU's, the moments', the parameters' updates
    CHECK_EQ(apart_fused, size_t(0));
    CHECK(nests + 6 <= apart_nests);
}

// fuse_maps also joins nests over the same rows, where the result runs as rows (a warp or a
// block per row): a layer norm's forward and backward, a softmax's, a loss's, each one kernel.
// The values of the CPU's and the bits of the nests apart, with rows of 96 (a warp each) and
// of 700 (a block each), and where a row reads another row's sum (flipped: not joined).
TEST(cuda_fuse_maps_joins_rows) {
    NEED_GPU();
    std::vector<tg::detail::Program> programs;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) { programs.push_back(p); };
    // the values, and the launches of the largest program and how many of them run as rows
    auto run = [&](const char* device, const char* passes, size_t* launched, size_t* rows) {
        EnvGuard dev("TG_DEVICE", device), chosen("TG_PASSES", passes);
        programs.clear();
        std::vector<float> out;
        for (int64_t width : {96, 700}) {
            int64_t n = width == 96 ? 1024 : 600;
            Tensor x = Tensor::from_vector(th::randf(size_t(n * width), 81), {n, width})
                           .requires_grad();
            tg::nn::LayerNorm norm(width);
            Tensor y = norm(x);
            Tensor classes = Tensor::from_vector(th::randi(size_t(n), 82, 0, int(width) - 1));
            Tensor loss = tg::nn::cross_entropy(y, classes) + (y.softmax(-1) * y).sum() +
                          (x - x.sum(-1, true).flip(0)).square().sum(-1).mean();
            loss.backward();
            for (const Tensor& t : {loss, x.grad(), norm.weight.grad(), norm.bias.grad()})
                for (float v : values(t)) out.push_back(v);
        }
        *launched = *rows = 0;
        for (const tg::detail::Program& p : programs) {
            auto launches = tg::detail::launches_of(p);
            if (launches.size() <= *launched) continue;
            *launched = launches.size();
            *rows = 0;
            for (const auto& l : launches)
                *rows += tg::detail::plan_kernel(p, l.block, l.part).cooperative;
        }
        return out;
    };
    size_t launched = 0, rows = 0, apart_launched = 0, apart_rows = 0, cpu_launched = 0;
    std::vector<float> cpu = run("CPU", "all", &cpu_launched, &rows);
    std::vector<float> cuda = run("CUDA", "all", &launched, &rows);
    std::vector<float> apart = run("CUDA", PASSES_APART, &apart_launched, &apart_rows);
    tg::detail::program_observer() = saved;
    CHECK_ALL_NEAR(cuda, cpu, 1e-5);
    CHECK(cuda == apart);
    CHECK(rows >= 2);
    CHECK(2 * launched <= apart_launched);   // here 6 against 21
}

// Launches that touch apart what the others write run side by side in one kernel, each on a
// range of its blocks: AdamW's updates of parameters of five shapes are one kernel, and so are
// sums by a block per row (3 of 1000) and by a warp per row (2000 of 100), two products'
// tiles (staging their terms in one array), and two split column sums (their last ranges add
// the totals, each with a scratch of its own) with a launch after them; scalar nests, each of
// one thread, that read one another (fuse_maps left out), run one after the other in one
// thread of one kernel; with the values of the CPU's and the same bits on every run. (A bounds check beside
// an in-place write keeps them apart: cuda_failed_check_is_an_error_and_skips_in_place_writes.)
TEST(cuda_launches_run_side_by_side_in_one_kernel) {
    NEED_GPU();
    std::vector<tg::detail::Program> programs;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) { programs.push_back(p); };
    auto run = [&](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        std::vector<Tensor> params;
        int salt = 90;
        for (tg::Shape s : std::vector<tg::Shape>{{300}, {20, 300}, {7}, {64, 5}, {1000}}) {
            int64_t n = 1;
            for (int64_t d : s) n *= d;
            params.push_back(Tensor::from_vector(th::randf(size_t(n), salt++), s).requires_grad());
        }
        tg::optim::AdamW opt(params, 1e-2, 0.9, 0.999, 1e-8, 0.01);
        for (int step = 0; step < 2; step++) {
            opt.zero_grad();
            Tensor loss = Tensor::from_vector(std::vector<float>{0.0f});
            for (const Tensor& p : params) loss = loss + (p * p * 0.5f).sum();
            loss.backward();
            opt.step();
        }
        {   // two scalars in a row, the second reading the first, as nests of their own
            // (AdamW's bias corrections were, before a device that recomputes calls computed
            // them in each update; fuse_maps joins such nests, so it is left out here)
            EnvGuard passes("TG_PASSES", "simplify,substitute_temps,dead_stores,first_write,"
                                         "parallel_loops,plan_memory");
            Tensor count = Tensor::from_vector(std::vector<float>{1.0f, 0.0f}).sum().realize();
            Tensor scale = Tensor::from_vector(std::vector<float>{0.5f, 0.0f}).sum().realize();
            Tensor counted = count.assign(count + 1.0f);
            tg::realize({counted, scale.assign((scale * counted).exp())});
            params.push_back(count);
            params.push_back(scale);
        }
        Tensor few = Tensor::from_vector(th::randf(3 * 1000, 95), {3, 1000});
        Tensor many = Tensor::from_vector(th::randf(2000 * 100, 96), {2000, 100});
        Tensor a = Tensor::from_vector(th::randf(64 * 96, 97), {64, 96});
        Tensor b = Tensor::from_vector(th::randf(96 * 80, 98), {96, 80});
        Tensor columns = Tensor::from_vector(th::randf(300 * 5000, 99), {300, 5000});
        Tensor more = Tensor::from_vector(th::randf(400 * 4000, 100), {400, 4000});
        std::vector<Tensor> sums = {few.sum(1),          many.sum(1),    a.matmul(b),
                                    b.t().matmul(a.t()), columns.sum(0), more.sum(0),
                                    a.exp()};
        tg::realize(sums);
        std::vector<float> out;
        for (const Tensor& p : params)
            for (float v : values(p)) out.push_back(v);
        for (const Tensor& s : sums)
            for (float v : values(s)) out.push_back(v);
        return out;
    };
    std::vector<float> cpu = run("CPU");
    programs.clear();
    std::vector<float> cuda = run("CUDA");
    size_t most = 0;       // the most updates side by side in a kernel
    bool groups = false;   // a block per row beside a warp per row
    bool products = false;   // two products' tiles
    bool split = false;      // two split sums and a launch after them
    bool sequence = false;   // the two scalars in one thread, in order
    for (const tg::detail::Program& p : programs) {
        std::vector<tg::detail::Launch> launches = tg::detail::launches_of(p);
        for (const auto& kernel : tg::detail::kernels_of(p, launches)) {
            bool updates = true, block = false, warp = false;
            int tiled = 0, splits = 0;
            for (size_t i : kernel) {
                const tg::detail::Launch& l = launches[i];
                updates = updates && l.part.title.find("update") != std::string::npos;
                tg::detail::KernelPlan plan = tg::detail::plan_kernel(p, l.block, l.part);
                block = block || (plan.cooperative && !plan.warp && plan.items == 3);
                warp = warp || (plan.warp && plan.items == 2000);
                tiled += plan.product;
                splits += l.stage == 1;
            }
            if (updates) most = std::max(most, kernel.size());
            groups = groups || (block && warp);
            // their staged terms in one array of the kernel
            products = products || (tiled == 2 && th::count_of(tg::detail::render_cuda(p),
                                                               "float tg_tiles[") == 1);
            split = split || (splits == 2 && kernel.size() > 2);
            sequence = sequence ||
                       (kernel.size() >= 2 && tg::detail::in_sequence(p, launches, kernel) &&
                        tg::detail::render_cuda(p).find("    {   // " + launches[kernel[0]].name) !=
                            std::string::npos);
        }
    }
    tg::detail::program_observer() = saved;
    CHECK_ALL_NEAR(cuda, cpu, 1e-5);
    CHECK(cuda == run("CUDA"));
    CHECK_EQ(most, size_t(5));
    CHECK(groups);
    CHECK(products);
    CHECK(split);
    CHECK(sequence);
}

// TG_CUDA_PROFILE=1: programs run kernel by kernel (no graphs), and each kernel's GPU time is
// summed in a table by program and kernel, beside the title of the nest it computes.
TEST(cuda_profile_times_each_kernel) {
    NEED_GPU();
    EnvGuard dev("TG_DEVICE", "CUDA"), profile("TG_CUDA_PROFILE", "1");
    Tensor x = Tensor::from_vector(th::randf(64 * 300, 51), {64, 300});
    int64_t graphs = tg::stats().graph_runs;
    for (int i = 0; i < 3; i++) (x.softmax(-1) * 2).realize();
    CHECK_EQ(tg::stats().graph_runs, graphs);
    std::string report = tg::cuda::profile_report();
    CHECK(report.find("CUDA kernel times (TG_CUDA_PROFILE)") != std::string::npos);
    int64_t calls = 0;
    std::istringstream lines(report);
    for (std::string line; std::getline(lines, line);) {
        if (line.find("test_cuda_cpp_") == std::string::npos) continue;
        if (line.find("/k0: K0") == std::string::npos) continue;
        double ms = -1, share = -1, mean = -1;
        long long n = 0;
        CHECK_EQ(std::sscanf(line.c_str(), "%lf %lf%% %lld %lf", &ms, &share, &n, &mean), 4);
        CHECK(ms >= 0 && mean >= 0);
        calls = std::max<int64_t>(calls, n);
    }
    CHECK(calls >= 3);
}

// Integer min is -max(-x): CUDA 13.0's ptxas lost the negations in such a loop (found by the
// oracle, graph 1169) until integer max became a call.
TEST(cuda_integer_min_and_max_match_the_cpu) {
    NEED_GPU();
    auto run = [](const char* device) {
        EnvGuard dev("TG_DEVICE", device);
        Tensor x = Tensor::arange(450).reshape({3, 6, 5, 5}).contiguous();
        Tensor y = Tensor::from_vector(th::randi(450, 7, -4, 4), {3, 6, 5, 5});
        std::vector<int32_t> out;
        for (const Tensor& t : {x.min(std::vector<int>{2, -1}, true), (-x).max({2, -1}, true),
                                y.min(std::vector<int>{2, -1}, true), y.max(1).values, y.argmax(-1)})
            for (int32_t v : t.to_vector<int32_t>()) out.push_back(v);
        return out;
    };
    CHECK(run("CUDA") == run("CPU"));
}

TEST(cuda_failed_check_is_an_error_and_skips_in_place_writes) {
    NEED_GPU();
    EnvGuard dev("TG_DEVICE", "CUDA");
    Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}).contiguous().realize();
    Tensor bad = Tensor::from_vector(std::vector<int32_t>{1, 9, 0, 2});
    CHECK_THROWS(w.assign(w + w.gather(0, bad)).realize(), "gather", "got 9", "test_cuda.cpp");
    CHECK_ALL_NEAR(values(w), (std::vector<float>{1, 2, 3, 4}), 0);
    // one program run three times: its kernels, then as a CUDA graph, then failing as one
    // (graphs on, also where make test-cuda-memcheck turns them off for the other tests)
    EnvGuard on("TG_CUDA_GRAPHS", "1");
    int64_t graphs = tg::stats().graph_runs;
    Tensor good = Tensor::from_vector(std::vector<int32_t>{3, 2, 1, 0});
    auto step = [&](const Tensor& idx) { w.assign(w + w.gather(0, idx)).realize(); };
    step(good);
    step(good);
    CHECK_ALL_NEAR(values(w), (std::vector<float>{10, 10, 10, 10}), 0);
    CHECK_THROWS(step(bad), "gather", "got 9");
    CHECK_ALL_NEAR(values(w), (std::vector<float>{10, 10, 10, 10}), 0);
    CHECK(tg::stats().graph_runs >= graphs + 2);
    // a nest of one thread that writes in place (a scalar) decides alone, without a barrier
    Tensor total = Tensor::from_vector(std::vector<float>{1}).reshape({}).contiguous().realize();
    auto add = [&](const Tensor& idx) { total.assign(total + w.gather(0, idx).sum()).realize(); };
    add(good);
    CHECK_THROWS(add(bad), "gather", "got 9");
    CHECK_ALL_NEAR(values(total), (std::vector<float>{41}), 0);
    EnvGuard check("TG_CHECK", "1");
    CHECK_THROWS((w.log() - 2 * w.log()).sqrt().realize(), "NaN");
}

// A program let go (the table of programs kept for reuse starts again, empty, at 64) unloads
// its module: a process that runs graphs of many shapes does not fill the GPU with modules.
TEST(cuda_programs_unload_their_module) {
    NEED_GPU();
    if (!stand_in()) SKIP("counts the CPU stand-in's modules");
    void* library = dlopen(std::getenv("TG_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
    auto live = library ? reinterpret_cast<int (*)()>(dlsym(library, "tg_cpu_live_modules"))
                        : nullptr;
    CHECK(live != nullptr);
    if (!live) return;
    tg::detail::Program captured;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) { captured = p; };
    (Tensor::arange(5).to("CUDA") * 3).realize();
    tg::detail::program_observer() = saved;
    int before = live();
    {
        std::shared_ptr<tg::detail::Executable> exe = tg::detail::device("CUDA").prepare(captured);
        CHECK_EQ(live(), before + 1);
    }
    CHECK_EQ(live(), before);
    dlclose(library);
}

TEST(cuda_memory_is_reused_and_copies_round_trip) {
    NEED_GPU();
    tg::detail::Device& d = tg::detail::device("CUDA");
    void* p = d.alloc(1000);
    d.free(p);
    void* q = d.alloc(1000);
#ifdef TG_TEST_ASAN
    // under AddressSanitizer a buffer is exactly its bytes and is freed at once; the stand-in's
    // device memory is host memory, where ASan sees both
    if (stand_in()) {
        CHECK(__asan_address_is_poisoned(static_cast<char*>(q) + 1000));
        CHECK(__asan_address_is_poisoned(p));
    }
#else
    CHECK_EQ(p, q);   // the freed block came back
#endif
    std::vector<int64_t> host = {1, -2, 3}, back(3);
    d.copy_in(q, host.data(), 24);
    d.copy_out(back.data(), q, 24);
    CHECK(back == host);
    d.free(q);
    Tensor big = Tensor::ones({1 << 20}).to("CUDA");
    CHECK_EQ(big.sum().item(), double(1 << 20));
    // copies from the host return at once: their sources may go right away (staged), many
    // may be in flight, and one over the staging limit waits
    std::vector<Tensor> moved;
    for (int i = 0; i < 300; i++) {
        std::vector<float> v(size_t(1000 + i), float(i));
        moved.push_back(Tensor::from_vector(v).to("CUDA"));
    }
    for (int i = 0; i < 300; i += 37) CHECK_EQ(moved[size_t(i)].sum().item(), double(i) * (1000 + i));
    Tensor huge = Tensor::full({5 << 20}, 2.0f).to("CPU").to("CUDA");   // 20 MiB
    CHECK_EQ(huge.sum().item(), double(10 << 20));
}

TEST(cuda_debug_keeps_the_cu_source) {
    NEED_GPU();
    char tmpl[] = "/tmp/tg-cuda-debug-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    {
        EnvGuard cache("TG_CACHE_DIR", dir.c_str());
        EnvGuard debug("TG_DEBUG", "2");
        EnvGuard dev("TG_DEVICE", "CUDA");
        (Tensor::randn({7}, 4) * 3).realize();
    }
    CHECK(!kept_cu_files(dir).empty());
    if (std::system(("rm -rf " + dir).c_str()) != 0) th::report(__FILE__, __LINE__, "rm failed");
}

// What the kept .cu is for: a debugger stops inside a generated kernel at a line of it, shows
// the line and reads the kernel's variables. On a GPU the debugger is cuda-gdb (TG_DEBUG >= 4
// compiles with -G -lineinfo); on the CPU stand-in, whose kernels are C++ built with -g under
// the .cu's name, it is gdb.
TEST_CHILD(cuda_debugged_program) {
    EnvGuard dev("TG_DEVICE", "CUDA");
    Tensor x = Tensor::arange(7).cast(tg::DType::FLOAT32);
    CHECK_NEAR(values((x * 3).sin())[1], std::sin(3.0), 1e-6);
}
TEST(cuda_debugger_stops_in_a_generated_kernel) {
    NEED_GPU();
    const int failures_before = th::failures();
    const std::string debugger = stand_in() ? "gdb" : "cuda-gdb", exe = th::self_exe();
    if (std::getenv("TG_TEST_MEMCHECK"))   // make test-cuda-memcheck
        SKIP("under compute-sanitizer: not with a debugger in a child at once");
    if (std::system(("command -v " + debugger + " >/dev/null 2>&1").c_str()) != 0)
        SKIP(debugger + " is not installed");
    char tmpl[] = "/tmp/tg-cuda-gdb-XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    struct Removed {   // the folder, however the case ends
        const std::string& dir;
        ~Removed() {
            if (std::system(("rm -rf '" + dir + "'").c_str()) != 0) std::perror("rm");
        }
    } removed{dir};
    const std::string child = "TG_TEST_CHILD=cuda_debugged_program TG_DEBUG=4 TG_CACHE_DIR='" +
                              dir + "' ";
    // a first run compiles the kernel with debug information and keeps its .cu
    CHECK_EQ(std::system((child + "'" + exe + "' >'" + dir + "/run.log' 2>&1").c_str()), 0);
    const std::vector<std::string> kept = kept_cu_files(dir);
    CHECK_EQ(kept.size(), size_t(1));   // the program's one
    const std::string cu = kept.empty() ? "" : kept[0];
    // the kernel's store, which every thread of an element runs
    std::ifstream source(cu);
    std::string text, store;
    int line = 0;
    bool in_kernel = false;
    for (int n = 1; store.empty() && std::getline(source, text); n++) {
        in_kernel = in_kernel || text.find("__global__") != std::string::npos;
        if (in_kernel && text.find("] = ") != std::string::npos) line = n, store = text;
    }
    CHECK(line > 0);
    if (cu.empty() || line == 0) return;
    const std::string at = cu + ":" + std::to_string(line), log = dir + "/debugger.log";
    // stops at the store, reads the thread's element, then lets the program run to its end
    // (LeakSanitizer cannot work in a traced process: make test-asan turns it off there)
    const std::string no_leak_check =
        "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" ";
    std::string command = child + no_leak_check + "timeout 120 " + debugger +
                          " -batch -nx -ex 'set breakpoint pending on' -ex 'break " + at +
                          "' -ex run -ex 'print i0' -ex delete -ex continue '" + exe +
                          "' >'" + log + "' 2>&1";
    int rc = std::system(command.c_str());
    std::ifstream read(log);
    std::stringstream out;
    out << read.rdbuf();
    const std::string said = out.str();
    if (said.find("ptrace: Operation not permitted") != std::string::npos)
        SKIP(debugger + " may not trace processes here (ptrace)");
    CHECK_EQ(rc, 0);
    CHECK(said.find("Breakpoint 1, ") != std::string::npos);
    CHECK(said.find(" at " + at + "\n") != std::string::npos);      // stopped there
    CHECK(said.find(std::to_string(line) + "\t" + store) != std::string::npos);   // the line
    size_t value = said.find("$1 = ");                               // a thread's element
    CHECK(value != std::string::npos && said.size() > value + 5 && said[value + 5] >= '0' &&
          said[value + 5] <= '6');
    CHECK(said.find("exited normally]") != std::string::npos);   // then ran to its end
    // the stand-in keeps a debug build's library on disk while it is loaded, for the debugger
    if (stand_in()) CHECK(said.find("BFD: reopening") == std::string::npos);
    if (th::failures() > failures_before) std::fprintf(stderr, "%s\n", said.c_str());
}

// A jitted step replays as one CUDA graph from its second run; new inputs (other buffers) set
// the arguments of the kernels that read them. The same bits as launches one by one.
TEST(cuda_jitted_steps_replay_as_one_graph) {
    NEED_GPU();
    auto train = [](const char* graphs) {
        EnvGuard dev("TG_DEVICE", "CUDA"), g("TG_CUDA_GRAPHS", graphs);
        Tensor X = Tensor::from_vector(th::randf(48 * 10, 5), {48, 10});
        Tensor Y = Tensor::from_vector(th::randi(48, 6, 0, 3), {48});
        tg::manual_seed(3);
        tg::nn::Sequential mlp(tg::nn::Linear(10, 32), tg::nn::Tanh(), tg::nn::Linear(32, 4));
        tg::optim::Adam opt(mlp.parameters(), 0.01);
        tg::Jit step([&](const std::vector<Tensor>& in) {
            Tensor loss = tg::nn::cross_entropy(mlp(in[0]), in[1]);
            opt.zero_grad();
            loss.backward();
            opt.step();
            return loss;
        });
        int64_t before = tg::stats().graph_runs;
        std::vector<float> out;
        std::vector<Tensor> kept;   // each batch in buffers of its own
        for (int s = 0; s < 6; s++) {   // the same batch twice, then others
            int b = s < 2 ? 0 : s % 3;
            kept.push_back(X.slice(0, 16 * b, 16 * b + 16).contiguous().realize());
            kept.push_back(Y.slice(0, 16 * b, 16 * b + 16).contiguous().realize());
            out.push_back(float(step({kept[kept.size() - 2], kept.back()}).item()));
        }
        for (const Tensor& p : mlp.parameters())
            for (float v : values(p)) out.push_back(v);
        out.push_back(float(tg::stats().graph_runs - before));
        return out;
    };
    std::vector<float> launches = train("0"), graphs = train("1");
    CHECK_EQ(launches.back(), 0.0f);
    CHECK(graphs.back() >= 5);   // the 5 replays (programs run again may add more)
    launches.pop_back();
    graphs.pop_back();
    CHECK(graphs == launches);
}

// Events stand for the work queued so far; copies between GPUs are ordered by them.
TEST(cuda_events_order_and_time_the_work) {
    NEED_GPU();
    tg::cuda::Event start;
    Tensor x = Tensor::from_vector(th::randf(4096, 8), {64, 64}).to("CUDA");
    Tensor y = (x.matmul(x) + 1).realize();
    tg::cuda::Event end;
    end.synchronize();
    CHECK(end.done());
    CHECK(end.milliseconds_since(start) >= 0);
    CHECK_THROWS(tg::cuda::Event("CPU"), "Event: CPU is not a CUDA device");
    bool two = true;
    try {
        tg::cuda::gpu_name("CUDA:1");
    } catch (const tg::Error&) {
        two = false;
    }
    if (!two) SKIP("one GPU: copies between GPUs need two");
    end.happens_before("CUDA:1");
    Tensor z = (y.to("CUDA:1") * 2).to("CUDA") - y * 2;   // there and back, in order
    CHECK_ALL_NEAR(values(z), std::vector<float>(4096, 0.0f), 0);
}

// The driver's entry points as the toolkit's stub library names them (the GPU's driver
// exports the same names): a misspelt or removed name fails here, without a GPU.
TEST(cuda_driver_entry_points_are_in_the_toolkits_stub_library) {
    std::string stub;
    for (const char* dir : {"/usr/local/cuda/lib64/stubs", "/usr/local/cuda/lib/stubs"}) {
        std::string path = std::string(dir) + "/libcuda.so";
        if (FILE* f = std::fopen(path.c_str(), "rb")) {
            std::fclose(f);
            stub = path;
            break;
        }
    }
    if (stub.empty()) SKIP("no CUDA toolkit in /usr/local/cuda (its stub libcuda.so)");
    void* lib = dlopen(stub.c_str(), RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != nullptr);
    if (!lib) return;
    for (const std::string& name : tg::detail::cuda_driver_symbol_names())
        if (!dlsym(lib, name.c_str())) th::report(__FILE__, __LINE__, stub + " has no " + name);
    CHECK(tg::detail::cuda_driver_symbol_names().size() >= 30);
    dlclose(lib);
}

// ---- random graphs --------------------------------------------------------------------------

// Random graphs (tests/random_graphs.hpp) and their gradients realized on CUDA against the
// unoptimized interpreter, with every product tiled (TG_TILE_MIN_WORK=1) and the GPU's plans
// at a test's sizes (TG_CUDA_SMALL_PLANS=1), so that graphs of a few elements reach each plan:
// tiled products with their sums split or not (tiles of the size the plan picks, 64 and 128 in
// turn), scatters with their rows split or not, blocks and warps that share an item, sums split
// over blocks, column sums. Each batch runs twice, with the same bits (the stand-in runs a
// kernel's blocks in the other order the second time).
TEST(cuda_random_graphs_take_every_plan_and_match_the_interpreter) {
    NEED_GPU();
    EnvGuard on("TG_ORACLE_DEVICE", "CUDA"), tiles("TG_TILE_MIN_WORK", "1"),
        small("TG_CUDA_SMALL_PLANS", "1");
    std::map<std::string, int> plans;
    std::function<void(const tg::detail::Program&)> before = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program& p) {
        if (before) before(p);
        const char* device = std::getenv("TG_DEVICE");
        if (!device || std::string(device) != "CUDA") return;
        for (const tg::detail::Launch& l : tg::detail::launches_of(p)) {
            if (l.stage == 2) continue;   // a split scatter's second kernel
            tg::detail::KernelPlan plan = tg::detail::plan_kernel(p, l.block, l.part);
            const char* split = plan.splits > 1 ? " split" : "";
            std::string kind = plan.product      ? std::string("product") + split
                               : plan.serial     ? std::string("scatter") + split
                               : plan.column_sum ? "column sum"
                               : plan.warp       ? "warp"
                               : plan.cooperative ? std::string("block") + split
                                                  : "thread";
            plans[kind]++;
        }
    };
    const oracle::Tolerance tolerance;
    for (uint64_t first = 80700; first < 80800; first += 10) {
        const char* tiles_of[] = {"0", "64", "128"};   // 0: the size the plan picks
        EnvGuard tile("TG_CUDA_TILE", tiles_of[first / 10 % 3]);
        std::vector<oracle::Graph> graphs;
        std::vector<const oracle::Graph*> each;
        for (uint64_t seed = first; seed < first + 10; seed++)
            graphs.push_back(oracle::generate(seed));
        for (const oracle::Graph& g : graphs) each.push_back(&g);
        std::vector<oracle::Outcome> cuda = oracle::run(each, oracle::Mode::OPTIMIZED_CPU),
                                     again = oracle::run(each, oracle::Mode::OPTIMIZED_CPU),
                                     interp = oracle::run(each, oracle::Mode::REFERENCE_INTERP);
        for (size_t i = 0; i < graphs.size(); i++) {
            std::string what = oracle::compare(cuda[i], interp[i], tolerance);
            if (what.empty()) what = oracle::same_bits(again[i], cuda[i]);
            if (!what.empty())
                th::report(__FILE__, __LINE__, "graph " + std::to_string(graphs[i].seed) + ": " +
                                                   what + "\n" + oracle::listing(graphs[i]));
        }
    }
    tg::detail::program_observer() = before;
    for (const char* kind : {"product", "product split", "scatter", "scatter split", "block",
                             "block split", "warp", "column sum"})
        if (plans[kind] == 0) th::report(__FILE__, __LINE__, std::string("no nest ran as ") + kind);
}

// ---- several GPUs and NCCL --------------------------------------------------------------------

TEST(cuda_numbered_devices_and_nccl_errors_without_a_gpu) {
    std::string why;
    if (gpu(&why)) SKIP("a GPU is present: the errors of its absence cannot be seen");
    CHECK(&tg::detail::device("CUDA:0") == &tg::detail::device("CUDA"));
    tg::detail::Device& second = tg::detail::device("CUDA:1");
    CHECK_EQ(std::string(second.name()), std::string("CUDA:1"));
    CHECK_THROWS(Tensor::ones({2}).to("CUDA:1"), "CUDA", "libcuda.so.1");
    {
        EnvGuard lib("TG_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
        CHECK_THROWS(tg::cuda::nccl_unique_id(), "NCCL: cannot load /nonexistent/libnccl.so.2",
                     "TG_NCCL_LIBRARY");
    }
    CHECK_THROWS(tg::cuda::Nccl(0, 2, "abc"), "NCCL: the unique id must be 256 lowercase hex");
    CHECK_THROWS(tg::cuda::Nccl(2, 2, std::string(256, '0')), "NCCL: rank 2 of 2 ranks");
    CHECK_THROWS(tg::cuda::Nccl(0, 1, std::string(256, '0'), "CPU"),
                 "NCCL: CPU is not a CUDA device");
    {
        EnvGuard rank("TG_NCCL_RANK", "0"), ranks("TG_NCCL_RANKS", "1");
        unsetenv("TG_NCCL_ID");
        unsetenv("TG_NCCL_ID_FILE");
        CHECK_THROWS(tg::cuda::Nccl::from_environment(), "TG_NCCL_ID", "TG_NCCL_ID_FILE");
    }
    tg::manual_seed(1);
    tg::nn::Linear layer(3, 2);
    tg::optim::SGD opt(layer.parameters(), 0.1);
    CHECK_THROWS(tg::DataParallel({"CPU", "CUDA"}, opt, [&](const std::vector<Tensor>& s) {
        return layer(s[0]).sum();
    }), "CPU and CUDA are devices of different kinds");
}

// An MLP trained 4 steps on CUDA, on batches of 12 rows: by one GPU's jitted step (no
// devices), or by DataParallel over `devices`; with a communicator (comm), this process takes
// its rank's rows of each batch and the gradients are summed across the processes. The
// parameters after.
static std::vector<float> train_mlp_on_cuda(const std::vector<std::string>& devices,
                                            tg::cuda::Nccl* comm = nullptr) {
    EnvGuard dev("TG_DEVICE", devices.empty() ? "CUDA" : devices[0].c_str());
    Tensor X = Tensor::from_vector(th::randf(64 * 10, 3), {64, 10});
    Tensor Y = Tensor::from_vector(th::randi(64, 4, 0, 3), {64});
    tg::manual_seed(2);
    tg::nn::Sequential mlp(tg::nn::Linear(10, 32), tg::nn::Tanh(), tg::nn::Linear(32, 4));
    tg::optim::Adam opt(mlp.parameters(), 0.01);
    auto loss_of = [&](const Tensor& x, const Tensor& y) {
        return tg::nn::cross_entropy(mlp(x), y);
    };
    tg::Jit one([&](const std::vector<Tensor>& in) {
        Tensor loss = loss_of(in[0], in[1]);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
    std::unique_ptr<tg::DataParallel> dp;
    if (!devices.empty())
        dp = std::make_unique<tg::DataParallel>(
            devices, opt, [&](const std::vector<Tensor>& s) { return loss_of(s[0], s[1]); });
    const int64_t batch = 12, rank = comm ? comm->rank() : 0, ranks = comm ? comm->ranks() : 1;
    if (comm) dp->all_reduce(comm->all_reduce(), comm->ranks());
    for (int64_t s = 0; s < 4; s++) {
        int64_t first = batch * s + batch * rank / ranks;
        int64_t end = batch * s + batch * (rank + 1) / ranks;
        std::vector<Tensor> in = {X.slice(0, first, end), Y.slice(0, first, end)};
        dp ? (*dp)(in) : one(in);
    }
    std::vector<float> out;
    for (const Tensor& p : mlp.parameters())
        for (float v : values(p.to("CPU"))) out.push_back(v);
    return out;
}

// Two GPUs (or the stand-in's two): DataParallel splits the batch over them (copies between
// GPUs, each device's queue, the gradients summed on the first) and gives one GPU's jitted
// step within float rounding, the same bits on every run.
TEST(cuda_data_parallel_over_two_gpus_matches_one) {
    NEED_GPU();
    try {
        tg::cuda::gpu_name("CUDA:1");
    } catch (const tg::Error&) {
        SKIP("one GPU: data parallelism over two needs two");
    }
    std::vector<float> one = train_mlp_on_cuda({}), two = train_mlp_on_cuda({"CUDA:0", "CUDA:1"});
    CHECK_ALL_NEAR(two, one, 2e-5);
    CHECK(train_mlp_on_cuda({"CUDA:0", "CUDA:1"}) == two);
}

// On one GPU: DataParallel on CUDA gives one device's jitted step, and a communicator of one
// rank runs the path that sums across processes, changing nothing.
TEST(cuda_data_parallel_with_a_one_rank_nccl) {
    NEED_GPU();
    if (stand_in()) SKIP("NCCL needs a GPU, not the CPU stand-in");
    std::vector<float> jit = train_mlp_on_cuda({}), dp = train_mlp_on_cuda({"CUDA:0"});
    CHECK_ALL_NEAR(dp, jit, 1e-5);
    tg::cuda::Nccl comm(0, 1, tg::cuda::nccl_unique_id());
    CHECK(train_mlp_on_cuda({"CUDA:0"}, &comm) == dp);
}

// A communicator whose other ranks never come: NCCL's error, named (the stand-in's NCCL waits
// 0.2 s here).
TEST(cuda_nccl_without_the_other_ranks_is_an_error) {
    NEED_GPU();
    if (!stand_in()) SKIP("the wait of a GPU's NCCL for absent ranks is its own to set");
    char tmpl[] = "/tmp/tg-nccl-test-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    {
        EnvGuard lib("TG_NCCL_LIBRARY", std::getenv("TG_CUDA_LIBRARY")),
            tmp("TMPDIR", dir.c_str()), wait("TG_CUDA_ON_CPU_NCCL_WAIT", "0.2");
        CHECK_THROWS(tg::cuda::Nccl(0, 2, tg::cuda::nccl_unique_id()),
                     "NCCL: ncclCommInitRank failed: a rank did not come in time");
    }
    CHECK_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

// One process of cuda_data_parallel_across_processes_with_nccl: rank TG_NCCL_RANK on
// CUDA:<rank>; its parameters after training, each float's bits in hex, a line each, in the
// file TG_TEST_NCCL_OUT.
TEST_CHILD(nccl_rank_trains_on_its_rows) {
    const char* rank = std::getenv("TG_NCCL_RANK");
    std::string device = std::string("CUDA:") + (rank ? rank : "0");
    tg::cuda::Nccl comm = tg::cuda::Nccl::from_environment(device);
    std::vector<float> params = train_mlp_on_cuda({device}, &comm);
    std::ofstream out(std::getenv("TG_TEST_NCCL_OUT"));
    for (float v : params) {
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        out << std::hex << bits << "\n";
    }
    CHECK(out.good());
}

// Processes, one per GPU (a machine's, or the CPU stand-in's, whose NCCL is files in a shared
// directory), each training on its rows of every batch, their gradients summed by NCCL: with
// 2 and with 3 ranks, every rank ends with the same parameters, one GPU's within float
// rounding, and the same bits on another run.
TEST(cuda_data_parallel_across_processes_with_nccl) {
    NEED_GPU();
    std::string nccl_library;   // the stand-in is NCCL too; a GPU has NCCL's own
    if (stand_in()) nccl_library = std::getenv("TG_CUDA_LIBRARY");
    else
        try {
            tg::cuda::nccl_unique_id();
        } catch (const tg::Error& e) {
            SKIP(std::string("no NCCL: ") + e.what());
        }
    char tmpl[] = "/tmp/tg-nccl-test-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    const std::string exe = th::self_exe();
    CHECK(!exe.empty());
    int jobs = 0;
    // each rank's parameters, from `ranks` processes started at once
    auto run_ranks = [&](int ranks) {
        std::string job = dir + "/job" + std::to_string(jobs++), command;
        for (int r = 0; r < ranks; r++) {
            std::string at = job + "." + std::to_string(r);
            command += "(TG_TEST_CHILD=nccl_rank_trains_on_its_rows TG_NCCL_RANK=" +
                       std::to_string(r) + " TG_NCCL_RANKS=" + std::to_string(ranks) +
                       " TG_NCCL_ID_FILE='" + job + ".id' TG_TEST_NCCL_OUT='" + at +
                       ".params' TMPDIR='" + dir + "' ";
            if (!nccl_library.empty())
                command += "TG_NCCL_LIBRARY='" + nccl_library +
                           "' TG_CUDA_ON_CPU_GPUS=" + std::to_string(ranks) + " ";
            command += "'" + exe + "' >'" + at + ".log' 2>&1; echo $? >'" + at +
                       ".status') & ";
        }
        CHECK_EQ(std::system((command + "wait").c_str()), 0);
        std::vector<std::vector<float>> params(static_cast<size_t>(ranks));
        for (int r = 0; r < ranks; r++) {
            std::string at = job + "." + std::to_string(r), status;
            std::ifstream(at + ".status") >> status;
            if (status != "0") {
                std::stringstream log;
                log << std::ifstream(at + ".log").rdbuf();
                th::report(__FILE__, __LINE__, "rank " + std::to_string(r) + " of " +
                           std::to_string(ranks) + " exited with " + status + ":\n" + log.str());
            }
            std::ifstream in(at + ".params");
            for (uint32_t bits; in >> std::hex >> bits;) {
                float v;
                std::memcpy(&v, &bits, sizeof v);
                params[size_t(r)].push_back(v);
            }
        }
        return params;
    };
    std::vector<float> one = train_mlp_on_cuda({});
    for (int ranks : {2, 3}) {
        if (!stand_in()) try {
                tg::cuda::gpu_name("CUDA:" + std::to_string(ranks - 1));
            } catch (const tg::Error&) {
                break;   // a rank a GPU: too few of them
            }
        std::vector<std::vector<float>> each = run_ranks(ranks);
        for (int r = 1; r < ranks; r++) CHECK(each[size_t(r)] == each[0]);
        CHECK_ALL_NEAR(each[0], one, 2e-5);
        if (ranks == 2) CHECK(run_ranks(2)[1] == each[0]);
    }
    CHECK_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
    if (jobs == 0) SKIP("one GPU: NCCL across processes needs a GPU for each");
}

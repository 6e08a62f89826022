// The runtime: disk cache shared between processes, corrupt entries rebuilt, compiler failures
// reported with everything needed to reproduce, TG_DEBUG output and kept artifacts.
#include "harness.hpp"
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <algorithm>
#include <fstream>
#include <thread>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef TG_TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif
using tg::Tensor;
using th::EnvGuard;

namespace {
using th::self_exe;
std::string fresh_dir() {
    char tmpl[] = "/tmp/tg-runtime-XXXXXX";
    return mkdtemp(tmpl) ? std::string(tmpl) : std::string();
}
std::vector<std::string> files_in(const std::string& dir, const std::string& suffix) {
    std::vector<std::string> out;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) {
            std::string n = e->d_name;
            if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
                out.push_back(dir + "/" + n);
        }
        closedir(d);
    }
    return out;
}
std::string slurp(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
// Runs the child test case in a new process with its own cache dir and TG_DEBUG=1; returns
// its stderr (the debug line) and whether it exited cleanly.
// env: more NAME=value words for the child's environment.
bool run_child(const std::string& cache, std::string& debug_out, const std::string& env = "") {
    std::string log = cache + "/child.log";
    std::string cmd = env + " TG_TEST_CHILD=child_program TG_DEBUG=1 TG_CACHE_DIR='" + cache +
                      "' '" + self_exe() + "' >/dev/null 2>'" + log + "'";
    int rc = std::system(cmd.c_str());
    debug_out = slurp(log);
    std::remove(log.c_str());
    return rc == 0;
}
void remove_tree(const std::string& dir) { std::system(("rm -rf '" + dir + "'").c_str()); }
// A program no other test compiles (id: unique to the call), so this process has not loaded it.
Tensor unique_program(int id) { return Tensor::arange(5) * 7919 + id; }
Tensor child_expression() {
    Tensor a = Tensor::arange(12).reshape({3, 4}).cast(tg::DType::FLOAT32);
    return (a * 2.0f + 1.0f).sum(1);
}
}  // namespace

// Runs only inside the child process that the cache tests start.
TEST_CHILD(child_program) {
    std::vector<float> v = child_expression().to_vector();
    CHECK_ALL_NEAR(v, (std::vector<double>{16, 48, 80}), 0);
    if (v != std::vector<float>{16, 48, 80}) std::exit(3);
}

TEST_ON_CPU(cache_second_process_compiles_nothing) {
    std::string dir = fresh_dir(), first, second;
    CHECK(run_child(dir, first));
    CHECK(run_child(dir, second));
    CHECK(first.find("compiles 1") != std::string::npos);
    CHECK(second.find("compiles 0") != std::string::npos);
    CHECK(second.find("disk hits 1") != std::string::npos);
    struct stat st;
    CHECK(stat(dir.c_str(), &st) == 0 && (st.st_mode & 0777) == 0700);
    CHECK_EQ(files_in(dir, ".so").size(), size_t(1));
    CHECK(files_in(dir, ".tmp").empty());
}

TEST(cache_dir_created_private) {
    std::string parent = fresh_dir(), dir = parent + "/a/b";
    {
        EnvGuard g("TG_CACHE_DIR", dir.c_str());
        CHECK_EQ((Tensor::arange(2) * 5).to_vector<int>()[1], 5);   // a program: it compiles
    }
    struct stat st;
    CHECK(stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
}

TEST_ON_CPU(cache_truncated_entry_is_rebuilt) {
    std::string dir = fresh_dir(), out;
    CHECK(run_child(dir, out));
    std::vector<std::string> sos = files_in(dir, ".so");
    CHECK_EQ(sos.size(), size_t(1));
    if (sos.size() != 1) return;
    CHECK(truncate(sos[0].c_str(), 100) == 0);
    CHECK(run_child(dir, out));   // the child also checks the values
    CHECK(out.find("compiles 1") != std::string::npos);
    CHECK(run_child(dir, out));
    CHECK(out.find("compiles 0") != std::string::npos);
}

TEST_ON_CPU(cache_corrupt_entry_is_rebuilt) {
    std::string dir = fresh_dir(), out;
    CHECK(run_child(dir, out));
    std::vector<std::string> sos = files_in(dir, ".so");
    if (sos.size() != 1) { CHECK(false); return; }
    std::string bytes = slurp(sos[0]);
    for (size_t i = 0; i < bytes.size(); i += 7) bytes[i] = char(bytes[i] ^ 0x5a);   // same size
    std::ofstream(sos[0], std::ios::binary) << bytes;
    CHECK(run_child(dir, out));
    CHECK(out.find("compiles 1") != std::string::npos);
}

TEST_ON_CPU(compile_failure_reports_command_stderr_and_source) {
    EnvGuard flags("TG_CFLAGS", "-fPIC -shared --no-such-flag");
    Tensor t = Tensor::arange(5) * 3;
    CHECK_THROWS(t.realize(), "compile", "--no-such-flag", "source kept at");
    try {
        Tensor(Tensor::arange(6) * 7).realize();
    } catch (const tg::Error& e) {
        std::string m = e.what(), marker = "source kept at ";
        size_t at = m.find(marker);
        CHECK(at != std::string::npos);
        if (at != std::string::npos) {
            std::string path = m.substr(at + marker.size());
            path = path.substr(0, path.find('\n'));
            CHECK(slurp(path).find("tg_program") != std::string::npos);
        }
        CHECK(m.find("unrecognized") != std::string::npos || m.find("unknown") != std::string::npos);
    }
    CHECK(!t.realized());   // nothing half-done: the tensor is still unrealized
}

TEST_ON_CPU(compile_failure_leaves_tensor_usable) {
    Tensor t = Tensor::arange(4) * 5;
    {
        EnvGuard flags("TG_CFLAGS", "-fPIC -shared --no-such-flag");
        CHECK_THROWS(t.realize(), "compile");
    }
    CHECK_EQ(t.to_vector<int>(), (std::vector<int>{0, 5, 10, 15}));
}

TEST_ON_CPU(missing_compiler_is_named) {
    EnvGuard cc("TG_CC", "/nonexistent/tg-cc");
    CHECK_THROWS((Tensor::arange(3) + 11).realize(), "compile", "/nonexistent/tg-cc", "not found");
}

// A C compiler that crashes (an "internal compiler error", as GCC 12.2's vectorizer had on a
// random graph) is asked again at -O1, and the program runs; one that finds an error in the
// source is not asked again, and its message reaches the user.
TEST_ON_CPU(a_compiler_that_crashes_builds_the_program_again_at_O1) {
    std::string dir = fresh_dir(), cc = dir + "/cc", log = dir + "/calls";
    auto write_cc = [&](const char* complaint) {
        std::ofstream(cc) << "#!/bin/sh\necho \"$*\" >> '" << log << "'\n"
                          << "case \"$*\" in *-dM*|*--version*|*-O1*) exec cc \"$@\";; esac\n"
                          << "echo 'k.c:1:1: " << complaint << "' >&2\nexit 1\n";
        chmod(cc.c_str(), 0755);
    };
    EnvGuard compiler("TG_CC", cc.c_str()), cache("TG_CACHE_DIR", dir.c_str()),
        quick("TG_QUICK_RUNS", "0");
    write_cc("internal compiler error: in vect_analyze_loop, at tree-vect-loop.cc:1");
    CHECK_EQ((Tensor::arange(5) * 7 + 1).sum().item(), 7 * 10 + 5);
    CHECK_EQ(th::count_of(slurp(log), " -O1 "), 1);
    write_cc("error: unknown type name 'flot'");
    CHECK_THROWS((Tensor::arange(6) * 7 + 2).sum().realize(), "compile", "unknown type name");
    CHECK_EQ(th::count_of(slurp(log), " -O1 "), 1);
    remove_tree(dir);
}

TEST(memory_cache_hit_in_same_process) {
    // Leaves made with requires_grad are computed with the next program: one that an earlier
    // test left would join make()'s first program (another graph), so a program runs first
    (Tensor::arange(3) + 1).sum().item();
    auto make = [] { return (Tensor::arange(7) * 13 + 2).sum(); };
    CHECK_EQ(make().item(), 13 * 21 + 14);
    tg::Stats before = tg::stats();
    CHECK_EQ(make().item(), 13 * 21 + 14);
    tg::Stats after = tg::stats();
    CHECK_EQ(after.compiles, before.compiles);
    CHECK_EQ(after.memory_cache_hits, before.memory_cache_hits + 1);
}

// An eager step builds a graph of the same structure each time: its program is found by that
// structure, without scheduling, lowering or rendering again (the pipeline runs once, seen by
// the program observer). Constants, which buffers are the same one, in-place updates, bounds
// checks and stale reads all still count.
TEST(eager_graphs_of_one_structure_reuse_their_program) {
    int built = 0;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program&) { built++; };
    Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3});
    Tensor v = Tensor::from_vector(std::vector<float>{4, 5, 6});
    for (int i = 0; i < 3; i++) CHECK_EQ((w * 2.0f + 1.0f).sum().item(), 15.0);
    CHECK_EQ(built, 1);
    CHECK_EQ((w * 3.0f + 1.0f).sum().item(), 21.0);   // another constant, another program
    CHECK_EQ(built, 2);
    auto dot = [](const Tensor& a, const Tensor& b) { return (a * b).sum().item(); };
    CHECK_EQ(dot(w, v), 32.0);
    CHECK_EQ(dot(v, w), 32.0);                        // the same structure, other buffers
    CHECK_EQ(dot(w, w), 14.0);                        // one buffer read twice: another program
    CHECK_EQ(built, 4);
    Tensor count = Tensor::full({}, 1.0f);
    count.realize();
    for (int i = 0; i < 3; i++) count.assign(count + 1.0f).realize();
    CHECK_EQ(count.item(), 4.0);
    CHECK_EQ(built, 5);
    auto pick = [&](std::vector<int32_t> ids) {
        return w.gather(0, Tensor::from_vector(ids)).sum().item();
    };
    CHECK_EQ(pick({0, 2}), 4.0);
    CHECK_THROWS(pick({0, 9}), "out of range", "got 9");   // the reused program's check
    CHECK_EQ(built, 6);
    Tensor before = w * 2.0f;
    w.assign(w + 1.0f).realize();
    CHECK_THROWS(before.realize(), "stale read");
    tg::detail::program_observer() = saved;
}

// Rows sliced from a realized tensor (a batch of a dataset) are a part of its buffer: every
// batch runs the same program, whose C holds no offset. Other slices stay views; assigning to
// a slice writes a copy, as for any view; a computation on a slice built before its tensor was
// updated in place is a stale read.
TEST(row_slices_of_realized_tensors_share_their_buffer) {
    int built = 0;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program&) { built++; };
    std::vector<float> v(64 * 3);
    for (size_t i = 0; i < v.size(); i++) v[i] = float(i);
    Tensor X = Tensor::from_vector(v, {64, 3});
    for (int b = 0; b < 4; b++) {
        double want = 0;
        for (size_t i = size_t(b) * 48; i < size_t(b + 1) * 48; i++) want += 2.0 * v[i];
        CHECK_EQ((X.slice(0, 16 * b, 16 * (b + 1)) * 2.0f).sum().item(), want);
    }
    CHECK_EQ(built, 1);
    CHECK_EQ(X.slice(0, 5, 6).reshape({3}).to_vector(), (std::vector<float>{15, 16, 17}));
    CHECK_EQ(X.slice(1, 1, 2).sum().item(), 64.0 * 63 / 2 * 3 + 64);   // columns: a view
    Tensor part = X.slice(0, 0, 2);
    part.assign(part * 0.0f).realize();
    CHECK_EQ(part.to_vector(), std::vector<float>(6, 0.0f));
    CHECK_EQ(X.to_vector(), v);
    Tensor doubled = X.slice(0, 0, 16) * 2.0f;
    X.assign(X + 1.0f).realize();
    CHECK_THROWS(doubled.realize(), "stale read");
    tg::detail::program_observer() = saved;
}

// A freed block of 64 KiB or more serves the next allocation of its size (no fresh pages at
// every eager step), and a program's results written there are its own. Under
// AddressSanitizer a buffer is a heap block of exactly its bytes instead, freed at once, so
// that a kernel built with -fsanitize=address reading past it, or after its free, is caught.
TEST(freed_host_blocks_are_reused_or_under_asan_exact) {
    tg::detail::Device& cpu = tg::detail::device("CPU");
#ifdef TG_TEST_ASAN
    for (size_t bytes : {size_t(200000), size_t(13)}) {
        char* first = static_cast<char*>(cpu.alloc(bytes));
        CHECK(!__asan_address_is_poisoned(first + bytes - 1));
        CHECK(__asan_address_is_poisoned(first + bytes));
        cpu.free(first);
        CHECK(__asan_address_is_poisoned(first));
    }
#else
    void* first = cpu.alloc(200000);
    cpu.free(first);
    void* again = cpu.alloc(200000);
    CHECK(again == first);
    cpu.free(again);
#endif
    for (float v : {1.0f, 3.0f}) {   // the second result lands where the first one was
        std::vector<float> got = (Tensor::full({50000}, v) * 2.0f).contiguous().to_vector();
        CHECK(std::all_of(got.begin(), got.end(), [&](float x) { return x == 2 * v; }));
    }
}

TEST_ON_CPU(debug_2_keeps_graph_ir_and_c_side_by_side) {
    std::string dir = fresh_dir();
    EnvGuard cache("TG_CACHE_DIR", dir.c_str());
    EnvGuard debug("TG_DEBUG", "2");
    int saved = dup(2);
    FILE* devnull = std::fopen("/dev/null", "w");
    dup2(fileno(devnull), 2);
    Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
    std::vector<float> v = (a.exp() * 2.0f).sum(0).to_vector();
    dup2(saved, 2);
    close(saved);
    std::fclose(devnull);
    CHECK_NEAR(v[0], 2 * (std::exp(1.0) + std::exp(3.0)), 1e-6);
    std::vector<std::string> graphs = files_in(dir, ".graph"), irs = files_in(dir, ".ir");
    CHECK_EQ(graphs.size(), size_t(1));
    CHECK_EQ(irs.size(), size_t(1));
    if (graphs.size() == 1 && irs.size() == 1) {
        std::string stem = graphs[0].substr(0, graphs[0].size() - 6);
        CHECK(stem.find("test_runtime_cpp") != std::string::npos);   // readable name
        CHECK(slurp(stem + ".graph").find("EXP2") != std::string::npos);
        CHECK(slurp(stem + ".ir").find("after passes") != std::string::npos);
        CHECK(slurp(stem + ".c").find("tg_program") != std::string::npos);
    }
}

// ---- the cache is part of what the process trusts -----------------------------------------

TEST(cache_refuses_directories_others_can_write) {
    std::string dir = fresh_dir();
    EnvGuard g("TG_CACHE_DIR", dir.c_str());
    chmod(dir.c_str(), 0777);
    CHECK_THROWS(unique_program(1001).realize(), dir.c_str(), "writable by everyone",
                 "chmod go-w");
    chmod(dir.c_str(), 0770);
    CHECK_THROWS(unique_program(1002).realize(), "writable by its group");
    chmod(dir.c_str(), 0700);
    CHECK_EQ(unique_program(1003).to_vector<int>()[1], 7919 + 1003);
    remove_tree(dir);
}

TEST(cache_refuses_directories_and_links_of_other_users) {
    if (geteuid() != 0) SKIP("needs root to give a directory to another user");
    std::string parent = fresh_dir(), theirs = parent + "/theirs", link = parent + "/link";
    mkdir(theirs.c_str(), 0700);
    CHECK(chown(theirs.c_str(), 65534, 65534) == 0);
    {
        EnvGuard g("TG_CACHE_DIR", theirs.c_str());
        CHECK_THROWS(unique_program(1004).realize(), "owned by another user", "uid 65534",
                     "TG_CACHE_DIR");
    }
    std::string mine = parent + "/mine";
    mkdir(mine.c_str(), 0700);
    CHECK(symlink(mine.c_str(), link.c_str()) == 0 && lchown(link.c_str(), 65534, 65534) == 0);
    {
        EnvGuard g("TG_CACHE_DIR", (link + "/cache").c_str());
        CHECK_THROWS(unique_program(1005).realize(), "symbolic link owned by another user",
                     link.c_str());
    }
    remove_tree(parent);
}

TEST(cache_without_home_uses_the_users_own_directory) {
    const passwd* pw = getpwuid(geteuid());
    if (!pw || !pw->pw_dir || !*pw->pw_dir) SKIP("this user has no home directory");
    std::string dir = std::string(pw->pw_dir) + "/.cache/tinygrad";
    std::vector<std::string> before = files_in(dir, ".so");
    tg::Stats at_start = tg::stats();
    {
        EnvGuard a("TG_CACHE_DIR", ""), b("XDG_CACHE_HOME", ""), c("HOME", "");
        CHECK_EQ(unique_program(1006).to_vector<int>()[0], 1006);
    }
    tg::Stats now = tg::stats();
    CHECK_EQ(now.compiles + now.disk_cache_hits, at_start.compiles + at_start.disk_cache_hits + 1);
    struct stat st;
    CHECK(stat(dir.c_str(), &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 022));
    for (const std::string& f : files_in(dir, ".so"))   // take away what this test added
        if (std::find(before.begin(), before.end(), f) == before.end())
            for (const char* ext : {".so", ".sum", ".c"})
                std::remove((f.substr(0, f.size() - 3) + ext).c_str());
}

TEST_ON_CPU(cache_key_includes_the_compilers_identity) {
    // a compiler named by its file is known by the file: replacing it builds anew
    std::string dir = fresh_dir(), cc = dir + "/cc", version = dir + "/version", out;
    auto write_cc = [&](const std::string& release) {
        std::ofstream(cc) << "#!/bin/sh\n# release " << release << "\ncase \"$*\" in *--version*) "
                          << "cat '" << version << "'; exit 0;; esac\nexec cc \"$@\"\n";
        chmod(cc.c_str(), 0755);
    };
    write_cc("1.0");
    std::ofstream(version) << "cc 1.0\n";
    std::string env = "TG_CC='" + cc + "'";
    CHECK(run_child(dir, out, env) && out.find("compiles 1") != std::string::npos);
    CHECK(run_child(dir, out, env) && out.find("compiles 0") != std::string::npos);
    write_cc("1.1 (an upgrade)");   // the same program is built again
    CHECK(run_child(dir, out, env) && out.find("compiles 1") != std::string::npos);
    CHECK(run_child(dir, out, env) && out.find("compiles 0") != std::string::npos);
    CHECK_EQ(files_in(dir, ".so").size(), size_t(2));
    // a command with arguments is known by its --version
    std::string with_args = "TG_CC=\"'" + cc + "' -w\"";
    CHECK(run_child(dir, out, with_args) && out.find("compiles 1") != std::string::npos);
    CHECK(run_child(dir, out, with_args) && out.find("compiles 0") != std::string::npos);
    std::ofstream(version) << "cc 1.2\n";
    CHECK(run_child(dir, out, with_args) && out.find("compiles 1") != std::string::npos);
    CHECK_EQ(files_in(dir, ".so").size(), size_t(4));
    remove_tree(dir);
}

// The macros the compiler predefines are asked once per cache directory, compiler version and
// CPU: a second process finds them kept and runs no preprocessor before its first program.
TEST_ON_CPU(cache_keeps_the_compilers_macros) {
    std::string dir = fresh_dir(), cc = dir + "/cc", log = dir + "/macro-runs", out;
    std::ofstream(cc) << "#!/bin/sh\ncase \"$*\" in *-dM*) echo run >> '" << log
                      << "';; esac\nexec cc \"$@\"\n";
    chmod(cc.c_str(), 0755);
    std::string env = "TG_CC='" + cc + "'";
    CHECK(run_child(dir, out, env) && out.find("compiles 1") != std::string::npos);
    CHECK(run_child(dir, out, env) && out.find("compiles 0") != std::string::npos);
    CHECK_EQ(slurp(log), std::string("run\n"));
    CHECK_EQ(files_in(dir, ".macros").size(), size_t(1));
    remove_tree(dir);
}

TEST_ON_CPU(cache_serves_processes_compiling_at_once) {
    std::string dir = fresh_dir();
    std::string one = "TG_TEST_CHILD=child_program TG_CACHE_DIR='" + dir + "' '" + self_exe() +
                      "' >/dev/null 2>&1";
    std::string all = "ok=0; for i in 1 2 3 4 5 6; do (" + one + ") & done; " +
                      "for j in 1 2 3 4 5 6; do wait -n || ok=1; done; exit $ok";
    CHECK_EQ(std::system(("bash -c \"" + all + "\"").c_str()), 0);   // each child checks values
    CHECK_EQ(files_in(dir, ".so").size(), size_t(1));
    CHECK(files_in(dir, ".tmp").empty());
    std::string out;
    CHECK(run_child(dir, out) && out.find("compiles 0") != std::string::npos);
    remove_tree(dir);
}

TEST_ON_CPU(cache_refuses_entries_others_can_write) {
    std::string dir = fresh_dir(), out;
    CHECK(run_child(dir, out));
    std::vector<std::string> sos = files_in(dir, ".so");
    CHECK_EQ(sos.size(), size_t(1));
    if (sos.size() != 1) return;
    chmod(sos[0].c_str(), 0666);
    CHECK(!run_child(dir, out));
    CHECK(out.find("refusing to load") != std::string::npos);
    remove_tree(dir);
}

TEST(cflags_replace_only_the_optimization_flags) {
    EnvGuard flags("TG_CFLAGS", "-O2");   // -fPIC -shared are still added
    CHECK_EQ((Tensor::arange(4) * 9 + 1).to_vector<int>(), (std::vector<int>{1, 10, 19, 28}));
}

// A program is linked without the C library, which the process has, unless its flags
// instrument it: then the default link adds the instrumentation's runtime, so a program built
// with -fsanitize=undefined loads in a process built without it (linked without, its
// __ubsan_handle_* were undefined when loaded).
TEST_ON_CPU(cflags_that_instrument_the_code_link_their_runtime) {
    EnvGuard flags("TG_CFLAGS", "-O1 -fsanitize=undefined");
    CHECK_EQ((Tensor::arange(4) * 7 + 2).to_vector<int>(), (std::vector<int>{2, 9, 16, 23}));
}

// ---- threads ------------------------------------------------------------------------------
// A nest whose outer iterations write disjoint rows runs in 16 chunks on TG_THREADS threads;
// each row is computed as it would be alone, so 1, 2 and 3 threads give the same bits. A nest
// of little work runs on the calling thread.
namespace {
Tensor rows_of(int64_t rows, int64_t cols, int salt) {
    std::vector<float> v(size_t(rows * cols));
    for (size_t i = 0; i < v.size(); i++) v[i] = float((i * 7 + size_t(salt)) % 23) / 11 - 1;
    return Tensor::from_vector(v, {rows, cols});
}
}  // namespace
TEST(threads_give_the_same_bits_for_any_count) {
    Tensor x = rows_of(512, 64, 1), w = rows_of(64, 64, 2), b = rows_of(1, 64, 3);
    Tensor y = (x.matmul(w) + b).tanh().softmax(1);
    CHECK(tg::inspect({y}).optimized_ir.find("[parallel: 16 chunks]") != std::string::npos);
    std::vector<std::vector<float>> runs;
    for (const char* threads : {"1", "2", "3"}) {
        EnvGuard env("TG_THREADS", threads);
        runs.push_back((y * 1.0f).to_vector());
    }
    CHECK(runs[0] == runs[1]);
    CHECK(runs[0] == runs[2]);
    Tensor small = rows_of(4, 10, 4).exp().sum(1);
    CHECK(tg::inspect({small}).optimized_ir.find("parallel") == std::string::npos);
}

// A failed bounds check in one chunk still stops the program before its in-place writes, and
// the error is the first bad index in loop order, whatever the threads.
TEST(threads_failed_bounds_check_skips_in_place_writes) {
    EnvGuard env("TG_THREADS", "2");
    std::vector<int32_t> ids(4096);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = int32_t(i % 64);
    ids[3000] = 70;   // out of range
    ids[3500] = 80;
    Tensor table = rows_of(64, 32, 5), w = rows_of(1, 32, 6);
    std::vector<float> before = w.to_vector();
    Tensor update = w.assign(w + table[Tensor::from_vector(ids)].sum(0, true));
    std::string ir = tg::inspect({update}).optimized_ir;
    CHECK(ir.find("[parallel: 16 chunks]") != std::string::npos);
    CHECK(ir.find("check") != std::string::npos);
    CHECK_THROWS(update.realize(), "out of range", "got 70");
    CHECK(w.to_vector() == before);
}

// A child process after fork() has none of the pool's threads: it runs the chunks itself
// instead of waiting for threads that do not exist.
TEST(threads_after_fork_run_in_the_child) {
    SKIP_UNDER_TSAN();
    EnvGuard env("TG_THREADS", "2");
    Tensor x = rows_of(512, 64, 7), w = rows_of(64, 64, 8);
    auto value = [&] { return ((x.matmul(w)).tanh().softmax(1) * 1.0f).sum().item(); };
    double parent = value();   // the pool's thread now exists
    pid_t child = fork();
    if (child == 0) {
        alarm(60);             // a child waiting for a missing thread fails rather than hangs
        _exit(value() == parent ? 0 : 1);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// The same for an optimizer's step, which the parent runs on its device's queue thread: the
// child runs it at once (its process id is its own, not the parent's, which it inherited).
TEST(optimizer_steps_after_fork_run_in_the_child) {
    SKIP_UNDER_TSAN();
    EnvGuard sync("TG_SYNC", "0"), small("TG_BACKGROUND_MIN_WORK", "0");
    Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3}).requires_grad();
    tg::optim::SGD opt({w}, 0.25);
    auto step = [&] {
        opt.zero_grad();
        (w * w).sum().backward();
        opt.step();
        return w.to_vector();
    };
    CHECK(step() == std::vector<float>({0.5f, 1.0f, 1.5f}));   // the queue's thread now exists
    pid_t child = fork();
    if (child == 0) {
        alarm(60);
        _exit(step() == std::vector<float>({0.25f, 0.5f, 0.75f}) ? 0 : 1);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(step() == std::vector<float>({0.25f, 0.5f, 0.75f}));
}

// A program of 32 KB of C or more compiles as two C files in two compiler processes and one
// link (where there are two cores): the first file's functions are hidden and declared in the
// second, which holds tg_program; the results are those of the one-file program. A compile
// error in either part names its command and its kept file. A smaller one, of as many nests,
// is one file: a second compiler and a link would cost more than they save.
TEST_ON_CPU(large_programs_compile_as_two_files_at_once) {
    if (std::thread::hardware_concurrency() < 2) SKIP("one core: programs compile as one file");
    std::string dir = fresh_dir();
    EnvGuard cache("TG_CACHE_DIR", dir.c_str());
    // nests of different extents, which no pass fuses, of `terms` sines each
    std::vector<Tensor> in;
    for (int64_t n : {7, 11, 13, 17, 19}) in.push_back(Tensor::from_vector(th::randf(size_t(n), n)));
    auto run = [&](int terms) {
        std::vector<Tensor> outs;
        for (const Tensor& x : in) {
            Tensor y = x.exp() * x;
            for (int i = 1; i < terms; i++) y = (y * (1 + 0.001f * float(i))).sin() + x;
            outs.push_back(y);
        }
        tg::realize(outs);
        std::vector<float> all;
        for (const Tensor& t : outs)
            for (float v : t.to_vector()) all.push_back(v);
        return all;
    };
    run(1);
    CHECK(tg::last_program().nests >= 4);
    CHECK_EQ(files_in(dir, ".0.c").size(), size_t(0));
    std::vector<float> split = run(200);
    std::vector<std::string> first = files_in(dir, ".0.c"), second = files_in(dir, ".1.c");
    CHECK_EQ(first.size(), size_t(1));
    CHECK_EQ(second.size(), size_t(1));
    if (first.size() == 1 && second.size() == 1) {
        std::string f0 = slurp(first[0]), f1 = slurp(second[0]);
        CHECK(f0.size() + f1.size() >= 32 * 1024);
        CHECK(f0.find("visibility(\"hidden\")") != std::string::npos);
        CHECK(f0.find("tg_program") == std::string::npos);
        CHECK(f1.find("void tg_program(") != std::string::npos);
    }
    std::vector<float> one;
    {
        EnvGuard interp("TG_DEVICE", "INTERP");
        for (Tensor& x : in) x = x.to("INTERP");
        one = run(200);
    }
    CHECK(split == one);
    EnvGuard flags("TG_CFLAGS", "-O2 --no-such-flag");
    for (Tensor& x : in) x = x.to("CPU");
    CHECK_THROWS(run(200), "compile", "--no-such-flag", "source kept at", ".0.c");
    remove_tree(dir);
}

// A constant is realized without a kernel: its buffer is filled on the host (the optimizers'
// state and zeros()/ones() parameters compile nothing), with the values a kernel would store.
TEST(constants_realize_without_a_kernel) {
    for (const char* device : {"CPU", "INTERP"}) {
        EnvGuard dev("TG_DEVICE", device);
        tg::Stats before = tg::stats();
        Tensor z = Tensor::zeros({3, 4}).realize();
        Tensor d = Tensor::full({5}, 0.1, tg::DType::FLOAT64).realize();
        Tensor f = Tensor::full({2}, 0.1).realize();
        Tensor i = Tensor::full({3}, -7, tg::DType::INT32).realize();
        Tensor b = Tensor::full({2}, 3, tg::DType::BOOL).realize();
        Tensor e = Tensor::zeros({0, 3}).realize();
        tg::Stats after = tg::stats();
        CHECK_EQ(after.compiles, before.compiles);
        CHECK_EQ(after.programs_run, before.programs_run);
        CHECK(z.to_vector() == std::vector<float>(12, 0.0f));
        CHECK(d.to_vector<double>() == std::vector<double>(5, 0.1));
        CHECK(f.to_vector() == std::vector<float>(2, 0.1f));
        CHECK(i.to_vector<int32_t>() == std::vector<int32_t>(3, -7));
        CHECK(b.cast(tg::DType::INT32).to_vector<int32_t>() == std::vector<int32_t>(2, 1));
        CHECK_EQ(e.numel(), int64_t(0));
        Tensor w = Tensor::ones({3}).requires_grad();   // a leaf: filled with the next program
        (w * Tensor::from_vector(std::vector<float>{1, 2, 3})).sum().backward();
        CHECK(w.grad().to_vector() == (std::vector<float>{1, 2, 3}));
        CHECK(w.to_vector() == std::vector<float>(3, 1.0f));
    }
}

// ---- quick builds: a program of little work runs first as built at -O0, and its optimized
// build, asked for at its TG_QUICK_RUNS-th run, is made on a background thread
namespace {
uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
// every file of the cache directory is a finished entry: no compiler's output is left over
bool only_finished_entries(const std::string& dir) {
    bool ok = true;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) {
            std::string n = e->d_name;
            ok = ok && n.find(".tmp") == std::string::npos && n.find(".err") == std::string::npos;
        }
        closedir(d);
    }
    return ok;
}
tg::Jit exp_sum_step(float scale) {
    return tg::Jit([scale](const std::vector<Tensor>& in) { return (in[0] * scale + 0.5f).exp().sum(); });
}
}  // namespace

TEST_ON_CPU(quick_build_runs_first_and_the_optimized_build_takes_over) {
    if (std::getenv("TG_CFLAGS")) SKIP("TG_CFLAGS is set: every program is built with it");
    std::string dir = fresh_dir();
    EnvGuard cache("TG_CACHE_DIR", dir.c_str());
    EnvGuard runs("TG_QUICK_RUNS", "2");
    Tensor x = Tensor::from_vector(std::vector<float>{0.1f, -0.2f, 0.3f, 1.7f});
    tg::Jit step = exp_sum_step(3.25f);
    tg::finish_compiles();   // the builds earlier tests asked for count apart
    tg::Stats s0 = tg::stats();
    float first = step({x}).item();
    tg::Stats s1 = tg::stats();
    CHECK_EQ(s1.compiles - s0.compiles, int64_t(1));
    CHECK_EQ(files_in(dir, ".so").size(), size_t(1));   // the quick build
    float second = step({x}).item();   // asks for the optimized build
    tg::finish_compiles();
    tg::Stats s2 = tg::stats();
    CHECK_EQ(s2.background_compiles - s1.background_compiles, int64_t(1));
    CHECK_EQ(s2.compiles, s1.compiles);
    CHECK_EQ(files_in(dir, ".so").size(), size_t(2));
    CHECK(only_finished_entries(dir));
    float third = step({x}).item();    // optimized
    CHECK_EQ(bits_of(first), bits_of(second));
    CHECK_EQ(bits_of(first), bits_of(third));
    double want = 0;
    for (float v : {0.1f, -0.2f, 0.3f, 1.7f}) want += std::exp(double(v) * 3.25 + 0.5);
    CHECK_NEAR(third, want, 1e-5);
    // the same program prepared again finds its optimized build and builds nothing
    tg::Jit again = exp_sum_step(3.25f);
    CHECK_EQ(bits_of(again({x}).item()), bits_of(first));
    again({x});
    tg::finish_compiles();
    tg::Stats s3 = tg::stats();
    CHECK_EQ(s3.compiles, s2.compiles);
    CHECK_EQ(s3.background_compiles, s2.background_compiles);
    CHECK_EQ(s3.memory_cache_hits - s2.memory_cache_hits, int64_t(1));
    remove_tree(dir);
}

// A program that runs once is built once; TG_QUICK_RUNS=0 builds every program optimized at
// once; so does a program of much work (Program::work: here 400^3 multiply-adds).
TEST_ON_CPU(quick_builds_only_where_they_pay) {
    if (std::getenv("TG_CFLAGS")) SKIP("TG_CFLAGS is set: every program is built with it");
    std::string dir = fresh_dir();
    EnvGuard cache("TG_CACHE_DIR", dir.c_str());
    EnvGuard runs("TG_QUICK_RUNS", "2");
    Tensor x = Tensor::from_vector(std::vector<float>{0.5f, 0.25f});
    tg::finish_compiles();   // the builds earlier tests asked for count apart
    tg::Stats s0 = tg::stats();
    (x * 5.5f).sum().item();
    tg::finish_compiles();
    CHECK_EQ(tg::stats().background_compiles, s0.background_compiles);
    Tensor a = Tensor::from_vector(th::randf(400 * 400, 41), {400, 400});
    tg::Jit product([&](const std::vector<Tensor>& in) { return a.matmul(in[0]).sum(); });
    Tensor b = Tensor::from_vector(th::randf(400 * 400, 42), {400, 400});
    for (int i = 0; i < 3; i++) product({b});
    tg::finish_compiles();
    CHECK_EQ(tg::stats().background_compiles, s0.background_compiles);
    runs.set("0");
    tg::Jit step = exp_sum_step(2.75f);
    for (int i = 0; i < 3; i++) step({x});
    tg::finish_compiles();
    CHECK_EQ(tg::stats().background_compiles, s0.background_compiles);
    CHECK_EQ(tg::stats().compiles - s0.compiles, int64_t(3));
    runs.set("-1");
    CHECK_THROWS((x * 6.5f).sum().item(), "TG_QUICK_RUNS must be a whole number", "'-1'");
    remove_tree(dir);
}

// Runs only in the child of the next test: asks for the optimized build of a training step
// (two files of C, about half a second at -O3), then leaves while it is being compiled.
TEST_CHILD(child_leaves_during_an_optimized_build) {
    tg::manual_seed(5);
    tg::nn::Sequential mlp(tg::nn::Linear(12, 48), tg::nn::Tanh(), tg::nn::Linear(48, 48),
                           tg::nn::Tanh(), tg::nn::Linear(48, 5));
    tg::optim::SGD opt(mlp.parameters(), 0.1);
    Tensor x = Tensor::from_vector(th::randf(16 * 12, 3), {16, 12});
    Tensor y = Tensor::from_vector(th::randi(16, 4, 0, 4));
    tg::Jit step([&](const std::vector<Tensor>& in) {
        Tensor loss = tg::nn::cross_entropy(mlp(in[0]), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
    step({x});
    step({x});
    std::this_thread::sleep_for(std::chrono::milliseconds(150));   // its compilers now run
}

// A process that leaves while its optimized build runs leaves a clean cache: the build never
// lands and no compiler output is left, only the initializers' program and the step's quick
// build. (It also kills the compilers at once rather than wait for them: that is speed, which
// this test cannot see, so it is not asserted here.)
TEST_ON_CPU(leaving_during_an_optimized_build_leaves_a_clean_cache) {
    if (std::getenv("TG_CFLAGS")) SKIP("TG_CFLAGS is set: every program is built with it");
    std::string dir = fresh_dir();
    std::string cmd = "TG_QUICK_RUNS=2 TG_TEST_CHILD=child_leaves_during_an_optimized_build "
                      "TG_CACHE_DIR='" + dir + "' '" + self_exe() + "' >/dev/null 2>&1";
    CHECK_EQ(std::system(cmd.c_str()), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));   // a compiler left would write
    CHECK_EQ(files_in(dir, ".so").size(), size_t(2));
    CHECK(only_finished_entries(dir));
    remove_tree(dir);
}

// A step that fails in the background and that nothing reads afterwards: the process says so
// on stderr when it leaves, instead of losing the error.
TEST_CHILD(child_leaves_after_a_failed_background_step) {
    Tensor table = Tensor::from_vector(std::vector<float>{1, 2, 3}).requires_grad();
    tg::optim::SGD opt({table}, 0.5);
    table[Tensor::from_vector(std::vector<int32_t>{0, 7})].sum().backward();
    opt.step();
}

TEST_ON_CPU(a_background_error_nothing_read_is_said_at_exit) {
    std::string dir = fresh_dir(), log = dir + "/child.log";
    std::string cmd = "TG_SYNC=0 TG_BACKGROUND_MIN_WORK=0 "
                      "TG_TEST_CHILD=child_leaves_after_a_failed_background_step "
                      "TG_CACHE_DIR='" + dir + "' '" + self_exe() + "' >/dev/null 2>'" + log + "'";
    CHECK_EQ(std::system(cmd.c_str()), 0);
    std::string err = slurp(log);
    CHECK(err.find("nothing read its results") != std::string::npos);
    CHECK(err.find("got 7") != std::string::npos);
    remove_tree(dir);
}

// Programs kept on disk by their graph's structure: a second process that builds the graphs a
// first one built reads their programs from the cache directory instead of lowering them, and
// computes the same bits; a line in an error is the user's in both; an entry cut short is not
// read (the program is lowered again).
TEST_CHILD(child_trains_two_steps_and_indexes) {
    int lowered = 0;
    auto saved = tg::detail::program_observer();
    tg::detail::program_observer() = [&](const tg::detail::Program&) { lowered++; };
    tg::manual_seed(71);
    tg::nn::Sequential net(tg::nn::Linear(5, 9), tg::nn::Tanh(), tg::nn::Linear(9, 3));
    tg::optim::SGD opt(net.parameters(), 0.1);
    Tensor x = Tensor::randn({4, 5});
    Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 2, 1, 2});
    std::string out;
    auto bits = [](float v) {
        char text[64];
        std::snprintf(text, sizeof text, "%a ", double(v));
        return std::string(text);
    };
    for (int s = 0; s < 2; s++) {
        Tensor loss = tg::nn::cross_entropy(net(x), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        out += "loss " + bits(loss.item()) + "\n";
    }
    for (const Tensor& p : net.parameters())
        for (float v : p.to_vector()) out += bits(v);
    try {
        Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3});
        t[Tensor::from_vector(std::vector<int32_t>{1, 9})].to_vector();
    } catch (const tg::Error& e) {
        out += std::string("\nerror ") + e.what();
    }
    tg::detail::program_observer() = saved;
    std::printf("lowered %d\n%s\n", lowered, out.c_str());
}

TEST_ON_CPU(a_process_reads_the_programs_an_earlier_one_lowered_from_disk) {
    std::string dir = fresh_dir(), out = dir + "/child.out";
    auto child = [&](int& lowered) {
        std::string cmd = "TG_TEST_CHILD=child_trains_two_steps_and_indexes TG_CACHE_DIR='" + dir +
                          "' '" + self_exe() + "' >'" + out + "'";
        CHECK_EQ(std::system(cmd.c_str()), 0);
        std::string text = slurp(out);
        lowered = std::atoi(text.c_str() + std::strlen("lowered "));
        return text.substr(text.find('\n') + 1);
    };
    int lowered_first = 0, lowered_second = -1, lowered_third = 0;
    std::string first = child(lowered_first);
    std::vector<std::string> entries = files_in(dir, ".bin");
    std::string second = child(lowered_second);
    CHECK(lowered_first >= 3);   // initializers, the step (once for both), the gather
    CHECK(!entries.empty());
    CHECK_EQ(lowered_second, 0);
    CHECK_EQ(second, first);
    CHECK(first.find("loss 0x") != std::string::npos);   // the losses' bits
    CHECK(first.find("index out of range") != std::string::npos);
    CHECK(first.find("test_runtime.cpp:") != std::string::npos);
    for (const std::string& e : entries) {
        std::string bytes = slurp(e);
        std::ofstream(e, std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
    }
    std::string third = child(lowered_third);
    CHECK_EQ(lowered_third, lowered_first);
    CHECK_EQ(third, first);
    remove_tree(dir);
}

// Parameters' initializers (realized together as one setup program) are compiled and run on
// the device's queue while the host builds and compiles the program that uses them: the same
// values as at once (TG_SYNC=1). Where their compile fails, the error thrown is the host's
// own; the parameters then throw it when read. (Shapes no other case uses: a compile is due.)
namespace {
std::vector<float> fresh_model_output(const char* sync, int64_t& background) {
    EnvGuard mode("TG_SYNC", sync);
    tg::manual_seed(5);
    tg::nn::Sequential net(tg::nn::Linear(7, 13), tg::nn::Tanh(), tg::nn::Linear(13, 6));
    Tensor x = Tensor::from_vector(std::vector<float>{0.5f, -1, 2, 0.25f, 3, -0.75f, 1}, {1, 7});
    int64_t before = tg::stats().background_runs;
    std::vector<float> out = net(x).to_vector();
    background = tg::stats().background_runs - before;
    return out;
}
}  // namespace
TEST_ON_CPU(parameter_initializers_compile_in_the_background) {
    std::string dir = fresh_dir();
    EnvGuard cache("TG_CACHE_DIR", dir.c_str());
    int64_t background_first = 0, background_second = 0;
    std::vector<float> in_background = fresh_model_output("0", background_first);
    std::vector<float> at_once = fresh_model_output("1", background_second);
    CHECK_EQ(background_first, int64_t(1));
    CHECK_EQ(background_second, int64_t(0));
    CHECK_EQ(in_background, at_once);
    {
        EnvGuard cc("TG_CC", "/nonexistent/tg-cc"), mode("TG_SYNC", "0");
        tg::nn::Linear lin(11, 4);
        Tensor x = Tensor::ones({2, 11});
        CHECK_THROWS(lin(x).to_vector(), "/nonexistent/tg-cc", "not found");
        tg::synchronize();   // thrown once: nothing is left to throw here
        CHECK_THROWS(lin.weight.to_vector(), "/nonexistent/tg-cc", "not found");
    }
    tg::finish_compiles();   // the optimized builds of the programs run twice, into dir
    remove_tree(dir);
}

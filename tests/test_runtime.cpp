// The runtime: disk cache shared between processes, corrupt entries rebuilt, compiler failures
// reported with everything needed to reproduce, TG_DEBUG output and kept artifacts.
#include "harness.hpp"
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>
using tg::Tensor;
using th::EnvGuard;

namespace {
std::string self_exe() {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, size_t(n)) : std::string();
}
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
bool run_child(const std::string& cache, std::string& debug_out) {
    std::string log = cache + "/child.log";
    std::string cmd = "TG_TEST_CHILD=child_program TG_DEBUG=1 TG_CACHE_DIR='" + cache + "' '" + self_exe() +
                      "' >/dev/null 2>'" + log + "'";
    int rc = std::system(cmd.c_str());
    debug_out = slurp(log);
    return rc == 0;
}
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

TEST(cache_second_process_compiles_nothing) {
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
        CHECK_EQ(Tensor::full({2}, 5, tg::DType::INT32).to_vector<int>()[1], 5);
    }
    struct stat st;
    CHECK(stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
}

TEST(cache_truncated_entry_is_rebuilt) {
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

TEST(cache_corrupt_entry_is_rebuilt) {
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

TEST(compile_failure_reports_command_stderr_and_source) {
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

TEST(compile_failure_leaves_tensor_usable) {
    Tensor t = Tensor::arange(4) * 5;
    {
        EnvGuard flags("TG_CFLAGS", "-fPIC -shared --no-such-flag");
        CHECK_THROWS(t.realize(), "compile");
    }
    CHECK_EQ(t.to_vector<int>(), (std::vector<int>{0, 5, 10, 15}));
}

TEST(missing_compiler_is_named) {
    EnvGuard cc("TG_CC", "/nonexistent/tg-cc");
    CHECK_THROWS((Tensor::arange(3) + 11).realize(), "compile", "/nonexistent/tg-cc", "not found");
}

TEST(memory_cache_hit_in_same_process) {
    auto make = [] { return (Tensor::arange(7) * 13 + 2).sum(); };
    CHECK_EQ(make().item(), 13 * 21 + 14);
    tg::Stats before = tg::stats();
    CHECK_EQ(make().item(), 13 * 21 + 14);
    tg::Stats after = tg::stats();
    CHECK_EQ(after.compiles, before.compiles);
    CHECK_EQ(after.memory_cache_hits, before.memory_cache_hits + 1);
}

TEST(debug_2_keeps_graph_ir_and_c_side_by_side) {
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

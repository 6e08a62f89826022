// Every example runs (in its short mode) so none goes stale. make test passes the directory of
// the built examples in TG_EXAMPLES_DIR; each runs in a scratch directory, so files it writes
// (moons.svg) land there.
#include "harness.hpp"
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace {
bool run_example(const std::string& name, const std::string& args, std::string& output) {
    const char* dir = std::getenv("TG_EXAMPLES_DIR");
    if (!dir) SKIP("TG_EXAMPLES_DIR not set (make test sets it)");
    char cwd[4096];
    std::string root = getcwd(cwd, sizeof cwd) ? cwd : ".";
    std::string exe = std::string(dir)[0] == '/' ? std::string(dir) : root + "/" + dir;
    char tmpl[] = "/tmp/tg-example-XXXXXX";
    std::string scratch = mkdtemp(tmpl) ? tmpl : "/tmp";
    std::string out = scratch + "/output.txt";
    std::string cmd = "cd '" + scratch + "' && '" + exe + "/" + name + "' --short " + args + " >'" + out + "' 2>&1";
    int rc = std::system(cmd.c_str());
    std::ifstream f(out);
    std::stringstream ss;
    ss << f.rdbuf();
    output = ss.str();
    std::ifstream svg(scratch + "/moons.svg");
    if (svg) output += "\n[moons.svg written]";
    std::system(("rm -rf '" + scratch + "'").c_str());
    if (rc != 0) std::fprintf(stderr, "    %s exited with %d:\n%s\n", name.c_str(), rc, output.c_str());
    return rc == 0;
}
bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }
}  // namespace

TEST(example_01_tensors) {
    std::string out;
    CHECK(run_example("01_tensors", "", out));
    CHECK(has(out, "tensor([33.9993, 37.9375, 56.6424"));
    CHECK(has(out, "einsum(\"ij,jk->ik\") equals matmul: 0"));
    CHECK(has(out, "[[8, 9],"));
}

TEST(example_02_pipeline) {
    std::string out;
    CHECK(run_example("02_pipeline", "", out));
    for (const char* stage : {"== 1. graph", "== 2. schedule", "== 3. loop IR", "== 4. loop IR after",
                              "== 5. C source", "void tg_program", "== result =="})
        CHECK(has(out, stage));
}

TEST(example_03_moons_reaches_99_percent) {
    std::string out;
    CHECK(run_example("03_moons", "", out));   // exits non-zero below 99% training accuracy
    CHECK(has(out, "training accuracy"));
    CHECK(has(out, "#") && has(out, "+") && has(out, "*") && has(out, "."));
    CHECK(has(out, "[moons.svg written]"));
}

TEST(example_04_makemore_learns) {
    char cwd[4096];
    std::string words = std::string(getcwd(cwd, sizeof cwd) ? cwd : ".") + "/examples/data/names.txt";
    std::string out;
    CHECK(run_example("04_makemore", "'" + words + "'", out));
    size_t at = out.find("loss on all");
    CHECK(at != std::string::npos);
    if (at == std::string::npos) return;
    double loss = std::atof(out.c_str() + out.find(':', at) + 1);
    CHECK(loss > 0 && loss < 2.7);   // uniform guessing gives ln 27 = 3.30
    CHECK(has(out, "20 new words:"));
}

TEST(example_05_regression) {
    std::string out;
    CHECK(run_example("05_regression", "", out));   // exits non-zero when softmax regression fails
    CHECK(has(out, "linear:   w = [2.9") || has(out, "linear:   w = [3.0"));
    CHECK(has(out, "logistic: training accuracy"));
}

// The header (with cuda_backend.hpp after it) compiles alone with the implementation, as C++17
// and C++20, with g++ and clang++.
TEST(header_compiles_alone_cxx17_cxx20) {
    for (const char* cxx : {"g++", "clang++"}) {
        if (std::system((std::string("command -v ") + cxx + " >/dev/null 2>&1").c_str()) != 0) continue;
        for (const char* std : {"-std=c++17", "-std=c++20"}) {
            std::string cmd = std::string("printf '#define TINYGRAD_IMPLEMENTATION\\n#include \"tinygrad.hpp\"\\n"
                                          "#include \"cuda_backend.hpp\"\\n' | ") + cxx +
                              " " + std + " -Wall -Wextra -Werror -fsyntax-only -I. -x c++ - 2>&1";
            CHECK(std::system(cmd.c_str()) == 0);
        }
    }
}

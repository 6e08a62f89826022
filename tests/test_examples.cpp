// Every example runs (in its short mode where it has one) so none goes stale. make test passes
// the directory of the built examples in TG_EXAMPLES_DIR.
#include "harness.hpp"
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace {
bool run_example(const char* name, std::string& output) {
    const char* dir = std::getenv("TG_EXAMPLES_DIR");
    if (!dir) SKIP("TG_EXAMPLES_DIR not set (make test sets it)");
    std::string out = std::string(dir) + "/" + name + ".out";
    int rc = std::system((std::string(dir) + "/" + name + " --short >'" + out + "' 2>&1").c_str());
    std::ifstream f(out);
    std::stringstream ss;
    ss << f.rdbuf();
    output = ss.str();
    return rc == 0;
}
}  // namespace

TEST(example_01_tensors) {
    std::string out;
    CHECK(run_example("01_tensors", out));
    CHECK(out.find("tensor([33.9993, 37.9375, 56.6424") != std::string::npos);
    CHECK(out.find("einsum(\"ij,jk->ik\") equals matmul: 0") != std::string::npos);
    CHECK(out.find("[[8, 9],") != std::string::npos);
}

TEST(example_02_pipeline) {
    std::string out;
    CHECK(run_example("02_pipeline", out));
    for (const char* stage : {"== 1. graph", "== 2. schedule", "== 3. loop IR", "== 4. loop IR after",
                              "== 5. C source", "void tg_program", "== result =="})
        CHECK(out.find(stage) != std::string::npos);
}

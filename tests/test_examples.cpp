// Every example runs (in its short mode) so none goes stale. make test passes the directory of
// the built examples in TG_EXAMPLES_DIR (with the data make copies beside them). Each runs in a
// fresh scratch directory, not the repository: the examples must find their data beside the
// executable and write their files where they are told, which is the scratch directory here.
#include "harness.hpp"
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

namespace {
// A directory for one test's runs, removed with its contents when the test ends; the output
// of each run goes to PATH.out beside it, so that the directory holds only what examples wrote.
struct Scratch {
    std::string path;
    Scratch() {
        char tmpl[] = "/tmp/tg-example-XXXXXX", real[PATH_MAX];
        if (mkdtemp(tmpl)) path = realpath(tmpl, real) ? real : tmpl;   // as getcwd names it
    }
    ~Scratch() {
        if (!path.empty() && std::system(("rm -rf '" + path + "' '" + path + ".out'").c_str())) {}
    }
    std::vector<std::string> entries(const std::string& sub = "") const {
        std::vector<std::string> names;
        if (DIR* d = opendir((path + sub).c_str())) {
            while (dirent* e = readdir(d))
                if (std::string(e->d_name) != "." && std::string(e->d_name) != "..")
                    names.push_back(e->d_name);
            closedir(d);
        }
        std::sort(names.begin(), names.end());
        return names;
    }
};

// The built examples' directory as the kernel names it (the examples read /proc/self/exe).
std::string examples_dir() {
    const char* dir = std::getenv("TG_EXAMPLES_DIR");
    if (!dir) SKIP("TG_EXAMPLES_DIR not set (make test sets it)");
    char real[PATH_MAX];
    if (!realpath(dir, real)) SKIP(std::string("TG_EXAMPLES_DIR ") + dir + " does not exist");
    return real;
}

// Runs the program exe with args in the scratch directory; stdout and stderr go to output.
int run_in(const Scratch& scratch, const std::string& exe, const std::string& args,
           std::string& output) {
    std::string log = scratch.path + ".out";
    std::string cmd = "cd '" + scratch.path + "' && '" + exe + "' " + args + " >'" + log +
                      "' 2>&1";
    int status = std::system(cmd.c_str());
    std::ifstream f(log);
    std::stringstream ss;
    ss << f.rdbuf();
    output = ss.str();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// An example from the build, in its short mode, in a fresh scratch directory; true when it
// exits with 0.
bool run_example(const std::string& name, const std::string& args, std::string& output) {
    Scratch scratch;
    int rc = run_in(scratch, examples_dir() + "/" + name, "--short " + args, output);
    if (rc != 0)
        std::fprintf(stderr, "    %s exited with %d:\n%s\n", name.c_str(), rc, output.c_str());
    return rc == 0;
}
bool has(const std::string& text, const std::string& what) {
    return text.find(what) != std::string::npos;
}
bool file_exists(const std::string& path) { return std::ifstream(path).good(); }
// The number after `label` in text, or -1 when label is missing.
double number_after(const std::string& text, const std::string& label) {
    size_t at = text.find(label);
    return at == std::string::npos ? -1 : std::atof(text.c_str() + at + label.size());
}
}  // namespace

TEST(example_01_tensors) {
    std::string out;
    CHECK(run_example("01_tensors", "", out));
    CHECK(has(out, "tensor([41.8541, 65.0994, 40.1715"));
    CHECK(has(out, "einsum(\"ij,jk->ik\") equals matmul: 0"));
    CHECK(has(out, "[[8, 9],"));
}

TEST(example_02_pipeline) {
    std::string out;
    CHECK(run_example("02_pipeline", "", out));
    for (const char* stage : {"== 1. graph", "== 2. schedule", "== 3. loop IR",
                              "== 4. loop IR after", "== 5. C source", "void tg_program",
                              "== result =="})
        CHECK(has(out, stage));
}

// The figure goes to the current directory by default, else to --out (a directory or a file
// name), and the full path is announced; nothing else is written.
TEST(example_03_moons_reaches_99_percent) {
    std::string exe = examples_dir() + "/03_moons", out;
    Scratch here;
    CHECK_EQ(run_in(here, exe, "--short", out), 0);   // exit 1 below 99% training accuracy
    CHECK(has(out, "training accuracy"));
    CHECK(has(out, "#") && has(out, "+") && has(out, "*") && has(out, "."));
    CHECK(has(out, "wrote " + here.path + "/moons.svg\n"));
    CHECK_EQ(here.entries(), (std::vector<std::string>{"moons.svg"}));

    Scratch there;
    CHECK(std::system(("mkdir '" + there.path + "/figs'").c_str()) == 0);
    CHECK_EQ(run_in(there, exe, "--short --out figs", out), 0);
    CHECK(has(out, "wrote " + there.path + "/figs/moons.svg\n"));
    CHECK(file_exists(there.path + "/figs/moons.svg"));
    CHECK_EQ(run_in(there, exe, "--out figs/boundary.svg --short", out), 0);
    CHECK(has(out, "wrote " + there.path + "/figs/boundary.svg\n"));
    CHECK_EQ(there.entries("/figs"), (std::vector<std::string>{"boundary.svg", "moons.svg"}));
    CHECK_EQ(there.entries(), (std::vector<std::string>{"figs"}));
}

// A place it cannot write is refused before training, not after it.
TEST(example_03_moons_errors) {
    std::string exe = examples_dir() + "/03_moons", out;
    Scratch scratch;
    CHECK_EQ(run_in(scratch, exe, "--short --out missing/moons.svg", out), 2);
    CHECK(has(out, "03_moons: cannot write " + scratch.path + "/missing/moons.svg: No such file"));
    CHECK(!has(out, "epoch"));
    CHECK_EQ(run_in(scratch, exe, "--short --out", out), 2);
    CHECK(has(out, "03_moons: --out needs a path\nusage: 03_moons"));
    CHECK_EQ(run_in(scratch, exe, "--shorter", out), 2);
    CHECK(has(out, "03_moons: unknown argument --shorter\nusage: 03_moons"));
    CHECK(scratch.entries().empty());
}

// Run from a scratch directory with no word list: the names beside the executable are found,
// split into training and held-out words, and both losses are reported.
TEST(example_04_makemore_learns) {
    std::string dir = examples_dir(), out;
    CHECK(run_example("04_makemore", "", out));
    CHECK(has(out, dir + "/data/names.txt: 32033 words, 29494 distinct: 26545 to train on"));
    CHECK(has(out, "2949 held out"));
    CHECK(has(out, "step   1500/1500  loss: train "));
    double train = number_after(out, "1500 steps: train loss ");
    double val = number_after(out, "val loss ");
    CHECK(train > 0 && train < 2.7);   // uniform guessing gives ln 27 = 3.30
    CHECK(val > 0 && val < 2.7);
    CHECK(has(out, "20 samples:"));
    size_t at = out.find(" of 20 samples are new (not among the 26545 training words)");
    CHECK(at != std::string::npos);
    if (at == std::string::npos) return;
    size_t line = out.rfind('\n', at) + 1;
    int fresh = std::atoi(out.c_str() + line);
    CHECK_EQ(out.substr(line, at - line), std::to_string(fresh));
    CHECK(fresh >= 5 && fresh <= 20);   // 16 here: mostly new names, not copies
}

// Each error the example promises, with its message: a word list given but unreadable, one
// with too few words, none beside the executable (a copy of it elsewhere), a bad option.
TEST(example_04_makemore_errors) {
    std::string exe = examples_dir() + "/04_makemore", out;
    Scratch scratch;
    CHECK_EQ(run_in(scratch, exe, "--short missing.txt", out), 2);
    CHECK(has(out, "04_makemore: cannot read the word list missing.txt\n"));

    CHECK(std::system(("echo anna > '" + scratch.path + "/one.txt'").c_str()) == 0);
    CHECK_EQ(run_in(scratch, exe, "one.txt", out), 2);
    CHECK(has(out, "04_makemore: one.txt has 1 distinct words; at least 2 are needed"));

    CHECK(std::system(("cp '" + exe + "' '" + scratch.path + "/'").c_str()) == 0);
    CHECK_EQ(run_in(scratch, scratch.path + "/04_makemore", "--short", out), 2);
    CHECK(has(out, "04_makemore: no word list given and none beside the executable; looked "
                   "for:\n  " + scratch.path + "/data/names.txt\n  " + scratch.path +
                       "/names.txt\n"));

    CHECK_EQ(run_in(scratch, exe, "--steps 0", out), 2);
    CHECK(has(out, "04_makemore: --steps needs a count\nusage: 04_makemore"));
    CHECK_EQ(run_in(scratch, exe, "--long", out), 2);
    CHECK(has(out, "04_makemore: unknown option --long\nusage: 04_makemore"));
}

TEST(example_05_regression) {
    std::string out;
    CHECK(run_example("05_regression", "", out));   // exit 1 when softmax regression fails
    CHECK(has(out, "linear:   w = [2.9") || has(out, "linear:   w = [3.0"));
    CHECK(has(out, "logistic: training accuracy"));
}

// Three devices train the moons as one does (exit 1 when the parameters differ by more than
// rounding), and both separate them.
TEST(example_07_data_parallel_agrees_with_one_device) {
    std::string out;
    CHECK(run_example("07_data_parallel", "--devices 3", out));
    CHECK(has(out, "moons on 3 devices (CPU:0 ... CPU:2)"));
    double many = number_after(out, "accuracy: "), one = number_after(out, "devices, ");
    CHECK(many > 0.9 && one > 0.9);
    CHECK(has(out, "parameters: largest difference "));
    CHECK(number_after(out, "largest difference ") < 1e-4);
}

// The GPT learns (the loss falls), checkpoints into the current directory, and a run stopped
// after step 30 and resumed prints what the uninterrupted run prints from step 36 on: the same
// losses, the same samples.
TEST(example_06_gpt_resumes_bit_for_bit) {
    std::string exe = examples_dir() + "/06_gpt", whole, first, rest;
    Scratch a, b;
    CHECK_EQ(run_in(a, exe, "--short", whole), 0);
    CHECK(has(whole, "checkpoint " + a.path + "/06_gpt.safetensors (step 60)"));
    CHECK_EQ(a.entries(), (std::vector<std::string>{"06_gpt.safetensors"}));
    double loss6 = number_after(whole, "step     6/60  loss ");
    double loss60 = number_after(whole, "step    60/60  loss ");
    CHECK(loss6 > 2.7 && loss60 > 0 && loss60 < 2.6);
    CHECK(has(whole, " of 20 samples are new names"));
    CHECK_EQ(run_in(b, exe, "--short --stop-after 30 --ckpt run.safetensors", first), 0);
    CHECK(has(first, "stopped after step 30; go on with --resume"));
    CHECK(!has(first, "samples are new"));
    CHECK_EQ(run_in(b, exe, "--short --resume --ckpt run.safetensors", rest), 0);
    CHECK(has(rest, "resumed from " + b.path + "/run.safetensors at step 30"));
    size_t from_whole = whole.find("step    36/60"), from_rest = rest.find("step    36/60");
    CHECK(from_whole != std::string::npos && from_rest != std::string::npos);
    // the rates and times left differ; everything else is the same
    auto strip = [](std::string text) {
        std::string out;
        std::istringstream lines(text);
        for (std::string line; std::getline(lines, line);) {
            if (line.find("checkpoint ") == 0) continue;
            out += line.substr(0, line.find("  |  ")) + "\n";
        }
        return out;
    };
    CHECK_EQ(strip(rest.substr(from_rest)), strip(whole.substr(from_whole)));
    CHECK_EQ(run_in(b, exe, "--resume --ckpt missing.safetensors", rest), 2);
    CHECK(has(rest, "06_gpt: cannot resume: ") && has(rest, "missing.safetensors"));
}

// The header (with cuda_backend.hpp after it) compiles alone with the implementation and no
// warning, by g++ as C++17 (the Makefile's standard) and by clang++ as C++20: each compiler
// and each standard once, in half the time of all four pairs (37 s of make test's cases)
TEST(header_compiles_alone_cxx17_cxx20) {
    for (auto [cxx, std] : {std::pair<const char*, const char*>{"g++", "-std=c++17"},
                            {"clang++", "-std=c++20"}}) {
        std::string probe = std::string("command -v ") + cxx + " >/dev/null 2>&1";
        if (std::system(probe.c_str()) != 0) continue;
        std::string cmd = std::string("printf '#define TINYGRAD_IMPLEMENTATION\\n"
                                      "#include \"tinygrad.hpp\"\\n"
                                      "#include \"cuda_backend.hpp\"\\n' | ") + cxx + " " +
                          std + " -Wall -Wextra -Werror -fsyntax-only -I. -x c++ - 2>&1";
        CHECK(std::system(cmd.c_str()) == 0);
    }
}

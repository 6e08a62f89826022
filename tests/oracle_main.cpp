// The compiler oracle from the command line: random graphs (tests/random_graphs.hpp) realized
// optimized on the CPU device and unoptimized on INTERP, compared. Any seed, any count:
//
//     build/oracle [-b BATCH] [-m MINIMIZE] [-t THREADS] [-j] [-v] SEED COUNT
//
// Graph seeds SEED .. SEED+COUNT-1, BATCH graphs per program (default 10). The first MINIMIZE
// failures (default 10; each try compiles a program) are minimized. -v prints every graph's
// listing. -t THREADS also runs each batch optimized on 1 thread and on THREADS, with every nest
// that can run in chunks on threads (TG_PARALLEL_MIN_WORK=1): the bits must be the same (a failure
// of that is listed, not minimized). -j also trains each graph for three steps under tg::Jit
// and eagerly (oracle::check_jit): the losses and parameters must be the same bits (listed,
// not minimized). Each batch runs in a child process, so a crash is reported (with the graph
// that causes it, run alone) and the run goes on. A failure prints the seed, what differs, the
// listing and a minimized listing; `oracle SEED 1` reruns one graph. The last line is
// "N graphs, M mismatches, T s"; the exit status is 1 when M > 0. The optimized side runs the
// passes of TG_PASSES where it is set (all where not); the interpreter's side runs none.
#include "random_graphs.hpp"
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const oracle::Tolerance tolerance;
int threads_checked = 0;   // -t: the threads whose results must be the bits of one thread's
bool jit_checked = false;  // -j: jitted training must give the bits of eager training

void print_failure(const oracle::Graph& g, const std::string& what, bool shrink) {
    std::printf("MISMATCH graph %" PRIu64 ": %s\n%s", g.seed, what.c_str(),
                oracle::listing(g).c_str());
    if (shrink) {
        oracle::Graph small = oracle::minimize(g, [](const oracle::Graph& c) {
            return !oracle::check_one(c, tolerance).empty();
        });
        std::string small_what = oracle::check_one(small, tolerance);
        if (small.nodes.size() < g.nodes.size() || small.outputs.size() < g.outputs.size())
            std::printf("minimized (%s):\n%s", small_what.c_str(), oracle::listing(small).c_str());
        else if (small_what.empty())
            std::printf("(it fails only beside the other graphs of its batch)\n");
    }
    std::fflush(stdout);
}

// Runs graphs [first, first + count) in this process; returns the mismatches.
int run_batch(uint64_t first, int count, bool verbose, bool shrink, double* worst,
              uint64_t* worst_seed) {
    std::vector<oracle::Graph> graphs;
    for (int i = 0; i < count; i++) graphs.push_back(oracle::generate(first + uint64_t(i)));
    if (verbose)
        for (const oracle::Graph& g : graphs) std::printf("%s\n", oracle::listing(g).c_str());
    oracle::Report r = oracle::check(graphs, tolerance);
    if (r.worst > *worst) *worst = r.worst, *worst_seed = first + r.worst_index;
    for (const oracle::Failure& f : r.failures) print_failure(graphs[f.index], f.what, shrink);
    std::vector<oracle::Failure> threads;
    if (threads_checked) threads = oracle::check_threads(graphs, threads_checked);
    for (const oracle::Failure& f : threads) print_failure(graphs[f.index], f.what, false);
    int jit_failures = 0;
    for (const oracle::Graph& g : graphs) {
        std::string what = jit_checked ? oracle::check_jit(g) : "";
        if (!what.empty()) print_failure(g, what, false), jit_failures++;
    }
    return int(r.failures.size() + threads.size()) + jit_failures;
}

// Runs the batch in a child; a child that dies is a crash. The child reports its mismatch
// count and largest error (and that graph's seed) through a pipe.
bool run_child(uint64_t first, int count, bool verbose, bool shrink, int* mismatches,
               double* worst, uint64_t* worst_seed) {
    int fd[2];
    if (pipe(fd) != 0) { std::perror("pipe"); std::exit(2); }
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) { std::perror("fork"); std::exit(2); }
    if (pid == 0) {
        close(fd[0]);
        double w = 0;
        uint64_t ws = 0;
        int m = run_batch(first, count, verbose, shrink, &w, &ws);
        std::fflush(stdout);
        char line[96];
        int len = std::snprintf(line, sizeof line, "%d %.17g %" PRIu64 "\n", m, w, ws);
        if (write(fd[1], line, size_t(len)) != len) _exit(3);
        _exit(0);
    }
    close(fd[1]);
    std::string got;
    char buf[64];
    for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) got.append(buf, size_t(n));
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    int m = 0;
    double w = 0;
    uint64_t ws = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        std::sscanf(got.c_str(), "%d %lf %" SCNu64, &m, &w, &ws) != 3)
        return false;
    *mismatches += m;
    if (w > *worst) *worst = w, *worst_seed = ws;
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    int batch = 10, to_minimize = 10;
    bool verbose = false;
    std::vector<const char*> args;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "-b") && i + 1 < argc) batch = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "-m") && i + 1 < argc) to_minimize = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "-t") && i + 1 < argc)
            threads_checked = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "-j")) jit_checked = true;
        else if (!std::strcmp(argv[i], "-v")) verbose = true;
        else args.push_back(argv[i]);
    }
    if (args.size() != 2 || batch < 1 || threads_checked < 0) {
        std::fprintf(stderr,
                     "usage: %s [-b BATCH] [-m MINIMIZE] [-t THREADS] [-j] [-v] SEED COUNT\n",
                     argv[0]);
        return 2;
    }
    uint64_t seed = std::strtoull(args[0], nullptr, 0);
    long long count = std::atoll(args[1]);
    auto t0 = std::chrono::steady_clock::now();
    auto seconds = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    int mismatches = 0;
    double worst = 0, last_progress = 0;
    uint64_t worst_seed = 0;
    for (long long done = 0; done < count;) {
        int n = int(std::min<long long>(batch, count - done));
        uint64_t first = seed + uint64_t(done);
        bool shrink = mismatches < to_minimize;
        if (!run_child(first, n, verbose, shrink, &mismatches, &worst, &worst_seed)) {
            // a crash: run the graphs alone to find the one that crashes
            for (int i = 0; i < n; i++) {
                double w = 0;
                uint64_t ws = 0;
                if (n > 1 &&
                    run_child(first + uint64_t(i), 1, false, shrink, &mismatches, &w, &ws))
                    continue;
                oracle::Graph g = oracle::generate(first + uint64_t(i));
                std::printf("CRASH graph %" PRIu64 " (the child process died):\n%s", g.seed,
                            oracle::listing(g).c_str());
                mismatches++;
            }
        }
        done += n;
        if (seconds() - last_progress > 10 || done == count) {
            last_progress = seconds();
            std::printf("  %lld/%lld graphs, %d mismatches, %.1f s; of the graphs that agree, "
                        "the largest error is %.3g of the tolerance (graph %" PRIu64 ")\n",
                        done, count, mismatches, seconds(), worst, worst_seed);
            std::fflush(stdout);
        }
    }
    std::printf("%lld graphs, %d mismatches, %.1f s\n", count, mismatches, seconds());
    return mismatches ? 1 : 0;
}

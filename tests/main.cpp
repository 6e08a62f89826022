// Runs every registered test case (or those selected by the arguments: a case runs when its
// name contains one of them, or its file is one named, like test_ops.cpp), those marked
// TEST_LAST after the others, and prints one line per case, then the summary line
// "N passed, N failed, N skipped". Exit status 1 on a failure.
// With TG_TEST_CLAIMS=DIR several processes share one run (tests/run.sh): a case runs in the
// process that first creates DIR/<its number>; a TEST_LAST case runs in each, over what that
// process did. TG_TEST_TIMES=1 prints each case's seconds after its status, and at the end
// what the process compiled and ran (tg::stats), to find the slow ones: make test stays quick.
#include "harness.hpp"
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fcntl.h>
#include <unistd.h>

static bool claimed(size_t index) {
    const char* dir = std::getenv("TG_TEST_CLAIMS");
    if (!dir) return true;
    std::string path = std::string(dir) + "/" + std::to_string(index);
    int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd < 0) return false;
    close(fd);
    return true;
}

static bool selected(const th::Case& c, int argc, char** argv) {
    if (argc < 2) return true;
    const char* slash = std::strrchr(c.file, '/');
    const char* file = slash ? slash + 1 : c.file;
    for (int i = 1; i < argc; i++)
        if (std::strstr(c.name, argv[i]) || std::strcmp(file, argv[i]) == 0) return true;
    return false;
}

int main(int argc, char** argv) {
    if (const char* child = std::getenv("TG_TEST_CHILD")) {   // a child process: one case
        for (const th::Case& c : th::cases())
            if (c.child_only && std::strcmp(c.name, child) == 0) c.fn();
        return th::failures() ? 1 : 0;
    }
    int passed = 0, failed = 0, skipped = 0;
    const char* times_env = std::getenv("TG_TEST_TIMES");
    const bool times = times_env && std::strcmp(times_env, "0") != 0;
    for (bool last : {false, true})
        for (size_t index = 0; index < th::cases().size(); index++) {
            const th::Case& c = th::cases()[index];
            if (c.child_only || c.last != last || !selected(c, argc, argv)) continue;
            if (!last && !claimed(index)) continue;
            int before = th::failures();
            std::string status = "ok";
            auto start = std::chrono::steady_clock::now();
            try {
                c.fn();
            } catch (const th::Skip& s) {
                status = "skipped: " + s.reason;
            } catch (const std::exception& e) {
                th::report(c.file, 0, std::string("uncaught exception: ") + e.what());
            }
            if (th::failures() > before) status = "FAILED";
            if (status == "ok") passed++;
            else if (status == "FAILED") failed++;
            else skipped++;
            std::printf("%-44s %s", c.name, status.c_str());
            std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
            if (times) std::printf("  %.2f s", took.count());
            std::printf("\n");
            std::fflush(stdout);
        }
    if (times) {
        tg::Stats s = tg::stats();
        std::printf("(this process: %lld programs compiled in %.1f s, %lld in the background"
                    " in %.1f s; %lld run in %.1f s)\n",
                    (long long)s.compiles, s.compile_seconds, (long long)s.background_compiles,
                    s.background_compile_seconds, (long long)s.programs_run, s.run_seconds);
    }
    std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}

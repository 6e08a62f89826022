// Runs every registered test case (or those whose name contains argv[1]) and prints one line
// per case, then the summary line "N passed, N failed, N skipped". Exit status 1 on a failure.
#include "harness.hpp"
#include <cstdlib>
#include <cstring>
#include <exception>

int main(int argc, char** argv) {
    const char* filter = argc > 1 ? argv[1] : "";
    if (const char* child = std::getenv("TG_TEST_CHILD")) {   // a child process: one case
        for (const th::Case& c : th::cases())
            if (c.child_only && std::strcmp(c.name, child) == 0) c.fn();
        return th::failures() ? 1 : 0;
    }
    int passed = 0, failed = 0, skipped = 0;
    for (const th::Case& c : th::cases()) {
        if (c.child_only || !std::strstr(c.name, filter)) continue;
        int before = th::failures();
        std::string status = "ok";
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
        std::printf("%-44s %s\n", c.name, status.c_str());
        std::fflush(stdout);
    }
    std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}

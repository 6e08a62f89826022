// The test harness: TEST registers a case, CHECK* record failures without stopping the case,
// SKIP ends a case as skipped with a reason, TEST_CHILD marks a case that runs only in a child
// process, TEST_LAST one that runs after all the others (it looks at what they did), TEST_ON_CPU
// one that runs on the CPU whatever TG_DEVICE names.
// tests/main.cpp runs the cases whose names contain one of its arguments, or whose file is
// one named (test_ops.cpp), all when there are none, and ends with "N passed, N failed,
// N skipped".
#pragma once
#include "../tinygrad.hpp"
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace th {
struct Case { const char* name; void (*fn)(); const char* file; bool child_only, last; };
inline std::vector<Case>& cases() { static std::vector<Case> all; return all; }
inline int& failures() { static int n = 0; return n; }
struct Register {
    Register(const char* n, void (*f)(), const char* file, bool child_only = false,
             bool last = false) {
        cases().push_back({n, f, file, child_only, last});
    }
};
struct Skip { std::string reason; };

inline void report(const char* file, int line, const std::string& what) {
    std::fprintf(stderr, "    %s:%d: %s\n", file, line, what.c_str());
    failures()++;
}
template <typename T> std::string show(const T& v) {
    std::ostringstream os;
    os << v;
    return os.str();
}
template <typename T> std::string show(const std::vector<T>& v) {
    std::string s = "{";
    for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + show(v[i]);
    return s + "}";
}
// Deterministic test inputs: a small LCG and uniform vectors drawn from it.
struct Lcg {
    uint64_t s;
    explicit Lcg(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {}
    double next() {   // uniform [0, 1)
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return double(s >> 11) / 9007199254740992.0;
    }
};
inline std::vector<float> randf(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
    Lcg g(seed);
    std::vector<float> v(n);
    for (float& x : v) x = float(lo + (hi - lo) * g.next());
    return v;
}
inline std::vector<double> randd(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
    Lcg g(seed);
    std::vector<double> v(n);
    for (double& x : v) x = lo + (hi - lo) * g.next();
    return v;
}
inline std::vector<int32_t> randi(size_t n, uint64_t seed, int lo, int hi) {   // [lo, hi]
    Lcg g(seed);
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = int32_t(lo + int(g.next() * (hi - lo + 1)));
    return v;
}

// Sets an environment variable for the lifetime of the guard, then restores (or unsets) it.
struct EnvGuard {
    std::string name, old;
    bool had;
    EnvGuard(const char* n, const char* value) : name(n), had(std::getenv(n) != nullptr) {
        if (had) old = std::getenv(n);
        setenv(n, value, 1);
    }
    void set(const char* value) { setenv(name.c_str(), value, 1); }
    ~EnvGuard() {
        if (had) setenv(name.c_str(), old.c_str(), 1);
        else unsetenv(name.c_str());
    }
    EnvGuard(const EnvGuard&) = delete;
    EnvGuard& operator=(const EnvGuard&) = delete;
};

// This test binary's path, to run it again as a child process (TG_TEST_CHILD)
inline std::string self_exe() {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

// how many times what occurs in text (kernels in a listing, loads of a buffer)
inline int count_of(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
    return n;
}

inline bool near(double a, double b, double tol) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    if (std::isinf(a) || std::isinf(b)) return a == b;
    return std::fabs(a - b) <= tol * (1 + std::fabs(b));
}
}  // namespace th

#define TEST(name)                                                                             \
    static void test_##name();                                                                 \
    static th::Register register_##name(#name, test_##name, __FILE__);                        \
    static void test_##name()

// A case about the CPU device itself (its C compiler, its .so cache, its passes' nests, CPU
// devices side by side): it runs on the CPU whatever TG_DEVICE the run names.
#define TEST_ON_CPU(name)                                                                      \
    static void test_##name();                                                                 \
    static void on_cpu_##name() {                                                              \
        th::EnvGuard cpu_("TG_DEVICE", "CPU");                                                 \
        test_##name();                                                                         \
    }                                                                                          \
    static th::Register register_##name(#name, on_cpu_##name, __FILE__);                      \
    static void test_##name()

#define CHECK(cond)                                                                            \
    do { if (!(cond)) th::report(__FILE__, __LINE__, "CHECK(" #cond ") failed"); } while (0)

#define CHECK_EQ(a, b)                                                                         \
    do {                                                                                       \
        auto va_ = (a); auto vb_ = (b);                                                        \
        if (!(va_ == vb_)) {                                                                   \
            th::report(__FILE__, __LINE__, "CHECK_EQ(" #a ", " #b "): " + th::show(va_) +      \
                       " != " + th::show(vb_));                                                \
        }                                                                                      \
    } while (0)

// relative-and-absolute tolerance: |a - b| <= tol·(1 + |b|)
#define CHECK_NEAR(a, b, tol)                                                                  \
    do {                                                                                       \
        double va_ = double(a), vb_ = double(b);                                               \
        if (!th::near(va_, vb_, tol)) {                                                        \
            std::ostringstream os_; os_.precision(9);                                          \
            os_ << "CHECK_NEAR(" #a ", " #b "): " << va_ << " vs " << vb_;                     \
            th::report(__FILE__, __LINE__, os_.str());                                         \
        }                                                                                      \
    } while (0)

// elementwise over two vectors of numbers
#define CHECK_ALL_NEAR(got, want, tol)                                                         \
    do {                                                                                       \
        auto g_ = (got); auto w_ = (want);                                                     \
        if (g_.size() != w_.size()) {                                                          \
            th::report(__FILE__, __LINE__, "CHECK_ALL_NEAR(" #got ", " #want "): sizes " +     \
                       std::to_string(g_.size()) + " != " + std::to_string(w_.size()));       \
        } else {                                                                               \
            for (size_t i_ = 0; i_ < g_.size(); i_++) {                                        \
                if (!th::near(double(g_[i_]), double(w_[i_]), tol)) {                          \
                    std::ostringstream os_; os_.precision(9);                                  \
                    os_ << "CHECK_ALL_NEAR(" #got ", " #want "): at " << i_ << ": "            \
                        << double(g_[i_]) << " vs " << double(w_[i_]);                         \
                    th::report(__FILE__, __LINE__, os_.str());                                 \
                    break;                                                                     \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    } while (0)

// expr must throw tg::Error whose message contains every one of the given strings
#define CHECK_THROWS(expr, ...)                                                                \
    do {                                                                                       \
        try {                                                                                  \
            (void)(expr);                                                                      \
            th::report(__FILE__, __LINE__, "CHECK_THROWS(" #expr "): nothing thrown");         \
        } catch (const tg::Error& e_) {                                                        \
            std::string m_ = e_.what();                                                        \
            for (const char* want_ : {__VA_ARGS__})                                            \
                if (m_.find(want_) == std::string::npos)                                       \
                    th::report(__FILE__, __LINE__, std::string("CHECK_THROWS(" #expr "): message '") + \
                               m_ + "' lacks '" + want_ + "'");                                \
        }                                                                                      \
    } while (0)

// A case that runs only in a child process started with TG_TEST_CHILD=name (for tests that
// need a second process, such as the disk cache's).
#define TEST_CHILD(name)                                                                       \
    static void test_##name();                                                                 \
    static th::Register register_##name(#name, test_##name, __FILE__, true);                  \
    static void test_##name()

#define TEST_LAST(name)                                                                        \
    static void test_##name();                                                                 \
    static th::Register register_##name(#name, test_##name, __FILE__, false, true);           \
    static void test_##name()

#define SKIP(reason) throw th::Skip{reason}

// Which sanitizer the tests run under (make test-asan, make test-tsan): gcc's macros, or
// clang's __has_feature. ThreadSanitizer cannot start threads in a child forked from a
// process that has them.
#if defined(__SANITIZE_ADDRESS__)
#define TG_TEST_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define TG_TEST_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TG_TEST_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define TG_TEST_TSAN 1
#endif
#endif
#ifdef TG_TEST_TSAN
#define SKIP_UNDER_TSAN() SKIP("ThreadSanitizer cannot start threads in a forked child")
#else
#define SKIP_UNDER_TSAN() (void)0
#endif

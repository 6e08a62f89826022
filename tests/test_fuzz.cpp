// The fuzz targets of tests/fuzz_targets.hpp in every test run, with any compiler: each file of
// the committed seed corpus tests/fuzz/corpus/<target>/, then TG_FUZZ_ITERATIONS (default 3000)
// deterministic mutations of it. make fuzz explores much further with libFuzzer; this keeps
// the corpus and the targets working everywhere.
//   TG_FUZZ_SEED=N       another stream of mutations
//   TG_FUZZ_CORPUS=DIR   seeds from DIR/<target>/ instead (a corpus libFuzzer grew, say)
//   TG_FUZZ_VERBOSE=1    how many inputs each target ran and accepted; 2: also each input
//                        before it runs (UBSan, as GCC links it, exits without naming it)
#include "harness.hpp"
#include "fuzz_targets.hpp"
#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

#ifdef TG_TEST_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace {

using Bytes = std::string;

struct Rng {   // splitmix64: fixed seed, same inputs on every machine
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    size_t below(size_t n) { return n ? size_t(next() % n) : 0; }
    bool one_in(size_t n) { return below(n) == 0; }
};

long env_long(const char* name, long fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::strtol(v, nullptr, 10) : fallback;
}

std::vector<Bytes> read_corpus(const std::string& dir) {
    std::vector<std::filesystem::path> paths;
    std::error_code ec;
    for (auto& entry : std::filesystem::directory_iterator(dir, ec))
        if (entry.is_regular_file()) paths.push_back(entry.path());
    std::sort(paths.begin(), paths.end());   // directory order differs between machines
    std::vector<Bytes> corpus;
    for (auto& path : paths) {
        std::ifstream in(path, std::ios::binary);
        corpus.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return corpus;
}

// ---- mutations: the byte-level ones libFuzzer also makes, then format-aware ones -----------

const char INTERESTING[] = "\x00\x01\x7f\x80\xff 0123456789,.-\n";
char interesting(Rng& rng) { return INTERESTING[rng.below(sizeof INTERESTING - 1)]; }

void mutate_bytes(Bytes& b, Rng& rng, const std::vector<Bytes>& pool) {
    size_t at = rng.below(b.size() + 1);
    const Bytes& other = pool[rng.below(pool.size())];
    switch (rng.below(7)) {
    case 0:
        if (!b.empty()) b[at % b.size()] ^= char(1u << rng.below(8));
        break;
    case 1:
        if (!b.empty()) b[at % b.size()] = interesting(rng);
        break;
    case 2:
        b.insert(at, 1, rng.one_in(2) ? char(rng.next()) : interesting(rng));
        break;
    case 3:
        b.erase(at, 1 + rng.below(8));
        break;
    case 4: {   // duplicate a chunk: repeated terms, repeated header entries
        size_t from = rng.below(b.size() + 1);
        b.insert(at, b.substr(from, 1 + rng.below(16)));
        break;
    }
    case 5:   // splice: the head of this input, the tail of another
        b = b.substr(0, at) + other.substr(std::min(other.size(), rng.below(other.size() + 1)));
        break;
    default: {   // overwrite with a chunk of another input
        size_t from = rng.below(other.size() + 1), n = 1 + rng.below(16);
        b.replace(at, n, other.substr(from, n));
    }
    }
}

// Somewhere a token of the given set occurs; npos when none does.
size_t find_any(const Bytes& s, const char* set, Rng& rng) {
    std::vector<size_t> hits;
    for (size_t i = 0; i < s.size(); i++)
        if (std::strchr(set, s[i]) && s[i]) hits.push_back(i);
    return hits.empty() ? Bytes::npos : hits[rng.below(hits.size())];
}

// The JSON header is where the loader's checks are: change one token of it, then (usually)
// make the length prefix agree, so that the change reaches the parser.
void mutate_header(Bytes& b, Rng& rng) {
    if (b.size() < 8) { b.resize(8 + rng.below(8), '\0'); return; }
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = (n << 8) | uint8_t(b[size_t(k)]);
    n = std::min<uint64_t>(n, b.size() - 8);
    Bytes header = b.substr(8, size_t(n)), data = b.substr(8 + size_t(n));
    static const char* const numbers[] = {
        "0", "1", "2", "-1", "3", "4", "8", "12", "1.5", "1e2", "-0", "nan", "inf", "0x10",
        "2147483648", "4294967296", "9007199254740993", "9000000000000000", "1e300",
        "18446744073709551616", "9223372036854775807"};
    static const char* const snippets[] = {
        "\"dtype\":\"F32\"", "\"shape\":[]", "\"shape\":[0]", "\"data_offsets\":[0,0]",
        "\"__metadata__\":{}", ",\"t\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}",
        "\"F64\"", "\"I64\"", "\"BOOL\"", "\"I32\"", "\"F16\"", "\\u00e9", "\\ud800", "\\",
        "{", "}", "[", "]", ",", ":", "\"", " ", "[[[[", "\"a\":"};
    size_t at;
    switch (rng.below(5)) {
    case 0:   // a number: sizes and offsets
        at = find_any(header, "0123456789", rng);
        if (at != Bytes::npos) {
            size_t end = at;
            while (end < header.size() && std::isdigit((unsigned char)header[end])) end++;
            header.replace(at, end - at, numbers[rng.below(std::size(numbers))]);
        }
        break;
    case 1:   // structure: drop or swap a bracket, quote, comma or colon
        at = find_any(header, "{}[]\",:", rng);
        if (at != Bytes::npos) {
            if (rng.one_in(2)) header.erase(at, 1);
            else header[at] = "{}[]\",: "[rng.below(8)];
        }
        break;
    case 2:   // a known snippet anywhere
        header.insert(rng.below(header.size() + 1), snippets[rng.below(std::size(snippets))]);
        break;
    case 3:   // a dtype name for another
        at = header.find("\"dtype\":\"");
        if (at != Bytes::npos) {
            size_t from = at + 9, end = header.find('"', from);
            static const char* const dtypes[] = {"F32", "F64", "I32", "I64", "BOOL", "F16", ""};
            header.replace(from, end - from, dtypes[rng.below(std::size(dtypes))]);
        }
        break;
    default:   // the data section grows or shrinks by an element
        if (rng.one_in(2)) data.append(size_t(1) << rng.below(4), char(rng.next()));
        else data.resize(data.size() - std::min(data.size(), size_t(1) << rng.below(4)));
    }
    uint64_t length = rng.one_in(8) ? n : header.size();
    Bytes prefix(8, '\0');
    for (int k = 0; k < 8; k++) prefix[size_t(k)] = char((length >> (8 * k)) & 0xff);
    b = prefix + header + data;
}

// The spec is the first line: add what changes its meaning.
void mutate_spec(Bytes& b, Rng& rng) {
    static const char* const tokens[] = {"...", ",", "->", "i", "j", "k", "I", "z", " ", "ii",
                                         ".", "-", ">", "\n"};
    size_t line = std::min(b.find('\n'), b.size());
    b.insert(rng.below(line + 1), tokens[rng.below(std::size(tokens))]);
}

// ---- crashes: they end the process before any CHECK, so the input is written as it dies ------

const std::string* running_input = nullptr;
long verbose = 0;

// Only write(): this runs in a signal handler or in a sanitizer's death callback.
void write_running_input() {
    if (!running_input) return;
    const char head[] = "\n    fuzz: crashed on input (escaped): \"";
    (void)!write(2, head, sizeof head - 1);
    char buf[256];
    size_t n = 0;
    for (unsigned char c : *running_input) {
        if (n > sizeof buf - 8) { (void)!write(2, buf, n); n = 0; }
        if (c == '"' || c == '\\') { buf[n++] = '\\'; buf[n++] = char(c); }
        else if (c >= 0x20 && c < 0x7f) buf[n++] = char(c);
        else {   // always \xNN"" so that a following hex digit stays a character of its own
            const char* hex = "0123456789abcdef";
            for (char x : {'\\', 'x', hex[c >> 4], hex[c & 15], '"', '"'}) buf[n++] = x;
        }
    }
    (void)!write(2, buf, n);
    (void)!write(2, "\"\n", 2);
}

// While a target runs, a crash names the input. Sanitizers keep their own signal handlers
// (their report is the useful part) and call back before exiting.
#ifdef TG_TEST_ASAN
struct CrashReporter {
    CrashReporter() { __sanitizer_set_death_callback(write_running_input); }
    ~CrashReporter() { running_input = nullptr; }
};
#else
void on_crash_signal(int sig) {
    write_running_input();
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

struct CrashReporter {
    static constexpr int SIGNALS[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    struct sigaction old[std::size(SIGNALS)];
    CrashReporter() {
        struct sigaction sa = {};
        sa.sa_handler = on_crash_signal;
        for (size_t i = 0; i < std::size(SIGNALS); i++) sigaction(SIGNALS[i], &sa, &old[i]);
    }
    ~CrashReporter() {
        running_input = nullptr;
        for (size_t i = 0; i < std::size(SIGNALS); i++) sigaction(SIGNALS[i], &old[i], nullptr);
    }
};
#endif

struct Target {
    const char* name;
    int (*run)(const uint8_t*, size_t);
    void (*mutate)(Bytes&, Rng&);
};

struct Stats {
    size_t inputs = 0, accepted = 0;
};

// One input. Any exception escaping a target is a finding; the first few are reported.
void run_one(const Target& t, const Bytes& input, Stats& st, size_t& failures) {
    st.inputs++;
    running_input = &input;
    if (verbose >= 2) {
        std::fprintf(stderr, "    %s: \"%s\"\n", t.name,
                     fuzz::escape(reinterpret_cast<const uint8_t*>(input.data()), input.size())
                         .c_str());
    }
    std::string what;
    bool failed = true;
    try {
        st.accepted += t.run(reinterpret_cast<const uint8_t*>(input.data()), input.size()) == 1;
        failed = false;
    } catch (const std::exception& e) {
        what = e.what();
    } catch (...) {
        what = "an exception that is not a std::exception";
    }
    running_input = nullptr;
    if (failed && ++failures <= 5) {   // a few are enough to reproduce; all of them would flood
        th::report(__FILE__, __LINE__,
                   std::string(t.name) + ": " + what + "\n      on input (" +
                       std::to_string(input.size()) + " bytes): \"" +
                       fuzz::escape(reinterpret_cast<const uint8_t*>(input.data()), input.size()) +
                       "\"");
    }
}

void fuzz_target(const Target& t) {
    th::EnvGuard device("TG_DEVICE", "INTERP");
    CrashReporter crashes;
    verbose = env_long("TG_FUZZ_VERBOSE", 0);
    const char* root = std::getenv("TG_FUZZ_CORPUS");
    std::vector<Bytes> pool = read_corpus((root ? root : "tests/fuzz/corpus") + std::string("/") +
                                          t.name);
    CHECK(!pool.empty());   // tests run from the repository root, where the corpus is committed
    if (pool.empty()) return;
    Stats seeds;
    size_t failures = 0;
    for (const Bytes& input : pool) run_one(t, input, seeds, failures);
    // the committed seeds are meant to reach both sides of the parser
    CHECK(seeds.accepted > 0);
    CHECK(root || seeds.accepted < seeds.inputs);

    Rng rng{uint64_t(env_long("TG_FUZZ_SEED", 20240601))};
    long iterations = env_long("TG_FUZZ_ITERATIONS", 3000);
    size_t pool_limit = pool.size() + 200;   // accepted mutants become parents too
    Stats mutants;
    for (long it = 0; it < iterations; it++) {
        Bytes input = pool[rng.below(pool.size())];
        for (size_t k = 1 + rng.below(4); k-- > 0;) {
            if (rng.one_in(2)) t.mutate(input, rng);
            else mutate_bytes(input, rng, pool);
        }
        if (input.size() > 4096) input.resize(4096);
        size_t accepted = mutants.accepted;
        run_one(t, input, mutants, failures);
        if (mutants.accepted > accepted && pool.size() < pool_limit) pool.push_back(input);
    }
    CHECK(iterations == 0 || mutants.accepted > 0);
    if (failures > 5)
        th::report(__FILE__, __LINE__, std::to_string(failures - 5) + " more failing inputs");
    if (verbose)
        std::fprintf(stderr, "    %s: %zu seeds (%zu accepted), %zu mutants (%zu accepted)\n",
                     t.name, seeds.inputs, seeds.accepted, mutants.inputs, mutants.accepted);
}

}  // namespace

TEST(fuzz_safetensors_corpus_and_mutations) {
    fuzz_target({"safetensors", fuzz_safetensors, mutate_header});
}

TEST(fuzz_einsum_corpus_and_mutations) {
    fuzz_target({"einsum", fuzz_einsum, mutate_spec});
}

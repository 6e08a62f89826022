// 04_makemore.cpp — a character-level language model that makes up new names.
//
// The MLP of Bengio et al. (2003), as in Karpathy's makemore: each character is predicted from
// the three before it. Each of the 27 characters ('.' marks the start and the end of a word)
// has a learned 10-number embedding; the three embeddings are joined into 30 numbers, then
// Linear(30→200) → tanh → Linear(200→200) → tanh → Linear(200→27) gives the logits and
// cross-entropy the loss. Training takes random mini-batches of 32 with SGD; the whole step is
// one compiled program (tg::jit). A tenth of the distinct words is held out: the loss on them
// says whether the model learned names in general or memorized its training names. Then it
// samples 20 words, one character at a time, and counts those that are not training names.
//
// Build alone:  c++ -std=c++17 -O2 examples/04_makemore.cpp -o 04_makemore -ldl
// Run:          ./04_makemore [--short] [--steps N] [words.txt]
//   words.txt   one word per line; default: data/names.txt beside the executable, else
//               names.txt beside it (make copies examples/data/ to build/examples/data/)
//   --steps N   training steps (default 60000); --short: 1500, for the tests
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <unistd.h>
#include <unordered_set>

using tg::Tensor;
namespace nn = tg::nn;
static const int T = 3, E = 10, D = 200, V = 27, B = 32;

static int usage(const char* why) {
    std::fprintf(stderr, "04_makemore: %s\nusage: 04_makemore [--short] [--steps N] [words.txt]\n",
                 why);
    return 2;
}

// The executable's own directory, so that the data beside it is found from any working
// directory; argv[0] is the fallback where /proc is missing.
static std::string exe_dir(const char* argv0) {
    char buf[4096];
    ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
    std::string exe = len > 0 ? std::string(buf, size_t(len)) : std::string(argv0);
    size_t slash = exe.rfind('/');
    return slash == std::string::npos ? "." : exe.substr(0, slash);
}

// Every character of every word, and the end mark, is an example: the three before it → it.
struct Examples {
    Tensor X, Y;
    int64_t n = 0;
};
static Examples examples(const std::vector<std::string>& words) {
    std::vector<int32_t> contexts, next;
    for (const std::string& word : words) {
        std::vector<int32_t> window(T, 0);
        for (char ch : word + ".") {
            int32_t c = ch == '.' ? 0 : ch - 'a' + 1;
            contexts.insert(contexts.end(), window.begin(), window.end());
            next.push_back(c);
            window.erase(window.begin());
            window.push_back(c);
        }
    }
    int64_t n = int64_t(next.size());
    return {Tensor::from_vector(contexts, {n, T}), Tensor::from_vector(next), n};
}

// Random numbers straight from mt19937, whose sequence the standard fixes (std::shuffle and the
// std distributions are each library's own), so every compiler gives the same run.
static uint32_t below(std::mt19937& rng, size_t n) { return uint32_t(rng() % n); }
static int32_t draw(std::mt19937& rng, const std::vector<float>& p) {
    double total = 0, sum = 0;
    for (float x : p) total += x;
    double u = rng() / 4294967296.0 * total;
    for (size_t i = 0; i < p.size(); i++)
        if ((sum += p[i]) > u) return int32_t(i);
    return int32_t(p.size() - 1);
}

int main(int argc, char** argv) {
    int steps = 60000;
    std::string path;
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "--short") {
            steps = 1500;
        } else if (arg == "--steps") {
            char* end = nullptr;
            long n = i + 1 < argc ? std::strtol(argv[++i], &end, 10) : 0;
            if (!end || *end || n < 1 || n > 100000000) return usage("--steps needs a count");
            steps = int(n);
        } else if (arg.size() > 1 && arg[0] == '-') {
            return usage(("unknown option " + arg).c_str());
        } else if (path.empty()) {
            path = arg;
        } else {
            return usage("more than one word list");
        }
    }
    if (path.empty()) {
        std::string dir = exe_dir(argv[0]), looked;
        for (const std::string& p : {dir + "/data/names.txt", dir + "/names.txt"}) {
            if (std::ifstream(p)) { path = p; break; }
            looked += "\n  " + p;
        }
        if (path.empty()) {
            std::fprintf(stderr, "04_makemore: no word list given and none beside the executable;"
                                 " looked for:%s\ngive one: 04_makemore words.txt\n",
                         looked.c_str());
            return 2;
        }
    }
    std::ifstream file(path);
    if (!file) {
        std::fprintf(stderr, "04_makemore: cannot read the word list %s\n", path.c_str());
        return 2;
    }

    // Distinct words only: a name listed twice could otherwise land in both splits, and the
    // held-out loss would then measure memory. Letters are kept, lowercased; others dropped.
    std::vector<std::string> words;
    std::unordered_set<std::string> seen;
    int64_t listed = 0;
    for (std::string token; file >> token; listed++) {
        std::string word;
        for (char ch : token)
            if (std::isalpha(static_cast<unsigned char>(ch)))
                word += char(std::tolower(static_cast<unsigned char>(ch)));
        if (!word.empty() && seen.insert(word).second) words.push_back(word);
    }
    if (words.size() < 2) {
        std::fprintf(stderr, "04_makemore: %s has %zu distinct words; at least 2 are needed "
                             "(one to train on, one to hold out)\n", path.c_str(), words.size());
        return 2;
    }
    std::mt19937 rng(1234);
    for (size_t i = words.size() - 1; i > 0; i--) std::swap(words[i], words[below(rng, i + 1)]);
    size_t n_val = std::max<size_t>(1, words.size() / 10);
    std::vector<std::string> val_words(words.begin(), words.begin() + long(n_val));
    std::vector<std::string> train_words(words.begin() + long(n_val), words.end());
    Examples train = examples(train_words), val = examples(val_words);
    std::printf("%s: %lld words, %zu distinct: %zu to train on (%lld examples), %zu held out "
                "(%lld examples)\n", path.c_str(), (long long)listed, words.size(),
                train_words.size(), (long long)train.n, val_words.size(), (long long)val.n);

    tg::manual_seed(42);
    Tensor C = Tensor::randn({V, E}).requires_grad();
    nn::Sequential mlp(nn::Linear(T * E, D, false), nn::Tanh(), nn::Linear(D, D, false), nn::Tanh(),
                       nn::Linear(D, V, false));
    std::vector<Tensor> params = mlp.parameters();
    params.push_back(C);
    tg::optim::SGD opt(params, 0.1);
    auto logits = [&](const Tensor& ctx) { return mlp(C[ctx].reshape({ctx.size(0), T * E})); };
    tg::Jit step([&](const std::vector<Tensor>& in) {   // in[0]: indices of B examples
        Tensor loss = nn::cross_entropy(logits(train.X[in[0]]), train.Y[in[0]]);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });
    auto loss_on = [&](const Examples& e, int64_t count) {
        tg::NoGrad no_grad;
        Tensor ctx = e.X.slice(0, 0, count);
        Tensor emb = C[ctx].reshape({count, T * E});
        return nn::cross_entropy(mlp(emb), e.Y.slice(0, 0, count)).item();
    };
    // The splits are compared on equally many examples, so that one compiled program serves
    // both: all the held-out ones, and as many training ones (from randomly chosen words).
    int64_t compared = std::min(train.n, val.n);
    double train_loss = 0, val_loss = 0;

    // A progress line rewritten in place on a terminal; elsewhere the report lines carry the
    // speed, so a log gets ten lines, not thousands.
    // Reports are at most ten, and 500 steps apart: evaluating costs about as much as 400 steps.
    int every = std::max(500, steps / 10);
    bool terminal = isatty(STDOUT_FILENO);
    using clock = std::chrono::steady_clock;
    clock::time_point started = clock::now(), shown = started;
    for (int i = 0; i < steps; i++) {
        if (i == steps * 3 / 4) opt.set_lr(0.01);   // a step down for the last quarter
        std::vector<int32_t> batch(B);
        for (auto& b : batch) b = int32_t(below(rng, size_t(train.n)));
        step({Tensor::from_vector(batch)});
        double elapsed = std::chrono::duration<double>(clock::now() - started).count();
        double rate = i > 0 && elapsed > 0 ? i / elapsed : 0;
        double left = rate > 0 ? (steps - 1 - i) / rate : 0;
        if (i % every == 0 || i == steps - 1) {
            train_loss = loss_on(train, compared);
            val_loss = loss_on(val, compared);
            std::printf("%sstep %6d/%d  loss: train %.4f  val %.4f", terminal ? "\r\033[K" : "",
                        i + 1, steps, train_loss, val_loss);
            if (rate > 0) std::printf("  %5.0f steps/s  %3.0f s left", rate, left);
            std::printf("\n");
            std::fflush(stdout);
            shown = clock::now();
        } else if (terminal && clock::now() - shown > std::chrono::milliseconds(200)) {
            shown = clock::now();
            std::printf("\r\033[Kstep %6d/%d  %5.0f steps/s  %3.0f s left", i + 1, steps, rate,
                        left);
            std::fflush(stdout);
        }
        if (i == 0) started = clock::now();   // the first step compiles: rates start after it
    }
    std::printf("after %d steps: train loss %.4f, val loss %.4f (each on %lld examples; "
                "uniform guessing: ln 27 = %.4f)\n", steps, train_loss, val_loss,
                (long long)compared, std::log(double(V)));

    // sampling: the last three characters in, the next one drawn from softmax(logits)
    tg::Jit probabilities([&](const std::vector<Tensor>& in) { return logits(in[0]).softmax(-1); });
    std::unordered_set<std::string> trained(train_words.begin(), train_words.end());
    std::unordered_set<std::string> held_out(val_words.begin(), val_words.end());
    int fresh = 0;
    std::printf("20 samples:\n");
    for (int w = 0; w < 20; w++) {
        std::vector<int32_t> window(T, 0);
        std::string out;
        for (int32_t c = -1; c != 0 && out.size() < 20;) {
            std::vector<float> p = probabilities({Tensor::from_vector(window, {1, T})}).to_vector();
            c = draw(rng, p);
            if (c) out += char('a' + c - 1);
            window.erase(window.begin());
            window.push_back(c);
        }
        bool copy = trained.count(out) > 0;
        fresh += !copy;
        const char* note = copy                  ? "(a training word)"
                           : held_out.count(out) ? "(a held-out word: new to the model)"
                                                 : "";
        if (*note) std::printf("  %-20s  %s\n", out.c_str(), note);
        else std::printf("  %s\n", out.c_str());
    }
    std::printf("%d of 20 samples are new (not among the %zu training words)\n", fresh,
                train_words.size());
    return 0;
}

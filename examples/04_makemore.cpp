// 04_makemore.cpp — a character-level language model that makes up new names.
//
// The MLP of Bengio et al. (2003), as in Karpathy's makemore: each character is predicted from
// the three before it. Each of the 27 characters ('.' marks the start and the end of a word)
// has a learned 10-number embedding; the three embeddings are joined into 30 numbers, then
// Linear(30→200) → tanh → Linear(200→200) → tanh → Linear(200→27) gives the logits and
// cross-entropy the loss. Training takes random mini-batches of 32 with SGD; the whole step is
// one compiled program (tg::jit). Then it samples 20 new words, one character at a time, from
// the predicted distribution.
//
// Build alone:  c++ -std=c++17 -O2 examples/04_makemore.cpp -o 04_makemore -ldl
// Run:          ./04_makemore [--short] [words.txt]   (default: examples/data/names.txt;
//               --short: fewer steps, for the tests)
#define TINYGRAD_IMPLEMENTATION
#include "../tinygrad.hpp"
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

using tg::Tensor;
namespace nn = tg::nn;
static const int T = 3, E = 10, D = 200, V = 27, B = 32;

int main(int argc, char** argv) {
    bool short_run = argc > 1 && std::strcmp(argv[1], "--short") == 0;
    std::string here = std::string(__FILE__).substr(0, std::string(__FILE__).rfind('/') + 1);
    std::string path = argc > 1 + short_run ? argv[1 + short_run] : here + "data/names.txt";
    std::ifstream file(path);
    if (!file) { std::fprintf(stderr, "cannot read the word list %s\n", path.c_str()); return 2; }

    // every character of every word, and the end mark, is an example: three before → it
    std::vector<int32_t> contexts, next;
    auto shift = [](std::vector<int32_t>& window, int32_t c) {
        window.erase(window.begin());
        window.push_back(c);
    };
    for (std::string word; file >> word;) {
        std::vector<int32_t> window(T, 0);
        for (char ch : word + ".") {
            int32_t c = ch == '.' ? 0 : ch - 'a' + 1;
            if (c < 0 || c >= V) continue;   // not a letter
            contexts.insert(contexts.end(), window.begin(), window.end());
            next.push_back(c);
            shift(window, c);
        }
    }
    int64_t n = int64_t(next.size());
    Tensor X = Tensor::from_vector(contexts, {n, T}), Y = Tensor::from_vector(next);

    tg::manual_seed(42);
    Tensor C = Tensor::randn({V, E}).requires_grad();
    nn::Sequential mlp(nn::Linear(T * E, D, false), nn::Tanh(), nn::Linear(D, D, false), nn::Tanh(),
                       nn::Linear(D, V, false));
    std::vector<Tensor> params = mlp.parameters();
    params.push_back(C);
    tg::optim::SGD opt(params, 0.1);
    auto logits = [&](const Tensor& ctx) { return mlp(C[ctx].reshape({ctx.size(0), T * E})); };
    tg::Jit step([&](const std::vector<Tensor>& in) {   // in[0]: indices of B examples
        Tensor loss = nn::cross_entropy(logits(X[in[0]]), Y[in[0]]);
        opt.zero_grad();
        loss.backward();
        opt.step();
        return loss;
    });

    const int steps = short_run ? 1500 : 30000;
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> pick(0, int32_t(n - 1));
    double running = std::log(double(V));   // the loss of a uniform guess
    for (int i = 0; i < steps; i++) {
        if (i == steps * 3 / 4) opt.set_lr(0.01);   // a step down for the last quarter
        std::vector<int32_t> batch(B);
        for (auto& b : batch) b = pick(rng);
        running = 0.98 * running + 0.02 * step({Tensor::from_vector(batch)}).item();
        if (i % (steps / 10) == 0 || i == steps - 1)
            std::printf("step %5d  loss %.4f\n", i, running);
    }
    std::printf("loss on all %lld examples: %.4f  (uniform guessing: ln 27 = %.4f)\n", (long long)n,
                nn::cross_entropy(logits(X), Y).item(), std::log(double(V)));

    // sampling: the last three characters in, the next one drawn from softmax(logits)
    tg::Jit probabilities([&](const std::vector<Tensor>& in) { return logits(in[0]).softmax(-1); });
    std::printf("20 new words:\n");
    for (int w = 0; w < 20; w++) {
        std::vector<int32_t> window(T, 0);
        std::string out;
        for (int32_t c = -1; c != 0 && out.size() < 20; shift(window, c)) {
            std::vector<float> p = probabilities({Tensor::from_vector(window, {1, T})}).to_vector();
            c = std::discrete_distribution<int32_t>(p.begin(), p.end())(rng);
            if (c) out += char('a' + c - 1);
        }
        std::printf("  %s\n", out.c_str());
    }
    return 0;
}
